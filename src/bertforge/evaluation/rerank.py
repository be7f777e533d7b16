"""Two-stage retrieval scores: a first stage ranks the whole corpus by the cosine of an embedding
model's vectors, a reranker re-orders each query's top ``k`` (:mod:`bertforge.inference.rerank`);
MRR@10, nDCG@10 and recall@1/10/100 of both orders (:func:`~bertforge.evaluation.metrics.
retrieval_per_query`, the ranking BEIR scores), so a reranker is judged by what it adds.

Beyond the top ``k`` the first stage's order stands (the reranker never sees those documents),
so recall@100 changes only when ``k`` reaches past 100.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bertforge.data.retrieval import RetrievalData
from bertforge.evaluation.embedding import unit_rows
from bertforge.evaluation.metrics import retrieval_per_query
from bertforge.progress import item_bar

PairScores = Callable[[str, Sequence[str]], np.ndarray]
"""(query, candidate texts) -> (k,) scores, higher more relevant."""


def reranked_order(
    similarity: np.ndarray, k: int, scores: Callable[[int, np.ndarray], np.ndarray]
) -> np.ndarray:
    """(Q, N) ranking values whose descending order is the two-stage ranking: each row's top
    ``k`` of ``similarity`` (first stage, ties in index order) ordered by ``scores(row, top)``
    (ties: the first stage's order) above every other document, which keep the first stage's
    order. Values are negated ranks (0 the best), so no two tie."""
    q, n = similarity.shape
    k = min(k, n)
    order = np.argsort(-similarity, axis=1, kind="stable")  # (Q, N) first-stage ranking
    out = np.empty((q, n))
    rows = np.arange(q)[:, None]
    out[rows, order] = -np.arange(n, dtype=np.float64)  # first-stage ranks
    for row in range(q):
        top = order[row, :k]
        new = np.argsort(-np.asarray(scores(row, top), dtype=np.float64), kind="stable")
        out[row, top[new]] = -np.arange(k, dtype=np.float64)
    return out


def rerank_scores(
    data: RetrievalData,
    queries: np.ndarray,
    documents: np.ndarray,
    pair_scores: PairScores,
    k: int,
    *,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """``{"retriever": scores, "reranked": scores}`` of ``data`` given the first stage's (Q, D)
    query vectors and (N, D) document vectors and a reranker's ``pair_scores``, which scores
    each query's top ``k`` documents. A query's own document
    (:attr:`RetrievalData.own_documents`) ranks below every other in both stages."""
    q, d = unit_rows(queries), unit_rows(documents)
    per: dict[str, dict[str, list[np.ndarray]]] = {"retriever": {}, "reranked": {}}
    rows = max(1, (1 << 22) // max(1, len(d)))
    with item_bar(len(q), "rerank", enabled=progress, unit=" queries") as bar:
        for start in range(0, len(q), rows):
            stop = min(start + rows, len(q))
            similarity = q[start:stop] @ d.T  # (rows, N)
            for row, own in enumerate((data.own_documents or [])[start:stop]):
                if own is not None:
                    similarity[row, own] = -np.inf

            def scores(row: int, top: np.ndarray, start: int = start) -> np.ndarray:
                bar.update(1)
                return pair_scores(data.queries[start + row], [data.documents[i] for i in top])

            reranked = reranked_order(similarity, k, scores)
            for row, own in enumerate((data.own_documents or [])[start:stop]):
                if own is not None:  # the reranker may have scored it: it still ranks last
                    reranked[row, own] = -np.inf
            relevance = data.relevance(start, stop)
            for name, values in (("retriever", similarity), ("reranked", reranked)):
                for metric, v in retrieval_per_query(values, relevance).items():
                    per[name].setdefault(metric, []).append(v)
    return {
        name: {metric: float(np.concatenate(parts).mean()) for metric, parts in scores.items()}
        for name, scores in per.items()
    }


__all__ = ["PairScores", "rerank_scores", "reranked_order"]
