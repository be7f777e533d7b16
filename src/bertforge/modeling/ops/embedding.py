""":func:`word_embedding`: the word lookup, and the weight for a tied decoder whose gradient
then sums with the lookup's in one buffer (:class:`WordEmbedding`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertforge.modeling.ops.buffers import scratch
from bertforge.modeling.ops.common import cpu_tuned


def word_embedding(ids: Tensor, weight: Tensor, padding_idx: int | None) -> tuple[Tensor, Tensor]:
    """``(F.embedding(ids, weight, padding_idx), weight)``: the word vectors, and the weight for
    a decoder tied to it. When training on the CPU both come from :class:`WordEmbedding`, and a
    tied decoder that takes the second gets its weight gradient summed with the lookup's in
    one buffer (the :class:`DecoderLinear` head, ``masked_lm``)."""
    training = weight.requires_grad and torch.is_grad_enabled()
    if training and cpu_tuned(ids, weight) and not torch.compiler.is_compiling():
        return WordEmbedding.apply(ids, weight, padding_idx)
    return F.embedding(ids, weight, padding_idx), weight


class WordEmbedding(torch.autograd.Function):
    """The word lookup, returning the weight too (a view of it) for a tied decoder. The
    decoder's weight gradient reaches this backward as the second output's; the lookup's rows
    are added into it in place and the sum goes to the weight as one gradient. Through autograd
    the two would each be a fresh 30k x H tensor a step (a zero-filled one for the lookup) plus
    a third pass to add them: ~9 ms of page faults and passes in the mini fp32 step (AMD EPYC
    Zen 4). Without a decoder gradient the rows go into a zeroed :func:`scratch` buffer. The
    row of ``padding_idx`` gets no gradient from the lookup, as in ``nn.Embedding``."""

    @staticmethod
    def forward(
        ctx: Any, ids: Tensor, weight: Tensor, padding_idx: int | None
    ) -> tuple[Tensor, Tensor]:
        flat = ids.reshape(-1)
        ctx.save_for_backward(flat)
        ctx.shape, ctx.padding_idx = weight.shape, padding_idx
        ctx.set_materialize_grads(False)
        out = weight.new_empty(*ids.shape, weight.shape[1])  # not a view: callers add into it
        torch.index_select(weight, 0, flat, out=out.view(-1, weight.shape[1]))
        return out, weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, grad_weight: Tensor | None) -> tuple:
        (flat,) = ctx.saved_tensors
        if grad_weight is None:
            dtype = torch.float32 if grad is None else grad.dtype
            out = scratch("embedding.grad", ctx.shape, dtype, flat.device)
            out.zero_()
        else:  # the decoder's gradient, this backward's alone: the rows are added in place
            out = grad_weight.contiguous()
        if grad is not None:
            rows = grad.reshape(-1, ctx.shape[1])
            if ctx.padding_idx is not None:
                real = flat != ctx.padding_idx
                flat, rows = flat[real], rows[real]
            out.index_add_(0, flat, rows.to(out.dtype))
        return None, out, None


__all__ = ["word_embedding", "WordEmbedding"]
