""":func:`cross_entropy`: mean cross-entropy with fewer passes over 30k-wide logits (the C kernel
of ``csrc/cross_entropy.c``, else :class:`CrossEntropy`); :class:`DecoderLinear`: the tied
decoder, its weight gradient contiguous, its logits in rows padded to 64 bytes
(:func:`~bertforge.modeling.ops.buffers.padded_rows`); :func:`decoder_cross_entropy`: the
decoder and the MLM loss in one, the gradients written in the loss's pass
(:class:`DecoderCrossEntropy`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertforge.modeling.kernels import (
    cross_entropy_kernels,
    cross_entropy_with_gradient_kernel,
)
from bertforge.modeling.ops.buffers import _padded, padded_rows, scratch
from bertforge.modeling.ops.common import _fp32_cpu, cpu_tuned


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy of (n', V) logits of any float dtype against (n,) int64 targets, in
    fp32: ``F.cross_entropy(logits[:n].float(), target)`` in value and gradient (rows past the
    targets, n' > n, take no part: a row count rounded up, :func:`masked_lm`), through the C
    kernel of :mod:`bertforge.kernels` for CPU fp32/bf16 logits with contiguous rows (such as
    :class:`DecoderLinear`'s padded ones), else :class:`CrossEntropy`."""
    kernels = cross_entropy_kernels(logits.dtype) if _kernel_takes(logits, target) else None
    if kernels is None:
        n = target.shape[0]
        return CrossEntropy.apply(logits if logits.shape[0] == n else logits[:n], target)
    return KernelCrossEntropy.apply(logits, target.contiguous(), kernels)


def _kernel_takes(logits: Tensor, target: Tensor) -> bool:
    """Whether the C loss kernel may run: CPU logits with contiguous, non-overlapping rows, at
    least one row, and int64 targets inside [0, V). The kernel indexes rows by target
    unchecked; the torch form handles the rest (an empty batch's nan loss, an out-of-range
    target's error) as it always did."""
    if logits.device.type != "cpu" or logits.dim() != 2 or target.shape[0] == 0:
        return False
    rows_ok = logits.stride(1) == 1 and logits.stride(0) >= logits.shape[1]
    if not (rows_ok or logits.is_contiguous()):
        return False
    return _targets_take(target, logits.shape[1])


def _targets_take(target: Tensor, V: int) -> bool:
    """int64 targets, all inside [0, V): what the C loss kernels index by, unchecked."""
    if target.dtype != torch.int64 or torch.compiler.is_compiling():
        return False
    return bool(((target >= 0) & (target < V)).all())


class KernelCrossEntropy(torch.autograd.Function):
    """The kernel form: the forward keeps one log-sum-exp per row (nothing n x V is written),
    the backward writes (softmax - one_hot) * grad / n in one pass, in the logits' dtype (and
    zeros in the rows past the n targets)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, kernels: Any) -> Tensor:
        lse, row_loss = kernels[0](logits[: target.shape[0]], target)
        ctx.save_for_backward(logits, target, lse)
        ctx.backward_kernel = kernels[1]
        return row_loss.mean()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None, None]:
        logits, target, lse = ctx.saved_tensors
        n = target.shape[0]
        scale = float(grad_loss) / n
        out = padded_rows(
            "logits.grad", logits.shape, logits.stride(0), logits.dtype, logits.device
        )
        out[n:].zero_()  # the rows past the targets (a rounded-up count): no gradient
        ctx.backward_kernel(logits[:n], target, lse, scale, out[:n])
        return out, None, None


class CrossEntropy(torch.autograd.Function):
    """The torch form of :func:`cross_entropy`, with fewer passes over the 30k-wide logits than
    autograd's (a third of a small model's step otherwise): the softmax is cast as it is
    computed, and the backward turns the saved log-probabilities into softmax - one_hot in
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


class DecoderLinear(torch.autograd.Function):
    """``F.linear`` on (n, in) rows whose weight gradient comes out contiguous (out, in), and
    whose output rows start 64 bytes apart.

    Autograd's ``F.linear`` yields the weight gradient as the transpose of an (in, out) product;
    here it is a contiguous :func:`scratch` buffer, into which :class:`WordEmbedding` adds the
    tied word lookup's gradient in place. The output is a view of rows padded to a multiple of
    16 floats (:func:`padded_rows`): BLAS wrote 30522-float rows at about half its speed
    (fp32 on an AMD EPYC Zen 4: 85-95 GFLOP/s against 155-160 into padded rows; the backward's
    products read such a gradient ~10% faster too). ``cross_entropy`` reads that layout as is.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return _decoder_product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, weight = ctx.saved_tensors
        return *_decoder_products_back(grad, x, weight), grad.sum(0)


def _decoder_product(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x @ weight.T + bias`` into the :func:`scratch` logits, rows ``_padded(V)`` apart."""
    shape, ld = (x.shape[0], weight.shape[0]), _padded(weight.shape[0])
    out = padded_rows("logits", shape, ld, x.dtype, x.device)
    return torch.addmm(bias, x, weight.t(), out=out)  # (n, V)


