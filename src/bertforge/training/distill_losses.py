"""The losses of knowledge distillation (``bertforge distill``), each a small module whose
``forward`` returns *named* terms, the math below them in pure functions tested against
hand-computed values (``tests/test_distill_losses.py``).

Output losses (what the student's head says against what the teacher's says):

- :class:`LogitsLoss`: classification's soft targets, ``T^2 KL(softmax(t/T) || softmax(s/T))``
  (Hinton et al. 2015: the ``T^2`` keeps the soft term's gradient the same size whatever the
  temperature), beside the gold labels' cross-entropy, mixed by ``alpha``; token
  classification is the same loss over the labelled tokens; regression is the MSE to the
  teacher's prediction beside the MSE to the gold target.
- :class:`SpanLoss`: question answering, the soft-target KL of the start and of the end
  distributions over each window's real tokens, beside the gold spans' cross-entropy.
- :class:`EmbeddingLoss`: an embedding model, the MSE to the teacher's vectors (through a fixed
  PCA projection of them where the widths differ, :func:`pca_projection`) and, optionally, the
  MSE between the two models' in-batch cosine matrices.

Intermediate losses (inside the encoders, on a layer map from student to teacher layers,
:func:`uniform_layer_map`; the same tokenizer on both sides, so that positions align):

- :class:`HiddenStateLoss`: TinyBERT's MSE between hidden states through a learned projection
  of the student's width to the teacher's.
- :class:`AttentionLoss`: the KL between the two models' attention distributions, head by head
  (the head counts must agree).
- :class:`RelationLoss`: MiniLM-v2's self-attention relations: queries, keys and values each
  split into the same number of relation heads on both sides, their scaled dot-product softmax
  compared by KL: any head counts and widths.

A term is a mean over its unit (rows, labelled tokens, real tokens); :func:`combine` weighs and
sums a module's terms into the loss the step backpropagates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

# ---- pure functions -------------------------------------------------------------------------


def _wide(x: Tensor) -> Tensor:
    """``x`` in float32 at least (bf16 logits of autocast widened; float64 kept)."""
    return x if x.dtype == torch.float64 else x.float()


def soft_target_kl(
    student_logits: Tensor, teacher_logits: Tensor, temperature: float, mask: Tensor | None = None
) -> Tensor:
    """``T^2 x`` the mean over rows of ``KL(softmax(teacher / T) || softmax(student / T))`` for
    (..., C) logits; ``mask`` (...) keeps the rows where it is True (a padded position of a
    distribution is set to a large negative logit by the caller, not masked here)."""
    s = _wide(student_logits).reshape(-1, student_logits.shape[-1])  # (N, C)
    t = _wide(teacher_logits).reshape(-1, teacher_logits.shape[-1])  # (N, C)
    if mask is not None:
        keep = mask.reshape(-1)
        s, t = s[keep], t[keep]
    log_p_s = F.log_softmax(s / temperature, dim=-1)
    log_p_t = F.log_softmax(t / temperature, dim=-1)
    # p_t (log p_t - log p_s): a masked position (p_t = 0, both logs finite) adds 0
    kl = F.kl_div(log_p_s, log_p_t, reduction="none", log_target=True).sum(-1)  # (N,)
    return kl.mean() * temperature**2


def masked_logits(logits: Tensor, attention_mask: Tensor) -> Tensor:
    """(B, T) position scores with the padded positions at the dtype's lowest value: a
    distribution over each sequence's real tokens (question answering's start and end)."""
    return logits.float().masked_fill(attention_mask == 0, torch.finfo(torch.float32).min)


def token_mse(student: Tensor, teacher: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean over the real tokens (``mask`` (B, T), or every row) of the mean squared difference
    of (B, T, H) states: TinyBERT's hidden-state loss after the projection."""
    diff = (student.float() - teacher.float()).square().mean(-1)  # (B, T)
    if mask is None:
        return diff.mean()
    keep = mask.to(diff.dtype)
    return (diff * keep).sum() / keep.sum().clamp(min=1.0)


