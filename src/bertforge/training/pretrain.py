"""Pretraining: :func:`pretrain`, the loop, and the named parts it calls (the ``bertforge
pretrain`` command that parses its config is ``bertforge.cli.pretrain``).

Per optimizer step: set the LR (a pure function of the step, or of elapsed time for a wall-clock
budget) -> draw this rank's share of the global batch -> accumulate micro-batches (loss
normalised by the GLOBAL number of masked tokens, so N ranks x B/N equal 1 process x B) -> clip ->
step unless the loss is non-finite -> log -> maybe evaluate / snapshot / checkpoint / stop on a
signal.

The run directory holds ``pretrain_config.yaml`` (the resolved config), ``metrics.jsonl``,
``checkpoint-*`` (model + optimizer + RNG + data position, the newest K), ``curves.png``, the
final ``model/`` (config.json, model.safetensors, vocab.txt, tokenizer.json, manifest.json) and,
with ``--train.snapshots``, ``snapshots/model-15m/`` ...: the model as ``model/`` holds it, saved
when the budget clock passed each time.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import yaml

from bertforge import distributed as D
from bertforge.data.loader import (
    pinned,
    prefetch,
    rows_for,
    validation_batches,
    with_masked_rows,
)
from bertforge.data.loader import steps as data_steps
from bertforge.errors import BertforgeError
from bertforge.evaluation.mlm import comparison_table, evaluate_mlm
from bertforge.evaluation.plots import plot_training_curves, run_title
from bertforge.evaluation.probe import LinearProbe
from bertforge.io import MANIFEST_NAME, atomic_directory, atomic_write_text, check_run_directory
from bertforge.modeling.model import BertForReplacedTokenDetection
from bertforge.modeling.pooling import copy_pooling_declaration
from bertforge.progress import MetricsLogger, format_duration, parse_duration, plural
from bertforge.runtime import (
    CoreWatch,
    autocast,
    compile_seconds,
    explain_compile,
    explain_precision,
    parse_bytes,
    peak_memory_bytes,
    pick_device,
    resident_memory_bytes,
    rng_state,
    seed_everything,
    set_rng_state,
    set_threads,
)
from bertforge.training import steps
from bertforge.training.budget import BatchPlan, measure_use, over_budget, plan_batches
from bertforge.training.checkpoints import (
    GracefulStop,
    check_same_run,
    duration_label,
    locks_output,
    snapshot_dir,
    write_checkpoint,
)
from bertforge.training.config import PretrainConfig, TrainConfig, snapshot_times
from bertforge.training.model_card import pretrain_card, write_model_card
from bertforge.training.objectives import UNITS, Objective, objective_for, unit_counts
from bertforge.training.optim import build_optimizer, set_lr
from bertforge.training.profiling import StepProfiler
from bertforge.training.setup import (
    PretrainingData,
    build_model,
    find_resume,
    open_data,
    random_twin,
    run_identity,
    start_pooler,
    start_report,
)
from bertforge.training.start import own_start, start_fresh

CONFIG_FILE = "pretrain_config.yaml"
FINAL_DIR = "model"
GENERATOR_DIR = "generator"
"""An rtd run's generator, as a fill-mask model (``model/`` holds the encoder)."""
PLOT_FILE = "curves.png"
Evaluations = dict[str, dict[str, Any]]
"""Metrics by evaluation set: ``val`` and ``val:<extra set>``."""


@dataclass
class PretrainState(steps.TrainState):
    """Pretraining's ``train_state.json``: the shared counters plus the data position and the
    evaluation of the untrained network (the final table's baseline)."""

    data: dict[str, int] = field(default_factory=dict)
    """The sampler's position (epoch, step in epoch)."""
    initial_eval: Evaluations | None = None
    """The evaluation before the first step."""
    random_eval: Evaluations | None = None
    """With --init_from: the same network freshly initialised (the table's third column)."""
    compile_seconds: float | None = None
    """Compiled (``--train.compile``, on by default on CUDA): seconds spent compiling, not charged
    to the time budget."""
    snapshots: dict[str, int] | None = None
    """With --train.snapshots: the snapshots written (``snapshots/model-15m``) -> the step each
    holds; a resumed run writes none of them again."""

    optional: ClassVar[tuple[str, ...]] = ("random_eval", "compile_seconds", "snapshots")


