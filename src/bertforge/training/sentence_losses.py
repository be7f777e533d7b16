"""The losses of sentence-embedding training (``finetune --task embedding``) as small pure
functions of embeddings, and GradCache (:func:`cached_backward`), which gives a large batch's
exact gradient while the encoder sees only a mini-batch at a time.

- :func:`in_batch_negatives_loss`: each anchor against every positive (and hard negative) of the
  batch, cross-entropy of the scaled cosines towards its own positive (sentence-transformers'
  MultipleNegativesRankingLoss; ``symmetric`` adds the positives' view of the anchors, as its
  MultipleNegativesSymmetricRankingLoss). SimCSE is this loss with a text as its own positive,
  the two views differing by dropout.
- :func:`cosent_loss`: for scored pairs, ``log(1 + sum exp(s_i - s_j))`` over every two pairs
  whose gold order says ``s_j`` should beat ``s_i`` (Su 2022; sentence-transformers' CoSENTLoss).
- :func:`matryoshka_loss`: a loss summed over the embeddings cut to each of ``dims`` leading
  dimensions (Kusupati et al. 2022; sentence-transformers' MatryoshkaLoss, weights 1).

``scale`` multiplies the cosines: 20 is a softmax temperature of 0.05, the usual default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Loss = Literal["in_batch_negatives", "in_batch_symmetric", "cosent", "simcse"]
"""The losses ``--loss`` chooses from (``auto``: from the data)."""


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """(N, D) and (M, D) -> (N, M) cosine similarities."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def in_batch_negatives_loss(
    anchors: Tensor,
    positives: Tensor,
    negatives: Tensor | None = None,
    *,
    scale: float = 20.0,
    symmetric: bool = False,
) -> Tensor:
    """Mean cross-entropy of ``scale`` x cosine(anchor i, candidate j) towards j = i, the
    candidates being the (B, D) ``positives`` then the (B, D) hard ``negatives``; with
    ``symmetric`` the mean of that and the positives' loss over the anchors."""
    candidates = positives if negatives is None else torch.cat([positives, negatives])  # (C, D)
    target = torch.arange(anchors.shape[0], device=anchors.device)
    loss = F.cross_entropy(cosine_matrix(anchors, candidates) * scale, target)  # (B, C) scores
    if symmetric:
        backward = F.cross_entropy(cosine_matrix(positives, anchors) * scale, target)
        loss = (loss + backward) / 2
    return loss


def cosent_loss(a: Tensor, b: Tensor, scores: Tensor, *, scale: float = 20.0) -> Tensor:
    """CoSENT: ``log(1 + sum over (i, j) with scores[i] < scores[j] of exp(s_i - s_j))``, where
    ``s = scale x cosine(a, b)`` row by row."""
    s = F.cosine_similarity(a, b, dim=-1) * scale  # (B,)
    diff = s[:, None] - s[None, :]  # (B, B): s_i - s_j
    wrong_way = scores[:, None] < scores[None, :]  # (B, B): j should score above i
    terms = diff[wrong_way]
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


def matryoshka_loss(
    loss: Callable[..., Tensor], embeddings: Sequence[Tensor], dims: Sequence[int] | None
) -> Tensor:
    """``loss(*embeddings)`` summed over each of ``dims``, the embeddings cut to that many
    leading dimensions; the plain loss without ``dims``."""
    if not dims:
        return loss(*embeddings)
    return sum(loss(*(e[..., :d] for e in embeddings)) for d in dims)  # type: ignore[return-value]


def embedding_loss(
    kind: str,
    embeddings: Sequence[Tensor],
    scores: Tensor | None = None,
    *,
    scale: float = 20.0,
    dims: Sequence[int] | None = None,
) -> Tensor:
    """The loss ``kind`` (:data:`Loss`) of one batch's embedded columns: (anchors, positives[,
    negatives]) for in-batch negatives, both views of each text for simcse, the two sides of each
    pair with their ``scores`` for cosent; over the Matryoshka ``dims`` when given."""
    if kind == "cosent":
        assert scores is not None, "cosent needs scores"
        return matryoshka_loss(
            lambda a, b: cosent_loss(a, b, scores, scale=scale), embeddings, dims
        )
    symmetric = kind == "in_batch_symmetric"

    def ranking(*columns: Tensor) -> Tensor:
        return in_batch_negatives_loss(*columns, scale=scale, symmetric=symmetric)

    return matryoshka_loss(ranking, embeddings, dims)


def _rng_state() -> tuple[Tensor, Tensor | None]:
    """The CPU generator's state and the current CUDA device's (dropout masks draw from it)."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


@contextlib.contextmanager
def _replaying(state: tuple[Tensor, Tensor | None]) -> Iterator[None]:
    """Run the block from the RNG ``state``, the generators going on afterwards as before it."""
    cpu, cuda = state
    devices = [torch.cuda.current_device()] if cuda is not None else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)
        yield


def cached_backward(
    embed: Callable[[int, int], Tensor],
    columns: int,
    parts: int,
    loss_of: Callable[[list[Tensor]], Tensor],
) -> Tensor:
    """GradCache (Gao et al. 2021; sentence-transformers' CachedMultipleNegativesRankingLoss):
    the gradient of ``loss_of(embeddings)`` with respect to the encoder, the encoder running on
    one mini-batch at a time. ``embed(c, m)`` embeds mini-batch ``m`` (of ``parts``) of column
    ``c`` (of ``columns``); ``loss_of`` takes the list of each column's (B, D) embeddings.

    1. embed every mini-batch without a graph, keeping the RNG state it started from;
    2. compute the loss on those embeddings and its gradient with respect to them (the cache);
    3. embed every mini-batch again from its saved RNG state (the same dropout masks) with a
       graph, and back-propagate its slice of the cached gradient through it.
    Peak activation memory is a mini-batch's; the parameter gradients equal the plain loss's.
    Returns the (detached) loss."""
    states: list[list[tuple[Tensor, Tensor | None]]] = []
    cached: list[list[Tensor]] = []
    with torch.no_grad():
        for c in range(columns):
            states.append([])
            cached.append([])
            for m in range(parts):
                states[c].append(_rng_state())
                cached[c].append(embed(c, m))
    leaves = [torch.cat(chunks).detach().requires_grad_() for chunks in cached]  # (B, D) each
    loss = loss_of(leaves)
    loss.backward()
    for c in range(columns):
        start = 0
        for m in range(parts):
            rows = cached[c][m].shape[0]
            with _replaying(states[c][m]):
                out = embed(c, m)
            grad = leaves[c].grad[start : start + rows]  # type: ignore[index]
            out.backward(grad.to(out.dtype))
            start += rows
    return loss.detach()


__all__ = [
    "Loss",
    "cached_backward",
    "cosent_loss",
    "cosine_matrix",
    "embedding_loss",
    "in_batch_negatives_loss",
    "matryoshka_loss",
]
