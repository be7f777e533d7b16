"""``bertforge tokenizer train``: train a WordPiece vocabulary on text files and save it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bertforge.cli.options import parse_config
from bertforge.errors import BertforgeError
from bertforge.tokenizer.wordpiece import Tokenizer


@dataclass
class TokenizerTrainConfig:
    """Options of ``bertforge tokenizer train`` (:meth:`Tokenizer.train` checks the values)."""

    input: list[str]
    """UTF-8 text files (.gz is read transparently)."""
    vocab_size: int
    """Vocabulary size including the 5 special tokens (BERT: 30522)."""
    output: str
    """Directory for vocab.txt, tokenizer.json, tokenizer_config.json."""
    min_frequency: int = 2
    """Minimum count of a merged WordPiece."""
    lowercase: bool = True
    """Lowercase the text (an uncased vocabulary); false keeps case."""
    strip_accents: bool | None = None
    """Strip accents; None: exactly when lowercasing, as BERT."""
    limit_alphabet: int = 1000
    """At most this many single characters in the vocabulary; rarer ones become [UNK]."""
    model_max_length: int | None = None
    """Record the longest sequence the model will take (e.g. 512) in tokenizer_config.json."""
    progress: bool = False
    """Show the trainer's progress bars."""


def main(argv: list[str]) -> int:
    """``bertforge tokenizer train --input FILE... --vocab_size N --output DIR``."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: bertforge tokenizer train [options]   (bertforge tokenizer train --help)")
        return 0
    if argv[0] != "train":
        raise BertforgeError(
            f"bertforge tokenizer: unknown subcommand {argv[0]!r}; use bertforge tokenizer train"
        )
    cfg = parse_config(
        TokenizerTrainConfig,
        argv[1:],
        prog="bertforge tokenizer train",
        description="Train a WordPiece vocabulary on text files.",
    )
    start = time.perf_counter()
    tok = Tokenizer.train(
        cfg.input,
        cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        lowercase=cfg.lowercase,
        strip_accents=cfg.strip_accents,
        limit_alphabet=cfg.limit_alphabet,
        show_progress=cfg.progress,
        model_max_length=cfg.model_max_length,
    )
    tok.save(cfg.output)
    size_mb = sum(Path(f).stat().st_size for f in cfg.input) / 1e6
    case = "lowercased" if cfg.lowercase else "cased"
    print(
        f"trained a {case} WordPiece vocabulary of {tok.vocab_size} tokens on {len(cfg.input)} "
        f"file(s) ({size_mb:.1f} MB on disk) in {time.perf_counter() - start:.1f} s -> {cfg.output} "
        f"(fingerprint {tok.fingerprint})"
    )
    return 0