@dataclass
class Run:
    """What the loop works with, set up once by :func:`setup`."""

    cfg: PretrainConfig
    out: Path
    info: D.DistInfo
    device: torch.device
    precision: str
    budget: float | None
    data: PretrainingData
    raw: torch.nn.Module
    """The plain module: what is saved and evaluated."""
    ddp: torch.nn.Module
    forward: Callable[..., Any]
    """The module the training step calls (DDP- and compile-wrapped as configured)."""
    compiled: bool
    optimizer: torch.optim.Optimizer
    logger: MetricsLogger
    objective: Objective
    """The objective's named loss terms (and what it read of the training split)."""
    probe: LinearProbe | None = None
    """The downstream probe (``probe.train``), on the main process."""
    probes: list[dict[str, Any]] = field(default_factory=list)
    """The probe's scores (``step``, ``accuracy``, ...) at each evaluation point."""
    watch: CoreWatch | None = None
    """Says once when the step rate collapses for oversubscribed cores."""
    snapshots: list[float] = field(default_factory=list)
    """``--train.snapshots`` in seconds of the budget clock, earliest first."""

    def say(self, text: str) -> None:
        if self.info.is_main:
            print(text, file=sys.stderr, flush=True)

    def done(self, state: PretrainState) -> bool:
        return steps.budget_spent(
            state.step, state.elapsed, total_steps=self.cfg.train.max_steps, budget=self.budget
        )


def starts_random(cfg: PretrainConfig) -> bool:
    """True when step 0 is BERT's random initialisation; else (``--init_from`` or a variant of
    :data:`~bertforge.training.start.FRESH_STARTS`) the final table also shows the same network
    freshly initialised."""
    return not cfg.init_from and not own_start(cfg.train)


