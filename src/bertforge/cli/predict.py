"""``bertforge fill-mask``, ``classify`` and ``embed``: texts from the command line or a file
through the inference functions of ``bertforge.inference.predict``; one JSON object per text (or a .npy
matrix for ``embed``)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import Any

import numpy as np

from bertforge.cli.common import (
    add_runtime_options,
    add_task_options,
    finetune_defaults,
    load_model,
)
from bertforge.data.tables import read_texts
from bertforge.errors import ArgumentParser, BertforgeError
from bertforge.inference.predict import classify, embed, fill_mask, fill_mask_side_by_side
from bertforge.io import atomic_write_bytes, atomic_write_text
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification, BertModel

MLM_HEAD = (
    "cls.predictions.transform",
    "the checkpoint has no masked-language-model head (cls.predictions.*); fill-mask needs a "
    "pretrained MLM model",
)
CLASSIFIER = (
    "classifier.",
    "the checkpoint has no classifier weights; fine-tune it first (bertforge finetune) or point "
    "--model at a fine-tuned model",
)


def _write_lines(records: list[dict[str, Any]], output: str | None) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if output:
        atomic_write_text(output, text)
    else:
        sys.stdout.write(text)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory")
    parser.add_argument("--output", metavar="FILE", help="write here instead of standard output")
    add_runtime_options(parser)


def _inputs(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[list[str], list[str] | None]:
    if bool(args.texts) == bool(args.input):
        raise BertforgeError(
            f"{parser.prog}: give texts as arguments or --input FILE (one of them)"
        )
    if args.input:
        return read_texts(
            args.input, getattr(args, "text_column", None), getattr(args, "text_pair_column", None)
        )
    return list(args.texts), None


def fill_mask_main(argv: list[str]) -> int:
    """``bertforge fill-mask --model DIR "the man went to the [MASK] ." --top-k 5``; with
    ``--compare DIR2`` both models' guesses side by side (a table; JSON lines with --output)."""
    parser = ArgumentParser(
        prog="bertforge fill-mask", description="Predict every [MASK] of each text."
    )
    parser.add_argument(
        "--compare",
        metavar="DIR2",
        help="a second MLM model (e.g. the run's starting point): print both top-k side by side",
    )
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts with [MASK] tokens")
    parser.add_argument(
        "--input", metavar="FILE", help="one text per line (or --text-column of a table)"
    )
    parser.add_argument(
        "--text-column", metavar="C", help="column of a CSV/TSV/JSONL input (default text)"
    )
    parser.add_argument("--top-k", type=int, default=5, metavar="K")
    _common(parser)
    args = parser.parse_args(argv)
    texts, _ = _inputs(args, parser)

    model, tokenizer, options = load_model(BertForMaskedLM, args, require=MLM_HEAD)
    results = fill_mask(model, tokenizer, texts, args.top_k, **options)
    if not args.compare:
        _write_lines(results, args.output)
        return 0
    del model
    other = argparse.Namespace(**{**vars(args), "model": args.compare})
    model, tokenizer, options = load_model(BertForMaskedLM, other, require=MLM_HEAD)
    compared = fill_mask(model, tokenizer, texts, args.top_k, **options)
    if args.output:
        _write_lines(
            [
                {"text": a["text"], "models": {args.model: a, args.compare: b}}
                for a, b in zip(results, compared, strict=True)
            ],
            args.output,
        )
    else:
        sys.stdout.write(fill_mask_side_by_side({args.model: results, args.compare: compared}))
    return 0


def classify_main(argv: list[str]) -> int:
    """``bertforge classify --model DIR TEXT...`` or ``--input FILE [--text-column C]``."""
    parser = ArgumentParser(
        prog="bertforge classify", description="Classify texts; one JSON object per text, in order."
    )
    parser.add_argument("texts", nargs="*", metavar="TEXT")
    parser.add_argument(
        "--input", metavar="FILE", help="one text per line, or a CSV/TSV/JSONL file"
    )
    add_task_options(parser)
    _common(parser)
    args = parser.parse_args(argv)
    defaults = finetune_defaults(args.model)
    args.text_column = args.text_column or defaults.get("text_column")
    if args.input and args.text_pair_column is None:
        args.text_pair_column = defaults.get("text_pair_column")
    texts, pairs = _inputs(args, parser)

    model, tokenizer, options = load_model(BertForSequenceClassification, args, require=CLASSIFIER)
    max_length = args.max_length or defaults.get("max_length")
    truncation = args.truncation or defaults.get("truncation", "head")
    results = classify(
        model, tokenizer, texts, pairs, max_length=max_length, truncation=truncation, **options
    )
    _write_lines(results, args.output)
    return 0


def embed_main(argv: list[str]) -> int:
    """``bertforge embed --model DIR --input FILE --output FILE.npy --pooling cls|mean``."""
    parser = ArgumentParser(
        prog="bertforge embed", description="Embed texts into an (N, hidden) float32 .npy matrix."
    )
    parser.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="one text per line, or a CSV/TSV/JSONL file with --text-column",
    )
    parser.add_argument("--text-column", metavar="C", help="column of a table input (default text)")
    parser.add_argument("--pooling", choices=("cls", "mean"), default="cls")
    parser.add_argument("--normalize", action="store_true", help="scale vectors to unit length")
    parser.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help="truncate longer texts (default: model positions)",
    )
    _common(parser)
    args = parser.parse_args(argv)
    if not args.output or not args.output.endswith(".npy"):
        raise BertforgeError("bertforge embed: --output FILE.npy is required (a NumPy file)")
    texts, _ = read_texts(args.input, args.text_column)

    model, tokenizer, options = load_model(BertModel, args)
    vectors = embed(
        model,
        tokenizer,
        texts,
        args.pooling,
        max_length=args.max_length,
        normalize=args.normalize,
        **options,
    )

    buffer = io.BytesIO()
    np.save(buffer, vectors)
    atomic_write_bytes(args.output, buffer.getvalue())
    print(
        f"wrote {args.output}: {vectors.shape[0]} x {vectors.shape[1]} float32 ({args.pooling} pooling)",
        file=sys.stderr,
    )
    return 0