def distribution_kl(student_probs: Tensor, teacher_probs: Tensor, mask: Tensor) -> Tensor:
    """KL(teacher || student) of (B, nh, T, T) attention (or relation) distributions, each row a
    distribution over keys, averaged over heads and the real query tokens of ``mask`` (B, T)."""
    p_t = teacher_probs.float()
    log_p_s = student_probs.float().clamp(min=1e-12).log()
    kl = (torch.xlogy(p_t, p_t) - p_t * log_p_s).sum(-1).mean(1)  # (B, T): over keys, heads
    keep = mask.to(kl.dtype)
    return (kl * keep).sum() / keep.sum().clamp(min=1.0)


def self_relations(vectors: Tensor, mask: Tensor, heads: int) -> Tensor:
    """MiniLM-v2's self-attention relation of (B, T, D) query, key or value vectors: split into
    ``heads`` relation heads of D / heads each, ``softmax(v v^T / sqrt(D / heads))`` over the real
    keys of ``mask`` (B, T) -> (B, heads, T, T)."""
    B, T, D = vectors.shape
    if D % heads:
        raise ValueError(f"width {D} does not split into {heads} relation heads")
    d = D // heads
    v = vectors.float().view(B, T, heads, d).transpose(1, 2)  # (B, heads, T, d)
    scores = v @ v.transpose(-2, -1) / math.sqrt(d)  # (B, heads, T, T)
    keys = mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    return scores.masked_fill(~keys, torch.finfo(scores.dtype).min).softmax(-1)


def cosine_matrix_mse(student: Tensor, teacher: Tensor) -> Tensor:
    """MSE between the (B, B) in-batch cosine matrices of (B, Ds) and (B, Dt) vectors: the two
    models should find the same texts alike (any widths)."""
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.float(), dim=-1)
    return F.mse_loss(s @ s.T, t @ t.T)


def pca_projection(vectors: np.ndarray, dim: int) -> np.ndarray:
    """The (dim, D) top ``dim`` principal directions of (N, D) ``vectors`` (centred for the fit,
    signs fixed so each direction's largest entry is positive): ``vectors @ P.T`` keeps most of
    their variance in ``dim`` numbers. sentence-transformers' model-distillation example
    (``examples/training/distillation/model_distillation.py``) fits a PCA on 25,000 teacher
    vectors and appends a bias-free Dense layer holding its components to the *teacher*, fixed,
    so that a narrower student learns the projected vectors; this is that projection."""
    x = np.asarray(vectors, dtype=np.float64)
    if dim > x.shape[1]:
        raise ValueError(f"cannot project {x.shape[1]} dimensions onto {dim}")
    if x.shape[0] < dim:
        raise ValueError(f"{x.shape[0]} vectors are too few for {dim} principal directions")
    _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)  # (min(N, D), D)
    p = vt[:dim]
    signs = np.sign(p[np.arange(dim), np.abs(p).argmax(1)])
    return (p * signs[:, None]).astype(np.float32)


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """``(student layer, teacher layer)`` pairs, 0-based: the student's layer ``i`` learns from
    the teacher's layer ``(i + 1) x teacher / student - 1``, so the last layers meet (TinyBERT's
    uniform strategy)."""
    if not 0 < student_layers <= teacher_layers:
        raise ValueError(f"a {student_layers}-layer student of a {teacher_layers}-layer teacher")
    step = teacher_layers // student_layers
    return [
        (i, (i + 1) * step - 1 + teacher_layers % student_layers) for i in range(student_layers)
    ]