@locks_output
def pretrain(cfg: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) pretraining as configured; return the initial and final evaluations, the
    step reached and where the model and plot are. See the module docstring for the loop."""
    run, state = setup(cfg)
    tc = cfg.train
    if state.initial_eval is None:  # the untrained network: the baseline of the final table
        state.initial_eval = evaluate(run)
        log_evaluations(run, 0, state.initial_eval)
        if not starts_random(cfg):  # the same network freshly initialised: a third column
            state.random_eval = evaluate(run, model=random_twin(cfg, run.data).to(run.device))
    bar = steps.progress_bar(
        state, tc.max_steps, run.budget, enabled=run.info.is_main and tc.progress
    )
    window = steps.RunningMeans()
    guard = steps.NonFiniteGuard(
        tc.max_nonfinite,
        "lower --train.lr, raise --train.warmup_ratio or use --train.precision fp32",
    )
    stopped = None
    lagged = reads_late(run)
    pending: Pending | None = None  # (lagged) a step applied on the device, its numbers unread
    mark = time.perf_counter(), compile_seconds() if run.compiled else 0.0
    profiler = StepProfiler(tc.profile if run.info.is_main else 0, run.out, run.device)

    @profiler.phased("host")
    def complete(done: Pending) -> bool:
        """The host's part of a step: read its numbers, the guard, the log, evaluation, saving;
        True when the run stops after it."""
        nonlocal mark
        report, stop_everywhere = done.launched.read()
        if lagged:  # the optimizer step was taken, or skipped on the device, already
            if not guard.allows(report.losses["loss"], report.grad_norm, state.step):
                state.skipped += 1
                run.say(f"step {state.step}: non-finite loss/gradient, step skipped")
        else:
            steps.optimizer_step(
                run.optimizer, guard, state, report.losses["loss"], report.grad_norm, run.say
            )
        state.data = done.drawn.position
        now = time.perf_counter(), compile_seconds() if run.compiled else 0.0
        report.lr, report.seconds = done.lr, now[0] - (mark[0] if lagged else done.t0)
        if run.compiled:  # compiling is set-up, not training: kept out of the budget
            compiling = now[1] - mark[1]
            report.seconds = max(report.seconds - compiling, 0.0)
            state.compile_seconds = (state.compile_seconds or 0.0) + compiling
            if compiling > 1.0:
                run.say(f"step {state.step}: compiled in {compiling:.1f} s (not charged)")
        if run.watch is not None:
            run.watch.step(report.seconds / max(report.tokens, 1.0))
        steps.record_step(
            state,
            report,
            window,
            bar,
            run.logger,
            log=lambda: steps.due(state.step, tc.log_every) or run.done(state),
            state_fields=("tokens", "elapsed") + (("compile_seconds",) if run.compiled else ()),
            epoch=done.drawn.epoch,
            skipped=state.skipped,
        )
        if steps.due(state.step, tc.eval_every) and not run.done(state):
            results = evaluate(run, with_extra=False)
            log_evaluations(run, state.step, results)
            val = results["val"]
            probed = f"; probe accuracy {run.probes[-1]['accuracy']:.2%}" if run.probe else ""
            bar.write(
                f"step {state.step}: val MLM loss {val['loss']:.3f} "
                f"accuracy {val['accuracy']:.2%}{probed}"
            )
        take_snapshots(run, state, bar.write)  # before the checkpoint, which records them
        if not stop_everywhere and steps.due(state.step, tc.save_every) and not run.done(state):
            save_checkpoint(run, state)
        mark = time.perf_counter(), compile_seconds() if run.compiled else 0.0
        return stop_everywhere

    take_snapshots(run, state, bar.write)  # a time the charged start-up work passed already
    with GracefulStop() as stop, profiler:
        source = data_steps(run.data.loader, run.data.micro)
        if run.device.type == "cuda":  # collate the next step while the GPU runs this one
            rate = static_rate(run)
            source = prefetch(source, lambda step: pinned(with_masked_rows(step, rate)))
        while not run.done(state):
            profiler.step()
            t0 = time.perf_counter()
            lr = steps.scheduled_lr(
                state.step, state.elapsed, tc, total_steps=tc.max_steps, budget=run.budget
            )
            set_lr(run.optimizer, lr)
            with profiler.phase("data"):
                drawn = next(source)
            before = rng_state() if pending is not None else None
            with profiler.phase("launch"):
                launched = launch_step(run, drawn.batches, stop.requested)
            if pending is not None:  # the step before, read now that this one is queued
                ends = complete(pending)
                pending = None
                if ends or run.done(state):  # this step is not taken: undo what it drew
                    run.optimizer.zero_grad(set_to_none=True)
                    set_rng_state(before)  # type: ignore[arg-type]
                    stopped = (stop.signal_name or "signal") if ends else None
                    break
            current = Pending(launched, drawn, lr, t0)
            if not lagged:
                if complete(current):
                    stopped = stop.signal_name or "signal"
                    break
                continue
            with profiler.phase("optimizer"):
                apply_on_device(run.optimizer, launched)
            state.step += 1
            if acts_after(state.step, tc):  # a log, evaluation, save or the end: read it now
                if complete(current):
                    stopped = stop.signal_name or "signal"
                    break
            else:
                pending = current
    bar.close()
    save_checkpoint(run, state)
    if stopped:
        run.logger.close()
        resume = f"Resume with:\n  bertforge pretrain --config {run.out / CONFIG_FILE}"
        run.say(steps.stopped_message(run.out, state.step, stopped, resume))
        return {"stopped": True, "step": state.step, "initial": state.initial_eval}
    return finish(run, state)


def setup(cfg: PretrainConfig) -> tuple[Run, PretrainState]:
    """Devices and processes, data, model, optimizer and the state (fresh or resumed); writes the
    resolved config and says what will run."""
    tc = cfg.train
    if tc.max_steps is None and tc.max_time is None:
        raise BertforgeError("set a budget: --train.max_steps N or --train.max_time 15m (or both)")
    # every rank, before any of them writes there
    check_run_directory(cfg.output, CONFIG_FILE, "a pretraining run to resume")
    budget = parse_duration(tc.max_time)
    threads = set_threads(tc.num_threads)
    device = pick_device(tc.device, option="--train.device")
    info = D.init_distributed(device)
    device = D.local_device(device, info)
    compiled, compiling = explain_compile(tc.compile, device)
    if tc.compile_mode != "default":
        if not compiled:
            raise BertforgeError(
                f"--train.compile_mode {tc.compile_mode} is a mode of a compiled run and this "
                f"one runs eager ({compiling}): add --train.compile true or drop "
                "--train.compile_mode"
            )
        compiling += f", mode {tc.compile_mode}"
    data = open_data(cfg, rank=info.rank, world_size=info.world_size)
    pc, probe = cfg.probe, None
    if pc.train is not None and info.is_main:  # read now: a bad file fails before training
        probe = LinearProbe(
            data.tokenizer,
            [pc.train],
            [pc.test or ""],
            text_column=pc.text_column,
            label_column=pc.label_column,
            max_examples=pc.max_examples,
            max_length=pc.max_length,
            l2=pc.l2,
        )
    seed_everything(tc.seed)
    resume_dir = find_resume(cfg)
    model = build_model(cfg, data, resume_dir)
    precision, why = explain_precision(tc.precision, device, model.config.hidden_size)
    if cfg.init_from and resume_dir is None and info.is_main:
        print(start_report(cfg, model), file=sys.stderr, flush=True)
    objective, spent = start_up_work(cfg, data, model, resume_dir, budget, info.is_main)
    if tc.dropout is not None:
        steps.set_dropout(model, tc.dropout)
    raw = model.to(device)
    optimizer = build_optimizer(raw, tc.lr, tc.weight_decay, tuple(tc.betas), tc.eps)
    memory = "" if tc.max_memory is None else "; " + plan_memory(cfg, data, raw, precision, device)
    torch.manual_seed(tc.seed + 1 + 7919 * info.rank)  # each rank its own dropout stream
    identity = run_identity(cfg, data.meta, len(data.train))
    state = PretrainState(run=identity, data=data.sampler.state_dict(), elapsed=spent)
    if resume_dir is not None:
        state, blob = PretrainState.load(resume_dir, optimizer, restore_rng=False)
        check_same_run(resume_dir, state.run, identity)
        per_rank_rng = blob.get("rng_per_rank", [])  # blob["rng"] is rank 0's
        set_rng_state(per_rank_rng[info.rank] if info.rank < len(per_rank_rng) else blob["rng"])
        data.sampler.load_state_dict(state.data)
    ddp = D.wrap_ddp(raw, device, info)
    out = Path(cfg.output)
    if info.is_main:  # first: the file that makes OUTPUT a pretraining run (check_run_directory)
        resolved = steps.config_dict(cfg) | {"resume": None}  # rerunning this config auto-resumes
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(resolved, sort_keys=False))
    logger = MetricsLogger(
        out, enabled=info.is_main, resume_step=state.step if resume_dir is not None else None
    )
    forward = torch.compile(ddp, mode=tc.compile_mode) if compiled else ddp
    objective.to(device)
    run = Run(
        cfg, out, info, device, precision, budget, data, raw, ddp, forward, compiled, optimizer,
        logger, objective, probe,
    )  # fmt: skip
    run.watch = CoreWatch(threads, run.say, "--train.num_threads")
    run.snapshots = snapshot_times(tc)
    if resume_dir is not None:
        check_snapshots_resume(run, state)
    if resume_dir is not None and run.done(state):  # rerun of a finished run: not a resume
        run.say(
            f"{out} holds a finished run ({state.step} steps, its budget reached): nothing left "
            "to train; writing its final model and table again. To train further raise "
            "--train.max_steps or --train.max_time; to start over choose another --output"
        )
    elif resume_dir is not None:
        used = f" ({format_duration(state.elapsed)} of the budget used)" if budget else ""
        run.say(f"resuming from {resume_dir} at step {state.step}{used}")
    n_params = sum(p.numel() for p in raw.parameters())
    limits = (tc.max_steps and plural(tc.max_steps, "step"), budget and format_duration(budget))
    run.say(
        f"pretraining {type(raw).__name__} ({n_params / 1e6:.2f}M parameters, {precision} "
        f"({why}), {device}, {compiling}, {plural(threads, 'thread')}, "
        f"{plural(info.world_size, 'process', 'processes')}) on {len(data.train):,} sequences; batch "
        f"{tc.batch_size} = {info.world_size} x {data.accum} x {data.micro}; budget "
        + " and ".join(x for x in limits if x)
        + memory
    )
    return run, state


def plan_memory(
    cfg: PretrainConfig,
    data: PretrainingData,
    model: torch.nn.Module,
    precision: str,
    device: torch.device,
) -> str:
    """``--train.max_memory``: measure this model's memory on the longest training sequences
    (:mod:`bertforge.training.budget`), then set the micro-batch (``data.micro``,
    ``data.accum``, ``--train.micro_batch_size``) and ``--train.eval_batch_size`` to the largest
    that fit; returns the start line's account, or raises saying what would fit."""
    tc = cfg.train
    longest = np.argsort(data.train.lengths, kind="stable")[-4:][::-1].tolist()
    examples = [data.train[i] for i in longest]
    nsp = tc.objective == "mlm_nsp"

    def forward(k: int) -> torch.Tensor:
        batch = data.collator(examples[:k], longest[:k], 0)
        batch = {key: v.to(device) for key, v in batch.items()}
        with autocast(device, precision):
            return model(
                batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
                labels=batch["labels"],
                **({"next_sentence_label": batch["next_sentence_label"]} if nsp else {}),
            ).loss

    bf16_cpu = precision == "bf16" and device.type == "cpu"
    rows = cfg.masking.mlm_probability * data.meta["max_seq_length"]  # masked per sequence
    logits = int(rows * model.config.vocab_size)
    use = measure_use(forward, model, resident_memory_bytes(), bf16_cpu, logits)
    budget = parse_bytes(tc.max_memory, "--train.max_memory")
    per_rank = data.micro * data.accum
    wanted_eval = tc.eval_batch_size or data.micro
    try:
        plan = plan_batches(budget, use, per_rank, data.micro, wanted_eval, "--train.max_memory")
        mine: tuple[int, int, str | None] = (plan.micro, plan.eval_batch, None)
    except BertforgeError as err:  # every process hears of it (none is left waiting below)
        mine = (0, 0, str(err))
    # every process must accumulate alike: the smallest choice of any (their memory differs)
    chosen = D.gather_object(mine)
    refused = [why for *_, why in chosen if why]  # type: ignore[misc]
    if refused:
        raise BertforgeError(refused[0])
    micro, evals = min(c[0] for c in chosen), min(c[1] for c in chosen)  # type: ignore[index]
    plan = BatchPlan(micro, evals, use.eval_peak(evals, micro))
    data.micro, data.accum = plan.micro, per_rank // plan.micro
    tc.micro_batch_size, tc.eval_batch_size = plan.micro, plan.eval_batch
    return plan.describe(budget, use, per_rank, "--train.max_memory")


