"""Task metrics as pure NumPy functions: classification (accuracy, macro-F1, MCC, confusion matrix,
per-class report), regression (MSE, MAE, Pearson, Spearman) and retrieval (MRR@10, nDCG@10,
recall@k).

Every function takes array-likes of true and predicted values and returns plain Python numbers
(or arrays), so fine-tuning, ``bertforge evaluate`` and the benchmarks all report the same thing.
Conventions follow scikit-learn's where a choice exists: a class with no predictions has
precision 0, a constant input has correlation 0 (not NaN) so that logs stay JSON-clean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike


def _pair(y_true: ArrayLike, y_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t, p = np.asarray(y_true).reshape(-1), np.asarray(y_pred).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} values but y_pred has {p.size}")
    if t.size == 0:
        raise ValueError("metrics need at least one example")
    return t, p


# ---- classification -----------------------------------------------------------------------


def confusion_matrix(
    y_true: ArrayLike, y_pred: ArrayLike, num_classes: int | None = None
) -> np.ndarray:
    """(K, K) int64 counts: row = true class id, column = predicted class id."""
    t, p = _pair(y_true, y_pred)
    t, p = t.astype(np.int64), p.astype(np.int64)
    k = int(max(t.max(), p.max()) + 1) if num_classes is None else int(num_classes)
    if t.min() < 0 or p.min() < 0 or t.max() >= k or p.max() >= k:
        raise ValueError(f"class ids must lie in [0, {k})")
    return np.bincount(t * k + p, minlength=k * k).reshape(k, k)


def accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    t, p = _pair(y_true, y_pred)
    return float(np.mean(t == p))


def precision_recall_f1(cm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-class precision, recall, F1 and support from a confusion matrix (0 where undefined)."""
    cm = np.asarray(cm, dtype=np.float64)
    tp = np.diag(cm)
    predicted, support = cm.sum(axis=0), cm.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    return precision, recall, f1, support.astype(np.int64)


def macro_f1(y_true: ArrayLike, y_pred: ArrayLike, num_classes: int | None = None) -> float:
    """Unweighted mean of per-class F1 over the classes that occur in ``y_true`` or ``y_pred``."""
    cm = confusion_matrix(y_true, y_pred, num_classes)
    present = (cm.sum(axis=0) + cm.sum(axis=1)) > 0
    return float(precision_recall_f1(cm)[2][present].mean())


def mcc(y_true: ArrayLike, y_pred: ArrayLike, num_classes: int | None = None) -> float:
    """Matthews correlation coefficient, multi-class form (Gorodkin 2004); 0 when undefined."""
    cm = confusion_matrix(y_true, y_pred, num_classes).astype(np.float64)
    n = cm.sum()
    correct = np.trace(cm)
    t, p = cm.sum(axis=1), cm.sum(axis=0)  # true and predicted counts per class
    cov_tp = correct * n - t @ p
    cov_tt, cov_pp = n * n - t @ t, n * n - p @ p
    denom = np.sqrt(cov_tt * cov_pp)
    return float(cov_tp / denom) if denom > 0 else 0.0


def classification_metrics(
    y_true: ArrayLike, y_pred: ArrayLike, num_classes: int | None = None
) -> dict[str, float]:
    """``accuracy``, ``macro_f1`` and ``mcc`` in one dict."""
    return {
        "accuracy": accuracy(y_true, y_pred),
        "macro_f1": macro_f1(y_true, y_pred, num_classes),
        "mcc": mcc(y_true, y_pred, num_classes),
    }


