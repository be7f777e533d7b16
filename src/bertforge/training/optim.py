"""Optimizer and learning-rate schedule shared by pretraining and fine-tuning.

``lr_at`` / ``lr_at_progress`` are pure functions of the position in training, so a resumed run
recomputes the same rate from its saved step (or elapsed time) without a scheduler object.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

from bertforge.errors import BertforgeError

Schedule = Literal["linear", "cosine", "constant", "trapezoid"]
"""Learning-rate decays after warmup (:func:`lr_at`); the training configs check the choice, so
the schedules themselves do not on every call. ``trapezoid`` holds the peak after warmup and
decays over the last ``decay_ratio`` of training only, as 1 - sqrt (ModernBERT's schedule;
Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training beyond Fixed Training
Durations")."""
SCHEDULES: tuple[str, ...] = get_args(Schedule)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed and a non-decayed group.

    Biases and normalisation weights (every 1-D parameter: LayerNorm gamma/beta, biases) get no
    weight decay, as in BERT's original AdamWeightDecay; matrices and embeddings do. Tied
    parameters appear once.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():  # named_parameters() already skips tied duplicates
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, using the fused kernel where torch has one for the device.

    The same model on the same device always gets the same implementation, so a resumed run steps
    exactly as the uninterrupted one.
    """
    if lr <= 0:
        raise BertforgeError(f"learning rate {lr} must be positive, e.g. 1e-4")
    if weight_decay < 0:
        raise BertforgeError(f"weight_decay={weight_decay} must be >= 0")
    groups = param_groups(model, weight_decay)
    device = next(model.parameters()).device
    kwargs: dict = {"lr": lr, "betas": tuple(betas), "eps": eps}
    if device.type in ("cuda", "cpu"):
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = True
    try:
        return torch.optim.AdamW(groups, **kwargs)
    except (RuntimeError, TypeError):  # older torch without a fused kernel for this device
        kwargs.pop("fused", None)
        kwargs["foreach"] = device.type != "cpu"
        return torch.optim.AdamW(groups, **kwargs)


def _decayed(decay: float, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of ``max_lr`` a fraction ``decay`` in [0, 1] into the decay phase."""
    decay = min(max(decay, 0.0), 1.0)
    if schedule == "linear":
        factor = 1.0 - decay
    elif schedule == "trapezoid":  # 1 - sqrt: steep at first, flat at the floor
        factor = 1.0 - math.sqrt(decay)
    else:  # cosine: half a period from 1 down to 0
        factor = 0.5 * (1.0 + math.cos(math.pi * decay))
    return min_lr_ratio + (1.0 - min_lr_ratio) * factor


def lr_at_progress(
    progress: float,
    *,
    max_lr: float,
    warmup: float = 0.0,
    schedule: Schedule = "linear",
    min_lr_ratio: float = 0.0,
    decay_ratio: float = 0.2,
) -> float:
    """Learning rate at ``progress`` in [0, 1] of training; ``warmup`` is a fraction of it too.

    Linear warmup from 0 to ``max_lr`` over ``[0, warmup)``, then decay to
    ``min_lr_ratio * max_lr`` at ``progress == 1``: straight line (``linear``), half cosine
    (``cosine``), none (``constant``), or the peak held until the last ``decay_ratio`` of
    training and 1 - sqrt over it (``trapezoid``). Used for wall-clock budgets, where progress
    is elapsed / budget.
    """
    progress = min(max(progress, 0.0), 1.0)
    if warmup > 0 and progress < warmup:
        return max_lr * progress / warmup
    if schedule == "constant":
        return max_lr
    if schedule == "trapezoid":
        start = 1.0 - decay_ratio
        if progress < start:
            return max_lr
        decay = (progress - start) / max(decay_ratio, 1e-12)
        return max_lr * _decayed(decay, schedule, min_lr_ratio)
    decay = (progress - warmup) / max(1.0 - warmup, 1e-12)  # 0 .. 1 after warmup
    return max_lr * _decayed(decay, schedule, min_lr_ratio)


def lr_at(
    step: int,
    *,
    max_lr: float,
    warmup: int,
    total: int,
    schedule: Schedule = "linear",
    min_lr_ratio: float = 0.0,
    decay_ratio: float = 0.2,
) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``total``, ``warmup`` steps of warmup.

    Step 0 of a warmup already gets a small non-zero rate (``max_lr / warmup``) so no step is
    wasted; the last step (``total - 1``) is the last one before the floor is reached. A
    ``trapezoid`` decays over the last ``round(decay_ratio * total)`` steps (at least one).
    """
    if total <= 0:
        raise BertforgeError(f"total={total} steps must be positive")
    if warmup < 0:
        raise BertforgeError(f"warmup={warmup} steps must be >= 0")
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if schedule == "constant":
        return max_lr
    if schedule == "trapezoid":
        cooldown = max(1, round(decay_ratio * total))
        start = total - cooldown
        if step < start:
            return max_lr
        return max_lr * _decayed((step - start) / cooldown, schedule, min_lr_ratio)
    decay = (step - warmup) / max(total - warmup, 1)  # 0 .. <1 over the decay steps
    return max_lr * _decayed(decay, schedule, min_lr_ratio)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the rate of every parameter group (the schedule is applied by the loop, not a scheduler)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


__all__ = [
    "SCHEDULES",
    "Schedule",
    "build_optimizer",
    "lr_at",
    "lr_at_progress",
    "param_groups",
    "set_lr",
]