def start_up_work(
    cfg: PretrainConfig,
    data: PretrainingData,
    model: torch.nn.Module,
    resume_dir: Path | None,
    budget: float | None,
    say: bool,
) -> tuple[Objective, float]:
    """The start-up work that reads the training split, charged to the time budget: the charged
    start variants of a fresh model (co-occurrence word vectors) and what the objective reads
    (bag-of-words weights; charged unless resuming). Returns the objective and the seconds."""
    spent = 0.0
    fresh = resume_dir is None and not cfg.init_from
    for variant, done, seconds in start_fresh(model, cfg, data, charged=True) if fresh else []:
        spent += seconds
        if budget is not None and spent >= budget:
            raise BertforgeError(
                f"{variant.option} took {spent:.1f} s, the whole --train.max_time "
                f"{cfg.train.max_time}; give a larger budget or use {variant.instead}"
            )
        if say:
            print(f"{done} ({seconds:.1f} s, charged to the budget)", file=sys.stderr, flush=True)
    objective = objective_for(cfg.train)
    started = time.perf_counter()
    if objective.prepare(data.train, data.tokenizer, model.config.vocab_size) and not resume_dir:
        spent += time.perf_counter() - started
    return objective, spent


@dataclass
class Launched:
    """A step's forward/backward and clipping, queued on the device; ``read()`` waits for them
    and returns the step's report and whether any process was asked to stop."""

    totals: torch.Tensor
    """The step's loss sums, counts and stop flag, summed over the processes (on the device)."""
    norm: torch.Tensor
    """The gradient norm before clipping (on the device)."""
    read: Callable[[], tuple[steps.StepReport, bool]]

    def nonfinite(self) -> torch.Tensor:
        """1.0 on the device when the step's loss or gradient norm is not finite, else 0.0 (the
        ``found_inf`` a fused optimizer skips its update by), computed without waiting."""
        both = self.totals.sum() + self.norm.detach().to(self.totals)
        return (~torch.isfinite(both)).to(torch.float32)


