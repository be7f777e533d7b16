"""Scores of a fine-tuned classifier or regressor on a labelled set: the metrics report, the
plots, and the columns of comparison tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.evaluation import metrics as M
from bertforge.evaluation.plots import plot_confusion_matrix, plot_regression_scatter
from bertforge.inference.predict import sequence_logits

HIGHER_IS_BETTER = {
    "accuracy": True,
    "macro_f1": True,
    "mcc": True,
    "spearman": True,
    "pearson": True,
    "mse": False,
    "mae": False,
    "loss": False,
}
"""Direction of each validation metric (which way is an improvement)."""


def evaluate_sequence_model(
    model: nn.Module,
    encoded: Sequence[tuple[np.ndarray, int]],
    labels: np.ndarray,
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    scale: Sequence[float] | None = None,
) -> tuple[dict[str, float], np.ndarray]:
    """Metrics of a ``BertForSequenceClassification`` on encoded examples, and its predictions.

    Classification: ``loss`` (mean cross-entropy), ``accuracy``, ``macro_f1``, ``mcc``; the
    predictions are class ids. Regression: ``loss`` plus ``mse``, ``mae``, ``pearson``,
    ``spearman`` in the labels' units; with ``scale = (mean, std)`` the model's outputs are
    z-scores (as while training on normalised targets), ``loss`` is their MSE and predictions are
    mapped back to ``z * std + mean``.
    """

    logits = sequence_logits(model, encoded, pad_id, batch_size=batch_size, precision=precision)
    if model.config.is_regression:
        raw = logits[:, 0].astype(np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if scale is not None:
            mean, std = scale
            loss = float(np.mean((raw - (y - mean) / std) ** 2))
            predictions = raw * std + mean
        else:
            predictions = raw
            loss = M.mse(y, predictions)
        return {
            "loss": loss,
            **M.regression_metrics(y, predictions),
            "examples": len(y),
        }, predictions
    target = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    loss = float(F.cross_entropy(torch.from_numpy(logits), target))
    predictions = logits.argmax(-1)
    metrics = M.classification_metrics(labels, predictions, model.config.num_labels)
    return {"loss": loss, **metrics, "examples": len(labels)}, predictions


def class_names(config: Any) -> list[str]:
    """The class names of a classifier's config in id order (``"0"``, ``"1"``, ... without
    ``id2label``)."""
    if config.id2label:
        return [config.id2label[i] for i in range(config.num_labels)]
    return [str(i) for i in range(config.num_labels)]


def task_report(
    config: Any,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    baseline_value: Any = None,
    *,
    plot: str | Path | None = None,
    plot_title: str | None = None,
) -> dict[str, Any]:
    """The per-class report (classification) and a trivial baseline for comparison: the majority
    class, or for regression ``baseline_value`` (e.g. the training mean) predicted for every
    example (its correlations are 0 by definition). With ``plot`` (a PNG path) the
    :func:`save_task_plot` goes there too."""
    y_true = np.asarray(y_true)
    if plot is not None:
        save_task_plot(config, y_true, y_pred, plot, title=plot_title)
    if config.is_regression:
        value = float(y_true.mean()) if baseline_value is None else float(baseline_value)
        base = M.regression_metrics(y_true, np.full(y_true.shape, value))
        return {"baseline": {"predicts": value, **base}}
    names = class_names(config)
    report = M.per_class_report(y_true, y_pred, names)
    majority = int(np.bincount(y_true.astype(np.int64), minlength=len(names)).argmax())
    base = M.classification_metrics(y_true, np.full(y_true.shape, majority), len(names))
    metrics = M.classification_metrics(y_true, y_pred, len(names))
    return {
        "per_class": report,
        "report_text": M.format_report(report, metrics),
        "confusion_matrix": M.confusion_matrix(y_true, y_pred, len(names)).tolist(),
        "baseline": {"predicts": names[majority], **base},
    }


def task_plot_name(config: Any) -> str:
    """File name of the task plot: ``predicted_vs_true.png`` or ``confusion_matrix.png``."""
    return "predicted_vs_true.png" if config.is_regression else "confusion_matrix.png"


def save_task_plot(
    config: Any,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    output: str | Path,
    title: str | None = None,
) -> Path:
    """A confusion matrix (classification) or predicted-vs-true scatter (regression) PNG."""

    if config.is_regression:
        return plot_regression_scatter(y_true, y_pred, output, title)
    names = class_names(config)
    cm = M.confusion_matrix(y_true, y_pred, len(names))
    return plot_confusion_matrix(cm, names, output, title)


# ---- masked-language models on a text file ---------------------------------------------------


__all__ = [
    "HIGHER_IS_BETTER",
    "class_names",
    "evaluate_sequence_model",
    "save_task_plot",
    "task_plot_name",
    "task_report",
]
