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
    "entity_f1": True,
    "token_accuracy": True,
    "exact_match": True,
    "f1": True,
    "loss": False,
    "mrr@10": True,
    "ndcg@10": True,
    "recall@1": True,
    "recall@10": True,
    "recall@100": True,
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
    progress: bool = False,
) -> tuple[dict[str, float], np.ndarray]:
    """Metrics of a ``BertForSequenceClassification`` on encoded examples, and its predictions.

    Classification: ``loss`` (mean cross-entropy), ``accuracy``, ``macro_f1``, ``mcc``; the
    predictions are class ids. Regression: ``loss`` plus ``mse``, ``mae``, ``pearson``,
    ``spearman`` in the labels' units; with ``scale = (mean, std)`` the model's outputs are
    z-scores (as while training on normalised targets), ``loss`` is their MSE and predictions are
    mapped back to ``z * std + mean``.
    """

    logits = sequence_logits(
        model,
        encoded,
        pad_id,
        batch_size=batch_size,
        precision=precision,
        progress=progress,
        desc="evaluate",
    )
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


TRAINING_BASELINE = {
    "classification": "the most frequent class of the training split",
    "regression": "the mean target of the training split",
}
"""The one baseline of ``finetune`` and ``evaluate``: what a model that learned nothing from the
texts would predict for every example, knowing only the training labels."""
DATA_BASELINE = {
    "classification": "the most frequent class of this data; the training split's is unknown",
    "regression": "the mean target of this data; the training split's is unknown",
}
"""The fallback when the model directory does not record its training baseline."""


def training_baseline(labels: np.ndarray, regression: bool) -> float | int:
    """The baseline prediction from the training labels: the mean target (regression) or the
    most frequent class id (ties: the lowest id)."""
    labels = np.asarray(labels)
    if regression:
        return float(labels.mean())
    return int(np.bincount(labels.astype(np.int64)).argmax())


def baseline_metrics(config: Any, y_true: np.ndarray, prediction: float | int) -> dict[str, float]:
    """The metrics of predicting ``prediction`` for every example of ``y_true``."""
    y_true = np.asarray(y_true)
    if config.is_regression:
        return M.regression_metrics(y_true, np.full(y_true.shape, float(prediction)))
    constant = np.full(y_true.shape, int(prediction))
    return M.classification_metrics(y_true, constant, config.num_labels)


def beats_baseline(metric: str, value: float, reference: float) -> bool:
    """Whether ``value`` of ``metric`` is better than the baseline's ``reference`` (a constant
    prediction's correlation, undefined, counts as 0; a value that is not finite never beats)."""
    if not np.isfinite(value):
        return False
    if not np.isfinite(reference):
        reference = 0.0
    return bool(value > reference if HIGHER_IS_BETTER[metric] else value < reference)


def baseline_warning(metric: str, value: float, baseline: dict[str, Any]) -> str | None:
    """A warning when ``value`` of ``metric`` does not beat the baseline's, else None."""
    reference = baseline.get(metric)
    if reference is None or not np.isfinite(reference):
        return None
    beats = value > reference if HIGHER_IS_BETTER[metric] else value < reference
    if beats:
        return None
    return (
        f"warning: {metric} {value:.4f} does not beat the baseline {reference:.4f} (always "
        f"{baseline['predicts']!r}, {baseline['definition']}): the model has not learned to use "
        "the texts; train longer, raise --lr, or check the labels"
    )


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
    """The per-class report (classification) and the baseline for comparison: the prediction
    ``baseline_value`` (a class id, or a regression target) of :func:`training_baseline` for
    every example, scored on ``y_true`` (regression correlations are 0 by definition). Without
    it the baseline is taken from ``y_true`` itself and says so. With ``plot`` (a PNG path) the
    :func:`save_task_plot` goes there too."""
    y_true = np.asarray(y_true)
    if plot is not None:
        save_task_plot(config, y_true, y_pred, plot, title=plot_title)
    kind = "regression" if config.is_regression else "classification"
    definition = (DATA_BASELINE if baseline_value is None else TRAINING_BASELINE)[kind]
    if baseline_value is None:
        baseline_value = training_baseline(y_true, config.is_regression)
    base = baseline_metrics(config, y_true, baseline_value)
    if config.is_regression:
        value = float(baseline_value)
        return {"baseline": {"predicts": value, "definition": definition, **base}}
    names = class_names(config)
    report = M.per_class_report(y_true, y_pred, names)
    metrics = M.classification_metrics(y_true, y_pred, len(names))
    return {
        "per_class": report,
        "report_text": M.format_report(report, metrics),
        "confusion_matrix": M.confusion_matrix(y_true, y_pred, len(names)).tolist(),
        "baseline": {"predicts": names[int(baseline_value)], "definition": definition, **base},
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
    "DATA_BASELINE",
    "HIGHER_IS_BETTER",
    "TRAINING_BASELINE",
    "baseline_metrics",
    "baseline_warning",
    "beats_baseline",
    "training_baseline",
    "class_names",
    "evaluate_sequence_model",
    "save_task_plot",
    "task_plot_name",
    "task_report",
]
