"""Scores of a sentence-embedding model: STS (Spearman and Pearson of the cosine of each pair
against its gold score) and retrieval (each query against a corpus: MRR@10, nDCG@10,
recall@1/10/100), from the vectors ``bertforge.inference.embed`` gives; and the same scores of
constant and random vectors, the baselines printed beside them.

A data set of pairs (``bertforge.data.pairs``) is scored by its kind: scored pairs as STS; pairs
as retrieval, the queries being the anchors, the corpus the distinct positives (and negatives),
a query's relevant documents the positives it is paired with. A retrieval test set read from
files (``bertforge.data.retrieval``: queries, a corpus, graded judgments) is scored as retrieval.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bertforge.data.pairs import PairData
from bertforge.data.retrieval import RetrievalData
from bertforge.evaluation.metrics import pearson, retrieval_per_query, spearman
from bertforge.inference.predict import embed

Vectors = Callable[[Sequence[str]], np.ndarray]
"""Texts -> (N, D) vectors: a model's, or a baseline's."""


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``a`` with row i of ``b``; 0 for a zero vector."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide((a * b).sum(axis=1), norms, out=np.zeros(len(a)), where=norms > 0)


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)


def cosine_all(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, D) and (M, D) -> (N, M) cosines."""
    return unit_rows(a) @ unit_rows(b).T


def sts_metrics(a: np.ndarray, b: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """``spearman`` and ``pearson`` of the cosine of each pair (row of ``a``, row of ``b``)
    against its ``gold`` score."""
    cos = cosine_rows(np.asarray(a, np.float64), np.asarray(b, np.float64))
    return {"spearman": spearman(gold, cos), "pearson": pearson(gold, cos)}


def retrieval_task(data: PairData) -> RetrievalData:
    """The retrieval task of a pair data set: the distinct anchors search the distinct positives
    and negatives, each anchor's positives being relevant (grade 1)."""
    assert data.positives is not None, "retrieval needs pairs"
    queries = list(dict.fromkeys(data.anchors))
    documents = list(dict.fromkeys(data.positives + (data.negatives or [])))
    q_index = {q: i for i, q in enumerate(queries)}
    d_index = {d: i for i, d in enumerate(documents)}
    judgments: list[dict[int, int]] = [{} for _ in queries]
    for query, positive in zip(data.anchors, data.positives, strict=True):
        judgments[q_index[query]][d_index[positive]] = 1
    return RetrievalData(queries, documents, judgments)


CHUNK_CELLS = 1 << 22
"""Query-document similarities scored at once (4M: about 32 MB per float64 array)."""


def retrieval_scores(
    data: RetrievalData, queries: np.ndarray, documents: np.ndarray, chunk_cells: int = CHUNK_CELLS
) -> dict[str, float]:
    """:func:`~bertforge.evaluation.metrics.retrieval_metrics` of ``data`` given the (Q, D)
    vectors of its queries and the (N, D) of its documents, ranked by cosine: a block of
    queries at a time, so that a large corpus needs no (Q, N) array. A query's own document
    (:attr:`RetrievalData.own_documents`) ranks below every other."""
    q, d = unit_rows(queries), unit_rows(documents)
    rows = max(1, chunk_cells // max(1, len(d)))
    per_query: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(q), rows):
        stop = min(start + rows, len(q))
        similarity = q[start:stop] @ d.T  # (rows, N)
        for row, own in enumerate((data.own_documents or [])[start:stop]):
            if own is not None:
                similarity[row, own] = -np.inf
        scores = retrieval_per_query(similarity, data.relevance(start, stop))
        for name, values in scores.items():
            per_query.setdefault(name, []).append(values)
    return {name: float(np.concatenate(parts).mean()) for name, parts in per_query.items()}


def score_vectors(data: PairData | RetrievalData, vectors: Vectors) -> dict[str, float]:
    """STS metrics of scored pairs, retrieval metrics of pairs and of retrieval test sets, with
    ``vectors`` embedding."""
    if isinstance(data, PairData) and data.kind == "scored":
        assert data.positives is not None and data.scores is not None
        return sts_metrics(vectors(data.anchors), vectors(data.positives), data.scores)
    task = data if isinstance(data, RetrievalData) else retrieval_task(data)
    return retrieval_scores(task, vectors(task.queries), vectors(task.documents))


def model_vectors(model: Any, tokenizer: Any, **options: Any) -> Vectors:
    """``embed`` with ``model`` (its declared or the given pooling: ``options`` go to embed)."""
    return lambda texts: embed(model, tokenizer, list(texts), **options)


def constant_vectors(dim: int) -> Vectors:
    """The same vector for every text: every similarity ties (the lowest score possible)."""
    return lambda texts: np.ones((len(texts), dim), dtype=np.float32)


def random_vectors(dim: int, seed: int = 0) -> Vectors:
    """A random vector per distinct text (the same text, the same vector): chance level."""

    def vectors(texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), dim), dtype=np.float32)
        for i, text in enumerate(texts):
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
            rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
            out[i] = rng.standard_normal(dim)
        return out

    return vectors


def baselines(data: PairData | RetrievalData, dim: int) -> dict[str, dict[str, float]]:
    """The scores of :func:`constant_vectors` and :func:`random_vectors` on ``data``."""
    return {
        "constant": score_vectors(data, constant_vectors(dim)),
        "random": score_vectors(data, random_vectors(dim)),
    }


def scores_table(rows: dict[str, dict[str, float]]) -> str:
    """A plain-text table: one row per label (model, constant, random), one column per score of
    the first row."""
    names = list(next(iter(rows.values())))
    lines = [f"{'':<12}" + "".join(f"{name:>12}" for name in names)]
    for label, scores in rows.items():
        lines.append(f"{label:<12}" + "".join(f"{scores[n]:>12.4f}" for n in names))
    return "\n".join(lines) + "\n"


__all__ = [
    "Vectors",
    "scores_table",
    "baselines",
    "constant_vectors",
    "cosine_all",
    "cosine_rows",
    "model_vectors",
    "random_vectors",
    "retrieval_scores",
    "retrieval_task",
    "score_vectors",
    "sts_metrics",
    "unit_rows",
]
