"""``bertforge prepare``: documents -> token shards (``bertforge.data.shards.prepare``)."""

from __future__ import annotations

import argparse

from bertforge.cli.common import positive_int
from bertforge.data.corpus import FORMATS
from bertforge.data.shards import MODES, format_summary, prepare
from bertforge.errors import ArgumentParser
from bertforge.tokenizer.wordpiece import Tokenizer


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="bertforge prepare",
        description="Turn text into token shards for pretraining: NSP pairs or packed sequences.",
    )
    p.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        help="text files, directories or globs (txt, WikiText, csv/tsv/jsonl, .gz)",
    )
    p.add_argument("--tokenizer", required=True, help="tokenizer directory or file")
    p.add_argument("--output", required=True, help="data directory to create")
    p.add_argument("--max-seq-length", type=int, default=128, help="tokens per sequence (128)")
    p.add_argument(
        "--mode",
        choices=MODES,
        default="nsp",
        help="nsp: sentence pairs with NSP labels; packed: full sequences, MLM only",
    )
    p.add_argument(
        "--short-seq-prob", type=float, default=0.1, help="share of shorter NSP targets (0.1)"
    )
    p.add_argument(
        "--validation-fraction", type=float, default=0.01, help="documents held out (0.01)"
    )
    p.add_argument(
        "--validation",
        nargs="+",
        action="extend",
        default=None,
        help="files holding the validation documents (instead of a fraction)",
    )
    p.add_argument(
        "--exclude",
        nargs="+",
        action="extend",
        default=None,
        help="drop documents whose text equals one in these files (e.g. an evaluation set)",
    )
    p.add_argument("--text-column", default=None, help="column or key of csv/tsv/jsonl inputs")
    p.add_argument("--format", choices=FORMATS, default="auto")
    p.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="tokenise in N processes (one per core); same output as 1 (default 1)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing data directory")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    tokenizer = Tokenizer.from_file(args.tokenizer)
    summary = prepare(
        args.input,
        tokenizer,
        args.output,
        max_seq_length=args.max_seq_length,
        mode=args.mode,
        short_seq_prob=args.short_seq_prob,
        validation_fraction=args.validation_fraction,
        validation_inputs=args.validation,
        exclude_inputs=args.exclude,
        text_column=args.text_column,
        format=args.format,
        seed=args.seed,
        encoding_errors=args.encoding_errors,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        workers=args.workers,
    )
    print(format_summary(summary))
    return 0
