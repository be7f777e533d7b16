""":func:`attention`: attention with dropout, its scaling, masking, softmax and dropout one C
pass forward and one backward in fp32 training (``csrc/softmax.c``, :class:`KernelAttention`),
else torch ops (:func:`explicit_attention`); :func:`query_attention`: attention from queries at
some rows only (the sparse last layer).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertforge.modeling.kernels import (
    softmax_dropout_kernels,
)
from bertforge.modeling.ops.buffers import _laid_out, scratch
from bertforge.modeling.ops.common import _fp32_cpu, _seed
from bertforge.modeling.ops.seeded_dropout import dropout
from bertforge.modeling.ops.unpadding import round_up, shape_multiple


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


def query_slots(seq: Tensor, T: int, like: Tensor) -> tuple[Tensor, int]:
    """Where :func:`query_attention`'s queries sit in their (B, R, H) block: for rows whose
    sequences are ``seq`` (n,), each row's place among its sequence's rows (n,), and R. On the
    CPU R is the largest count (a product pays for each row), rounded where oneDNN builds a
    kernel per shape (``like`` bf16); elsewhere a bound known without waiting for the device nor
    breaking a compiled graph, T + 1 (T positions, [CLS] twice at most; the extra rows are
    zeros, never read)."""
    order = torch.argsort(seq, stable=True)
    in_order = seq[order]  # sorted: a row's place is its distance from its run's start
    slot = torch.empty_like(seq)
    slot[order] = torch.arange(seq.numel(), device=seq.device) - torch.searchsorted(
        in_order, in_order
    )
    R = T + 1
    if like.device.type == "cpu":
        R = int(slot.max()) + 1 if seq.numel() else 0
        R = min(round_up(R, 1 + 7 * (shape_multiple(like) > 1)), T + 1)
    return slot, R


def query_attention(
    q: Tensor, kv: Tensor, num_heads: int, mask: Tensor | None, p: float, training: bool
) -> Tensor:
    """:func:`attention` for queries at some positions only: ``q`` (B, R, H) against keys and
    values at every position, ``kv`` (B, T, 2H) (k and v side by side, heads inside each);
    returns (B, R, H). ``mask``: (B, 1, 1, T) True at real keys, or (B, 1, R, T) per query (a
    sliding window's band), or None. The last layer of sparse MLM prediction needs its attention output at the
    masked tokens and [CLS] only (:meth:`BertSelfAttention.forward_rows`).

    fp32 CPU training with dropout: :class:`KernelAttention` (the C softmax + dropout);
    otherwise torch's fused attention, or with dropout the explicit form with :func:`dropout`."""
    p = p if training else 0.0
    B, R, H = q.shape
    T, hs = kv.shape[1], H // num_heads
    scale = 1.0 / math.sqrt(hs)
    keys_only = mask is None or mask.shape[-2] == 1  # the kernels take a key mask, no band
    fast = p > 0 and keys_only and _fp32_cpu(q, kv) and q.numel()
    kernels = softmax_dropout_kernels() if fast else None
    if kernels is not None:
        return KernelAttention.apply(q, kv, num_heads, _key_mask(mask, B, T), p, scale, kernels)
    qh = q.view(B, R, num_heads, hs).transpose(1, 2)  # (B, nh, R, hs)
    k, v = kv.view(B, T, 2, num_heads, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs)
    if p > 0:
        y = explicit_attention(qh, k, v, mask, p, scale)  # (B, nh, R, hs)
    else:
        y = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask)  # (B, nh, R, hs)
    return y.transpose(1, 2).reshape(B, R, H)  # (B, R, H)


__all__ = ["attention", "explicit_attention", "KernelAttention", "query_attention", "query_slots"]
