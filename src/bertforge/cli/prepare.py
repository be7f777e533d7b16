"""``bertforge prepare``: documents -> token shards (:func:`bertforge.data.shards.prepare`)."""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.cli.options import parse_config
from bertforge.data.corpus import EncodingErrors, Format
from bertforge.data.shards import Mode, format_summary, prepare
from bertforge.tokenizer.wordpiece import Tokenizer


@dataclass
class PrepareConfig:
    """Options of ``bertforge prepare`` (:func:`~bertforge.data.shards.prepare` checks them)."""

    input: list[str]
    """Text files, directories or globs (txt, WikiText, csv/tsv/jsonl, .gz)."""
    tokenizer: str
    """Tokenizer directory or file (from bertforge tokenizer train)."""
    output: str
    """Data directory to create."""
    max_seq_length: int = 128
    """Tokens per sequence, [CLS] and [SEP] included."""
    mode: Mode = "nsp"
    """nsp: sentence pairs with NSP labels; packed: full sequences, MLM only."""
    short_seq_prob: float = 0.1
    """Share of shorter NSP targets (BERT's 0.1)."""
    validation_fraction: float = 0.01
    """Share of the documents held out for validation (spread evenly)."""
    validation: list[str] | None = None
    """Files holding the validation documents (instead of a fraction)."""
    exclude: list[str] | None = None
    """Drop documents whose text equals one in these files (e.g. an evaluation set)."""
    text_column: str | None = None
    """Column or key of csv/tsv/jsonl inputs."""
    format: Format = "auto"
    """How to read the inputs; auto decides from each file's name."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes that are not UTF-8; replace: read them as U+FFFD."""
    seed: int = 12345
    """Seed of the validation split and NSP pairing."""
    workers: int = 1
    """Tokenise in N processes (one per core); the output is the same as with 1."""
    overwrite: bool = False
    """Replace an existing data directory."""
    progress: bool = True
    """Show a progress bar."""


def main(argv: list[str]) -> int:
    """``bertforge prepare --input FILE... --tokenizer DIR --output DIR [options]``."""
    cfg = parse_config(
        PrepareConfig,
        argv,
        prog="bertforge prepare",
        description="Turn text into token shards for pretraining: NSP pairs or packed sequences.",
    )
    summary = prepare(
        cfg.input,
        Tokenizer.from_file(cfg.tokenizer),
        cfg.output,
        max_seq_length=cfg.max_seq_length,
        mode=cfg.mode,
        short_seq_prob=cfg.short_seq_prob,
        validation_fraction=cfg.validation_fraction,
        validation_inputs=cfg.validation,
        exclude_inputs=cfg.exclude,
        text_column=cfg.text_column,
        format=cfg.format,
        seed=cfg.seed,
        encoding_errors=cfg.encoding_errors,
        overwrite=cfg.overwrite,
        progress=cfg.progress,
        workers=cfg.workers,
    )
    print(format_summary(summary))
    return 0