def per_class_report(
    y_true: ArrayLike, y_pred: ArrayLike, labels: Sequence[str]
) -> list[dict[str, Any]]:
    """One dict per class (``label``, ``precision``, ``recall``, ``f1``, ``support``), in id order."""
    cm = confusion_matrix(y_true, y_pred, len(labels))
    precision, recall, f1, support = precision_recall_f1(cm)
    return [
        {
            "label": str(name),
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(labels)
    ]


def format_report(report: list[dict[str, Any]], metrics: dict[str, float] | None = None) -> str:
    """The per-class report as an aligned text table (plus the overall metrics below it)."""
    width = max(10, *(len(r["label"]) for r in report))
    lines = [f"{'label':<{width}}  precision  recall      f1  support"]
    for r in report:
        lines.append(
            f"{r['label']:<{width}}  {r['precision']:9.4f}  {r['recall']:6.4f}  "
            f"{r['f1']:6.4f}  {r['support']:7d}"
        )
    for key, value in (metrics or {}).items():
        lines.append(f"{key:<{width}}  {value:.4f}")
    return "\n".join(lines)


# ---- regression ---------------------------------------------------------------------------


def mse(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    t, p = _pair(y_true, y_pred)
    return float(np.mean((t.astype(np.float64) - p.astype(np.float64)) ** 2))


def mae(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    t, p = _pair(y_true, y_pred)
    return float(np.mean(np.abs(t.astype(np.float64) - p.astype(np.float64))))


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; 0.0 when either side is constant."""
    a, b = _pair(x, y)
    if a.min() == a.max() or b.min() == b.max():  # centred by a rounded mean it is not all 0
        return 0.0
    a, b = a.astype(np.float64) - a.mean(), b.astype(np.float64) - b.mean()
    denom = np.sqrt((a @ a) * (b @ b))
    return float(a @ b / denom) if denom > 0 else 0.0


def rankdata(x: ArrayLike) -> np.ndarray:
    """1-based ranks with ties given their average rank (scipy's ``rankdata(method="average")``)."""
    x = np.asarray(x).reshape(-1)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # start index of each run of equal values, and the run lengths
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    lengths = np.diff(np.r_[starts, x.size])
    mean_rank = starts + (lengths + 1) / 2.0  # average of 1-based ranks start+1 .. start+length
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, lengths)
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rank correlation: Pearson on average ranks (ties handled)."""
    a, b = _pair(x, y)
    return pearson(rankdata(a), rankdata(b))


def regression_metrics(y_true: ArrayLike, y_pred: ArrayLike) -> dict[str, float]:
    """``mse``, ``mae``, ``pearson`` and ``spearman`` in one dict."""
    return {
        "mse": mse(y_true, y_pred),
        "mae": mae(y_true, y_pred),
        "pearson": pearson(y_true, y_pred),
        "spearman": spearman(y_true, y_pred),
    }


# ---- retrieval ------------------------------------------------------------------------------

RETRIEVAL_METRICS: tuple[str, ...] = ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100")


def retrieval_metrics(similarity: ArrayLike, relevant: ArrayLike) -> dict[str, float]:
    """MRR@10, nDCG@10 (binary relevance) and recall@1/10/100, averaged over queries, of a
    (Q, N) ``similarity`` of every query to every corpus document and a (Q, N) boolean
    ``relevant``. Documents are ranked by similarity; a tie ranks the relevant document below the
    others (so a constant similarity scores as badly as it should, not by the corpus order)."""
    sim = np.asarray(similarity, dtype=np.float64)
    rel = np.asarray(relevant, dtype=bool)
    if sim.shape != rel.shape or sim.ndim != 2 or sim.size == 0:
        raise ValueError(
            f"similarity {sim.shape} and relevant {rel.shape}: two equal (Q, N) shapes"
        )
    if not rel.any(axis=1).all():
        raise ValueError("every query needs at least one relevant document")
    order = np.lexsort((rel, -sim), axis=-1)  # by similarity, ties: the relevant last
    hits = np.take_along_axis(rel, order, axis=1)  # (Q, N): relevant at rank r (0-based)
    n_relevant = rel.sum(axis=1)
    first = hits.argmax(axis=1)  # 0-based rank of the best relevant document
    mrr = np.where(first < 10, 1.0 / (first + 1), 0.0)
    gains = 1.0 / np.log2(np.arange(2, 12))  # ranks 1..10
    dcg = hits[:, :10] @ gains[: min(10, hits.shape[1])]
    ideal = np.cumsum(gains)[np.minimum(n_relevant, 10) - 1]
    out = {"mrr@10": float(mrr.mean()), "ndcg@10": float((dcg / ideal).mean())}
    for k in (1, 10, 100):
        out[f"recall@{k}"] = float((hits[:, :k].sum(axis=1) / n_relevant).mean())
    return out


__all__ = [
    "RETRIEVAL_METRICS",
    "retrieval_metrics",
    "accuracy",
    "classification_metrics",
    "confusion_matrix",
    "format_report",
    "macro_f1",
    "mae",
    "mcc",
    "mse",
    "pearson",
    "per_class_report",
    "precision_recall_f1",
    "rankdata",
    "regression_metrics",
    "spearman",
]
