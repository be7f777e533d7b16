"""``bertforge tokenizer train``: train a WordPiece vocabulary on text files and save it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.cli.options import parse_config
from bertforge.data import shards
from bertforge.data.columnar import is_table_folder
from bertforge.data.corpus import EncodingErrors, detect_format, read_documents
from bertforge.errors import BertforgeError
from bertforge.io import (
    atomic_directory,
    describe_directory,
    directory_entries,
    disk_size,
    make_directory,
    metered_reads,
)
from bertforge.progress import ReadProgress, format_duration, time_left
from bertforge.tokenizer.files import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    VOCAB_FILE,
    check_text_files,
    iter_text_lines,
    sample_texts,
)
from bertforge.tokenizer.wordpiece import Tokenizer

TOKENIZER_FILES = (VOCAB_FILE, TOKENIZER_FILE, CONFIG_FILE)
"""What ``tokenizer train`` writes: all a directory may hold for --overwrite to replace it."""


@dataclass
class TokenizerTrainConfig:
    """Options of ``bertforge tokenizer train`` (:meth:`Tokenizer.train` checks the values)."""

    input: list[str]
    """UTF-8 text files, or csv/tsv/jsonl tables, Parquet files or datasets folders with
    --text_column (.gz, .bz2, .xz and .zst are read as they stream)."""
    vocab_size: int
    """Vocabulary size including the 5 special tokens (BERT: 30522)."""
    output: str
    """Directory for vocab.txt, tokenizer.json, tokenizer_config.json."""
    text_column: str | None = None
    """Column or key of csv/tsv/jsonl/Parquet inputs (as bertforge prepare reads them): only its
    text is trained on, never the header, the other columns or the quotes."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes that are not UTF-8 (naming file and line); replace: read them as
    U+FFFD."""
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
    overwrite: bool = False
    """Replace an existing tokenizer directory (never a model or any other directory)."""
    max_chars: int | None = 100_000_000
    """Train on a uniform random sample of the lines of at most this many characters when the
    input is larger (the vocabulary of a 100M-character sample is that of the whole; the trainer's
    memory and time grow with the text); null: every line."""
    seed: int = 0
    """Seed of that sample."""
    progress: bool = True
    """On a terminal, the trainer's progress bars; in a log file (a recipe's step), a line every
    5% of the input read (by bytes on disk) once it has run 10 s, and one as the vocabulary
    training starts and ends; false: neither."""


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
    output = Path(cfg.output)
    check_output(output, cfg.overwrite)  # before training, which may take minutes
    start = time.perf_counter()
    terminal = sys.stderr.isatty()
    lines = cfg.progress and not terminal  # a log file: lines, never the trainer's bars
    with metered_reads(p for p in map(Path, cfg.input) if p.is_file()) as meter:
        texts: Iterable[str] = training_text(cfg)
        after = shards.PROGRESS_AFTER  # prepare's: a short run says nothing
        if lines:
            texts = _say_progress(texts, ReadProgress(meter, start, shards.PROGRESS_STEP, after))
        sampled = ""
        if cfg.max_chars is not None:
            texts, read, kept = sample_texts(texts, cfg.max_chars, cfg.seed)
            if kept < read:
                sampled = (
                    f" on a random sample of {kept:,} of its {read:,} characters "
                    f"(--max_chars {cfg.max_chars}, --seed {cfg.seed})"
                )
                print(f"tokenizer train: the input is large; training{sampled}", flush=True)
        trained = time.perf_counter()
        if lines and trained - start >= after:  # (--max_chars null: the trainer reads too)
            what = "the sample" if sampled else "the input"
            _say(f"tokenizer train: training the vocabulary on {what}, after {_took(start)}")
        tok = Tokenizer.train_from_iterator(
            texts,
            cfg.vocab_size,
            source=", ".join(cfg.input),
            min_frequency=cfg.min_frequency,
            lowercase=cfg.lowercase,
            strip_accents=cfg.strip_accents,
            limit_alphabet=cfg.limit_alphabet,
            show_progress=cfg.progress and terminal,
            model_max_length=cfg.model_max_length,
        )
    if lines and time.perf_counter() - start >= after:
        _say(f"tokenizer train: vocabulary trained in {_took(trained)}")
    if output.is_dir() and not directory_entries(output):  # empty (e.g. --output .): filled
        tok.save(output)
    else:  # new or replaced whole: never a mix of the old vocabulary's files and the new one's
        with atomic_directory(output, replace=cfg.overwrite) as tmp:
            tok.save(tmp)
    size_mb = sum(disk_size(f) for f in cfg.input) / 1e6
    case = "lowercased" if cfg.lowercase else "cased"
    print(
        f"trained a {case} WordPiece vocabulary of {tok.vocab_size} tokens on {len(cfg.input)} "
        f"file(s) ({size_mb:.1f} MB on disk){sampled} in {time.perf_counter() - start:.1f} s -> {cfg.output} "
        f"(fingerprint {tok.fingerprint})"
    )
    return 0


def training_text(cfg: TokenizerTrainConfig) -> Iterator[str]:
    """The text to train on: the lines of text files, as :meth:`Tokenizer.train` reads them, or
    the sentences of a table's ``--text_column`` (what ``bertforge prepare`` reads from it); a
    table without ``--text_column`` is refused with its columns."""
    paths = [Path(f) for f in cfg.input]
    # a datasets folder or a folder of Parquet files is one table; any other folder is refused
    check_text_files([p for p in paths if not is_table_folder(p)], "; check --input")
    for path in paths:
        if path.is_dir() or detect_format(path) in ("csv", "tsv", "jsonl", "parquet", "arrow"):
            for document in read_documents(
                path, text_column=cfg.text_column, encoding_errors=cfg.encoding_errors
            ):
                yield from document
        else:
            yield from iter_text_lines([path], cfg.encoding_errors)


def _took(since: float) -> str:
    """``2m05s``: the time since ``since`` (a ``time.perf_counter()``)."""
    return format_duration(time.perf_counter() - since)


def _say_progress(texts: Iterable[str], report: ReadProgress) -> Iterator[str]:
    """``texts``, printing ``tokenizer train: 35% of the input read, 6m40s, about 12m23s left``
    to stderr whenever ``report`` says a line is due (checked every 256 texts)."""
    for number, text in enumerate(texts):
        yield text
        if number % 256 == 0 and (due := report.due()):
            step, done, seconds = due
            _say(
                f"tokenizer train: {step:.0%} of the input read, "
                f"{format_duration(seconds)}{time_left(done, seconds)}"
            )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse an ``output`` that holds anything, unless ``overwrite`` and it is a tokenizer
    directory (a model's tokenizer must match its weights and manifest: never replaced)."""
    if output.exists() and not output.is_dir():
        make_directory(output)  # raises: a file is in the way (the message of every command)
    held = describe_directory(output)
    if held is None:
        return
    if not set(directory_entries(output)) <= set(TOKENIZER_FILES):
        raise BertforgeError(
            f"{output} is {held}; tokenizer train replaces (with --overwrite) only a directory "
            f"of nothing but {', '.join(TOKENIZER_FILES)}: choose another --output"
        )
    if not overwrite:
        raise BertforgeError(
            f"{output}: already exists and is {held}; choose another --output or pass --overwrite"
        )
