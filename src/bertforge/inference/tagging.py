"""Tagging with a token classifier: per-token logits in batches (:func:`token_logits`) and
:func:`tag`, the entities of raw texts with character offsets into them (``bertforge tag``).

A text is cut into WordPiece windows at word boundaries when it is longer than ``max_length``
(each piece is predicted once), so nothing is silently left untagged. Entities are grouped as
transformers' token-classification pipeline groups them: ``aggregation="first"`` (the default)
gives each word the tag of its first piece, the piece the model was trained on (``run_ner``'s
convention, and transformers' ``aggregation_strategy="first"``); ``"simple"`` tags every piece
on its own (``aggregation_strategy="simple"``). Either way adjacent units of one type form an
entity unless a ``B-`` opens a new one, which is how :func:`bertforge.data.iob.entities`
reads a tag sequence; its score is the mean of its units' top probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from bertforge.data.iob import entities
from bertforge.data.tagging import split_windows
from bertforge.errors import BertforgeError
from bertforge.inference.predict import (
    _check_texts,
    _max_length,
    head_batches,
    saved_settings,
)
from bertforge.tokenizer.wordpiece import valid_unicode

Aggregation = Literal["first", "simple"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


@torch.inference_mode()
def token_logits(
    model: nn.Module,
    encoded: Sequence[tuple[np.ndarray, int]],
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    progress: bool = False,
    desc: str = "tag",
) -> list[np.ndarray]:
    """(length, num_labels) float32 logits of every encoded window, in input order, from a
    ``BertForTokenClassification`` or its ONNX export (an ``OnnxModel``)."""
    out: list[np.ndarray] = [np.empty(0)] * len(encoded)
    for index, logits in head_batches(
        model,
        encoded,
        pad_id,
        lambda arrays: model.token_logits(arrays),
        lambda batch: model(**batch).logits.float().cpu().numpy(),  # (B, T, C)
        batch_size=batch_size,
        precision=precision,
        progress=progress,
        desc=desc,
    ):
        for row, i in enumerate(index):
            out[int(i)] = logits[row, : len(encoded[int(i)][0])]
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _group(
    labels: Sequence[str], scores: Sequence[float], spans: Sequence[tuple[int, int]], text: str
) -> list[dict[str, Any]]:
    found = []
    for kind, first, end in entities(labels):
        start, stop = spans[first][0], spans[end - 1][1]
        found.append(
            {
                "entity": kind,
                "word": text[start:stop],
                "start": int(start),
                "end": int(stop),
                "score": float(np.mean(scores[first:end])),
            }
        )
    return found


def _text_windows(
    tokenizer: Any, encodings: Sequence[Any], max_length: int
) -> tuple[list[tuple[np.ndarray, int]], list[tuple[int, list[int]]]]:
    """Windows ``[CLS] pieces [SEP]`` of whole words of each encoded text, and for each window
    (its text, the positions of its pieces in that text's encoding)."""
    encoded, origin = [], []
    for t, enc in enumerate(encodings):
        words = [w if w is not None else -1 for w in enc.word_ids]
        starts = [i for i in range(len(words)) if i == 0 or words[i] != words[i - 1]]
        ends = starts[1:] + [len(words)]
        lengths = [e - s for s, e in zip(starts, ends, strict=True)]
        for first, end in split_windows(lengths, max_length - 2):
            positions = [p for w in range(first, end) for p in range(starts[w], ends[w])]
            positions = positions[: max_length - 2]  # a single word longer than a window
            ids = [tokenizer.cls_id, *(enc.ids[p] for p in positions), tokenizer.sep_id]
            encoded.append((np.asarray(ids, dtype=np.int32), len(ids)))
            origin.append((t, positions))
    return encoded, origin


def tag(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    aggregation: str = "first",
    precision: str = "fp32",
    progress: bool = False,
) -> list[list[dict[str, Any]]]:
    """The entities of each text, in order: ``{"entity": type, "word": the text's characters,
    "start", "end": character offsets into the text, "score": mean top probability}``.

    ``max_length`` (default: what fine-tuning saved, else the model's positions) is the window
    size in tokens with [CLS] and [SEP]; longer texts are split into windows at word boundaries.
    ``aggregation``: ``first`` (a tag per word, from its first piece) or ``simple`` (a tag per
    piece); see the module docstring.
    """
    texts = _check_texts(texts)
    # what config.json says it is (a sequence classifier's head would load into ours unnoticed)
    kind = next(iter(model.config.architectures or []), type(model).__name__)
    if kind not in ("BertForTokenClassification", "ModernBertForTokenClassification"):
        where = getattr(model, "name_or_path", "the model")
        raise BertforgeError(
            f"{where}: is a {kind}, not a token classifier; fine-tune one with bertforge "
            "finetune --task token_classification"
        )
    if aggregation not in AGGREGATIONS:
        raise BertforgeError(f"aggregation {aggregation!r}: choose {' or '.join(AGGREGATIONS)}")
    if not texts:
        return []
    if max_length is None:
        max_length = saved_settings(model).get("max_length")
    max_length = _max_length(model, max_length)
    if max_length < 3:
        raise BertforgeError(
            f"--max_length {max_length}: must be at least 3 ([CLS], [SEP], a piece)"
        )
    try:
        encodings = tokenizer.backend.encode_batch(list(texts), add_special_tokens=False)
    except TypeError:
        encodings = tokenizer.backend.encode_batch(valid_unicode(texts), add_special_tokens=False)
    encoded, origin = _text_windows(tokenizer, encodings, max_length)
    logits = token_logits(
        model,
        encoded,
        tokenizer.pad_id,
        batch_size=batch_size,
        precision=precision,
        progress=progress,
    )
    probs = [
        np.full((len(e.ids), model.config.num_labels), np.nan, dtype=np.float32) for e in encodings
    ]
    for (t, positions), window in zip(origin, logits, strict=True):
        probs[t][positions] = _softmax(window[1 : 1 + len(positions)])
    id2label = model.config.id2label or {i: f"LABEL_{i}" for i in range(model.config.num_labels)}
    results = []
    for text, enc, p in zip(texts, encodings, probs, strict=True):
        scored = ~np.isnan(p[:, 0]) if len(p) else np.zeros(0, dtype=bool)
        units = [i for i in range(len(p)) if scored[i]]
        if aggregation == "first":  # a word's first piece speaks for the word
            words = enc.word_ids
            units = [i for i in units if i == 0 or words[i] is None or words[i] != words[i - 1]]
            last = {}
            for i, w in enumerate(words):
                last[w] = i
            spans = [(enc.offsets[i][0], enc.offsets[last[words[i]]][1]) for i in units]
        else:
            spans = [enc.offsets[i] for i in units]
        best = [int(p[i].argmax()) for i in units]
        labels = [id2label[b] for b in best]
        scores = [float(p[i][b]) for i, b in zip(units, best, strict=True)]
        results.append(_group(labels, scores, spans, text))
    return results


__all__ = ["AGGREGATIONS", "Aggregation", "tag", "token_logits"]
