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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from bertforge.data.encoding import batch_order, encode_examples, iterate_batches, pad_multiple
from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import finetune_defaults
from bertforge.modeling.pooling import (
    POOLINGS,
    PoolingMode,
    copy_pooling_declaration,
    declared_pooling,
    pool,
    pooling_declaration,
)
from bertforge.progress import item_bar
from bertforge.runtime import autocast
from bertforge.tokenizer.wordpiece import valid_unicode

T = TypeVar("T")


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
    for index, batch in iterate_batches(encoded, order, pad_id, pad_multiple(device)):
        yield index, {k: v.to(device) for k, v in batch.items()}


def head_batches(
    model: Any,
    encoded: Sequence[tuple[np.ndarray, int]],
    pad_id: int,
    onnx: Callable[[dict[str, np.ndarray]], T],
    eager: Callable[[dict[str, torch.Tensor]], T],
    *,
    batch_size: int,
    precision: str,
    progress: bool,
    desc: str,
) -> Iterator[tuple[np.ndarray, T]]:
    """Each padded batch of ``encoded`` (longest first) as its input indices and the head's
    outputs: ``onnx(arrays)`` for an exported :class:`~bertforge.inference.onnx.OnnxModel`, else
    ``eager(tensors)`` under the model's device and ``precision`` (evaluation mode meanwhile);
    a bar labelled ``desc`` when ``progress``. Consume it whole."""
    with item_bar(len(encoded), desc, enabled=progress) as bar:
        if not isinstance(model, nn.Module):
            for index, batch in _batches(encoded, pad_id, batch_size, torch.device("cpu")):
                yield index, onnx({k: v.numpy() for k, v in batch.items()})
                bar.update(len(index))
            return
        with _evaluating(model) as device:
            for index, batch in _batches(encoded, pad_id, batch_size, device):
                with autocast(device, precision):
                    out = eager(batch)
                yield index, out
                bar.update(len(index))


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
    progress: bool = False,
    desc: str = "classify",
) -> np.ndarray:
    """(N, num_labels) float32 logits of a sequence-classification model (or of an exported
    :class:`~bertforge.inference.onnx.OnnxModel`), in input order (``progress``: a bar on a
    terminal's stderr, labelled ``desc``)."""
    out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    for index, logits in head_batches(
        model,
        encoded,
        pad_id,
        lambda arrays: model.sequence_logits(arrays),
        lambda batch: model(**batch, cls_only=True).logits.float().cpu().numpy(),  # (B, C)
        batch_size=batch_size,
        precision=precision,
        progress=progress,
        desc=desc,
    ):
        out[index] = logits
    return out


