"""Inference with a loaded model: ``fill_mask``, ``classify`` and ``embed``. Their commands
(``bertforge fill-mask``, ``classify``, ``embed``) are in ``bertforge.cli.predict``.

The functions take a model already in memory (a server loads it once), run in batches under
``torch.inference_mode``, sort each call's texts by length so a batch pads little, and return
results in input order. ``classify`` and ``embed`` also take an exported ONNX model
(:class:`bertforge.inference.onnx.OnnxModel`, the ``--backend onnx`` of their commands) in place
of the PyTorch one: same batching, ONNX Runtime runs the batches (anything that is not an
``nn.Module`` is taken for such a model: its ``config``, ``sequence_logits`` and ``hidden_states``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.data.tasks import batch_order, encode_examples, iterate_batches
from bertforge.errors import BertforgeError
from bertforge.runtime import autocast


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[torch.device]:
    """``model`` in eval mode for the block (its training flag restored after); yields its device."""
    was_training = model.training
    model.eval()
    try:
        yield next(model.parameters()).device
    finally:
        model.train(was_training)


def _batches(
    encoded: Sequence[tuple[np.ndarray, int]], pad_id: int, batch_size: int, device: torch.device
) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """``(indices, padded batch on device)``, longest examples first so a batch pads little."""
    order = batch_order(
        [len(ids) for ids, _ in encoded], batch_size, seed=0, epoch=0, shuffle=False
    )
    for index, batch in iterate_batches(encoded, order, pad_id):
        yield index, {k: v.to(device) for k, v in batch.items()}


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
    """(N, num_labels) float32 logits of a sequence-classification model (or of an exported
    :class:`~bertforge.inference.onnx.OnnxModel`), in input order."""
    out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    if not isinstance(model, nn.Module):  # an OnnxModel: ONNX Runtime runs the batches
        for index, batch in _batches(encoded, pad_id, batch_size, torch.device("cpu")):
            out[index] = model.sequence_logits({k: v.numpy() for k, v in batch.items()})
        return out
    with _evaluating(model) as device:
        for index, batch in _batches(encoded, pad_id, batch_size, device):
            with autocast(device, precision):
                logits = model(**batch).logits  # (B, num_labels)
            out[index] = logits.float().cpu().numpy()
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
    """Classify texts (or text pairs) with a ``BertForSequenceClassification`` (or its ONNX
    export, an :class:`~bertforge.inference.onnx.OnnxModel`).

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
    results: list[dict[str, Any]] = [{} for _ in texts]
    with _evaluating(model) as device:
        for index, batch in _batches(encoded, tokenizer.pad_id, batch_size, device):
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
    for b, (ids, _) in enumerate(encoded):
        filled = ids.copy()
        filled[filled == tokenizer.mask_id] = [m[0]["id"] for m in results[b]["masks"]]
        results[b] = {"text": texts[b], "filled": tokenizer.decode(filled), **results[b]}
    return results


def fill_mask_side_by_side(columns: dict[str, list[dict[str, Any]]], width: int = 26) -> str:
    """A plain-text table of several models' :func:`fill_mask` results for the same texts: per
    text and per ``[MASK]``, one row per rank with each model's token and probability side by
    side (``columns`` maps a model's name to its results, in the same text order)."""
    names = list(columns)
    results = list(columns.values())
    if len({len(r) for r in results}) > 1:
        raise BertforgeError("fill_mask_side_by_side: every model needs results for the same texts")
    lines: list[str] = []
    header = "".join(f"{_clip(n, width):<{width + 2}}" for n in names)
    for t, first in enumerate(results[0]):
        lines.append(first["text"])
        for m, top in enumerate(first["masks"]):
            label = f"[MASK] {m + 1}" if len(first["masks"]) > 1 else "[MASK]"
            lines.append(f"  {label:<9}{header.rstrip()}")
            for rank in range(len(top)):
                cells = []
                for r in results:
                    guesses = r[t]["masks"][m]
                    if rank < len(guesses):
                        g = guesses[rank]
                        cell = f"{_clip(g['token'], width - 8)} {g['score']:6.1%}"
                    else:
                        cell = ""
                    cells.append(f"{cell:<{width + 2}}")
                lines.append(f"  {rank + 1:<9}" + "".join(cells).rstrip())
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (its end kept: model paths differ at the end)."""
    return text if len(text) <= width else "..." + text[-(width - 3) :]


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
    """(N, hidden) float32 sentence vectors from any of our BERT models' encoder (or from an
    exported :class:`~bertforge.inference.onnx.OnnxModel` with a ``last_hidden_state`` output).

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
    onnx = not isinstance(model, nn.Module)  # an OnnxModel
    with contextlib.nullcontext(torch.device("cpu")) if onnx else _evaluating(encoder) as device:
        for index, batch in _batches(encoded, tokenizer.pad_id, batch_size, device):
            if onnx:
                numpy_batch = {k: v.numpy() for k, v in batch.items()}
                hidden = torch.from_numpy(model.hidden_states(numpy_batch))  # (B, T, H)
            else:
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
    return out


__all__ = [
    "classify",
    "embed",
    "fill_mask",
    "fill_mask_side_by_side",
    "sequence_logits",
]
