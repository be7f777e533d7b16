"""Scores of a token classifier on tagged sentences: the windows' logits stitched back into a tag
per word, entity-level precision/recall/F1 (as seqeval's default mode), token accuracy, the
per-type report, the all-``O`` baseline and a confusion matrix of the tags."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.tagging import IGNORE, Windows, word_predictions
from bertforge.evaluation import metrics as M
from bertforge.evaluation.entities import entity_scores, format_entity_report
from bertforge.evaluation.plots import plot_confusion_matrix
from bertforge.inference.tagging import token_logits

TAGGING_BASELINE = "the tag O for every word (no entity)"
"""The baseline of a token classifier: what a model that found nothing would score."""


def _names(config: Any) -> list[str]:
    return [config.id2label[i] for i in range(config.num_labels)]


def evaluate_tagging_model(
    model: nn.Module,
    windows: Windows,
    true_tags: Sequence[np.ndarray],
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    progress: bool = False,
) -> tuple[dict[str, float], list[np.ndarray]]:
    """Metrics of a ``BertForTokenClassification`` on encoded windows, and its predicted tag ids
    per word of each sentence. ``loss`` is the mean cross-entropy over the labelled positions;
    ``entity_f1``, ``precision``, ``recall`` are seqeval's (default mode) micro scores over
    entities, ``token_accuracy`` the share of words tagged right."""
    logits = token_logits(
        model, windows.encoded, pad_id, batch_size=batch_size, precision=precision,
        progress=progress, desc="evaluate",
    )  # fmt: skip
    flat = np.concatenate(logits)  # (positions, C)
    labels = np.concatenate(windows.labels) if windows.labels is not None else None
    loss = float("nan")
    if labels is not None and (labels != IGNORE).any():
        loss = float(
            F.cross_entropy(torch.from_numpy(flat), torch.from_numpy(labels), ignore_index=IGNORE)
        )
    predicted = word_predictions(windows, [x.argmax(-1) for x in logits])
    metrics = tag_metrics(model.config, true_tags, predicted)
    return {"loss": loss, **metrics}, predicted


def tag_metrics(
    config: Any, true_tags: Sequence[np.ndarray], predicted: Sequence[np.ndarray]
) -> dict[str, float]:
    """``entity_f1``, ``precision``, ``recall``, ``token_accuracy``, ``entities`` and
    ``sentences`` of predicted tag ids against true ones."""
    names = _names(config)
    scores = entity_scores(
        [[names[i] for i in t] for t in true_tags], [[names[i] for i in p] for p in predicted]
    )
    return {
        "entity_f1": scores["f1"],
        "precision": scores["precision"],
        "recall": scores["recall"],
        "token_accuracy": scores["token_accuracy"],
        "entities": scores["entities"],
        "examples": len(true_tags),
    }


def tagging_report(
    config: Any,
    true_tags: Sequence[np.ndarray],
    predicted: Sequence[np.ndarray],
    *,
    plot: str | Path | None = None,
    plot_title: str | None = None,
) -> dict[str, Any]:
    """The per-type report (``report_text``: seqeval's layout), the all-``O`` baseline, the word
    confusion matrix of the tags (also drawn to ``plot``, a PNG path)."""
    names = _names(config)
    as_names = lambda rows: [[names[i] for i in r] for r in rows]  # noqa: E731
    scores = entity_scores(as_names(true_tags), as_names(predicted))
    outside = names.index("O") if "O" in names else 0
    nothing = [np.full(len(t), outside) for t in true_tags]
    base = tag_metrics(config, true_tags, nothing)
    t, p = np.concatenate(true_tags), np.concatenate(predicted)
    cm = M.confusion_matrix(t, p, len(names))
    if plot is not None:
        plot_confusion_matrix(cm, names, plot, plot_title)
    return {
        "per_type": scores["per_type"],
        "report_text": format_entity_report(scores),
        "confusion_matrix": cm.tolist(),
        "baseline": {"predicts": names[outside], "definition": TAGGING_BASELINE, **base},
    }


__all__ = [
    "TAGGING_BASELINE",
    "evaluate_tagging_model",
    "tag_metrics",
    "tagging_report",
]