def saved_settings(model: nn.Module) -> dict[str, Any]:
    """The fine-tuning settings saved beside the model's weights (``finetune_config.json`` in the
    directory it was loaded from, read by :func:`~bertforge.modeling.checkpoint.finetune_defaults`),
    or {} for a model without them."""
    directory = getattr(model, "name_or_path", None)
    return {} if directory is None else finetune_defaults(directory)


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
    truncation: str | None = None,
    precision: str = "fp32",
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Classify texts (or text pairs) with a ``BertForSequenceClassification`` (or its ONNX
    export, an :class:`~bertforge.inference.onnx.OnnxModel`).

    Returns one dict per text, in order: ``{"label": top label, "scores": {label: probability}}``
    for classification, ``{"value": prediction}`` for a regression model. Texts longer than
    ``max_length`` are truncated as ``truncation`` says; both default to what fine-tuning saved
    beside the model (``finetune_config.json``), else to the model's positions and ``head``, so
    Python and ``bertforge classify`` score a text alike. A model fine-tuned on text pairs needs
    ``pairs``.
    """
    texts = _check_texts(texts)
    settings = saved_settings(model)
    pair_column = settings.get("text_pair_column")
    if pair_column and pairs is None:
        first = settings.get("text_column", "text")
        raise BertforgeError(
            f"{model.name_or_path}: the model was fine-tuned on text pairs ({first!r} + "
            f"{pair_column!r}) and needs both texts: pass pairs=[...] in Python, or give "
            "bertforge classify --text_pair SECOND for each text, or --input a .csv, .tsv or "
            f".jsonl file with columns {first!r} and {pair_column!r}"
        )
    if not texts:
        return []
    if max_length is None:
        max_length = settings.get("max_length")
    encoded = encode_examples(
        tokenizer,
        texts,
        pairs,
        max_length=_max_length(model, max_length),
        truncation=truncation or settings.get("truncation", "head"),
    )
    logits = sequence_logits(
        model,
        encoded,
        tokenizer.pad_id,
        batch_size=batch_size,
        precision=precision,
        progress=progress,
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
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Top-k predictions for every ``[MASK]`` of every text (a ``BertForMaskedLM`` or
    ``BertForPreTraining``).

    Returns per text ``{"text", "filled" (the text with each [MASK] replaced by its top token,
    every other character as given), "masks": [[{"token", "id", "score"}, ... top_k], ... one
    list per [MASK]]}``. A text without ``[MASK]`` or longer than the model's positions is an
    error naming it.
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
    bar = item_bar(len(texts), "fill-mask", enabled=progress)
    with _evaluating(model) as device, bar:
        for index, batch in _batches(encoded, tokenizer.pad_id, batch_size, device):
            bar.update(len(index))
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
    # fill the top token into the text's own characters (decoding the ids instead would drop
    # [UNK] words and change case, accents and spacing)
    # (unpaired surrogates become U+FFFD first, as the encoding above did: the same offsets)
    readable = valid_unicode(texts)
    spans = tokenizer.backend.encode_batch(readable, add_special_tokens=False)
    for b, text in enumerate(texts):
        masks = [
            o for i, o in zip(spans[b].ids, spans[b].offsets, strict=True) if i == tokenizer.mask_id
        ]
        filled = readable[b]
        for (start, end), top in reversed(list(zip(masks, results[b]["masks"], strict=True))):
            piece = top[0]["token"].removeprefix("##")
            if not tokenizer.wordpiece:  # a BPE piece's text is its decoding ("Ġthe": " the")
                piece = tokenizer.decode([top[0]["id"]])
            filled = filled[:start] + piece + filled[end:]
        results[b] = {"text": text, "filled": filled, **results[b]}
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


@dataclass
class PoolingChoice:
    """How :func:`embed` turns hidden states into one vector, and where each choice came from."""

    pooling: str
    """One of :data:`POOLINGS`."""
    normalize: bool
    """Scale each vector to unit length."""
    pooling_source: str
    """``given``, ``declared in 1_Pooling/config.json`` or ``the default: ...``."""
    normalize_source: str
    """``given``, ``2_Normalize in modules.json`` or ``the default: ...``."""


def resolve_pooling(
    model: nn.Module, pooling: str | None = None, normalize: bool | None = None
) -> PoolingChoice:
    """The pooling and normalisation :func:`embed` uses: those given, else those the model's
    directory declares (sentence-transformers layout), else ``cls`` without normalising."""
    directory = getattr(model, "name_or_path", None)
    # the directory's files are read only when something is left to what it declares
    need = directory and (pooling is None or normalize is None)
    declared, where, declared_norm = declared_pooling(directory) if need else (None, None, False)
    if pooling is not None:
        chosen, source = pooling, "given"
    elif declared is not None:
        chosen, source = declared, f"declared in {where}"
    else:
        chosen, source = "cls", "the default: the model declares none"
    if chosen not in POOLINGS:
        raise BertforgeError(f"pooling={chosen!r} is unknown; choose one of {', '.join(POOLINGS)}")
    if normalize is not None:
        norm, norm_source = normalize, "given"
    elif declared_norm:
        norm, norm_source = True, "2_Normalize in modules.json"
    else:
        norm, norm_source = False, "the default: the model declares none"
    return PoolingChoice(chosen, norm, source, norm_source)


@torch.inference_mode()
def embed(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    pooling: str | None = None,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    normalize: bool | None = None,
    precision: str = "fp32",
    progress: bool = False,
    truncation: str = "head",
) -> np.ndarray:
    """(N, hidden) float32 sentence vectors from any of our BERT models' encoder (or from an
    exported :class:`~bertforge.inference.onnx.OnnxModel` with a ``last_hidden_state`` output).

    ``pooling="cls"`` takes the last hidden state of ``[CLS]``; ``"mean"`` averages the last
    hidden states of the real (non-padding) tokens (``"max"``, ``"mean_sqrt_len"`` as
    sentence-transformers defines them). ``normalize`` scales each vector to unit length. Both
    default to what the model's directory declares (a sentence-transformers model such as
    all-MiniLM-L6-v2: mean pooling, normalised), else cls without normalising; see
    :func:`resolve_pooling`. A text longer than ``max_length`` keeps its first tokens
    (``truncation="tail"``: its last; :func:`~bertforge.data.encoding.encode_examples`).
    """
    texts = _check_texts(texts)
    encoder = getattr(model, "bert", model)
    limit = _max_length(encoder, max_length)
    encoded = encode_examples(tokenizer, texts, max_length=limit, truncation=truncation)
    return embed_ids(
        model,
        tokenizer,
        [ids for ids, _ in encoded],
        pooling,
        batch_size=batch_size,
        normalize=normalize,
        precision=precision,
        progress=progress,
    )


@torch.inference_mode()
def embed_ids(
    model: nn.Module,
    tokenizer: Any,
    ids: Sequence[Sequence[int]],
    pooling: str | None = None,
    *,
    batch_size: int = 32,
    normalize: bool | None = None,
    precision: str = "fp32",
    progress: bool = False,
) -> np.ndarray:
    """(N, hidden) float32 vectors of texts already tokenized: each ``ids[i]`` the full input,
    ``[CLS] ... [SEP]`` included and within the model's positions (:func:`embed` passes its
    texts through here; the server's token-id inputs come in so)."""
    choice = resolve_pooling(model, pooling, normalize)
    encoder = getattr(model, "bert", model)
    out = np.zeros((len(ids), encoder.config.hidden_size), dtype=np.float32)
    if not len(ids):
        return out
    encoded = [(np.asarray(row, dtype=np.int32), len(row)) for row in ids]
    bar = item_bar(len(ids), "embed", enabled=progress)
    onnx = not isinstance(model, nn.Module)  # an OnnxModel
    running = contextlib.nullcontext(torch.device("cpu")) if onnx else _evaluating(encoder)
    with running as device, bar:
        for index, batch in _batches(encoded, tokenizer.pad_id, batch_size, device):
            bar.update(len(index))
            if onnx:
                numpy_batch = {k: v.numpy() for k, v in batch.items()}
                hidden = torch.from_numpy(model.hidden_states(numpy_batch))  # (B, T, H)
            else:
                with autocast(device, precision):
                    # token-wise ops on the real tokens only; pooling masks the (zero) pads
                    hidden = encoder(**batch, skip_padding=True).last_hidden_state.float()
            vectors = pool(hidden, batch["attention_mask"], choice.pooling)  # (B, H)
            if choice.normalize:
                vectors = torch.nn.functional.normalize(vectors, dim=-1)
            out[index] = vectors.cpu().numpy()
    return out


