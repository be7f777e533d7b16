""":func:`dropout` / :class:`Dropout`: dropout with a cheaper random mask on CPU (the C kernel
of ``csrc/dropout.c`` through :mod:`bertforge.modeling.kernels` when one is built, else
:func:`torch_dropout`), the backward recomputing the mask from its seed (:class:`SeededDropout`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge.modeling.kernels import (
    dropout_kernel,
)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout`` with a cheaper keep-mask on CPU, where torch's ``bernoulli_`` draws one 32-bit
    number per element and made dropout ~15% of a small model's training step. Each element is
    kept when a 16-bit uniform is >= round(p * 2^16) (p resolved to 2^-16: 0.1 drops with
    probability 0.100006); kept values are scaled by 1 / (1 - p) as in torch. With the C kernel
    of :mod:`bertforge.kernels` (float32, bfloat16) mask and scaling take one pass and the
    backward recomputes the mask; otherwise :func:`torch_dropout` computes the same in torch."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0  # as F.dropout: everything dropped
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    kernel = dropout_kernel(x.dtype)
    if kernel is None or torch.compiler.is_compiling():
        return torch_dropout(x, p)
    return SeededDropout.apply(x, p, kernel)


class SeededDropout(torch.autograd.Function):
    """Dropout through a kernel ``f(x, out, seed, p)``: the seed is drawn from torch's generator
    (so ``torch.manual_seed`` reproduces the masks) and the backward reruns the kernel on the
    gradient with the same seed: same mask, same scale, and no mask kept in memory."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float, kernel: Any) -> Tensor:
        seed = int(torch.randint(0, 2**62, (1,)).item())
        x = x.contiguous()
        out = torch.empty_like(x)
        kernel(x, out, seed, p)
        ctx.seed, ctx.p, ctx.kernel = seed, p, kernel
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        ctx.kernel(grad, out, ctx.seed, ctx.p)
        return out, None, None


def torch_dropout(x: Tensor, p: float) -> Tensor:
    """The torch form of :func:`dropout` (training): each 64-bit draw of torch's generator yields
    four 16-bit uniforms, compared, cast and multiplied in separate passes."""
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device)
    bits = bits.random_(-(2**63), None).view(torch.int16)[: x.numel()]  # uniform over int16
    keep = bits.view(x.shape) >= round(p * 2**16) - 2**15
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same name in the module tree, no parameters) running :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


__all__ = ["dropout", "SeededDropout", "torch_dropout", "Dropout"]
