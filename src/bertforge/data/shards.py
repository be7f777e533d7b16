"""``bertforge prepare``: raw text to prepared pretraining data (see :mod:`.dataset` for the format).

:func:`prepare` (CLI ``bertforge prepare``, :func:`main`) streams documents from the inputs
(:mod:`bertforge.data.corpus`), tokenises them in chunks with the ``tokenizers`` library's parallel
batch encoding, builds NSP pairs or packed sequences (:mod:`bertforge.data.instances`) and flushes
them to shards as it goes (:class:`~bertforge.data.dataset.ShardWriter`), so memory stays bounded
whatever the corpus size. It writes into a temporary directory renamed when complete, copies the
tokenizer into ``OUTPUT/tokenizer/``, records every file's size and SHA-256 in
``manifest.json`` and returns a summary dict (documents, instances, tokens,
skipped documents and why, throughput).

The reader lives in :mod:`bertforge.data.dataset` and is re-exported here:
:class:`PretrainingDataset`, :func:`read_meta`, :data:`TOKENIZER_DIR`, :data:`FORMAT_VERSION`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from tqdm import tqdm

from bertforge.data.corpus import (
    Document,
    EncodingErrors,
    Format,
    expand_inputs,
    iter_documents,
)
from bertforge.data.dataset import (
    FORMAT_VERSION,
    META_FILE,
    SPLITS,
    TOKENIZER_DIR,
    PretrainingDataset,
    ShardWriter,
    read_meta,
)
from bertforge.data.instances import InstanceBuilder
from bertforge.data.workers import ChunkPool
from bertforge.errors import BertforgeError
from bertforge.io import ReadMeter, atomic_directory, metered_reads, write_manifest
from bertforge.modeling.checkpoint import resolve_model
from bertforge.progress import ReadProgress, format_duration, time_left
from bertforge.tokenizer.wordpiece import Tokenizer

__all__ = [
    "FORMAT_VERSION",
    "MODES",
    "META_FILE",
    "Mode",
    "PrepareConfig",
    "TOKENIZER_DIR",
    "PretrainingDataset",
    "ShardWriter",
    "format_summary",
    "prepare",
    "read_meta",
]

Mode = Literal["nsp", "packed"]
"""nsp: sentence pairs with next-sentence labels; packed: full sequences, MLM only."""
MODES: tuple[str, ...] = get_args(Mode)


SMALL_VALIDATION = 5
"""Fewer validation documents than this make prepare warn (packed mode) and suggest a fraction."""


def _warnings(
    builders: dict[str, InstanceBuilder],
    writers: dict[str, ShardWriter],
    validating: bool,
) -> list[str]:
    out = []
    if validating and writers["validation"].instances == 0:
        out.append(
            "no validation instances: the corpus has too few documents for "
            "--validation_fraction; raise it or pass --validation FILE"
        )
    val_docs = builders["validation"].documents
    all_docs = val_docs + builders["train"].documents
    if validating and builders["validation"].mode == "packed" and 0 < val_docs < SMALL_VALIDATION:
        fraction = math.ceil(100 * SMALL_VALIDATION / all_docs) / 100
        out.append(
            f"the validation split holds {val_docs} document{'s' * (val_docs != 1)} of "
            f"{all_docs}, too few for a steady validation loss; use --validation_fraction "
            f"{fraction:g} (about {SMALL_VALIDATION} documents) or --validation FILE"
        )
    for split, builder in builders.items():
        if builder.mode == "nsp" and builder.documents == 1:
            out.append(
                f"the {split} split has a single document, so it has no NotNext pairs; "
                "add documents"
            )
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """A few human-readable lines about a finished :func:`prepare`."""
    skipped = summary["skipped_documents"]
    why = ", ".join(f"{n:,} {reason}" for reason, n in skipped.items()) or "none"
    lines = [
        f"wrote {summary['output']} ({summary['mode']}, max_seq_length {summary['max_seq_length']})",
        f"documents: {summary['documents']:,} read, train {summary['documents_used']['train']:,}, "
        f"validation {summary['documents_used']['validation']:,}; skipped: {why}",
        f"instances: train {summary['instances']['train']:,}, validation "
        f"{summary['instances']['validation']:,}; tokens: train {summary['tokens']['train']:,}, "
        f"validation {summary['tokens']['validation']:,}",
        f"sentences {summary['sentences']:,} ({summary['long_sentences_split']:,} too long, split); "
        f"{summary['text_tokens']:,} text tokens in {summary['seconds']:.1f} s "
        f"({summary['tokens_per_second']:,} tokens/s)",
        f"workers {summary['workers']}: tokenising {summary['tokenize_seconds']:.1f} s"
        + (" (summed over workers)" if summary["workers"] > 1 else "")
        + f", main process waiting for workers {summary['waited_seconds']:.1f} s",
    ]
    if summary["not_next_fraction"] is not None:
        lines.append(f"NotNext share (train): {summary['not_next_fraction']:.3f}")
    lines += [f"warning: {w}" for w in summary["warnings"]]
    return "\n".join(lines)


def _is_validation(doc_index: int, fraction: float) -> bool:
    """Spread ``fraction`` of the documents evenly and deterministically over the corpus."""
    return int((doc_index + 1) * fraction + 0.5) > int(doc_index * fraction + 0.5)


def _document_key(doc: Document) -> bytes:
    return hashlib.blake2b(" ".join(doc).encode("utf-8"), digest_size=12).digest()


def _tagged_documents(
    inputs,
    validation_inputs,
    fraction,
    read,
    excluded: set[bytes],
    stats: dict[str, Any],
    held_out: frozenset[bytes] = frozenset(),
) -> Iterator[tuple[str, Document]]:
    """(split, document) pairs; documents whose text is in ``excluded``, and training documents
    whose text is in ``held_out`` (the ``--validation`` files' documents), are skipped and
    counted."""
    tagged = (
        ("validation" if fraction > 0 and _is_validation(i, fraction) else "train", doc)
        for i, doc in enumerate(iter_documents(inputs, **read))
    )
    if validation_inputs:
        tagged = itertools.chain(
            tagged, (("validation", doc) for doc in iter_documents(validation_inputs, **read))
        )
    skipped = stats.setdefault("skipped", {})
    for split, doc in tagged:
        if excluded and _document_key(doc) in excluded:
            skipped["text in --exclude"] = skipped.get("text in --exclude", 0) + 1
            continue
        if held_out and split == "train" and _document_key(doc) in held_out:
            skipped["text in --validation"] = skipped.get("text in --validation", 0) + 1
            continue
        yield split, doc


@contextlib.contextmanager
def _held(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` for the block: marks a temporary directory as being
    written by a live ``prepare`` (the kernel drops the lock when the process dies)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_killed_temporaries(output: Path) -> list[Path]:
    """Delete the hidden ``.NAME.tmp-*`` directories that killed ``prepare`` runs into ``output``
    left beside it (:func:`bertforge.io.atomic_directory`'s temporaries); one whose ``flock`` is
    held belongs to a ``prepare`` still running and is kept. Returns the deleted paths."""
    removed = []
    for debris in sorted(output.parent.glob(f".{glob.escape(output.name)}.tmp-*")):
        try:
            fd = os.open(debris, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # gone meanwhile, or not a directory
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # another prepare is writing it
        else:
            shutil.rmtree(debris, ignore_errors=True)
            removed.append(debris)
        finally:
            os.close(fd)
    return removed


@dataclass
class PrepareConfig:
    """Options of ``bertforge prepare`` (:func:`~bertforge.data.shards.prepare` checks them)."""

    input: list[str]
    """Text files, directories or globs (txt, WikiText, csv/tsv/jsonl, Parquet, each text file
    optionally .gz/.bz2/.xz/.zst) or datasets save_to_disk folders."""
    tokenizer: str
    """Tokenizer directory or file (from bertforge tokenizer train), or a model directory or a
    published model's name (all-MiniLM-L6-v2) whose tokenizer to use."""
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
    """Files holding the validation documents (instead of a fraction); an input document with
    the same text is left out of training (held out, not seen twice)."""
    exclude: list[str] | None = None
    """Drop documents whose text equals one in these files (e.g. an evaluation set)."""
    text_column: str | None = None
    """Column or key of csv/tsv/jsonl inputs, string column of Parquet/datasets inputs."""
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

    def __post_init__(self) -> None:
        # a model's name (--tokenizer all-MiniLM-L6-v2) means its tokenizer, as --model does
        self.tokenizer = resolve_model(self.tokenizer)


def prepare(
    cfg: PrepareConfig,
    tokenizer: Tokenizer | None = None,
    *,
    chunk_chars: int = 1_000_000,
    shard_tokens: int = 1 << 26,
) -> dict[str, Any]:
    """Turn ``cfg.input`` into a prepared data directory at ``cfg.output``; return a summary dict.

    ``tokenizer`` is one already loaded (e.g. trained in memory); None reads ``cfg.tokenizer``.
    With ``cfg.validation`` every document of those files is validation data and
    ``cfg.validation_fraction`` is ignored; otherwise that fraction of the documents (spread
    evenly) is held out. Documents whose text equals a document of ``cfg.exclude`` (read the same
    way, e.g. IMDB's test reviews) are skipped and counted. ``cfg.workers`` > 1 tokenises in that
    many processes (:mod:`bertforge.data.workers`); the output is byte-identical to one worker's.
    ``chunk_chars`` (characters tokenised at once) and ``shard_tokens`` (tokens per shard file)
    are tuning knobs, not options of the command. See the module docstring.
    """
    output = _check(cfg)
    tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_file(cfg.tokenizer)
    for debris in remove_killed_temporaries(output):
        print(f"prepare: removed {debris}, left by a killed run", file=sys.stderr)
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
    read = {
        "format": cfg.format,
        "text_column": cfg.text_column,
        "encoding_errors": cfg.encoding_errors,
    }
    fraction = 0.0 if cfg.validation else cfg.validation_fraction
    stats: dict[str, Any] = {}
    # documents to keep out of the data, e.g. an evaluation set's texts
    excluded = (
        {_document_key(d) for d in iter_documents(cfg.exclude, **read)} if cfg.exclude else set()
    )
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        pool = None
        if cfg.workers > 1:
            pool = stack.enter_context(ChunkPool(tokenizer.backend.to_str(), cfg.workers))
        held = stack.enter_context(contextlib.ExitStack())  # released after the rename below
        tmp = stack.enter_context(atomic_directory(output, replace=cfg.overwrite))
        # locked until renamed into place: a later run's clean-up of killed runs leaves it alone
        held.enter_context(_held(tmp))
        writers = {split: ShardWriter(tmp, split, dtype, shard_tokens) for split in SPLITS}
        builders = _builders(cfg, tokenizer, writers, stats, chunk_chars, pool)
        held_out = (
            frozenset(_document_key(d) for d in iter_documents(cfg.validation, **read))
            if cfg.validation
            else frozenset()
        )
        tagged = _tagged_documents(
            cfg.input, cfg.validation, fraction, read, excluded, stats, held_out
        )
        inputs = expand_inputs([*cfg.input, *(cfg.validation or [])])
        with metered_reads(inputs) as meter:
            n_docs, n_sentences = _feed(tagged, builders, stats, start, cfg.progress, meter)
        for split in SPLITS:
            builders[split].finish()
            writers[split].close()
        seconds = time.perf_counter() - start
        _check_output(cfg, n_docs, writers["train"], stats)
        counts = _Counts(n_docs, n_sentences, builders, writers, stats, seconds, pool)
        summary = _summary(cfg, output, counts, bool(fraction > 0 or cfg.validation))
        meta = _meta(cfg, tokenizer, dtype, fraction, chunk_chars, writers, summary)
        tokenizer.save(tmp / TOKENIZER_DIR)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        write_manifest(tmp)  # sizes checked at every open, hashes by bertforge verify
    return summary


def _check(cfg: PrepareConfig) -> Path:
    """Raise on options out of range or an output that may not be written; the output path."""
    if cfg.workers < 1:
        raise BertforgeError(f"--workers {cfg.workers}: must be at least 1")
    if cfg.mode not in MODES:
        raise BertforgeError(f"--mode {cfg.mode!r}: choose nsp or packed")
    if not 8 <= cfg.max_seq_length <= 1 << 16:
        raise BertforgeError(f"--max_seq_length {cfg.max_seq_length}: must be between 8 and 65536")
    if not 0 <= cfg.short_seq_prob <= 1 or not 0 <= cfg.validation_fraction < 1:
        raise BertforgeError(
            "--short_seq_prob must be in [0, 1] and --validation_fraction in [0, 1)"
        )
    output = Path(cfg.output)
    if output.exists() and not cfg.overwrite:
        raise BertforgeError(
            f"{output}: already exists; choose another --output or pass --overwrite"
        )
    if output.exists() and not output.is_dir():
        raise BertforgeError(f"{output}: is a file, not a data directory; choose another --output")
    if output.exists() and any(output.iterdir()) and not (output / META_FILE).is_file():
        raise BertforgeError(
            f"{output}: exists and is not a prepared data set; refusing to replace it"
        )
    return output


def _builders(
    cfg: PrepareConfig,
    tokenizer: Tokenizer,
    writers: dict[str, ShardWriter],
    stats: dict[str, Any],
    chunk_chars: int,
    pool: ChunkPool | None,
) -> dict[str, InstanceBuilder]:
    """One instance builder per split, each flushing to its split's shard writer."""
    return {
        split: InstanceBuilder(
            tokenizer,
            lambda instances, w=writers[split]: w.write(
                instances, tokenizer.cls_id, tokenizer.sep_id
            ),
            cfg.mode,
            cfg.max_seq_length,
            cfg.short_seq_prob,
            np.random.default_rng([cfg.seed, code]),
            stats,
            chunk_chars,
            pool,
        )
        for code, split in enumerate(SPLITS)
    }


def _feed(
    tagged: Iterator[tuple[str, Document]],
    builders: dict[str, InstanceBuilder],
    stats: dict[str, Any],
    start: float,
    progress: bool,
    meter: ReadMeter,
) -> tuple[int, int]:
    """Give each (split, document) to its split's builder, with a progress bar (on a terminal)
    or a line every :data:`PROGRESS_STEP` of the input bytes read (a log file, a recipe); the
    numbers of documents and sentences read."""
    n_docs = n_sentences = 0
    lines = progress and not sys.stderr.isatty()
    report = ReadProgress(meter, start, PROGRESS_STEP, PROGRESS_AFTER)
    # delay: no bar for a run that fails or ends at once (no "prepare: 0 docs" before an error);
    # none when stderr is a log file (its carriage returns would fill it), as item_bar
    bar = tqdm(
        desc="prepare",
        unit=" docs",
        disable=not (progress and sys.stderr.isatty()),
        mininterval=1.0,
        delay=1.0,
    )
    try:
        for split, doc in tagged:
            n_docs += 1
            n_sentences += len(doc)
            builders[split].add(doc)
            bar.update(1)
            if n_docs % 200 == 0:
                rate = stats["text_tokens"] / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix_str(f"{stats['text_tokens']:,} tokens, {rate:,.0f} tokens/s")
            if lines and (due := report.due()):
                print(progress_line(*due, stats["text_tokens"]), file=sys.stderr, flush=True)
    finally:
        bar.close()  # ends the bar's line, so an error message starts on its own
    return n_docs, n_sentences


PROGRESS_STEP = 0.05
"""How much more of the input (by bytes on disk) each progress line of a log file reports."""
PROGRESS_AFTER = 10.0
"""Seconds before the first progress line (a short prepare prints none)."""


def progress_line(step: float, done: float, seconds: float, tokens: int) -> str:
    """``prepare: 35% of the input read, 12,345,678 tokens, 6m40s, about 12m23s left`` when the
    share ``done`` has crossed ``step`` (a multiple of :data:`PROGRESS_STEP`): the time left
    extrapolated from the share read so far."""
    return (
        f"prepare: {step:.0%} of the input read, {tokens:,} tokens, "
        f"{format_duration(seconds)}{time_left(done, seconds)}"
    )


def _check_output(
    cfg: PrepareConfig, n_docs: int, train: ShardWriter, stats: dict[str, Any]
) -> None:
    """Raise when the inputs held no text or gave no training instance."""
    if n_docs == 0:
        raise BertforgeError(f"{', '.join(map(str, cfg.input))}: no text found; the input is empty")
    if train.instances == 0:
        raise BertforgeError(
            f"no training instances from {n_docs} documents (skipped: {stats['skipped']}); "
            "give more text, or use --mode packed for corpora of one-sentence documents"
        )


@dataclass
class _Counts:
    """What a finished pass over the documents counted."""

    documents: int
    sentences: int
    builders: dict[str, InstanceBuilder]
    writers: dict[str, ShardWriter]
    stats: dict[str, Any]
    seconds: float
    pool: ChunkPool | None


def _summary(cfg: PrepareConfig, output: Path, counts: _Counts, validating: bool) -> dict[str, Any]:
    """The summary dict :func:`prepare` returns (and records in meta.json's ``counts``)."""
    builders, writers, stats, seconds = (
        counts.builders,
        counts.writers,
        counts.stats,
        counts.seconds,
    )
    train = writers["train"]
    return {
        "output": str(output),
        "mode": cfg.mode,
        "max_seq_length": cfg.max_seq_length,
        "documents": counts.documents,
        "sentences": counts.sentences,
        "documents_used": {s: b.documents for s, b in builders.items()},
        "skipped_documents": stats["skipped"],
        "long_sentences_split": stats["long_sentences_split"],
        "text_tokens": stats["text_tokens"],
        "instances": {s: w.instances for s, w in writers.items()},
        "tokens": {s: w.tokens for s, w in writers.items()},
        "not_next_fraction": train.not_next / train.instances if cfg.mode == "nsp" else None,
        "nsp_chunks_without_negative": stats["nsp_chunks_without_negative"],
        "warnings": _warnings(builders, writers, validating),
        "seconds": round(seconds, 3),
        "workers": cfg.workers,
        # where the time went: tokenising (summed over workers) and, with workers, the main
        # process's idle wait for them (what the --workers cost model in docs/pretraining.md uses)
        "tokenize_seconds": round(stats["tokenize_seconds"], 3),
        "waited_seconds": round(counts.pool.waited, 3) if counts.pool is not None else 0.0,
        "tokens_per_second": round(stats["text_tokens"] / max(seconds, 1e-9)),
    }


def _meta(
    cfg: PrepareConfig,
    tokenizer: Tokenizer,
    dtype: np.dtype,
    fraction: float,
    chunk_chars: int,
    writers: dict[str, ShardWriter],
    summary: dict[str, Any],
) -> dict[str, Any]:
    """The data directory's meta.json: format, tokenizer, the settings that made it, splits."""
    return {
        "format_version": FORMAT_VERSION,
        "mode": cfg.mode,
        "max_seq_length": cfg.max_seq_length,
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype.name,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "special_ids": {
            "pad": tokenizer.pad_id,
            "unk": tokenizer.unk_id,
            "cls": tokenizer.cls_id,
            "sep": tokenizer.sep_id,
            "mask": tokenizer.mask_id,
        },
        "settings": {
            "inputs": [str(i) for i in cfg.input],
            "validation_inputs": [str(i) for i in cfg.validation or []],
            "exclude_inputs": [str(i) for i in cfg.exclude or []],
            "validation_fraction": fraction,
            "short_seq_prob": cfg.short_seq_prob,
            "seed": cfg.seed,
            "text_column": cfg.text_column,
            "format": cfg.format,
            "encoding_errors": cfg.encoding_errors,
            "chunk_chars": chunk_chars,
        },
        "splits": {
            s: {"instances": w.instances, "tokens": w.tokens, "shards": w.shards}
            for s, w in writers.items()
        },
        "counts": summary,
    }