def trained_dimensions(settings: dict[str, Any], width: int) -> list[int]:
    """The vector sizes a model answers well, largest first: its full ``width``, and the
    Matryoshka cuts ``bertforge finetune --matryoshka_dims`` trained (``matryoshka_dims`` in
    the ``finetune_config.json`` it saved, ``settings`` as :func:`saved_settings` reads it)."""
    cuts = settings.get("matryoshka_dims") or []
    return sorted({width, *(int(k) for k in cuts if 0 < int(k) <= width)}, reverse=True)


def cut_dimensions(vectors: np.ndarray, size: int, normalize: bool) -> np.ndarray:
    """(N, H) vectors -> (N, size), their first ``size`` dimensions (a Matryoshka cut), scaled
    back to unit length when ``normalize`` (a cut of a unit vector is shorter than 1), as
    sentence-transformers' ``encode(truncate_dim=size, normalize_embeddings=True)`` does."""
    cut = np.ascontiguousarray(vectors[:, :size], dtype=np.float32)
    if not normalize:
        return cut
    norms = np.linalg.norm(cut, axis=1, keepdims=True)  # (N, 1)
    return (cut / np.maximum(norms, 1e-12)).astype(np.float32)


__all__ = [
    "POOLINGS",
    "PoolingChoice",
    "PoolingMode",
    "classify",
    "copy_pooling_declaration",
    "cut_dimensions",
    "declared_pooling",
    "embed",
    "embed_ids",
    "fill_mask",
    "fill_mask_side_by_side",
    "pooling_declaration",
    "resolve_pooling",
    "saved_settings",
    "sequence_logits",
    "trained_dimensions",
]
