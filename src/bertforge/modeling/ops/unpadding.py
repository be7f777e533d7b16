""":func:`unpad` / :func:`repad`: move between a padded (B, T) batch and its N real tokens."""

from __future__ import annotations

from torch import Tensor


# Unpadding: with padding in the batch, every token-wise op (projections, feed-forward, LayerNorm,
# dropout) runs on the N real tokens only; attention alone goes back to the (B, T) grid.
def unpad(x: Tensor, index: Tensor) -> Tensor:
    """(B, T, C) -> (N, C): the rows of the real tokens, ``index`` = their flat positions."""
    return x.reshape(-1, x.shape[-1])[index]  # (N, C)


def repad(x: Tensor, index: Tensor, B: int, T: int) -> Tensor:
    """(N, C) -> (B, T, C), zeros at the padding: the inverse of :func:`unpad`."""
    out = x.new_zeros(B * T, x.shape[-1]).index_copy(0, index, x)  # (B*T, C)
    return out.view(B, T, -1)  # (B, T, C)


__all__ = ["unpad", "repad"]
