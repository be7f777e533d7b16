"""The parts of a training loop that ``pretrain`` and ``finetune`` share, written once so the
two loops cannot drift apart: the typed train state a checkpoint saves (:class:`TrainState`),
the learning rate by steps or by wall-clock time, the budget check, micro-batch accumulation
(:func:`accumulate`), gradient clipping, the non-finite guard and the optimizer step
(:func:`optimizer_step`), the running means, progress bar and log line of each step
(:func:`record_step`), when to evaluate (:func:`due`) and the message of a run stopped by a
signal (:func:`stopped_message`).

Each loop is one short function that calls these in order; see ``pretrain.py`` and
``finetune.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.progress import MetricsLogger, ProgressBar, format_duration
from bertforge.training.checkpoints import checkpoint_name, load_train_state
from bertforge.training.optim import lr_at, lr_at_progress

S = TypeVar("S", bound="TrainState")
T = TypeVar("T")


@dataclass
class TrainState:
    """The counters a checkpoint's ``train_state.json`` holds for both loops; each loop's state
    adds its own fields. The JSON is :func:`dataclasses.asdict` of it (the same keys as before the
    state was typed, so old checkpoints resume)."""

    step: int = 0
    """Optimizer steps taken (skipped non-finite steps included)."""
    elapsed: float = 0.0
    """Training seconds so far (evaluation and checkpoints not counted): the time budget's clock."""
    tokens: int = 0
    """Real (non-padding) tokens trained on."""
    skipped: int = 0
    """Steps skipped because the loss or gradient was non-finite."""
    run: dict[str, Any] = field(default_factory=dict)
    """The settings a resumed run must share (see ``check_same_run``)."""

    optional: ClassVar[tuple[str, ...]] = ()
    """Fields left out of the JSON while None (written only by the runs that use them)."""

    def to_json(self) -> dict[str, Any]:
        state = dataclasses.asdict(self)
        return {k: v for k, v in state.items() if not (k in self.optional and v is None)}

    @classmethod
    def load(
        cls: type[S], directory: Path, optimizer: torch.optim.Optimizer, restore_rng: bool = True
    ) -> tuple[S, dict[str, Any]]:
        """The state saved in checkpoint ``directory`` (the optimizer and, with ``restore_rng``,
        the RNG restored in place) and the raw torch payload; a required key missing is a damaged
        checkpoint."""
        required = [f.name for f in dataclasses.fields(cls) if f.name not in cls.optional]
        saved, blob = load_train_state(
            directory, optimizer=optimizer, restore_rng=restore_rng, keys=required
        )
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known}), blob


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
    decay_ratio: float


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
        max_lr=cfg.lr,
        schedule=cfg.schedule,
        min_lr_ratio=getattr(cfg, "min_lr_ratio", 0.0),
        decay_ratio=cfg.decay_ratio,
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


def schedule_cut(
    step: int, elapsed: float, *, total_steps: int | None, budget: float | None, option: str
) -> str | None:
    """The line a run ends with when its wall-clock budget (``option``, e.g. ``--max_time``)
    ended it before its step schedule (``--epochs``/``--max_steps``): how many of the planned
    steps ran, and the budget that would run them all at this pace; None when the schedule
    finished (or there was no budget)."""
    if budget is None or total_steps is None or step >= total_steps or elapsed < budget:
        return None
    share = step / total_steps
    whole = elapsed / max(step, 1) * total_steps
    return (
        f"budget cut the schedule: ran {step:,} of {total_steps:,} steps ({share:.0%}) in "
        f"{option} {format_duration(budget)}; all of them need about {format_duration(whole)} "
        "at this pace"
    )


def micro_batches(
    rows: Sequence[int], micro: int, units: Sequence[float] | None = None
) -> list[tuple[Sequence[int], float]]:
    """Split a batch's ``rows`` into consecutive micro-batches of ``micro`` rows (the last one
    smaller when ``micro`` does not divide them, as in an epoch's short last batch), each paired
    with its share of the batch: the weight of its mean loss in the mean loss of the batch. The
    share counts rows, or ``units`` (one count per row) where the loss is a mean over something
    else, e.g. a tagger's labelled words, so that the micro-batches add up to the batch's mean; a
    micro-batch with none is left out (a batch with none at all has no micro-batches)."""
    n = len(rows)
    if units is None:
        return [(rows[i : i + micro], min(micro, n - i) / n) for i in range(0, n, micro)]
    counts = [float(u) for u in units]
    total = sum(counts)
    parts = [(rows[i : i + micro], sum(counts[i : i + micro])) for i in range(0, n, micro)]
    # a micro-batch without units adds nothing to the mean (and its own mean would be NaN)
    return [(part, count / total) for part, count in parts if count > 0]