@dataclass
class Pending:
    """A step launched by the loop: its launch, its data and when it began."""

    launched: Launched
    drawn: Any
    lr: float
    t0: float


def reads_late(run: Run) -> bool:
    """Whether the loop reads each step's numbers one step late (on CUDA with a fused optimizer):
    the next step is queued before this one's loss and gradient norm are read, so the GPU never
    waits for the host between steps; the non-finite guard then skips a bad step on the device
    (the fused optimizer's ``found_inf``) and the host learns of it at the read. Elsewhere (the
    CPU, where a read costs nothing) each step is read before the next starts."""
    optimizer = run.optimizer
    fused = all(group.get("fused") for group in optimizer.param_groups)
    return run.device.type == "cuda" and fused and isinstance(optimizer, torch.optim.AdamW)


def apply_on_device(optimizer: torch.optim.Optimizer, launched: Launched) -> None:
    """The optimizer step of a launched step, skipped on the device when its loss or gradient
    is not finite; the gradients cleared."""
    optimizer.found_inf = launched.nonfinite()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]
    optimizer.zero_grad(set_to_none=True)


def acts_after(step: int, tc: TrainConfig) -> bool:
    """Whether the loop does more than count after ``step``: a log line, an evaluation, a
    checkpoint or the last step of a step budget. A lagged loop reads such a step at once."""
    every = (tc.log_every, tc.eval_every, tc.save_every)
    return any(steps.due(step, n) for n in every) or bool(tc.max_steps and step >= tc.max_steps)


def train_step(
    run: Run, micro_batches: list[dict[str, torch.Tensor]], stop_requested: bool
) -> tuple[steps.StepReport, bool]:
    """:func:`launch_step`, read at once."""
    return launch_step(run, micro_batches, stop_requested).read()


