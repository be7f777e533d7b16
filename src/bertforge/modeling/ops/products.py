"""The matrix products: :func:`gemm`, the fp32 training products, in oneDNN on AMD CPUs
(``BERTFORGE_GEMM``); :func:`onednn_linear`, an inference product with its bias and GELU or
residual sum in one oneDNN call (AMD CPUs with AVX-512, :func:`onednn_inference`);
:func:`linear` / :class:`ScratchLinear`, a product whose output or input gradient is a
:func:`~bertforge.modeling.ops.buffers.scratch` buffer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertforge.modeling.kernels import (
    gemm_library,
    onednn_for_inference,
)
from bertforge.modeling.ops.buffers import scratch
from bertforge.modeling.ops.common import _fp32_cpu, cpu_tuned


def gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """``a @ b.T (+ bias)`` for 2-D fp32 CPU tensors (transposed views welcome): in oneDNN where
    :func:`~bertforge.modeling.kernels.gemm_library` picks it (a new tensor; ``out`` unused),
    else ``torch.mm``/``torch.addmm`` into ``out`` when given."""
    if gemm_library() == "onednn" and a.device.type == "cpu":
        return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")
    if bias is None:
        return torch.mm(a, b.t()) if out is None else torch.mm(a, b.t(), out=out)
    return torch.addmm(bias, a, b.t()) if out is None else torch.addmm(bias, a, b.t(), out=out)


def onednn_inference(*tensors: Tensor | None) -> bool:
    """Whether an inference product of these tensors runs in oneDNN (:func:`onednn_linear`):
    no gradient recorded, fp32 CPU tensors outside autocast, and
    :func:`~bertforge.modeling.kernels.onednn_for_inference` (AMD CPUs with AVX-512)."""
    if torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return False
    present = [t for t in tensors if t is not None]
    return _fp32_cpu(*present) and present[0].numel() > 0 and onednn_for_inference()


def onednn_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, post: str = "none", add: Tensor | None = None
) -> Tensor:
    """``F.linear(x, weight, bias)`` in one oneDNN call, followed by BERT's exact GELU
    (``post="gelu"``) or plus ``add`` (shaped as the output) in the same pass over the output:
    the layers' products in inference on AMD CPUs with AVX-512, where oneDNN runs them 10-25%
    faster than MKL with GELU or the residual sum fused (see
    :func:`onednn_inference`)."""
    flat = x.reshape(-1, x.shape[-1])
    if add is not None:
        other = add.reshape(flat.shape[0], weight.shape[0])
        y = torch.ops.mkldnn._linear_pointwise.binary(flat, other, weight, bias, "add")
    else:
        y = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, post, [], "none")
    return y.view(*x.shape[:-1], weight.shape[0])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, name: str | None) -> Tensor:
    """``F.linear(x, weight, bias)``; when training in fp32 on the CPU, through
    :class:`ScratchLinear` (the products in :func:`gemm`), its output in the :func:`scratch`
    buffer ``name`` (None: a new tensor); in inference, in oneDNN where
    :func:`onednn_inference` says so (with a bias)."""
    if bias is not None and onednn_inference(x, weight, bias):
        return onednn_linear(x, weight, bias)
    given = [t for t in (x, weight, bias) if t is not None]
    fp32 = all(t.dtype == torch.float32 for t in given)
    tuned = fp32 and cpu_tuned(*given) and not torch.is_autocast_enabled("cpu")
    if not (torch.is_grad_enabled() and tuned) or x.numel() == 0:
        return F.linear(x, weight, bias)
    if torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    return ScratchLinear.apply(flat, weight, bias, name, None).view(*x.shape[:-1], -1)


class ScratchLinear(torch.autograd.Function):
    """``F.linear`` on (n, in) rows, ``bias`` optional, with its output in the :func:`scratch`
    buffer ``name`` (None: a new tensor) and its input's gradient in the buffer ``grad_name``
    (None: a new tensor). For the activations and gradients a layer makes and the next op
    consumes: the attention's q/k/v projection (12 MB of fresh pages a layer in the mini step
    otherwise), the feed-forward's input gradient (16 MB)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        name: str | None,
        grad_name: str | None,
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.with_bias, ctx.grad_name = bias is not None, grad_name
        shape = (x.shape[0], weight.shape[0])
        out = None if name is None else scratch(name, shape, x.dtype, x.device)
        return gemm(x, weight, bias, out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        into = None if ctx.grad_name is None else scratch(ctx.grad_name, x.shape, x.dtype, x.device)
        grad_x = gemm(grad, weight.t(), out=into)
        grad_bias = grad.sum(0) if ctx.with_bias else None
        return grad_x, grad.t().mm(x), grad_bias, None, None


__all__ = ["gemm", "onednn_inference", "onednn_linear", "linear", "ScratchLinear"]
