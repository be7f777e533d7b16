"""Tensor operations the model uses for speed, each the same function as its plain form.

* :func:`dropout` / :class:`Dropout`: dropout with a cheaper random mask on CPU (a C kernel of
  :mod:`bertforge.modeling.kernels` when one is built, else :func:`torch_dropout`);
* :func:`cross_entropy`: mean cross-entropy with fewer passes over 30k-wide logits (the C kernel,
  else :class:`CrossEntropy`);
* :func:`dense_dropout_norm`, :func:`attention`, :func:`dense_activation`: the end of each
  post-LN block, attention with dropout, and the feed-forward's bias + GELU, each one C pass
  forward and one backward in fp32 training (:class:`AddNorm`, :class:`KernelAttention`,
  :class:`BiasGelu`), else torch ops;
* :func:`query_attention`: attention from queries at some rows only (the sparse last layer);
* :class:`DecoderLinear`: the tied decoder, its weight gradient contiguous, its logits in rows
  padded to 64 bytes (:func:`padded_rows`); :func:`decoder_cross_entropy`: the decoder and the
  MLM loss in one, the gradients written in the loss's pass (:class:`DecoderCrossEntropy`);
* :func:`gemm`: the fp32 training products, in oneDNN on AMD CPUs (``BERTFORGE_GEMM``);
  :func:`onednn_linear`: an inference product with its bias and GELU or residual sum in one
  oneDNN call (AMD CPUs with AVX-512, :func:`onednn_inference`);
  :func:`linear` / :class:`ScratchLinear`: a product whose output or input gradient is a
  :func:`scratch` buffer;
* :func:`word_embedding`: the word lookup, and the weight for a tied decoder whose gradient
  then sums with the lookup's in one buffer (:class:`WordEmbedding`);
* :func:`scratch`: large per-step buffers, pooled per name and reused once nobody holds them
  (no page faults);
* :func:`unpad` / :func:`repad`: move between a padded (B, T) batch and its N real tokens;
* :func:`activation` and :func:`autograd_free`: in inference, activations overwrite their input.

``tests/test_fast_paths.py`` and ``tests/test_fused_kernels.py`` check each against the plain
computation (float64 for the kernels).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge.modeling.kernels import (
    add_norm_kernels,
    bias_gelu_kernels,
    cross_entropy_kernels,
    cross_entropy_with_gradient_kernel,
    dropout_kernel,
    gemm_library,
    onednn_for_inference,
    softmax_dropout_kernels,
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


def _seed() -> int:
    """A kernel's dropout seed, drawn from torch's generator (``torch.manual_seed`` reproduces it)."""
    return int(torch.randint(0, 2**62, (1,)).item())


def cpu_tuned(*tensors: Tensor) -> bool:
    """Whether the torch forms tuned for the CPU's memory take these tensors: the :func:`scratch`
    pools, the decoder's padded rows (:class:`DecoderLinear`), the summed embedding gradient
    (:class:`WordEmbedding`). True on the CPU only; each of them is also correct on any device
    (``tests/test_devices.py`` forces them onto another one), but a GPU gains nothing from
    them. The C kernels ask :func:`_fp32_cpu`, which tests the memory itself."""
    return all(t.device.type == "cpu" for t in tensors)


def _fp32_cpu(*tensors: Tensor) -> bool:
    """Whether the fp32 CPU kernels may take these tensors (and no graph is being compiled)."""
    if torch.compiler.is_compiling():
        return False
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


# ---- the products ------------------------------------------------------------------------------
def gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """``a @ b.T (+ bias)`` for 2-D fp32 CPU tensors (transposed views welcome): in oneDNN where
    :func:`~bertforge.modeling.kernels.gemm_library` picks it (a new tensor; ``out`` unused),
    else ``torch.mm``/``torch.addmm`` into ``out`` when given."""
    if gemm_library() == "onednn" and a.device.type == "cpu":
        return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")
    if bias is None:
        return torch.mm(a, b.t()) if out is None else torch.mm(a, b.t(), out=out)
    return torch.addmm(bias, a, b.t()) if out is None else torch.addmm(bias, a, b.t(), out=out)


# ---- bias + dropout + residual add + LayerNorm ------------------------------------------------
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


# ---- attention with dropout -------------------------------------------------------------------
def attention(qkv: Tensor, num_heads: int, mask: Tensor | None, p: float, training: bool) -> Tensor:
    """Multi-head ``dropout(softmax(q k^T / sqrt(hs), keys masked), p) @ v`` from a (B, T, 3H)
    ``qkv`` (q, k and v side by side, heads inside each) and a (B, 1, 1, T) boolean ``mask``
    (True at real keys) or None; returns (B, T, H). The explicit attention of training, where
    torch's fused attention has no CPU kernel with dropout.

    fp32 on the CPU: :class:`KernelAttention`, the scaling, masking, softmax and dropout of the
    (B, nh, T, T) scores in one C pass forward and one backward around torch's batched products;
    else the same in torch ops with :func:`dropout` (a different mask, the same distribution)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability has to be in [0, 1) here, but got {p}")
    p = p if training else 0.0
    B, T, H3 = qkv.shape
    hs = H3 // 3 // num_heads
    scale = 1.0 / math.sqrt(hs)
    kernels = softmax_dropout_kernels() if _fp32_cpu(qkv) and qkv.numel() else None
    if kernels is None:
        q, k, v = qkv.reshape(B, T, 3, num_heads, hs).permute(2, 0, 3, 1, 4).unbind(0)
        y = explicit_attention(q, k, v, mask, p, scale)  # (B, nh, T, hs)
        return y.transpose(1, 2).reshape(B, T, H3 // 3)  # (B, T, H)
    return KernelAttention.apply(qkv, None, num_heads, _key_mask(mask, B, T), p, scale, kernels)


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, scale: float
) -> Tensor:
    """``dropout(softmax(q k^T * scale, keys masked), p) @ v`` over (B, nh, R, hs) queries and
    (B, nh, T, hs) keys and values in torch ops: the form of :func:`attention` and
    :func:`query_attention` where no kernel runs; (B, nh, R, hs)."""
    scores = (q * scale) @ k.transpose(-2, -1)  # (B, nh, R, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return dropout(scores.softmax(-1), p, True) @ v  # (B, nh, R, hs)


