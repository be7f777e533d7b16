"""``bertforge tokenizer train``: train a WordPiece vocabulary on text files and save it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bertforge.errors import ArgumentParser
from bertforge.tokenizer.wordpiece import Tokenizer, TrainOptions


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="bertforge tokenizer", description="WordPiece tokenizers.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a WordPiece vocabulary on text files")
    train.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="FILE",
        help="UTF-8 text files (.gz is read transparently)",
    )
    train.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        metavar="N",
        help="vocabulary size including the 5 special tokens (BERT: 30522)",
    )
    train.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="directory for vocab.txt, tokenizer.json, tokenizer_config.json",
    )
    train.add_argument(
        "--min-frequency",
        type=int,
        default=2,
        metavar="N",
        help="minimum count of a merged WordPiece (default 2)",
    )
    train.add_argument(
        "--no-lowercase",
        dest="lowercase",
        action="store_false",
        help="keep case (a cased vocabulary)",
    )
    train.add_argument(
        "--strip-accents",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="strip accents (default: exactly when lowercasing, as BERT)",
    )
    train.add_argument(
        "--limit-alphabet",
        type=int,
        default=1000,
        metavar="N",
        help="at most N single characters in the vocabulary (default 1000)",
    )
    train.add_argument(
        "--model-max-length",
        type=int,
        default=None,
        metavar="N",
        help="record the longest sequence the model will take (e.g. 512)",
    )
    train.add_argument(
        "--progress",
        dest="show_progress",
        action="store_true",
        help="show the trainer's progress bars",
    )
    return parser


def main(argv: list[str]) -> int:
    """``bertforge tokenizer train --input FILE... --vocab-size N --output DIR``."""
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    # every TrainOptions key is an option of this command, under the same name
    options = {name: getattr(args, name) for name in TrainOptions.__annotations__}
    tok = Tokenizer.train(args.input, args.vocab_size, **options)
    tok.save(args.output)
    size_mb = sum(Path(f).stat().st_size for f in args.input) / 1e6
    case = "lowercased" if args.lowercase else "cased"
    print(
        f"trained a {case} WordPiece vocabulary of {tok.vocab_size} tokens on {len(args.input)} "
        f"file(s) ({size_mb:.1f} MB on disk) in {time.perf_counter() - start:.1f} s -> {args.output} "
        f"(fingerprint {tok.fingerprint})"
    )
    return 0
