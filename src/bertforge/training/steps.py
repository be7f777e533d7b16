"""The parts of an optimizer step that ``pretrain`` and ``finetune`` share, so the two loops
cannot drift apart: the learning rate by steps or by wall-clock time, the budget check, gradient
clipping, skipping non-finite steps, the running means behind each log line and the progress
bar, the dropout override, the "same run?" check on resume and checkpoint writing (plus the
micro-batch split fine-tuning's gradient accumulation uses).

Each loop stays one flat function that calls these in order; see ``pretrain.py`` and
``finetune.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.progress import ProgressBar
from bertforge.training.optim import lr_at, lr_at_progress


def set_dropout(model: nn.Module, p: float) -> None:
    """Use dropout rate ``p`` everywhere in ``model`` (its config, saved for fine-tuning, keeps
    its own values)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
        if hasattr(module, "dropout_p"):  # attention dropout goes to SDPA as a float
            module.dropout_p = p


class ScheduleOptions(Protocol):
    """What :func:`scheduled_lr` reads from a config (``TrainConfig``, ``FinetuneConfig``); a
    ``min_lr_ratio`` attribute, where there is one, sets the floor."""

    lr: float
    warmup_ratio: float
    schedule: str


def scheduled_lr(
    step: int,
    elapsed: float,
    cfg: ScheduleOptions,
    *,
    total_steps: int | None,
    budget: float | None,
) -> float:
    """The learning rate of optimizer step ``step`` after ``elapsed`` training seconds.

    Without a wall-clock ``budget`` the schedule runs over ``total_steps`` steps; with one it
    follows the fraction of the budget used, or of the steps when that is further along.
    """
    shape = dict(
        max_lr=cfg.lr, schedule=cfg.schedule, min_lr_ratio=getattr(cfg, "min_lr_ratio", 0.0)
    )
    if budget is None:
        if total_steps is None:
            raise BertforgeError("set a budget: a maximum number of steps or a maximum time")
        warmup = round(cfg.warmup_ratio * total_steps)
        return lr_at(step, warmup=warmup, total=total_steps, **shape)
    progress = elapsed / budget
    if total_steps is not None:
        progress = max(progress, step / total_steps)
    return lr_at_progress(progress, warmup=cfg.warmup_ratio, **shape)


def budget_spent(
    step: int, elapsed: float, *, total_steps: int | None, budget: float | None
) -> bool:
    """True once the step budget or the wall-clock budget (whichever is set) is used up."""
    return (total_steps is not None and step >= total_steps) or (
        budget is not None and elapsed >= budget
    )


def micro_batches(rows: Sequence[int], micro: int) -> list[tuple[Sequence[int], float]]:
    """Split a batch's ``rows`` into consecutive micro-batches of ``micro`` rows (the last one
    smaller when ``micro`` does not divide them, as in an epoch's short last batch), each paired
    with its share of the rows: the weight of its mean loss in the mean loss of the batch."""
    n = len(rows)
    return [(rows[i : i + micro], min(micro, n - i) / n) for i in range(0, n, micro)]


def config_dict(cfg: Any) -> dict[str, Any]:
    """A (nested) dataclass config as plain JSON/YAML-able data: what a run records of itself."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples -> lists


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` (0 = no clipping); return the norm before."""
    limit = max_norm if max_norm > 0 else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(parameters, limit))


class NonFiniteGuard:
    """Decides whether an optimizer step may be taken. A non-finite loss or gradient norm (a bf16
    overflow, a bad batch) skips the step so it cannot poison the weights; ``limit`` skipped steps
    in a row stop the run with an error that ends in ``hint`` (how to fix it)."""

    def __init__(self, limit: int, hint: str) -> None:
        self.limit, self.hint, self.streak = limit, hint, 0

    def allows(self, loss: float, grad_norm: float, step: int) -> bool:
        """True when step ``step`` (1-based) may update the weights."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.streak = 0
            return True
        self.streak += 1
        if self.streak >= self.limit:
            raise BertforgeError(
                f"the loss was non-finite for {self.streak} steps in a row (step {step}); "
                + self.hint
            )
        return False


class RunningMeans:
    """The numbers behind one log line: means of the finite losses since the last line and the
    throughput over the same steps."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.steps, self.tokens, self.seconds = 0, 0.0, 0.0

    def add(self, tokens: float, seconds: float, **losses: float) -> None:
        """One step's token count and duration, and its losses if they are all finite."""
        if all(math.isfinite(v) for v in losses.values()):
            for key, value in losses.items():
                self.sums[key] = self.sums.get(key, 0.0) + value
            self.steps += 1
        self.tokens += tokens
        self.seconds += seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def means(self, *keys: str) -> dict[str, float]:
        """The mean of each loss in ``keys`` over the finite steps (0.0 when none was finite)."""
        return {key: self.sums.get(key, 0.0) / max(self.steps, 1) for key in keys}


def progress_bar(
    state: dict[str, Any], total_steps: int | None, budget: float | None, enabled: bool
) -> ProgressBar:
    """A bar over the steps, or over the seconds of a wall-clock budget, starting where
    ``state`` (``step``, ``elapsed``) is."""
    return ProgressBar(
        budget or total_steps,
        initial=state["elapsed"] if budget else state["step"],
        by_time=budget is not None,
        enabled=enabled,
    )


__all__ = [
    "NonFiniteGuard",
    "RunningMeans",
    "ScheduleOptions",
    "budget_spent",
    "clip_gradients",
    "micro_batches",
    "progress_bar",
    "scheduled_lr",
    "set_dropout",
]