def launch_step(
    run: Run, micro_batches: list[dict[str, torch.Tensor]], stop_requested: bool
) -> Launched:
    """Forward/backward of one step's micro-batches and gradient clipping; the objective's named
    losses and the tokens summed over all processes, and whether any process was asked to stop.

    Each loss term is a mean per micro-batch, weighted by its share of the global batch in the
    term's unit (:data:`~bertforge.training.objectives.UNITS`: masked tokens for MLM, labelled
    pairs for NSP, real tokens for replaced-token detection)."""
    objective, world = run.objective, run.info.world_size
    terms, scores = objective.terms, objective.scores
    # per micro-batch: masked tokens, pairs, real tokens (counted once, on the CPU)
    local = torch.tensor(
        [unit_counts(b, objective.pair_field) for b in micro_batches], dtype=torch.float64
    )  # (accum, 3)
    total = dict(zip(UNITS, D.all_reduce_sum(local.sum(0)).tolist(), strict=True))  # global
    # summed where the losses are, read once at the end of the step (one wait for the device)
    where = _sums_device(run.device)
    sums = {
        name: torch.zeros((), dtype=torch.float64, device=where)
        for name in [*terms, *scores, "tokens", "stop"]
    }

    def loss_of(k: int) -> torch.Tensor:
        counts = dict(zip(UNITS, local[k].tolist(), strict=True))
        part = micro_batches[k]
        padded = counts["tokens"] < part["attention_mask"].numel()  # decided here, on the host
        if "masked_rows" not in part:  # found on the host: no wait for the device (prefetch)
            part = part | {"masked_rows": rows_for(part["labels"], static_rate(run))}
        batch = {key: v.to(run.device, non_blocking=True) for key, v in part.items()}
        with autocast(run.device, run.precision):
            output = run.forward(
                batch["input_ids"],
                attention_mask=batch["attention_mask"] if padded else None,
                token_type_ids=batch["token_type_ids"],
                labels=batch["labels"],
                **objective.forward_kwargs(batch, counts),
            )
        loss = None
        for name, value in objective.losses(output, batch, run.raw).items():
            if name in scores:
                sums[name] += value.to(sums[name])
                continue
            # a per-micro-batch mean -> its share of the global mean; DDP then averages ranks
            unit, weight = terms[name].unit, terms[name].weight
            part_loss = weight * value * (counts[unit] * world / total[unit])
            loss = part_loss if loss is None else loss + part_loss
            sums[name] += value.detach().to(sums[name]) * counts[unit]
        sums["tokens"] += counts["tokens"]
        return loss

    steps.accumulate(
        range(len(micro_batches)), loss_of, run.ddp.no_sync if run.info.enabled else None
    )
    norm = steps.clip_norm(run.raw.parameters(), run.cfg.train.max_grad_norm)
    sums["stop"].fill_(float(stop_requested))
    names = list(sums)
    on_device = D.all_reduce_sum(torch.stack([sums[name] for name in names]))
    return Launched(on_device, norm, lambda: _read_step(on_device, norm, names, total, objective))


def static_rate(run: Run) -> float | None:
    """The masking rate when the model is compiled (its masked rows are then padded to a count
    that stays put: ``static_masked_rows``), else None (the rows as they are)."""
    return run.cfg.masking.mlm_probability if run.compiled else None


def _read_step(
    on_device: torch.Tensor,
    norm: torch.Tensor,
    names: list[str],
    total: dict[str, float],
    objective: Objective,
) -> tuple[steps.StepReport, bool]:
    """A launched step's report: its sums (``names``) and norm read (the step's one wait for the
    device) and turned into the objective's mean losses, each over its unit's ``total``."""
    totals, grad_norm = _to_host(on_device, norm)
    summed = dict(zip(names, totals.tolist(), strict=True))
    terms = [(name, term.unit) for name, term in objective.terms.items()]
    means = {
        name: summed[name] / total[unit] if total[unit] else 0.0
        for name, unit in [*terms, *objective.scores.items()]
    }
    loss = None
    for name, term in objective.terms.items():
        weighted = term.weight * means[name]
        loss = weighted if loss is None else loss + weighted
    losses = {"loss": loss or 0.0, **means}
    report = steps.StepReport(0.0, grad_norm, summed["tokens"], 0.0, losses)
    return report, summed["stop"] > 0


def _sums_device(device: torch.device) -> torch.device:
    """Where a step's float64 loss sums accumulate: beside the losses, except on MPS (no
    float64), where they go to the CPU."""
    return torch.device("cpu") if device.type == "mps" else device


