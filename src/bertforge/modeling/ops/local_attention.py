""":func:`window_attention`: bidirectional sliding-window attention (each query sees the keys at
most ``window`` positions away: ModernBERT's local layers) without a (T, T) score matrix when
the window is small against the sequence; :func:`band_mask`, the (T, T) band it equals.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from bertforge.modeling.ops.seeded_dropout import dropout


def band_mask(T: int, window: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query i may see key j: ``|i - j| <= window``."""
    i = torch.arange(T, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


def window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keys: Tensor | None,
    window: int,
    p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """``softmax(q k^T / sqrt(hs), masked) @ v`` over (B, nh, T, hs) ``q``, ``k``, ``v``, where
    query i sees key j only if ``|i - j| <= window`` and ``keys`` (B, T) bool (True at real
    tokens; None: all) holds at j; dropout ``p`` on the probabilities. Returns (B, nh, T, hs).

    Memory: when the band leaves out most of the sequence (T > 3 x window) the queries go in
    blocks of ``window`` rows, each against the 3 x window keys around it, so the scores take
    B x nh x T x 3w floats instead of B x nh x T x T (at T 8,192 and ModernBERT's w 64: 192
    floats a query instead of 8,192); below that, one (B, 1, T, T) boolean band-and-key mask
    goes to SDPA (its scores are T x T, but T is at most 3w)."""
    B, nh, T, hs = q.shape
    if window >= T - 1:  # the band covers every pair: plain attention with the key mask
        mask = None if keys is None else keys[:, None, None, :]
        return _attend(q, k, v, mask, p, training)
    if 3 * window >= T:
        mask = band_mask(T, window, q.device)[None, None]  # (1, 1, T, T)
        if keys is not None:
            mask = mask & keys[:, None, None, :]  # (B, 1, T, T)
        return _attend(q, k, v, mask, p, training)
    return _blocked(q, k, v, keys, window, p, training)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, training: bool
) -> Tensor:
    if p > 0 and training:  # SDPA's CPU kernels take no dropout: the explicit form
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = (q * scale) @ k.transpose(-2, -1)  # (B, nh, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return dropout(scores.softmax(-1), p, True) @ v
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _blocked(
    q: Tensor, k: Tensor, v: Tensor, keys: Tensor | None, w: int, p: float, training: bool
) -> Tensor:
    """Blocks of C = w queries, each against its C + 2w neighbouring keys."""
    B, nh, T, hs = q.shape
    C = w
    nb = -(-T // C)
    Tp = nb * C
    L = C + 2 * w  # keys a block sees
    qb = F.pad(q, (0, 0, 0, Tp - T)).view(B, nh, nb, C, hs)  # (B, nh, nb, C, hs)
    # keys padded by w before and w + (Tp - T) after: block b's keys start at b*C - w
    kp = F.pad(k, (0, 0, w, w + Tp - T))  # (B, nh, Tp + 2w, hs)
    vp = F.pad(v, (0, 0, w, w + Tp - T))
    kb = kp.unfold(2, L, C)  # (B, nh, nb, hs, L)
    vb = vp.unfold(2, L, C).transpose(-1, -2)  # (B, nh, nb, L, hs)
    real = torch.ones(B, T, dtype=torch.bool, device=q.device) if keys is None else keys
    real = F.pad(real, (w, w + Tp - T)).unfold(1, L, C)  # (B, nb, L): key j of block b exists
    # query i of a block and its key j (at i_abs + j - w - i) are within w iff 0 <= j - i <= 2w
    i = torch.arange(C, device=q.device)
    j = torch.arange(L, device=q.device)
    band = ((j[None, :] - i[:, None]) >= 0) & ((j[None, :] - i[:, None]) <= 2 * w)  # (C, L)
    mask = band[None, None] & real[:, :, None, :]  # (B, nb, C, L)
    scale = 1.0 / math.sqrt(hs)
    scores = (qb * scale) @ kb  # (B, nh, nb, C, L)
    scores = scores.masked_fill(~mask[:, None], torch.finfo(scores.dtype).min)
    probs = dropout(scores.softmax(-1), p, training)
    y = probs @ vb  # (B, nh, nb, C, hs)
    return y.view(B, nh, Tp, hs)[:, :, :T]  # (B, nh, T, hs)


__all__ = ["band_mask", "window_attention"]