def _decoder_products_back(grad: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """The decoder's input and weight gradients from the logits' ``grad``; the weight's in a
    reused buffer (no page faults), into which :class:`WordEmbedding` adds the lookup's rows."""
    into = scratch("decoder.grad", weight.shape, x.dtype, x.device)
    grad_weight = torch.mm(grad.t(), x, out=into)
    return grad.mm(weight), grad_weight


def decoder_logits(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The tied decoder's ``h @ weight.T + bias``: :class:`DecoderLinear` when autograd records
    (n, H) CPU rows of the bias's dtype, else ``F.linear`` (on a GPU: cuBLAS with the bias in
    its epilogue, and autocast's bf16)."""
    tuned = cpu_tuned(h, weight, bias)
    if tuned and h.dim() == 2 and torch.is_grad_enabled() and h.dtype == bias.dtype:
        return DecoderLinear.apply(h, weight, bias)  # (n, V)
    return F.linear(h, weight, bias)


def decoder_cross_entropy(
    h: Tensor, weight: Tensor, bias: Tensor, target: Tensor
) -> tuple[Tensor, Tensor]:
    """``(cross_entropy(logits, target), logits)`` of the tied decoder's ``logits = h @
    weight.T + bias`` over (n', H) rows, the loss over the first n (``target`` (n,); rows past
    them are computed and take no part): :class:`DecoderCrossEntropy` when training in fp32
    on the CPU with the C kernel, else :class:`DecoderLinear` (or ``F.linear``) and
    :func:`cross_entropy`."""
    kernel = None
    fp32 = _fp32_cpu(h, weight, bias) and not torch.is_autocast_enabled("cpu")
    if torch.is_grad_enabled() and h.dim() == 2 and fp32 and h.shape[0] == target.shape[0]:
        kernel = cross_entropy_with_gradient_kernel()
    if kernel is not None and h.shape[0] > 0 and _targets_take(target, weight.shape[0]):
        return DecoderCrossEntropy.apply(h, weight, bias, target.contiguous(), kernel)
    logits = decoder_logits(h, weight, bias)
    return cross_entropy(logits, target), logits


class DecoderCrossEntropy(torch.autograd.Function):
    """:class:`DecoderLinear` and the mean cross-entropy in one: the loss kernel writes the
    logits' gradient (for a loss gradient of 1) and its column sums, the bias gradient, in the
    forward's pass over the logits (``csrc/cross_entropy.c``), where a separate backward would
    read the n x 30k logits again and then the gradient once more for the bias. Returns
    ``(loss, logits)``; a gradient reaching the logits from elsewhere is added in the
    backward. The saved gradient is never written over (a graph may be run backward twice)."""

    @staticmethod
    def forward(
        ctx: Any, h: Tensor, weight: Tensor, bias: Tensor, target: Tensor, kernel: Any
    ) -> tuple[Tensor, Tensor]:
        logits = _decoder_product(h, weight, bias)  # (n, V), rows _padded(V) apart
        into = padded_rows(
            "logits.grad", logits.shape, logits.stride(0), logits.dtype, logits.device
        )
        row_loss, grad, colsum = kernel(logits, target, 1.0 / h.shape[0], into)
        ctx.save_for_backward(h, weight, grad, colsum)
        ctx.set_materialize_grads(False)
        return row_loss.mean(), logits

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor | None, grad_logits: Tensor | None) -> tuple:
        h, weight, grad, colsum = ctx.saved_tensors
        if grad_loss is None or float(grad_loss) != 1.0:  # scaled (accumulation) or unused
            s = 0.0 if grad_loss is None else float(grad_loss)
            grad, colsum = grad * s, colsum * s
        if grad_logits is not None:
            grad, colsum = grad + grad_logits, colsum + grad_logits.sum(0)
        return *_decoder_products_back(grad, h, weight), colsum, None, None


__all__ = [
    "cross_entropy",
    "KernelCrossEntropy",
    "CrossEntropy",
    "DecoderLinear",
    "decoder_logits",
    "decoder_cross_entropy",
    "DecoderCrossEntropy",
]
