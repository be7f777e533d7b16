"""Dynamic masking for masked-language modelling: pure, vectorised, reproducible.

:func:`mask_tokens` picks positions to predict and corrupts them (80% ``[MASK]``, 10% a random
token, 10% unchanged by default) for a whole (B, T) batch at once, with no Python loop over
tokens. Like Google's ``create_pretraining_data.py`` it predicts an exact number of positions
per row, ``round(rate * candidates)`` (at least one, at most ``max_predictions``), so a row with
any maskable token always has a prediction and the loss is never NaN.

Randomness comes either from a ``torch.Generator`` or from ``uniforms`` given by the caller.
:func:`counter_uniforms` makes those from a counter-based hash of (seed, epoch, example index,
position): the mask of an example then depends on nothing else — not on its batch, its rank
under DDP, nor on padding — which makes distributed runs equal single-process runs and resume
exact without saving any generator state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment (odd, golden ratio)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
IGNORE_LABEL = -100
"""The label of positions the MLM loss skips (the model's ``IGNORE_INDEX``, HF's -100)."""
N_STREAMS = 3  # selection score, corruption kind, random-token draw


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective avalanche of 64-bit words (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def counter_uniforms_np(seed: int, epoch: int, indices: Sequence[int], length: int) -> np.ndarray:
    """As :func:`counter_uniforms`, as a float64 numpy array."""
    mask64 = (1 << 64) - 1
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & mask64], dtype=np.uint64) + _GAMMA)
        key = _mix(key ^ np.uint64(epoch & mask64))
        idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
        per_example = _mix(key + (idx + np.uint64(1)) * _GAMMA)  # (B,)
        counters = np.arange(1, N_STREAMS * length + 1, dtype=np.uint64) * _GAMMA  # (3T,)
        bits = _mix(per_example[:, None] + counters[None, :])  # (B, 3T)
    u = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return u.reshape(len(idx), length, N_STREAMS).transpose(2, 0, 1)  # (3, B, T)


def counter_uniforms(seed: int, epoch: int, indices: Sequence[int], length: int) -> torch.Tensor:
    """Uniforms in [0, 1) of shape (3, B, length), a pure function of (seed, epoch, index, position).

    Row b uses ``indices[b]`` (the example's index in the data set); stream s at position t is
    the splitmix64 output number ``3 t + s + 1`` of a key mixed from (seed, epoch, index).
    """
    return torch.from_numpy(np.ascontiguousarray(counter_uniforms_np(seed, epoch, indices, length)))


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor | np.ndarray,
    *,
    rate: float = 0.15,
    mask_token_id: int,
    vocab_size: int,
    replace_probs: tuple[float, float, float] = (0.8, 0.1, 0.1),
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | np.ndarray | None = None,
    word_starts: torch.Tensor | np.ndarray | None = None,
    max_predictions: int | None = None,
    candidate_ids: torch.Tensor | np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask a batch for MLM; returns ``(masked_ids, labels)``, labels -100 where not predicted.

    Args:
        input_ids: (B, T) token ids.
        special_mask: (B, T) bool, True for tokens that must never be predicted ([CLS], [SEP],
            [PAD], ...).
        rate: fraction of the maskable tokens of each row to predict (0.15; 0.3 works).
        mask_token_id: id of ``[MASK]``.
        vocab_size: random replacements are drawn from ``range(vocab_size)`` unless
            ``candidate_ids`` is given.
        replace_probs: probabilities of ``[MASK]`` / random token / unchanged; sum to 1.
        generator: source of randomness when ``uniforms`` is None.
        uniforms: (3, B, T) floats in [0, 1) (see :func:`counter_uniforms`): selection score,
            corruption kind and random-token draw per position.
        word_starts: (B, T) bool, True at the first WordPiece of a word; when given, whole words
            are masked (all their pieces) and the per-row budget counts pieces (a row's
            best-scored word is taken even if it alone exceeds the budget).
        max_predictions: cap on predictions per row.
        candidate_ids: 1-D ids allowed as random replacements; pass the non-special ids (the
            collator does) so a special token is never drawn.

    The work is done in numpy on the CPU: for batches of this size it is several times faster
    than torch's small-op overhead and never competes for the training step's threads. The
    results are returned as tensors on ``input_ids``' device.
    """
    if input_ids.dim() != 2 or special_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and special_mask must both be (B, T); got "
            f"{tuple(input_ids.shape)} and {tuple(special_mask.shape)}"
        )
    if not 0.0 < rate < 1.0:
        raise ValueError(f"masking rate={rate} must be in (0, 1)")
    p_mask, p_random, p_keep = replace_probs
    if min(replace_probs) < 0 or abs(p_mask + p_random + p_keep - 1.0) > 1e-6:
        raise ValueError(
            f"replace_probs={replace_probs} must be 3 non-negative numbers summing to 1"
        )
    B, T = input_ids.shape
    ids = _numpy(input_ids)
    if uniforms is None:
        uniforms = torch.rand((N_STREAMS, B, T), generator=generator, dtype=torch.float64)
    u_score, u_kind, u_token = _numpy(uniforms)
    candidates = ~_numpy(special_mask).astype(bool)
    positions = np.broadcast_to(np.arange(T), (B, T))

    if word_starts is not None:
        # a piece after a non-candidate starts a word, so every word begins on a candidate
        prev = np.zeros_like(candidates)
        prev[:, 1:] = candidates[:, :-1]
        starts = candidates & (_numpy(word_starts).astype(bool) | ~prev)
        start_pos = np.maximum.accumulate(np.where(starts, positions, 0), axis=1)  # (B, T)
        word_id = np.maximum(starts.cumsum(1) - 1, 0) + (np.arange(B) * T)[:, None]  # (B, T)
        word_len = np.bincount(word_id[candidates], minlength=B * T)[word_id]  # pieces per word
        score = np.take_along_axis(u_score, start_pos, 1)  # every piece takes its word's score
    else:
        start_pos, word_len, score = positions, 1, u_score

    # rank of each token when sorted by score; a word's pieces sort together (equal score,
    # stable by position), so a word occupies ranks start_rank .. start_rank + len - 1
    score = np.where(candidates, score, np.inf)
    order = np.argsort(score, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, positions, axis=1)
    start_rank = np.take_along_axis(rank, start_pos, 1)

    n_cand = candidates.sum(1)
    budget = np.maximum(np.rint(n_cand * rate).astype(np.int64), 1)
    if max_predictions is not None:
        budget = np.minimum(budget, max_predictions)
    budget = np.minimum(budget, n_cand)[:, None]  # (B, 1)
    fits = start_rank + word_len <= budget
    # the best-scored word is always taken, even when it alone exceeds the budget
    selected = candidates & (fits | ((start_rank == 0) & (budget > 0)))

    labels = np.where(selected, ids, IGNORE_LABEL)
    to_mask = selected & (u_kind < p_mask)
    to_random = selected & (u_kind >= p_mask) & (u_kind < p_mask + p_random)
    pool = np.arange(vocab_size) if candidate_ids is None else _numpy(candidate_ids)
    random_ids = pool[np.minimum((u_token[to_random] * len(pool)).astype(np.int64), len(pool) - 1)]
    masked = ids.copy()
    masked[to_mask] = mask_token_id
    masked[to_random] = random_ids
    device = input_ids.device
    return torch.from_numpy(masked).to(device), torch.from_numpy(labels).to(device)
