"""Inference with a loaded model: ``fill_mask``, ``classify`` and ``embed``, plus their commands
(``bertforge fill-mask``, ``classify``, ``embed``).

The functions take a model already in memory (a server loads it once), run in batches under
``torch.inference_mode``, sort each call's texts by length so a batch pads little, and return
results in input order.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.data.tasks import (
    batch_order,
    clean_text,
    collate,
    encode_examples,
    read_columns,
    table_format,
)
from bertforge.errors import BertforgeError
from bertforge.runtime import autocast, pick_device, pick_precision

FINETUNE_CONFIG = "finetune_config.json"
"""Written by ``bertforge finetune`` next to the model: its data columns and truncation."""


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise BertforgeError("pass a list of texts, not a single string (wrap it: [text])")
    return list(texts)


@torch.inference_mode()
def sequence_logits(
    model: nn.Module,
    encoded: Sequence[tuple[np.ndarray, int]],
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
) -> np.ndarray:
    """(N, num_labels) float32 logits of a sequence-classification model, in input order."""
    was_training = model.training
    model.eval()
    device = _device(model)
    out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    try:
        lengths = [len(ids) for ids, _ in encoded]
        for index in batch_order(lengths, batch_size, seed=0, epoch=0, shuffle=False):
            batch = {
                k: v.to(device) for k, v in collate([encoded[i] for i in index], pad_id).items()
            }
            with autocast(device, precision):
                logits = model(**batch).logits  # (B, num_labels)
            out[index] = logits.float().cpu().numpy()
    finally:
        model.train(was_training)
    return out


def _max_length(model: nn.Module, max_length: int | None) -> int:
    limit = model.config.max_position_embeddings
    if max_length is None:
        return limit
    if max_length > limit:
        raise BertforgeError(
            f"max_length={max_length} exceeds the model's max_position_embeddings={limit}; lower it"
        )
    return max_length


def classify(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    truncation: str = "head",
    precision: str = "fp32",
) -> list[dict[str, Any]]:
    """Classify texts (or text pairs) with a ``BertForSequenceClassification``.

    Returns one dict per text, in order: ``{"label": top label, "scores": {label: probability}}``
    for classification, ``{"value": prediction}`` for a regression model. Texts longer than
    ``max_length`` (default: the model's positions) are truncated as ``truncation`` says.
    """
    texts = _check_texts(texts)
    if not texts:
        return []
    encoded = encode_examples(
        tokenizer, texts, pairs, max_length=_max_length(model, max_length), truncation=truncation
    )
    logits = sequence_logits(
        model, encoded, tokenizer.pad_id, batch_size=batch_size, precision=precision
    )
    config = model.config
    if config.is_regression:
        return [{"value": float(v)} for v in logits[:, 0]]
    id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    probs = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
    names = [id2label[i] for i in range(config.num_labels)]
    return [
        {
            "label": names[int(p.argmax())],
            "scores": {n: float(s) for n, s in zip(names, p, strict=True)},
        }
        for p in probs
    ]


@torch.inference_mode()
def fill_mask(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    top_k: int = 5,
    *,
    batch_size: int = 32,
    precision: str = "fp32",
) -> list[dict[str, Any]]:
    """Top-k predictions for every ``[MASK]`` of every text (a ``BertForMaskedLM`` or
    ``BertForPreTraining``).

    Returns per text ``{"text", "filled" (each [MASK] replaced by its top token), "masks": [[{"token",
    "id", "score"}, ... top_k], ... one list per [MASK]]}``. A text without ``[MASK]`` or longer
    than the model's positions is an error naming it.
    """
    texts = _check_texts(texts)
    if top_k < 1:
        raise BertforgeError(f"top_k={top_k} must be at least 1")
    limit = model.config.max_position_embeddings
    encoded = encode_examples(tokenizer, texts, max_length=10**9)
    for i, (ids, _) in enumerate(encoded):
        if not (ids == tokenizer.mask_id).any():
            raise BertforgeError(
                f"text {i + 1} has no [MASK] token: {texts[i][:80]!r}; write [MASK] "
                "where a word should be predicted"
            )
        if len(ids) > limit:
            raise BertforgeError(
                f"text {i + 1} is {len(ids)} tokens long, more than the model's "
                f"{limit} positions; shorten it"
            )
    was_training = model.training
    model.eval()
    device = _device(model)
    results: list[dict[str, Any]] = [{} for _ in texts]
    try:
        order = batch_order(
            [len(ids) for ids, _ in encoded], batch_size, seed=0, epoch=0, shuffle=False
        )
        for index in order:
            batch = {
                k: v.to(device)
                for k, v in collate([encoded[i] for i in index], tokenizer.pad_id).items()
            }
            masked = batch["input_ids"] == tokenizer.mask_id  # (B, T)
            # labels only select the rows the head scores (sparse prediction), their values are unused
            labels = torch.where(masked, 0, -100)
            with autocast(device, precision):
                out = model(**batch, labels=labels)
            logits = getattr(out, "prediction_logits", None)
            logits = out.logits if logits is None else logits  # (n_masked, V), row-major order
            probs = torch.softmax(logits.float(), dim=-1)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # (n_masked, k)
            row_of = masked.nonzero()[:, 0].tolist()  # batch row of each masked position
            for b in index:
                results[b]["masks"] = []
            for m, row in enumerate(row_of):
                b = int(index[row])
                results[b]["masks"].append(
                    [
                        {"token": tokenizer.id_to_token(int(t)), "id": int(t), "score": float(s)}
                        for s, t in zip(
                            top.values[m].tolist(), top.indices[m].tolist(), strict=True
                        )
                    ]
                )
    finally:
        model.train(was_training)
    for b, (ids, _) in enumerate(encoded):
        filled = ids.copy()
        filled[filled == tokenizer.mask_id] = [m[0]["id"] for m in results[b]["masks"]]
        results[b] = {"text": texts[b], "filled": tokenizer.decode(filled), **results[b]}
    return results


@torch.inference_mode()
def embed(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    pooling: str = "cls",
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    normalize: bool = False,
    precision: str = "fp32",
) -> np.ndarray:
    """(N, hidden) float32 sentence vectors from any of our BERT models' encoder.

    ``pooling="cls"`` takes the last hidden state of ``[CLS]``; ``"mean"`` averages the last
    hidden states of the real (non-padding) tokens, as sentence-transformers models such as
    all-MiniLM-L6-v2 do. ``normalize`` scales each vector to unit length.
    """
    texts = _check_texts(texts)
    if pooling not in ("cls", "mean"):
        raise BertforgeError(f"pooling={pooling!r} is unknown; choose cls or mean")
    encoder = getattr(model, "bert", model)
    hidden_size = encoder.config.hidden_size
    out = np.zeros((len(texts), hidden_size), dtype=np.float32)
    if not texts:
        return out
    encoded = encode_examples(tokenizer, texts, max_length=_max_length(encoder, max_length))
    was_training = encoder.training
    encoder.eval()
    device = _device(encoder)
    try:
        for index in batch_order(
            [len(i) for i, _ in encoded], batch_size, seed=0, epoch=0, shuffle=False
        ):
            batch = {
                k: v.to(device)
                for k, v in collate([encoded[i] for i in index], tokenizer.pad_id).items()
            }
            with autocast(device, precision):
                hidden = encoder(**batch).last_hidden_state.float()  # (B, T, H)
            if pooling == "cls":
                vectors = hidden[:, 0]  # (B, H)
            else:
                mask = batch["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
                vectors = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, H)
            if normalize:
                vectors = torch.nn.functional.normalize(vectors, dim=-1)
            out[index] = vectors.cpu().numpy()
    finally:
        encoder.train(was_training)
    return out


# ---- commands -------------------------------------------------------------------------------


def read_texts(
    path: str | Path, text_column: str | None = None, text_pair_column: str | None = None
) -> tuple[list[str], list[str] | None]:
    """Texts of an input file: a column of a CSV/TSV/JSONL file, or the non-empty lines of any
    other (plain-text) file."""
    path = Path(path)
    try:
        table_format(path)
        is_table = True
    except BertforgeError:
        is_table = False
    if not is_table:
        if text_pair_column:
            raise BertforgeError(f"{path}: --text-pair-column needs a .csv, .tsv or .jsonl file")
        import gzip

        if not path.is_file():
            raise BertforgeError(f"{path}: no such file")
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            texts = [clean_text(line.rstrip("\n")) for line in f if line.strip()]
        if not texts:
            raise BertforgeError(f"{path}: the file is empty (no non-blank line)")
        return texts, None
    texts, pairs = read_columns(path, [text_column or "text", text_pair_column])
    return [clean_text(t) for t in texts], [
        clean_text(t) for t in pairs
    ] if text_pair_column else None


def _common(parser: argparse.ArgumentParser, batch_size: int = 32) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory")
    parser.add_argument("--output", metavar="FILE", help="write here instead of standard output")
    parser.add_argument("--batch-size", type=int, default=batch_size, metavar="N")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "bf16", "fp32"),
        help="bf16 autocast where the hardware runs it fast (default auto)",
    )


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


def _load(cls: type, directory: str, device: str) -> tuple[nn.Module, Any, torch.device]:
    from bertforge.tokenizer import Tokenizer

    dev = pick_device(device)
    model = cls.from_pretrained(directory).to(dev)
    return model, Tokenizer.from_file(directory), dev


def _write_lines(records: list[dict[str, Any]], output: str | None) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if output:
        from bertforge.checkpoint import atomic_write_text

        atomic_write_text(output, text)
    else:
        sys.stdout.write(text)


def fill_mask_main(argv: list[str]) -> int:
    """``bertforge fill-mask --model DIR "the man went to the [MASK] ." --top-k 5``."""
    parser = argparse.ArgumentParser(
        prog="bertforge fill-mask", description="Predict every [MASK] of each text."
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
    from bertforge.model import BertForMaskedLM

    model, tokenizer, device = _load(BertForMaskedLM, args.model, args.device)
    missing = [
        k for k in model.loading_info["missing"] if k.startswith("cls.predictions.transform")
    ]
    if missing:
        raise BertforgeError(
            f"{args.model}: the checkpoint has no masked-language-model head "
            "(cls.predictions.*); fill-mask needs a pretrained MLM model"
        )
    results = fill_mask(
        model,
        tokenizer,
        texts,
        args.top_k,
        batch_size=args.batch_size,
        precision=pick_precision(args.precision, device),
    )
    _write_lines(results, args.output)
    return 0


def _finetune_defaults(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / FINETUNE_CONFIG
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def classify_main(argv: list[str]) -> int:
    """``bertforge classify --model DIR TEXT...`` or ``--input FILE [--text-column C]``."""
    parser = argparse.ArgumentParser(
        prog="bertforge classify", description="Classify texts; one JSON object per text, in order."
    )
    parser.add_argument("texts", nargs="*", metavar="TEXT")
    parser.add_argument(
        "--input", metavar="FILE", help="one text per line, or a CSV/TSV/JSONL file"
    )
    parser.add_argument(
        "--text-column", metavar="C", help="text column (default: as in fine-tuning)"
    )
    parser.add_argument(
        "--text-pair-column", metavar="C2", help="second-text column for pair tasks"
    )
    parser.add_argument("--max-length", type=int, metavar="N", help="default: as in fine-tuning")
    parser.add_argument(
        "--truncation", choices=("head", "head_tail"), help="default: as in fine-tuning"
    )
    _common(parser)
    args = parser.parse_args(argv)
    defaults = _finetune_defaults(args.model)
    args.text_column = args.text_column or defaults.get("text_column")
    if args.input and args.text_pair_column is None:
        args.text_pair_column = defaults.get("text_pair_column")
    texts, pairs = _inputs(args, parser)
    from bertforge.model import BertForSequenceClassification

    model, tokenizer, device = _load(BertForSequenceClassification, args.model, args.device)
    if any(k.startswith("classifier.") for k in model.loading_info["missing"]):
        raise BertforgeError(
            f"{args.model}: the checkpoint has no classifier weights; fine-tune it "
            "first (bertforge finetune) or point --model at a fine-tuned model"
        )
    results = classify(
        model,
        tokenizer,
        texts,
        pairs,
        batch_size=args.batch_size,
        max_length=args.max_length or defaults.get("max_length"),
        truncation=args.truncation or defaults.get("truncation", "head"),
        precision=pick_precision(args.precision, device),
    )
    _write_lines(results, args.output)
    return 0


def embed_main(argv: list[str]) -> int:
    """``bertforge embed --model DIR --input FILE --output FILE.npy --pooling cls|mean``."""
    parser = argparse.ArgumentParser(
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
    from bertforge.model import BertModel

    model, tokenizer, device = _load(BertModel, args.model, args.device)
    vectors = embed(
        model,
        tokenizer,
        texts,
        args.pooling,
        batch_size=args.batch_size,
        max_length=args.max_length,
        normalize=args.normalize,
        precision=pick_precision(args.precision, device),
    )
    from bertforge.checkpoint import atomic_write_bytes

    buffer = io.BytesIO()
    np.save(buffer, vectors)
    atomic_write_bytes(args.output, buffer.getvalue())
    print(
        f"wrote {args.output}: {vectors.shape[0]} x {vectors.shape[1]} float32 ({args.pooling} pooling)",
        file=sys.stderr,
    )
    return 0


__all__ = [
    "FINETUNE_CONFIG",
    "classify",
    "classify_main",
    "embed",
    "embed_main",
    "fill_mask",
    "fill_mask_main",
    "read_texts",
    "sequence_logits",
]
