"""Reranking: the score of each candidate text for a query, by a model of either kind.

- a **cross-encoder** (a ``BertForSequenceClassification``, as ``bertforge finetune`` writes a
  pair classifier or regressor) reads each (query, text) pair jointly: the score is its output
  for a one-output model (a regressor, or a reranker trained on 0/1 relevance), and for a
  two-class model the log-odds of the second class (``logit[1] - logit[0]``: label ``1`` of 0/1
  labels, sorted second); a model of more classes ranks nothing and is refused;
- a **sentence-embedding model** (an encoder alone, or a directory declaring its pooling)
  embeds the query and the texts apart: the score is the cosine of their vectors.

These are the raw scores (a cross-encoder's equal sentence-transformers' ``CrossEncoder(dir)
.predict`` of a bertforge fine-tune, whose config.json names the identity as its activation);
:func:`sigmoid` maps a cross-encoder's to (0, 1) as text-embeddings-inference's ``/rerank``
does unless ``raw_scores``. :func:`rerank` returns the candidates best first; ``bertforge
rerank`` and the server's ``/rerank`` route call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from bertforge.data.encoding import encode_examples
from bertforge.errors import BertforgeError
from bertforge.inference.loading import LoadOptions, load_model
from bertforge.inference.predict import _max_length, embed, saved_settings, sequence_logits
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForSequenceClassification, BertModel

RerankerKind = Literal["cross-encoder", "embedding"]


def reranker_kind(config: BertConfig) -> RerankerKind:
    """``cross-encoder`` for a sequence classifier/regressor (config.json's ``architectures``),
    else ``embedding``; a token classifier or question-answering model is refused."""
    architectures = config.architectures or []
    if "BertForSequenceClassification" in architectures:
        if config.num_labels > 2:
            raise BertforgeError(
                f"a classifier of {config.num_labels} classes is no reranker (a score per "
                "candidate needs one output, or two classes whose second is 'relevant'); "
                "fine-tune one on 0/1 relevance labels (--task regression or classification)"
            )
        return "cross-encoder"
    for head in ("BertForTokenClassification", "BertForQuestionAnswering"):
        if head in architectures:
            raise BertforgeError(
                f"a {head} is no reranker; rerank with a cross-encoder (a pair classifier or "
                "regressor from bertforge finetune --text_pair_column) or an embedding model"
            )
    return "embedding"


@dataclass
class Reranker:
    """A loaded reranking model, its tokenizer and the inference options (``batch_size``,
    ``precision``, ``progress``)."""

    model: nn.Module
    tokenizer: Any
    kind: RerankerKind
    options: dict[str, Any]


def load_reranker(args: LoadOptions) -> Reranker:
    """The model of directory ``args.model`` as the reranker its config says it is."""
    kind = reranker_kind(BertConfig.load(args.model))
    cls = BertForSequenceClassification if kind == "cross-encoder" else BertModel
    require = (
        ("classifier.", "the checkpoint has no classifier head") if cls is not BertModel else None
    )
    model, tokenizer, options = load_model(cls, args, require)
    return Reranker(model, tokenizer, kind, options)


def pair_scores(logits: np.ndarray) -> np.ndarray:
    """(N,) scores from a cross-encoder's (N, 1) or (N, 2) logits: the output itself, or the
    second class's log-odds ``logit[1] - logit[0]`` (whose sigmoid is its softmax probability)."""
    if logits.ndim != 2 or logits.shape[1] not in (1, 2):
        raise ValueError(f"logits of shape {logits.shape}: (N, 1) or (N, 2)")
    if logits.shape[1] == 1:
        return logits[:, 0].astype(np.float64)
    return logits[:, 1].astype(np.float64) - logits[:, 0].astype(np.float64)


def sigmoid(scores: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-s))``, as ``(1 + tanh(s / 2)) / 2`` (no overflow for large ``|s|``)."""
    return (1.0 + np.tanh(np.asarray(scores, dtype=np.float64) / 2.0)) / 2.0


def score(
    reranker: Reranker,
    query: str,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    truncation: str | None = None,
) -> np.ndarray:
    """(N,) raw scores of ``texts`` for ``query`` (see the module docstring); ``max_length`` and
    ``truncation`` default to what fine-tuning saved beside the model, else its positions and
    ``head``."""
    if isinstance(texts, str):
        raise BertforgeError(
            "pass a list of candidate texts, not a single string (wrap it: [text])"
        )
    texts = list(texts)
    if not texts:
        return np.zeros(0)
    model, tokenizer, options = reranker.model, reranker.tokenizer, reranker.options
    settings = saved_settings(model)
    if max_length is None:
        max_length = settings.get("max_length")
    if reranker.kind == "embedding":
        vectors = embed(model, tokenizer, [query, *texts], max_length=max_length, **options)
        vectors = vectors.astype(np.float64)
        norms = np.maximum(np.linalg.norm(vectors, axis=1), 1e-12)
        unit = vectors / norms[:, None]
        return unit[1:] @ unit[0]
    encoded = encode_examples(
        tokenizer,
        [query] * len(texts),
        texts,
        max_length=_max_length(model, max_length),
        truncation=truncation or settings.get("truncation", "head"),
    )
    logits = sequence_logits(model, encoded, tokenizer.pad_id, desc="rerank", **options)
    return pair_scores(logits)


@torch.inference_mode()
def rerank(
    reranker: Reranker,
    query: str,
    texts: Sequence[str],
    *,
    top_k: int | None = None,
    max_length: int | None = None,
    truncation: str | None = None,
) -> list[dict[str, Any]]:
    """``[{"index", "score"}]`` of ``texts`` for ``query``, the best first (ties: input order),
    at most ``top_k``; ``score`` is the raw score of :func:`score`."""
    scores = score(reranker, query, texts, max_length=max_length, truncation=truncation)
    order = np.argsort(-scores, kind="stable")[: top_k if top_k is not None else len(scores)]
    return [{"index": int(i), "score": float(scores[i])} for i in order]


__all__ = [
    "Reranker",
    "RerankerKind",
    "load_reranker",
    "pair_scores",
    "rerank",
    "reranker_kind",
    "score",
    "sigmoid",
]
