"""Scores of a sentence-embedding model: STS (Spearman and Pearson of the cosine of each pair
against its gold score) and retrieval (each query against a corpus: MRR@10, nDCG@10,
recall@1/10/100), from the vectors ``bertforge.inference.embed`` gives; and the same scores of
constant and random vectors, the baselines printed beside them.

A data set of pairs (``bertforge.data.pairs``) is scored by its kind: scored pairs as STS; pairs
as retrieval, the queries being the anchors, the corpus the distinct positives (and negatives),
a query's relevant documents the positives it is paired with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bertforge.data.pairs import PairData
from bertforge.evaluation.metrics import pearson, retrieval_metrics, spearman
from bertforge.inference.predict import embed

Vectors = Callable[[Sequence[str]], np.ndarray]
"""Texts -> (N, D) vectors: a model's, or a baseline's."""


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``a`` with row i of ``b``; 0 for a zero vector."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide((a * b).sum(axis=1), norms, out=np.zeros(len(a)), where=norms > 0)


def cosine_all(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, D) and (M, D) -> (N, M) cosines."""
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return a @ b.T


def sts_metrics(a: np.ndarray, b: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """``spearman`` and ``pearson`` of the cosine of each pair (row of ``a``, row of ``b``)
    against its ``gold`` score."""
    cos = cosine_rows(np.asarray(a, np.float64), np.asarray(b, np.float64))
    return {"spearman": spearman(gold, cos), "pearson": pearson(gold, cos)}


def retrieval_task(data: PairData) -> tuple[list[str], list[str], np.ndarray]:
    """``(queries, corpus, relevant)`` of a pair data set: the distinct anchors, the distinct
    positives and negatives, and the (Q, N) boolean of each anchor's positives."""
    assert data.positives is not None, "retrieval needs pairs"
    queries = list(dict.fromkeys(data.anchors))
    documents = list(dict.fromkeys(data.positives + (data.negatives or [])))
    q_index = {q: i for i, q in enumerate(queries)}
    d_index = {d: i for i, d in enumerate(documents)}
    relevant = np.zeros((len(queries), len(documents)), dtype=bool)
    for query, positive in zip(data.anchors, data.positives, strict=True):
        relevant[q_index[query], d_index[positive]] = True
    return queries, documents, relevant


def score_vectors(data: PairData, vectors: Vectors) -> dict[str, float]:
    """STS metrics of scored pairs, retrieval metrics of pairs, with ``vectors`` embedding."""
    if data.kind == "scored":
        assert data.positives is not None and data.scores is not None
        return sts_metrics(vectors(data.anchors), vectors(data.positives), data.scores)
    queries, documents, relevant = retrieval_task(data)
    return retrieval_metrics(cosine_all(vectors(queries), vectors(documents)), relevant)


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


def baselines(data: PairData, dim: int) -> dict[str, dict[str, float]]:
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
    "retrieval_task",
    "score_vectors",
    "sts_metrics",
]