def _key_mask(mask: Tensor | None, B: int, T: int) -> Tensor | None:
    """The kernels' (B, T) uint8 key mask from a (B, 1, 1, T) boolean one."""
    return None if mask is None else mask.reshape(B, T).to(torch.uint8).contiguous()


class KernelAttention(torch.autograd.Function):
    """Attention with dropout through the C kernels of
    :func:`bertforge.modeling.kernels.softmax_dropout_kernels`, from a packed (B, T, 3H) ``qkv``
    (``kv`` None) or from queries (B, R, H) apart from keys and values (B, T, 2H). The inputs are
    laid out head by head in one copy each (the batched products need contiguous heads), the
    scores' buffer becomes the probabilities and the dropped probabilities get a second one
    (both kept: softmax's backward needs the probabilities, the value gradient the dropped ones);
    the backward overwrites the gradient of the dropped probabilities with that of the scores
    and writes the gradients into buffers laid out back as the inputs, one copy each."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        kv: Tensor | None,
        num_heads: int,
        keys: Tensor | None,
        p: float,
        scale: float,
        kernels: Any,
    ) -> Tensor:
        B, R = q.shape[:2]
        nh, hs, dt = num_heads, q.shape[2] // num_heads // (3 if kv is None else 1), q.dtype
        if kv is None:  # q is the packed qkv: (3, B, nh, T, hs), contiguous
            heads = _laid_out("attention.heads", q.view(B, R, 3, nh, hs).permute(2, 0, 3, 1, 4))
            qh, k, v = heads.unbind(0)
        else:
            qh = _laid_out("attention.queries", q.view(B, R, nh, hs).transpose(1, 2))
            T = kv.shape[1]
            heads = _laid_out("attention.heads", kv.view(B, T, 2, nh, hs).permute(2, 0, 3, 1, 4))
            k, v = heads.unbind(0)  # (B, nh, T, hs)
        T = k.shape[2]
        probs = scratch(
            "attention.probs", (B, nh, R, T), dt, q.device
        )  # the scores, then probabilities
        torch.matmul(qh, k.transpose(-2, -1), out=probs)
        dropped_out = scratch("attention.dropped", probs.shape, dt, q.device) if p > 0 else None
        dropped = kernels[0](probs, keys, scale, _seed() if p > 0 else 0, p, dropped_out)
        dropped = probs if dropped is None else dropped
        ctx.save_for_backward(qh, heads, probs, dropped)
        ctx.packed = kv is None
        ctx.scale, ctx.backward_kernel = scale, kernels[1]
        context = scratch("attention.context", (B, nh, R, hs), dt, q.device)
        y = torch.matmul(dropped, v, out=context)
        return _laid_out("attention.out", y.transpose(1, 2)).view(B, R, nh * hs)  # (B, R, H)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        qh, heads, probs, dropped = ctx.saved_tensors
        k, v = heads.unbind(0)[-2:]
        B, nh, R, hs = qh.shape
        grad = _laid_out("attention.grad", grad.view(B, R, nh, hs).transpose(1, 2))
        grad_heads = scratch(
            "attention.grad_heads", heads.shape, heads.dtype, heads.device
        )  # [q,] k, v
        torch.matmul(dropped.transpose(-2, -1), grad, out=grad_heads[-1])  # value
        grad_scores = scratch("attention.grad_scores", probs.shape, probs.dtype, probs.device)
        torch.matmul(grad, v.transpose(-2, -1), out=grad_scores)  # (B, nh, R, T)
        ctx.backward_kernel(grad_scores, probs, dropped, ctx.scale)  # scaled by 1/sqrt(hs) too
        grad_q = grad_heads[0] if ctx.packed else None
        grad_q = torch.matmul(grad_scores, k, out=grad_q)  # query (B, nh, R, hs)
        torch.matmul(grad_scores.transpose(-2, -1), qh, out=grad_heads[-2])  # key
        n, T = grad_heads.shape[0], grad_heads.shape[3]
        grad_in = _laid_out("attention.grad_in", grad_heads.permute(1, 3, 0, 2, 4))  # as input
        grad_in = grad_in.view(B, T, n * nh * hs)
        if ctx.packed:
            return grad_in, None, None, None, None, None, None
        grad_q = grad_q.transpose(1, 2).reshape(B, R, nh * hs)  # (B, R, H)
        return grad_q, grad_in, None, None, None, None, None


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


def linear(x: Tensor, weight: Tensor, bias: Tensor, name: str) -> Tensor:
    """``F.linear(x, weight, bias)``; when training in fp32 on the CPU, through
    :class:`ScratchLinear`, its output in the :func:`scratch` buffer ``name``; in inference, in
    oneDNN where :func:`onednn_inference` says so."""
    if onednn_inference(x, weight, bias):
        return onednn_linear(x, weight, bias)
    fp32 = all(t.dtype == torch.float32 for t in (x, weight, bias))
    tuned = fp32 and cpu_tuned(x, weight, bias) and not torch.is_autocast_enabled("cpu")
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


def _laid_out(name: str, x: Tensor) -> Tensor:
    """``x.contiguous()`` in the :func:`scratch` buffer ``name``."""
    return scratch(name, x.shape, x.dtype, x.device).copy_(x)


def query_attention(
    q: Tensor, kv: Tensor, num_heads: int, mask: Tensor | None, p: float, training: bool
) -> Tensor:
    """:func:`attention` for queries at some positions only: ``q`` (B, R, H) against keys and
    values at every position, ``kv`` (B, T, 2H) (k and v side by side, heads inside each);
    returns (B, R, H). The last layer of sparse MLM prediction needs its attention output at the
    masked tokens and [CLS] only (:meth:`BertSelfAttention.forward_rows`).

    fp32 CPU training with dropout: :class:`KernelAttention` (the C softmax + dropout);
    otherwise torch's fused attention, or with dropout the explicit form with :func:`dropout`."""
    p = p if training else 0.0
    B, R, H = q.shape
    T, hs = kv.shape[1], H // num_heads
    scale = 1.0 / math.sqrt(hs)
    kernels = softmax_dropout_kernels() if p > 0 and _fp32_cpu(q, kv) and q.numel() else None
    if kernels is not None:
        return KernelAttention.apply(q, kv, num_heads, _key_mask(mask, B, T), p, scale, kernels)
    qh = q.view(B, R, num_heads, hs).transpose(1, 2)  # (B, nh, R, hs)
    k, v = kv.view(B, T, 2, num_heads, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs)
    if p > 0:
        y = explicit_attention(qh, k, v, mask, p, scale)  # (B, nh, R, hs)
    else:
        y = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask)  # (B, nh, R, hs)
    return y.transpose(1, 2).reshape(B, R, H)  # (B, R, H)


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy of (n, V) logits of any float dtype against (n,) int64 targets, in
    fp32: ``F.cross_entropy(logits.float(), target)`` in value and gradient, through the C
    kernel of :mod:`bertforge.kernels` for CPU fp32/bf16 logits with contiguous rows (such as
    :class:`DecoderLinear`'s padded ones), else :class:`CrossEntropy`."""
    kernels = cross_entropy_kernels(logits.dtype) if _kernel_takes(logits, target) else None
    if kernels is None:
        return CrossEntropy.apply(logits, target)
    return KernelCrossEntropy.apply(logits, target.contiguous(), kernels)


def _kernel_takes(logits: Tensor, target: Tensor) -> bool:
    """Whether the C loss kernel may run: CPU logits with contiguous, non-overlapping rows, at
    least one row, and int64 targets inside [0, V). The kernel indexes rows by target
    unchecked; the torch form handles the rest (an empty batch's nan loss, an out-of-range
    target's error) as it always did."""
    if logits.device.type != "cpu" or logits.dim() != 2 or logits.shape[0] == 0:
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
    the backward writes (softmax - one_hot) * grad / n in one pass, in the logits' dtype."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, kernels: Any) -> Tensor:
        lse, row_loss = kernels[0](logits, target)
        ctx.save_for_backward(logits, target, lse)
        ctx.backward_kernel = kernels[1]
        return row_loss.mean()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None, None]:
        logits, target, lse = ctx.saved_tensors
        scale = float(grad_loss) / logits.shape[0]
        out = padded_rows(
            "logits.grad", logits.shape, logits.stride(0), logits.dtype, logits.device
        )
        return ctx.backward_kernel(logits, target, lse, scale, out), None, None


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
    weight.T + bias`` over (n, H) rows: :class:`DecoderCrossEntropy` when training in fp32 on
    the CPU with the C kernel, else :class:`DecoderLinear` (or ``F.linear``) and
    :func:`cross_entropy`."""
    kernel = None
    fp32 = _fp32_cpu(h, weight, bias) and not torch.is_autocast_enabled("cpu")
    if torch.is_grad_enabled() and h.dim() == 2 and fp32:
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


# Large per-step buffers (the MLM logits and their gradient, each layer's feed-forward and q/k/v
# activations: MBs to tens of MBs each) come back from glibc as fresh pages every step: freed at
# the end of a step, the top of the heap is returned to the kernel, and the next step's first
# touch of each page faults (~7,000 faults, ~25 ms of the mini fp32 step on an AMD EPYC Zen 4;
# keeping the heap, a process-wide malloc setting, made the step ~4% faster). Buffers taken
# from :func:`scratch` are kept and handed out again once no tensor holds them any more: a pool
# per name, as long as the most buffers of that name alive at once (one per layer for an
# activation autograd saves, one for a gradient the layers take turns with).
_SCRATCH: dict[tuple[str, torch.dtype], list[Tensor]] = {}
_SCRATCH_LOCK = threading.Lock()


def scratch(
    name: str,
    shape: tuple[int, ...] | torch.Size,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Tensor:
    """An uninitialised tensor of ``shape``, ``dtype`` on ``device`` (the device of the tensors
    it will meet: no default, so that no caller gets CPU memory by omission) for the per-step
    buffer ``name``. On the CPU: the memory of a buffer of that name that no tensor holds any
    more (checked by the storage's reference count), else a new allocation (1/8 larger, for
    batches that vary) kept for the next calls; a free buffer too small for ``shape`` is
    replaced. Elsewhere a plain ``torch.empty``: a GPU's caching allocator already reuses
    freed blocks without page faults."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    with _SCRATCH_LOCK:
        pool = _SCRATCH.setdefault((name, dtype), [])
        free = [i for i, buf in enumerate(pool) if _unshared(buf)]
        fits = [i for i in free if pool[i].numel() >= numel]
        if fits:
            buf = pool[fits[0]]
        else:
            buf = torch.empty(numel + numel // 8, dtype=dtype)
            if free:
                pool[free[0]] = buf
            else:
                pool.append(buf)
        return buf[:numel].view(shape)


def _padded(width: int, multiple: int = 16) -> int:
    """``width`` rounded up to a multiple of ``multiple`` elements (16 floats = 64 bytes)."""
    return -(-width // multiple) * multiple


def padded_rows(
    name: str,
    shape: tuple[int, int] | torch.Size,
    ld: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Tensor:
    """A :func:`scratch` (n, V) view on ``device`` whose rows start ``ld`` >= V elements apart."""
    n, V = shape
    return scratch(name, (n, ld), dtype, device)[:, :V]


def _unshared(buf: Tensor) -> bool:
    """Whether ``buf`` (held by the scratch table) is the only tensor on its storage."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # a torch without it: never reuse
        return False
    return use_count(buf.untyped_storage()._cdata) <= 2  # buf + the temporary storage object


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


def autograd_free(*tensors: Tensor) -> bool:
    """True when no gradient is being recorded (inference) and ``tensors`` share one dtype (no
    autocast mixing): intermediate buffers may then be reused in place."""
    return not torch.is_grad_enabled() and len({t.dtype for t in tensors}) == 1


__all__ = [
    "AddNorm",
    "BiasGelu",
    "CrossEntropy",
    "KernelAttention",
    "KernelCrossEntropy",
    "ScratchLinear",
    "Dropout",
    "DecoderCrossEntropy",
    "DecoderLinear",
    "SeededDropout",
    "activation",
    "decoder_cross_entropy",
    "decoder_logits",
    "dense_dropout_norm",
    "attention",
    "autograd_free",
    "cpu_tuned",
    "cross_entropy",
    "dense_activation",
    "dropout",
    "explicit_attention",
    "gemm",
    "linear",
    "onednn_inference",
    "onednn_linear",
    "padded_rows",
    "query_attention",
    "repad",
    "scratch",
    "torch_dropout",
    "unpad",
    "word_embedding",
    "WordEmbedding",
]
