"""Tensor operations the model uses for speed, each the same function as its plain form.

* :func:`dropout` / :class:`Dropout`: dropout with a cheaper random mask on CPU;
* :class:`CrossEntropy`: mean cross-entropy with fewer passes over 30k-wide logits;
* :func:`unpad` / :func:`repad`: move between a padded (B, T) batch and its N real tokens;
* :func:`activation` and :func:`autograd_free`: in inference, activations overwrite their input.

``tests/test_fast_paths.py`` checks each against the plain computation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout`` with a cheaper keep-mask on CPU, where torch's ``bernoulli_`` draws one 32-bit
    number per element and made dropout ~15% of a small model's training step. Here each 64-bit
    draw yields four 16-bit uniforms, each kept with probability 1 - p (p resolved to 2^-16:
    0.1 drops with probability 0.100006); kept values are scaled by 1 / (1 - p) as in torch."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device)
    bits = bits.random_(-(2**63), None).view(torch.int16)[: x.numel()]  # uniform over int16
    keep = bits.view(x.shape) >= round(p * 2**16) - 2**15
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same name in the module tree, no parameters) running :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of (n, V) logits of any float dtype against (n,) targets, in fp32.

    Equals ``F.cross_entropy(logits.float(), target)`` in value and gradient with fewer passes
    over the 30k-wide logits (a third of a small model's step otherwise): the softmax is cast as
    it is computed, and the backward turns the saved log-probabilities into softmax - one_hot in
    place instead of scattering into a zero-filled tensor.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor) -> Tensor:
        logp = torch.log_softmax(logits, -1, dtype=torch.float32)  # (n, V)
        ctx.save_for_backward(logp, target)
        ctx.logits_dtype = logits.dtype
        return -logp.gather(1, target[:, None]).mean()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None]:
        logp, target = ctx.saved_tensors
        n = logp.shape[0]
        grad = logp.exp_()  # softmax (the log-probabilities are not needed any more)
        grad[torch.arange(n, device=grad.device), target] -= 1.0
        return grad.mul_(grad_loss / n).to(ctx.logits_dtype), None


# Unpadding: with padding in the batch, every token-wise op (projections, feed-forward, LayerNorm,
# dropout) runs on the N real tokens only; attention alone goes back to the (B, T) grid.
def unpad(x: Tensor, index: Tensor) -> Tensor:
    """(B, T, C) -> (N, C): the rows of the real tokens, ``index`` = their flat positions."""
    return x.reshape(-1, x.shape[-1])[index]  # (N, C)


def repad(x: Tensor, index: Tensor, B: int, T: int) -> Tensor:
    """(N, C) -> (B, T, C), zeros at the padding: the inverse of :func:`unpad`."""
    out = x.new_zeros(B * T, x.shape[-1]).index_copy(0, index, x)  # (B*T, C)
    return out.view(B, T, -1)  # (B, T, C)


def activation(name: str, x: Tensor, inplace: bool = False) -> Tensor:
    """BERT's ``hidden_act`` of ``x``; ``inplace`` overwrites ``x`` (inference: no new buffer)."""
    if name in ("gelu", "gelu_new", "gelu_pytorch_tanh"):  # "gelu": BERT's exact, erf-based one
        approximate = "none" if name == "gelu" else "tanh"
        if inplace:
            return torch.ops.aten.gelu_(x, approximate=approximate)
        return F.gelu(x, approximate=approximate)
    return torch.relu_(x) if inplace else F.relu(x)


def autograd_free(*tensors: Tensor) -> bool:
    """True when no gradient is being recorded (inference) and ``tensors`` share one dtype (no
    autocast mixing): intermediate buffers may then be reused in place."""
    return not torch.is_grad_enabled() and len({t.dtype for t in tensors}) == 1


__all__ = ["CrossEntropy", "Dropout", "activation", "autograd_free", "dropout", "repad", "unpad"]
