""":func:`dense_dropout_norm`: the end of each post-LN block, dense + bias + dropout + residual
add + LayerNorm, one C pass forward and one backward in fp32 training (``csrc/layer_norm.c``,
:class:`AddNorm`), else torch ops.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from bertforge.modeling.kernels import (
    add_norm_kernels,
)
from bertforge.modeling.ops.common import _fp32_cpu, _seed
from bertforge.modeling.ops.products import ScratchLinear
from bertforge.modeling.ops.seeded_dropout import dropout


def dense_dropout_norm(
    x: Tensor, dense: nn.Linear, residual: Tensor, norm: nn.LayerNorm, p: float, training: bool
) -> Tensor:
    """``norm(dropout(dense(x), p, training) + residual)``: the end of BERT's post-LN blocks,
    ``x`` (.., in) and ``residual`` (.., H) with the same leading dimensions; the result has the
    shape of ``residual``.

    fp32 on the CPU: the product runs without its bias, and the C kernels of
    :func:`bertforge.modeling.kernels.add_norm_kernels` add the bias, drop, add the residual and
    normalise in one pass, and compute every gradient of those in one pass back (:class:`AddNorm`);
    else ``dense``, :func:`dropout`, an in-place add and ``norm`` (a different dropout mask, the
    same distribution)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability has to be in [0, 1) here, but got {p}")
    p = p if training else 0.0
    w, b = dense.weight, dense.bias
    kernels = add_norm_kernels() if _add_norm_takes(x, w, b, residual, norm) else None
    if kernels is None:
        h = dropout(dense(x), p, True)  # a new tensor autograd keeps nothing of: add in place
        h = h.add_(residual) if h.dtype == residual.dtype else h + residual
        return norm(h)
    # (rows, H): a new tensor, not a view (AddNorm writes over it); x's gradient is consumed by
    # the op before (attention, GELU) and goes into a reused buffer
    y = ScratchLinear.apply(x.reshape(-1, x.shape[-1]), w, None, None, "dense.grad_input")
    res = residual.reshape(y.shape)
    out, _ = AddNorm.apply(y, b, res, norm.weight, norm.bias, p, norm.eps, kernels)
    return out.view(residual.shape)


def _add_norm_takes(
    x: Tensor, w: Tensor, b: Tensor | None, residual: Tensor, norm: nn.LayerNorm
) -> bool:
    H = residual.shape[-1]
    if norm.weight is None or norm.bias is None or norm.normalized_shape != (H,):
        return False
    if x.shape[:-1] != residual.shape[:-1] or w.shape[0] != H or residual.numel() == 0:
        return False
    if torch.is_autocast_enabled("cpu"):  # the product would come out in bf16
        return False
    tensors = [x, w, residual, norm.weight, norm.bias] + ([] if b is None else [b])
    return H <= 16384 and _fp32_cpu(*tensors)


class AddNorm(torch.autograd.Function):
    """LayerNorm(dropout(y + bias) + residual) through the C kernels on (n, H) rows, ``bias``
    optional. Returns ``(out, h)``: the pre-norm sum h is written over ``y`` (a non-view tensor,
    marked dirty so that autograd refuses a graph that still needed the old ``y``) and kept for
    the backward with one mean and 1/std per row; the dropout mask is recomputed from its
    seed."""

    @staticmethod
    def forward(
        ctx: Any,
        y: Tensor,
        bias: Tensor | None,
        residual: Tensor,
        weight: Tensor,
        norm_bias: Tensor,
        p: float,
        eps: float,
        kernels: Any,
    ) -> tuple[Tensor, Tensor]:
        seed = _seed() if p > 0 else 0
        res = residual.contiguous()
        out, mean, rstd = kernels[0](y, bias, res, weight, norm_bias, eps, seed, p)
        ctx.mark_dirty(y)
        ctx.save_for_backward(y, mean, rstd, weight)
        ctx.seed, ctx.p, ctx.with_bias, ctx.backward_kernel = seed, p, bias is not None, kernels[1]
        ctx.set_materialize_grads(False)
        return out, y

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor | None, grad_sum: Tensor | None) -> tuple:
        h, mean, rstd, weight = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(h)
        extra = None if grad_sum is None else grad_sum.contiguous()  # the sum was used too
        grads = ctx.backward_kernel(
            grad_out.contiguous(), h, mean, rstd, weight, ctx.seed, ctx.p, extra, ctx.with_bias
        )
        grad_h, grad_y, grad_weight, grad_norm_bias, grad_bias = grads
        return grad_y, grad_bias, grad_h, grad_weight, grad_norm_bias, None, None, None


def residual_norm(
    y: Tensor, dense: nn.Linear, residual: Tensor, norm: nn.LayerNorm, p: float, training: bool
) -> tuple[Tensor, Tensor]:
    """``(norm(s), s)`` with ``s = residual + dropout(dense(y), p)``: the end of a pre-norm
    block (ModernBERT's), whose sum goes on as the residual stream and whose normalised sum is
    the next block's input. ``y`` (n, in), ``residual`` (n, H) rows; ``dense`` and ``norm``
    with or without biases.

    fp32 training on the CPU: the bias-free product, then :class:`AddNorm`'s C kernels for the
    bias, dropout, sum and LayerNorm in one pass (both outputs), and all their gradients in one
    pass back; else torch ops (a different dropout mask, the same distribution)."""
    p = p if training else 0.0
    w, b = dense.weight, dense.bias
    beta = norm.bias if norm.bias is not None else None
    takes = (
        torch.is_grad_enabled()
        and y.dim() == 2
        and residual.shape == (y.shape[0], w.shape[0])
        and norm.weight is not None
        and residual.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and _fp32_cpu(y, w, residual, norm.weight)
    )
    kernels = add_norm_kernels() if takes else None
    if kernels is None:
        s = residual + dropout(dense(y), p, True)
        return norm(s), s
    if beta is None:  # a bias-free LayerNorm: the kernel adds zeros (their gradient is unused)
        beta = torch.zeros_like(norm.weight)
    h = ScratchLinear.apply(y, w, None, None, "dense.grad_input")  # (n, H), a new tensor
    return AddNorm.apply(h, b, residual, norm.weight, beta, p, norm.eps, kernels)


__all__ = ["dense_dropout_norm", "residual_norm", "AddNorm"]
