""":func:`unpad` / :func:`repad`: move between a padded (B, T) batch and its N real tokens;
:func:`shape_multiple` / :func:`round_up` / :func:`unpadded_index`: row counts that repeat from
batch to batch where the products build a kernel per shape."""

from __future__ import annotations

import torch
from torch import Tensor

ONEDNN_ROWS = 64
"""The multiple a varying row count is rounded up to where oneDNN runs the products."""


# Unpadding: with padding in the batch, every token-wise op (projections, feed-forward, LayerNorm,
# dropout) runs on the N real tokens only; attention alone goes back to the (B, T) grid.
def unpad(x: Tensor, index: Tensor) -> Tensor:
    """(B, T, C) -> (N, C): the rows of the real tokens, ``index`` = their flat positions."""
    return x.reshape(-1, x.shape[-1])[index]  # (N, C)


def repad(x: Tensor, index: Tensor, B: int, T: int) -> Tensor:
    """(N, C) -> (B, T, C), zeros at the padding: the inverse of :func:`unpad`."""
    out = x.new_zeros(B * T, x.shape[-1]).index_copy(0, index, x)  # (B*T, C)
    return out.view(B, T, -1)  # (B, T, C)


def shape_multiple(x: Tensor) -> int:
    """What a row count that changes every batch (the masked tokens, the real tokens of a padded
    batch) is rounded up to before the products: :data:`ONEDNN_ROWS` on a CPU in bf16 or fp16
    (autocast or half weights), where oneDNN builds a kernel for every new product shape and
    keeps it with its buffers, several MB each (docs/memory.md); rounded counts repeat, so a
    handful of kernels serve every step. 1 elsewhere: BLAS (fp32 on the CPU) and the GPU
    libraries keep nothing per shape, and the extra rows would be work for nothing."""
    if x.device.type != "cpu":
        return 1
    half = x.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled("cpu")
    return ONEDNN_ROWS if half else 1


def round_up(n: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is >= ``n``."""
    return -(-n // multiple) * multiple


def unpadded_index(real: Tensor, multiple: int = 1) -> tuple[Tensor, int]:
    """(the flat positions to compute, N) for a flat (B*T,) mask ``real`` (nonzero at the N real
    tokens): the real tokens' positions in order, then as many padding positions as round the
    count up to ``multiple`` (at most every position). The extra rows are computed like the
    others (a [PAD] token attending to its sequence) and never read: callers take the first N."""
    index = real.nonzero().squeeze(1)  # (N,)
    n = index.numel()
    extra = min(round_up(n, multiple), real.numel()) - n
    if extra > 0:
        pads = (real == 0).nonzero().squeeze(1)[:extra]  # (extra,)
        index = torch.cat([index, pads])  # (N + extra,)
    return index, n


__all__ = ["ONEDNN_ROWS", "unpad", "repad", "shape_multiple", "round_up", "unpadded_index"]