def config_dict(cfg: Any) -> dict[str, Any]:
    """A (nested) dataclass config as plain JSON/YAML-able data: what a run records of itself."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples -> lists


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` (0 = no clipping); return the norm before."""
    return float(clip_norm(parameters, max_norm))


def clip_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """:func:`clip_gradients` returning the norm as a tensor on the gradients' device (reading
    it is a wait for the device, which a loop does once per step)."""
    limit = max_norm if max_norm > 0 else float("inf")
    return torch.nn.utils.clip_grad_norm_(parameters, limit)


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
    state: TrainState, total_steps: int | None, budget: float | None, enabled: bool
) -> ProgressBar:
    """A bar over the steps, or over the seconds of a wall-clock budget, starting where
    ``state`` is."""
    return ProgressBar(
        budget or total_steps,
        initial=state.elapsed if budget else state.step,
        by_time=budget is not None,
        enabled=enabled,
    )


def accumulate(
    parts: Sequence[T],
    loss_of: Callable[[T], torch.Tensor],
    no_sync: Callable[[], AbstractContextManager] | None = None,
) -> None:
    """Gradient accumulation: ``loss_of(part).backward()`` for each micro-batch, the gradients
    summing in place. ``loss_of`` returns the micro-batch's loss already weighted by its share of
    the step; under DDP, ``no_sync`` (the wrapper's) keeps all but the last backward local."""
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            loss_of(part).backward()


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    guard: NonFiniteGuard,
    state: TrainState,
    loss: float,
    grad_norm: float,
    say: Callable[[str], None] | None = None,
) -> None:
    """Step the optimizer unless the loss or gradient is non-finite (then count the step as
    skipped, and ``say`` so), clear the gradients and count the step."""
    if guard.allows(loss, grad_norm, state.step + 1):
        optimizer.step()
    else:
        state.skipped += 1
        if say is not None:
            say(f"step {state.step + 1}: non-finite loss/gradient, step skipped")
    optimizer.zero_grad(set_to_none=True)
    state.step += 1


@dataclass
class StepReport:
    """What one optimizer step measured, for the progress bar and the log."""

    lr: float
    grad_norm: float
    tokens: float
    """Real tokens of the step (all processes)."""
    seconds: float
    losses: dict[str, float]
    """``loss`` first, then its parts (``mlm_loss``, ``nsp_loss``)."""


def record_step(
    state: TrainState,
    report: StepReport,
    window: RunningMeans,
    bar: ProgressBar,
    logger: MetricsLogger,
    log: Callable[[], bool],
    state_fields: Sequence[str] = (),
    **fields: Any,
) -> None:
    """Add the step's tokens and time to ``state``, update the running means and the bar, and
    when ``log()`` (asked after the update) write the train line (the mean losses since the last line, the LR, gradient
    norm, throughput, the ``state_fields`` of the updated state, then ``fields``) and start a
    new window."""
    state.tokens += int(report.tokens)
    state.elapsed += report.seconds
    window.add(report.tokens, report.seconds, **report.losses)
    bar.update(
        step=state.step,
        elapsed=state.elapsed,
        loss=report.losses["loss"],
        lr=report.lr,
        tokens_per_s=window.tokens_per_s,
        mlm_loss=report.losses.get("mlm_loss"),
    )
    if log():
        logger.log(
            state.step,
            "train",
            **window.means(*report.losses),
            lr=report.lr,
            grad_norm=report.grad_norm,
            tokens_per_s=window.tokens_per_s,
            **{name: getattr(state, name) for name in state_fields},
            **fields,
        )
        window.reset()


def due(step: int, every: int) -> bool:
    """True every ``every`` steps (never for 0): the evaluation, log and checkpoint schedule."""
    return every > 0 and step % every == 0


def stopped_message(out: Path, step: int, signal: str, resume: str) -> str:
    """What a run stopped by a signal says: where its checkpoint is and how to resume."""
    return (
        f"stopped at step {step} on {signal}; checkpoint saved in {out / checkpoint_name(step)}. "
        + resume
    )


__all__ = [
    "schedule_cut",
    "NonFiniteGuard",
    "RunningMeans",
    "ScheduleOptions",
    "StepReport",
    "TrainState",
    "accumulate",
    "budget_spent",
    "clip_gradients",
    "clip_norm",
    "due",
    "micro_batches",
    "optimizer_step",
    "progress_bar",
    "record_step",
    "scheduled_lr",
    "set_dropout",
    "stopped_message",
]
