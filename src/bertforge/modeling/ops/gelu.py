""":func:`dense_activation`: the feed-forward's product, bias and GELU, the bias and GELU one C
pass forward and one backward in fp32 training (``csrc/gelu.c``, :class:`BiasGelu`);
:func:`gated_activation`: ModernBERT's GeGLU, act(first half) x second half, with exact GELU one
C pass each way on fp32 CPU rows (:class:`GeGLU`); :func:`activation`: BERT's ``hidden_act``, in
place in inference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge.modeling.kernels import (
    bias_gelu_kernels,
    geglu_kernels,
)
from bertforge.modeling.ops.buffers import scratch
from bertforge.modeling.ops.common import _fp32_cpu, autograd_free
from bertforge.modeling.ops.products import gemm, onednn_inference, onednn_linear


def activation(name: str, x: Tensor, inplace: bool = False) -> Tensor:
    """BERT's ``hidden_act`` of ``x``; ``inplace`` overwrites ``x`` (inference: no new buffer)."""
    if name in ("gelu", "gelu_new", "gelu_pytorch_tanh"):  # "gelu": BERT's exact, erf-based one
        approximate = "none" if name == "gelu" else "tanh"
        if inplace:
            return torch.ops.aten.gelu_(x, approximate=approximate)
        return F.gelu(x, approximate=approximate)
    return torch.relu_(x) if inplace else F.relu(x)


def dense_activation(x: Tensor, dense: nn.Linear, name: str) -> Tensor:
    """``activation(name, dense(x))``: the feed-forward's first half. When training in fp32 on
    the CPU with BERT's exact GELU, the product runs without its bias and :class:`BiasGelu`
    adds it inside one C pass forward and one backward (the bias gradient included); in
    inference (no autograd) the activation overwrites the product, or with exact GELU where
    :func:`onednn_inference` says so, oneDNN applies it in the product's call."""
    w, b = dense.weight, dense.bias
    kernels = None
    if (
        name == "gelu"
        and b is not None
        and torch.is_grad_enabled()
        and _fp32_cpu(x, w, b)
        and (
            not torch.is_autocast_enabled("cpu")  # else the product comes out in bf16
        )
    ):
        kernels = bias_gelu_kernels()
    if kernels is None or x.numel() == 0:
        if name == "gelu" and onednn_inference(x, w, b):
            return onednn_linear(x, w, b, "gelu")
        h = F.linear(x, w, b)
        return activation(name, h, inplace=autograd_free(h))
    return BiasGelu.apply(x.reshape(-1, x.shape[-1]), w, b, kernels).view(*x.shape[:-1], -1)


class BiasGelu(torch.autograd.Function):
    """``gelu(x @ weight.T + bias)`` (exact GELU) over (n, in) rows: the bias-free product, then
    bias and GELU in one pass of the C kernels of
    :func:`bertforge.modeling.kernels.bias_gelu_kernels`. Keeps the product (the sum is
    recomputed in the backward's single pass, which also sums the bias gradient); the product
    and the activation are :func:`scratch` buffers (one pair per layer, reused each step)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, kernels: Any) -> Tensor:
        shape = (x.shape[0], weight.shape[0])
        h = gemm(x, weight, out=scratch("intermediate.in", shape, x.dtype, x.device))  # (n, I)
        ctx.save_for_backward(x, weight, h, bias)
        ctx.backward_kernel = kernels[1]
        return kernels[0](h, bias, scratch("intermediate.out", shape, x.dtype, x.device))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        x, weight, h, bias = ctx.saved_tensors
        into = scratch("intermediate.grad", h.shape, h.dtype, h.device)  # layers take turns
        grad_h, grad_bias = ctx.backward_kernel(grad.contiguous(), h, bias, into)
        return gemm(grad_h, weight.t()), grad_h.t().mm(x), grad_bias, None


def gated_activation(h: Tensor, name: str) -> Tensor:
    """``activation(name, a) * g`` of the halves ``a``, ``g`` of ``h`` (..., 2I) -> (..., I):
    ModernBERT's GeGLU. With exact GELU on fp32 CPU rows (no autocast), :class:`GeGLU`: one C
    pass forward, one backward, and only ``h`` kept for the backward (torch keeps ``gelu(a)``
    too, an extra (n, I) per layer); else the torch form."""
    kernels = None
    if name == "gelu" and _fp32_cpu(h) and not torch.is_autocast_enabled("cpu"):
        kernels = geglu_kernels()
    if kernels is None or h.numel() == 0:
        a, g = h.chunk(2, dim=-1)  # (..., I) each
        return activation(name, a) * g
    rows = h.reshape(-1, h.shape[-1]).contiguous()  # (n, 2I)
    return GeGLU.apply(rows, kernels).view(*h.shape[:-1], -1)


class GeGLU(torch.autograd.Function):
    """``gelu(a) * g`` (exact GELU) of the halves of contiguous fp32 (n, 2I) rows ``h = [a | g]``
    through the C kernels of :func:`bertforge.modeling.kernels.geglu_kernels`; saves ``h`` only
    and recomputes ``gelu(a)`` in the backward's single pass, which writes ``h``'s gradient
    whole (no concatenation of the halves' gradients)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, kernels: Any) -> Tensor:
        ctx.save_for_backward(h)
        ctx.backward_kernel = kernels[1]
        return kernels[0](h)  # (n, I)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (h,) = ctx.saved_tensors
        return ctx.backward_kernel(grad.contiguous(), h), None


__all__ = ["activation", "dense_activation", "gated_activation", "BiasGelu", "GeGLU"]
