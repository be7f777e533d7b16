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


def retrieval_per_query(similarity: ArrayLike, relevance: ArrayLike) -> dict[str, np.ndarray]:
    """MRR@10, nDCG@10 and recall@1/10/100 of each query (one (Q,) array per score) from a
    (Q, N) ``similarity`` of every query to every corpus document and a (Q, N) ``relevance``:
    booleans, or graded judgments (0 = not relevant; 1, 2, ... as BEIR's and TREC's qrels).

    Documents are ranked by similarity; a tie ranks the more relevant document below the others
    (so a constant similarity scores as badly as it should, not by the corpus order). nDCG gains
    are the grades themselves (linear, as trec_eval and so BEIR), discounted by log2(rank + 1),
    over the ideal ordering of the query's judged grades. Recall@k is the fraction of the
    query's relevant (grade > 0) documents in its top k."""
    sim = np.asarray(similarity, dtype=np.float64)
    gain = np.asarray(relevance, dtype=np.float64)
    if sim.shape != gain.shape or sim.ndim != 2 or sim.size == 0:
        raise ValueError(
            f"similarity {sim.shape} and relevance {gain.shape}: two equal (Q, N) shapes"
        )
    if (gain < 0).any() or not (gain > 0).any(axis=1).all():
        raise ValueError("relevance grades are >= 0 and every query needs one above 0")
    order = np.lexsort((gain, -sim), axis=-1)[:, :100]  # by similarity, ties: the relevant last
    ranked = np.take_along_axis(gain, order, axis=1)  # (Q, min(N, 100)): grade at rank r+1
    hits = ranked > 0
    n_relevant = (gain > 0).sum(axis=1)
    top10 = hits[:, :10]
    first = top10.argmax(axis=1)  # 0-based rank of the best relevant document (if in the top 10)
    mrr = np.where(top10.any(axis=1), 1.0 / (first + 1), 0.0)
    discount = 1.0 / np.log2(np.arange(2, 12))  # ranks 1..10
    k = min(10, sim.shape[1])
    best = -np.partition(-gain, k - 1, axis=1)[:, :k]  # (Q, k): the k highest grades
    ideal = -np.sort(-best, axis=1)  # best first
    out = {"mrr@10": mrr, "ndcg@10": (ranked[:, :k] @ discount[:k]) / (ideal @ discount[:k])}
    for cut in (1, 10, 100):
        out[f"recall@{cut}"] = hits[:, :cut].sum(axis=1) / n_relevant
    return out


def retrieval_metrics(similarity: ArrayLike, relevance: ArrayLike) -> dict[str, float]:
    """:func:`retrieval_per_query`'s scores averaged over the queries."""
    return {name: float(v.mean()) for name, v in retrieval_per_query(similarity, relevance).items()}


__all__ = [
    "RETRIEVAL_METRICS",
    "retrieval_metrics",
    "retrieval_per_query",
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