def combine(terms: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """The loss the step backpropagates: the weighted sum of the named ``terms`` (a term absent
    from a batch, e.g. the gold loss of unlabelled text, adds nothing)."""
    total = [weights[name] * value for name, value in terms.items() if weights.get(name, 0.0)]
    if not total:
        raise ValueError(f"no weighted term among {sorted(terms)}")
    return torch.stack(total).sum()


# ---- the loss modules -----------------------------------------------------------------------


class DistillLoss(nn.Module):
    """A loss module: ``forward`` returns its named terms, :attr:`weights` how :meth:`loss` sums
    them."""

    @property
    def weights(self) -> dict[str, float]:
        raise NotImplementedError

    def loss(self, terms: dict[str, Tensor]) -> Tensor:
        return combine(terms, self.weights)


class LogitsLoss(DistillLoss):
    """A sequence (or token) classifier's or a regressor's output loss, named terms ``soft``
    (against the teacher) and ``hard`` (against the gold labels, where a row has one)."""

    def __init__(self, regression: bool, alpha: float, temperature: float) -> None:
        super().__init__()
        self.regression, self.alpha, self.temperature = regression, alpha, temperature

    @property
    def weights(self) -> dict[str, float]:
        """``soft`` weighs ``alpha``, ``hard`` ``1 - alpha``; a batch with no gold label trains on
        ``soft`` alone (weight 1)."""
        return {"soft": self.alpha, "hard": 1.0 - self.alpha}

    def forward(
        self,
        student: Tensor,
        teacher: Tensor,
        labels: Tensor | None = None,
        labelled: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """(N, C) logits (regression: (N, 1) or (N,) predictions); ``labels`` (N,) with
        ``labelled`` (N,) True where a row's label is gold (transfer text has none)."""
        if self.regression:
            s, t = student.float().reshape(-1), teacher.float().reshape(-1)
            terms = {"soft": F.mse_loss(s, t)}
        else:
            terms = {"soft": soft_target_kl(student, teacher, self.temperature)}
        if labels is not None and (labelled is None or bool(labelled.any())):
            keep = slice(None) if labelled is None else labelled
            if self.regression:
                hard = F.mse_loss(student.float().reshape(-1)[keep], labels.float()[keep])
            else:
                hard = F.cross_entropy(student.float()[keep], labels[keep])
            terms["hard"] = hard
        return terms

    def loss(self, terms: dict[str, Tensor]) -> Tensor:
        return terms["soft"] if "hard" not in terms else combine(terms, self.weights)


class SpanLoss(DistillLoss):
    """Question answering: the soft-target KL of the start and the end distributions (each over
    a window's real tokens), named ``soft``, and the gold spans' cross-entropy, ``hard``."""

    def __init__(self, alpha: float, temperature: float) -> None:
        super().__init__()
        self.alpha, self.temperature = alpha, temperature

    @property
    def weights(self) -> dict[str, float]:
        return {"soft": self.alpha, "hard": 1.0 - self.alpha}

    def forward(
        self,
        student: tuple[Tensor, Tensor],
        teacher: tuple[Tensor, Tensor],
        attention_mask: Tensor,
        positions: tuple[Tensor, Tensor] | None = None,
    ) -> dict[str, Tensor]:
        """``(start, end)`` (B, T) scores of each model; gold ``(start, end)`` (B,) positions."""
        kl = [
            soft_target_kl(
                masked_logits(s, attention_mask), masked_logits(t, attention_mask), self.temperature
            )
            for s, t in zip(student, teacher, strict=True)
        ]
        terms = {"soft": (kl[0] + kl[1]) / 2}
        if positions is not None:  # transfer text has no gold span
            ce = [
                F.cross_entropy(masked_logits(s, attention_mask), p)
                for s, p in zip(student, positions, strict=True)
            ]
            terms["hard"] = (ce[0] + ce[1]) / 2
        return terms

    def loss(self, terms: dict[str, Tensor]) -> Tensor:
        return terms["soft"] if "hard" not in terms else combine(terms, self.weights)


class EmbeddingLoss(DistillLoss):
    """An embedding model's loss: ``mse`` between the student's vectors and the teacher's (their
    PCA projection where the widths differ: ``projection`` (Ds, Dt)), and with
    ``cosine_weight`` the ``cosine`` term (:func:`cosine_matrix_mse`). ``normalize``: both
    sides at unit length first (a model saved with a Normalize module)."""

    def __init__(
        self,
        cosine_weight: float = 0.0,
        projection: np.ndarray | None = None,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        self.cosine_weight, self.normalize = cosine_weight, normalize
        self.register_buffer(
            "projection", None if projection is None else torch.as_tensor(projection)
        )

    @property
    def weights(self) -> dict[str, float]:
        return {"mse": 1.0, "cosine": self.cosine_weight}

    def target(self, teacher: Tensor) -> Tensor:
        """The teacher's (B, Dt) vectors as the student learns them: (B, Ds)."""
        teacher = teacher.float()
        target = teacher if self.projection is None else teacher @ self.projection.T
        return F.normalize(target, dim=-1) if self.normalize else target

    def forward(self, student: Tensor, teacher: Tensor) -> dict[str, Tensor]:
        """(B, Ds) student vectors (pooled, not yet normalised), (B, Dt) teacher vectors."""
        student = F.normalize(student.float(), dim=-1) if self.normalize else student.float()
        terms = {"mse": F.mse_loss(student, self.target(teacher))}
        if self.cosine_weight:
            terms["cosine"] = cosine_matrix_mse(student, teacher)
        return terms


class HiddenStateLoss(DistillLoss):
    """TinyBERT's hidden-state loss, named ``hidden``: the student's states at each mapped layer
    through one learned linear projection to the teacher's width, their MSE to the teacher's
    states at its layer, averaged over the map."""

    def __init__(
        self,
        student_width: int,
        teacher_width: int,
        layer_map: Sequence[tuple[int, int]],
        weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.layer_map, self.weight = list(layer_map), weight
        self.projection = nn.Linear(student_width, teacher_width)
        if student_width == teacher_width:  # start as the identity: same-width states align
            with torch.no_grad():
                self.projection.weight.copy_(torch.eye(student_width))
                self.projection.bias.zero_()

    @property
    def weights(self) -> dict[str, float]:
        return {"hidden": self.weight}

    def forward(
        self, student: Sequence[Tensor], teacher: Sequence[Tensor], mask: Tensor
    ) -> dict[str, Tensor]:
        """Each model's (B, T, H) layer outputs by layer index, ``mask`` (B, T) the real tokens."""
        losses = [
            token_mse(self.projection(student[s].float()), teacher[t], mask)
            for s, t in self.layer_map
        ]
        return {"hidden": torch.stack(losses).mean()}


class AttentionLoss(DistillLoss):
    """The KL between the attention distributions of each mapped pair of layers (TinyBERT uses
    their MSE, MiniLM-v1 this KL), named ``attention``; both models need the same head count
    (else :class:`RelationLoss`)."""

    def __init__(self, layer_map: Sequence[tuple[int, int]], weight: float = 1.0) -> None:
        super().__init__()
        self.layer_map, self.weight = list(layer_map), weight

    @property
    def weights(self) -> dict[str, float]:
        return {"attention": self.weight}

    def forward(
        self, student: Sequence[Tensor], teacher: Sequence[Tensor], mask: Tensor
    ) -> dict[str, Tensor]:
        """Each model's (B, nh, T, T) attention probabilities by layer index."""
        losses = []
        for s, t in self.layer_map:
            if student[s].shape[1] != teacher[t].shape[1]:
                raise ValueError(
                    f"attention KL needs the same head count ({student[s].shape[1]} against "
                    f"{teacher[t].shape[1]}); use the relation loss for differing heads"
                )
            losses.append(distribution_kl(student[s], teacher[t], mask))
        return {"attention": torch.stack(losses).mean()}


class RelationLoss(DistillLoss):
    """MiniLM-v2's multi-head self-attention relation transfer, named ``relation``: for each
    mapped pair of layers, the query-query, key-key and value-value relations
    (:func:`self_relations`, ``heads`` relation heads on both sides, whatever each model's own
    head count) compared by KL, averaged."""

    def __init__(
        self, layer_map: Sequence[tuple[int, int]], heads: int, weight: float = 1.0
    ) -> None:
        super().__init__()
        self.layer_map, self.heads, self.weight = list(layer_map), heads, weight

    @property
    def weights(self) -> dict[str, float]:
        return {"relation": self.weight}

    def forward(
        self,
        student: Sequence[tuple[Tensor, Tensor, Tensor]],
        teacher: Sequence[tuple[Tensor, Tensor, Tensor]],
        mask: Tensor,
    ) -> dict[str, Tensor]:
        """Each model's (q, k, v) (B, T, H) vectors by layer index."""
        losses = [
            distribution_kl(
                self_relations(sv, mask, self.heads), self_relations(tv, mask, self.heads), mask
            )
            for s, t in self.layer_map
            for sv, tv in zip(student[s], teacher[t], strict=True)
        ]
        return {"relation": torch.stack(losses).mean()}


__all__ = [
    "AttentionLoss",
    "DistillLoss",
    "EmbeddingLoss",
    "HiddenStateLoss",
    "LogitsLoss",
    "RelationLoss",
    "SpanLoss",
    "combine",
    "cosine_matrix_mse",
    "distribution_kl",
    "masked_logits",
    "pca_projection",
    "self_relations",
    "soft_target_kl",
    "token_mse",
    "uniform_layer_map",
]