def _to_host(totals: torch.Tensor, norm: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The step's sums and gradient norm on the CPU, in one copy."""
    both = torch.cat([totals, norm.detach().to(totals).view(1)]).cpu()
    return both[:-1], float(both[-1])


def evaluate(
    run: Run, with_extra: bool = True, model: torch.nn.Module | None = None
) -> Evaluations:
    """MLM metrics of ``model`` (default: the one training) on the validation split, and on the
    extra sets when ``with_extra`` (before and after training only)."""
    sets = {"val": run.data.val}
    if with_extra:
        sets |= {f"val:{name}": ds for name, ds in run.data.extra.items()}
    tc = run.cfg.train
    return {
        name: evaluate_mlm(
            run.raw if model is None else model,
            validation_batches(
                ds,
                run.data.collator,
                tc.eval_batch_size or run.data.micro,
                rank=run.info.rank,
                world_size=run.info.world_size,
                max_examples=tc.eval_examples,
            ),
            run.device,
            run.precision,
            reduce_across_ranks=True,
        )
        for name, ds in sets.items()
    }


def log_evaluations(run: Run, step: int, results: Evaluations) -> None:
    """Log the evaluations, and score the downstream probe at this point."""
    for name, metrics in results.items():
        run.logger.log(step, name, **{k: v for k, v in metrics.items() if v is not None})
    if run.probe is not None:  # frozen features: no gradient, no random numbers drawn
        scores = run.probe(run.raw)
        run.logger.log(step, "probe", **scores)
        run.probes.append({"step": step, **scores})


def save_checkpoint(run: Run, state: PretrainState) -> None:
    """Every process's RNG state gathered; the main process writes the checkpoint."""
    ranks_rng = D.gather_object(rng_state())
    if run.info.is_main:
        write_checkpoint(
            run.out,
            run.raw,
            run.data.tokenizer,
            state=state.to_json(),
            optimizer=run.optimizer,
            keep=run.cfg.train.keep_checkpoints,
            extra_tensors={"rng_per_rank": ranks_rng},
        )
    D.barrier()


def save_model(run: Run, directory: Path) -> list[str]:
    """Write the model into ``directory``, whole or not at all, as the final ``model/`` is
    written (an rtd run: its encoder; a run from ``--init_from``: with the pooler and pooling
    declaration MLM cannot train, taken from the start); returns what was so carried over."""
    with atomic_directory(directory) as tmp:
        if isinstance(run.raw, BertForReplacedTokenDetection):
            run.raw.save_encoder(tmp, tokenizer=run.data.tokenizer)
            return []
        start = run.cfg.init_from
        kept = start_pooler(start, run.raw) if start else {}  # what MLM cannot train
        run.raw.save_pretrained(tmp, tokenizer=run.data.tokenizer, extra_tensors=kept)
        return (["pooler"] if kept else []) + (
            copy_pooling_declaration(start, Path(tmp)) if start else []
        )


def due_snapshots(times: Sequence[float], elapsed: float, written: Collection[str]) -> list[float]:
    """The snapshot ``times`` (seconds) the budget clock has reached at ``elapsed`` whose
    snapshot (named by :func:`~bertforge.training.checkpoints.duration_label`) is not among
    ``written``, earliest first."""
    return [t for t in times if t <= elapsed and duration_label(t) not in written]


def take_snapshots(run: Run, state: PretrainState, say: Callable[[str], None]) -> None:
    """Save the snapshot of every ``--train.snapshots`` time the budget clock has passed that
    this run has not written (:func:`save_model` into ``snapshots/model-15m``), on the main
    process, and record it in ``state`` (the checkpoint saves it: a resumed run writes none
    again). One on disk that the state lacks (the run was killed after writing it, before a
    checkpoint recorded it) is kept, not written twice. Not charged to the budget."""
    for seconds in due_snapshots(run.snapshots, state.elapsed, state.snapshots or {}):
        target = snapshot_dir(run.out, seconds)
        kept = run.info.is_main and (target / MANIFEST_NAME).is_file()
        if run.info.is_main and not kept:
            save_model(run, target)
        state.snapshots = {**(state.snapshots or {}), duration_label(seconds): state.step}
        if run.info.is_main:
            how = "kept, written before the restart" if kept else f"step {state.step}"
            say(f"snapshot at {format_duration(seconds)} of the budget ({how}): {target}")


def written_snapshots(run: Run, state: PretrainState) -> dict[str, dict[str, Any]]:
    """results.json's ``snapshots``: by name (``15m``), each written snapshot's directory and the
    step it holds."""
    written = state.snapshots or {}
    found = {}
    for seconds in run.snapshots:
        label = duration_label(seconds)
        if label in written:
            found[label] = {
                "model_dir": str(snapshot_dir(run.out, seconds)),
                "step": written[label],
            }
    return found


def check_snapshots_resume(run: Run, state: PretrainState) -> None:
    """Refuse to resume past a ``--train.snapshots`` time whose snapshot this run never wrote (a
    time added when resuming, or a checkpoint of an older bertforge): it cannot be taken now."""
    for seconds in due_snapshots(run.snapshots, state.elapsed, state.snapshots or {}):
        if not (snapshot_dir(run.out, seconds) / MANIFEST_NAME).is_file():
            raise BertforgeError(
                f"--train.snapshots {duration_label(seconds)}: this run resumes at "
                f"{format_duration(state.elapsed)} of its budget, past that time, and never "
                "saved its snapshot; drop it from --train.snapshots (or start a new --output)"
            )


def write_cards(run: Run, result: dict[str, Any]) -> None:
    """The model card (README.md) of the final model and of each snapshot (whose scores are
    those logged at its step, if an evaluation fell there)."""
    out = run.out
    write_model_card(
        out / FINAL_DIR, pretrain_card(run.cfg, result, out, out / FINAL_DIR, run.device)
    )
    for label, snap in result["snapshots"].items():
        at = {**result, "step": snap["step"], "elapsed": parse_duration(label)}
        card = pretrain_card(run.cfg, at, out, Path(snap["model_dir"]), run.device)
        write_model_card(snap["model_dir"], card)


def finish(run: Run, state: PretrainState) -> dict[str, Any]:
    """The end-of-run report: the final evaluation, the model, the curves, results.json and the
    "random init vs trained" tables."""
    out, final = run.out, evaluate(run)
    log_evaluations(run, state.step, final)
    run.logger.close()
    result = {
        "stopped": False,
        "step": state.step,
        "elapsed": state.elapsed,
        "tokens": state.tokens,
        "skipped": state.skipped,
        "initial": state.initial_eval,
        "random_init": state.random_eval,
        "final": final,
        "probe": run.probes,
        "model_dir": str(out / FINAL_DIR),
        "snapshots": written_snapshots(run, state),
        "plot": str(out / PLOT_FILE),
        "peak_memory_bytes": peak_memory_bytes(),
    }
    if run.info.is_main:
        electra = isinstance(run.raw, BertForReplacedTokenDetection)
        carried = save_model(run, out / FINAL_DIR)
        if carried:
            run.say(
                f"kept from {run.cfg.init_from}: {', '.join(carried)} (not trained by this run)"
            )
        if electra:
            with atomic_directory(out / GENERATOR_DIR) as tmp:
                run.raw.generator_model().save_pretrained(tmp, tokenizer=run.data.tokenizer)
        plot_training_curves(out, out / PLOT_FILE, title=f"bertforge pretrain: {run_title(out)}")
        atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
        write_cards(run, result)
        assert state.initial_eval is not None
        for name in final:
            title = f"{name} ({'validation split' if name == 'val' else 'extra evaluation set'})"
            trained = f"trained ({plural(state.step, 'step')})"
            columns = {"random init": state.initial_eval[name], trained: final[name]}
            legend = ""
            if not starts_random(run.cfg):  # start vs trained, beside the random-init network
                done = f"{'adapted' if run.cfg.init_from else 'trained'} ({plural(state.step, 'step')})"
                start = "step 0 (--init_from)" if run.cfg.init_from else "step 0 (own init)"
                columns = {
                    "BERT random init": (state.random_eval or {}).get(name, {}),
                    start: state.initial_eval[name],
                    done: final[name],
                }
                legend = (
                    f"\n{start}: this run before its first step; BERT random init: the same "
                    "network as BERT initialises it, never trained (for reference only)"
                )
            run.say("\n" + comparison_table(columns, title) + legend)
        if run.probes:
            probe_line = " -> ".join(f"{p['accuracy']:.2%} (step {p['step']})" for p in run.probes)
            run.say(
                "\ndownstream probe (logistic regression on frozen mean-pooled features, "
                f"{run.probes[-1]['examples']:,} test rows of {run.cfg.probe.test}): accuracy "
                + probe_line
            )
        run.say(
            f"\nmodel: {out / FINAL_DIR}\nplot:  {out / PLOT_FILE}\nmetrics: {out / 'metrics.jsonl'}"
            + "".join(f"\nsnapshot {k}: {v['model_dir']}" for k, v in result["snapshots"].items())
        )
        tc = run.cfg.train
        over = tc.max_memory and over_budget(
            result["peak_memory_bytes"], parse_bytes(tc.max_memory), "--train.max_memory"
        )
        if over:
            run.say(over)
        cut = steps.schedule_cut(
            state.step,
            state.elapsed,
            total_steps=tc.max_steps,
            budget=run.budget,
            option="--train.max_time",
        )
        if cut:  # last, where it is seen
            run.say(cut)
    D.barrier()
    return result


__all__ = [
    "CONFIG_FILE",
    "FINAL_DIR",
    "GENERATOR_DIR",
    "PLOT_FILE",
    "PretrainState",
    "Run",
    "due_snapshots",
    "pretrain",
    "save_model",
]
