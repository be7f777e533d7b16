"""Pretraining: the loop, one flat function (the ``bertforge pretrain`` command that parses its
config is ``bertforge.cli.pretrain``).

Per optimizer step: set the LR (a pure function of the step, or of elapsed time for a wall-clock
budget) -> draw this rank's share of the global batch -> accumulate micro-batches (loss
normalised by the GLOBAL number of masked tokens, so N ranks x B/N equal 1 process x B) -> clip ->
step unless the loss is non-finite -> log -> maybe evaluate / checkpoint / stop on a signal.

The run directory holds ``pretrain_config.yaml`` (the resolved config), ``metrics.jsonl``,
``checkpoint-*`` (model + optimizer + RNG + data position, the newest K), ``curves.png`` and the
final ``model/`` (config.json, model.safetensors, vocab.txt, tokenizer.json).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from bertforge import distributed as D
from bertforge.data.loader import validation_batches
from bertforge.errors import BertforgeError
from bertforge.evaluation.mlm import comparison_table, evaluate_mlm
from bertforge.evaluation.plots import plot_training_curves
from bertforge.evaluation.probe import LinearProbe
from bertforge.io import atomic_directory, atomic_write_text
from bertforge.modeling.model import IGNORE_INDEX
from bertforge.progress import MetricsLogger, format_duration, parse_duration
from bertforge.runtime import (
    autocast,
    pick_device,
    pick_precision,
    rng_state,
    seed_everything,
    set_rng_state,
)
from bertforge.training import steps
from bertforge.training.checkpoints import (
    GracefulStop,
    check_same_run,
    checkpoint_name,
    load_train_state,
    write_checkpoint,
)
from bertforge.training.config import PretrainConfig
from bertforge.training.optim import build_optimizer, set_lr
from bertforge.training.setup import (
    build_model,
    find_resume,
    open_data,
    random_twin,
    run_identity,
    start_report,
)

CONFIG_FILE = "pretrain_config.yaml"
FINAL_DIR = "model"
PLOT_FILE = "curves.png"


def pretrain(cfg: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) pretraining as configured; return the initial and final evaluations, the
    step reached and where the model and plot are. See the module docstring for the loop."""
    tc = cfg.train
    if tc.max_steps is None and tc.max_time is None:
        raise BertforgeError("set a budget: --train.max_steps N or --train.max_time 15m (or both)")
    budget = parse_duration(tc.max_time)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    device = pick_device(tc.device)
    info = D.init_distributed(device)
    device = D.local_device(device, info)
    precision = pick_precision(tc.precision, device)
    out = Path(cfg.output)
    main_proc = info.is_main

    def say(text: str) -> None:
        if main_proc:
            print(text, file=sys.stderr, flush=True)

    # ---- data and model ------------------------------------------------------------------------
    data = open_data(cfg, rank=info.rank, world_size=info.world_size)
    tokenizer, train_ds, sampler, collator = data.tokenizer, data.train, data.sampler, data.collator
    use_nsp, micro, accum = tc.objective == "mlm_nsp", data.micro, data.accum
    pc = cfg.probe
    probe = None
    if pc.train is not None and main_proc:  # read now: a bad file fails before training
        probe = LinearProbe(
            tokenizer,
            [pc.train],
            [pc.test or ""],
            text_column=pc.text_column,
            label_column=pc.label_column,
            max_examples=pc.max_examples,
            max_length=pc.max_length,
            l2=pc.l2,
        )
    probes: list[dict[str, Any]] = []  # {"step", "accuracy", ...} per evaluation point
    seed_everything(tc.seed)
    resume_dir = find_resume(cfg)
    model = build_model(cfg, data, resume_dir)
    if cfg.init_from and resume_dir is None:
        say(start_report(cfg, model))

    # ---- optimizer, state --------------------------------------------------------------------
    if tc.dropout is not None:
        steps.set_dropout(model, tc.dropout)
    raw = model.to(device)  # the plain module: what is saved and evaluated
    optimizer = build_optimizer(raw, tc.lr, tc.weight_decay, tuple(tc.betas), tc.eps)
    torch.manual_seed(tc.seed + 1 + 7919 * info.rank)  # each rank its own dropout stream
    identity = run_identity(cfg, data.meta, len(train_ds))
    state: dict[str, Any] = {
        "step": 0,
        "elapsed": 0.0,
        "tokens": 0,
        "skipped": 0,
        "data": sampler.state_dict(),
        "initial_eval": None,
        "run": identity,
    }
    if resume_dir is not None:
        state, blob = load_train_state(
            resume_dir, optimizer=optimizer, restore_rng=False, keys=state
        )
        check_same_run(resume_dir, state["run"], identity)
        per_rank_rng = blob.get("rng_per_rank", [])  # blob["rng"] is rank 0's
        set_rng_state(per_rank_rng[info.rank] if info.rank < len(per_rank_rng) else blob["rng"])
        sampler.load_state_dict(state["data"])
        say(
            f"resuming from {resume_dir} at step {state['step']}"
            + (f" ({format_duration(state['elapsed'])} of the budget used)" if budget else "")
        )
    ddp = D.wrap_ddp(raw, device, info)
    forward = torch.compile(ddp) if tc.compile else ddp
    logger = MetricsLogger(
        out, enabled=main_proc, resume_step=state["step"] if resume_dir is not None else None
    )
    if main_proc:
        resolved = steps.config_dict(cfg) | {"resume": None}  # rerunning this config auto-resumes
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(resolved, sort_keys=False))

    eval_bs = tc.eval_batch_size or micro

    def evaluate_all(
        with_extra: bool = True, model: torch.nn.Module | None = None
    ) -> dict[str, dict[str, Any]]:
        """The validation split (+ the extra sets: before and after training only)."""
        sets = {"val": data.val}
        if with_extra:
            sets |= {f"val:{name}": ds for name, ds in data.extra.items()}
        return {
            name: evaluate_mlm(
                raw if model is None else model,
                validation_batches(
                    ds,
                    collator,
                    eval_bs,
                    rank=info.rank,
                    world_size=info.world_size,
                    max_examples=tc.eval_examples,
                ),
                device,
                precision,
                reduce_across_ranks=True,
            )
            for name, ds in sets.items()
        }

    def log_eval(step: int, results: dict[str, dict[str, Any]]) -> None:
        for name, metrics in results.items():
            logger.log(step, name, **{k: v for k, v in metrics.items() if v is not None})
        if probe is not None:  # frozen features: no gradient, no random numbers drawn
            scores = probe(raw)
            logger.log(step, "probe", **scores)
            probes.append({"step": step, **scores})

    def save_checkpoint() -> None:
        ranks_rng = D.gather_object(rng_state())
        if main_proc:
            write_checkpoint(
                out,
                raw,
                tokenizer,
                state=state,
                optimizer=optimizer,
                keep=tc.keep_checkpoints,
                extra_tensors={"rng_per_rank": ranks_rng},
            )
        D.barrier()

    def done() -> bool:
        return steps.budget_spent(
            state["step"], state["elapsed"], total_steps=tc.max_steps, budget=budget
        )

    n_params = sum(p.numel() for p in raw.parameters())
    say(
        f"pretraining {type(raw).__name__} ({n_params / 1e6:.2f}M parameters, {precision}, "
        f"{device}, {info.world_size} process(es)) on {len(train_ds):,} sequences; batch "
        f"{tc.batch_size} = {info.world_size} x {accum} x {micro}; budget "
        + " and ".join(
            x
            for x in (tc.max_steps and f"{tc.max_steps} steps", budget and format_duration(budget))
            if x
        )
    )
    if state["initial_eval"] is None:  # the untrained network: the baseline of the final table
        state["initial_eval"] = evaluate_all()
        log_eval(0, state["initial_eval"])
        if cfg.init_from:  # the same network freshly initialised: the table's third column
            state["random_eval"] = evaluate_all(model=random_twin(cfg, data).to(device))

    # ---- the loop -------------------------------------------------------------------------------
    bar = steps.progress_bar(state, tc.max_steps, budget, enabled=main_proc and tc.progress)
    batches = iter(sampler)
    window = steps.RunningMeans()
    guard = steps.NonFiniteGuard(
        tc.max_nonfinite,
        "lower --train.lr, raise --train.warmup_ratio or use --train.precision fp32",
    )
    stopped = None
    with GracefulStop() as stop:
        while not done():
            t0 = time.perf_counter()
            lr = steps.scheduled_lr(
                state["step"], state["elapsed"], tc, total_steps=tc.max_steps, budget=budget
            )
            set_lr(optimizer, lr)
            indices = next(batches)
            epoch = sampler.epoch  # the epoch of the batch just drawn
            parts = [rows for rows, _ in steps.micro_batches(indices, micro)]
            micro_batches = [collator([train_ds[i] for i in c], c, epoch) for c in parts]
            # per micro-batch: masked tokens, NSP labels, real tokens (counted once, on the CPU)
            local = torch.tensor(
                [
                    [
                        float((b["labels"] != IGNORE_INDEX).sum()),
                        float((b["next_sentence_label"] >= 0).sum()),
                        float(b["attention_mask"].sum()),
                    ]
                    for b in micro_batches
                ],
                dtype=torch.float64,
            )  # (accum, 3)
            # over the whole global batch
            n_masked, n_nsp = D.all_reduce_sum(local[:, :2].sum(0)).tolist()
            sums = torch.zeros(4, dtype=torch.float64)  # mlm CE sum, nsp CE sum, tokens, stop
            for k, (batch, counts) in enumerate(zip(micro_batches, local.tolist(), strict=True)):
                n_local, n_local_nsp, n_tokens = counts
                batch = {key: v.to(device, non_blocking=True) for key, v in batch.items()}
                last = k == accum - 1
                sync = contextlib.nullcontext() if last or not info.enabled else ddp.no_sync()
                with sync:
                    kwargs = (
                        {"next_sentence_label": batch["next_sentence_label"]} if use_nsp else {}
                    )
                    with autocast(device, precision):
                        output = forward(
                            batch["input_ids"],
                            attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"],
                            labels=batch["labels"],
                            **kwargs,
                        )
                    # per-micro-batch means -> share of the global mean; DDP then averages ranks
                    mlm = output.mlm_loss if use_nsp else output.loss
                    loss = mlm * (n_local * info.world_size / n_masked)
                    sums[0] += mlm.detach().double().cpu() * n_local
                    if use_nsp and output.nsp_loss is not None:
                        loss = loss + output.nsp_loss * (n_local_nsp * info.world_size / n_nsp)
                        sums[1] += output.nsp_loss.detach().double().cpu() * n_local_nsp
                    loss.backward()
                sums[2] += n_tokens
            grad_norm = steps.clip_gradients(raw.parameters(), tc.max_grad_norm)
            sums[3] = float(stop.requested)
            totals = D.all_reduce_sum(sums)
            mlm_loss = float(totals[0]) / n_masked
            nsp_loss = float(totals[1]) / n_nsp if use_nsp and n_nsp else None
            step_loss = mlm_loss + (nsp_loss or 0.0)
            if guard.allows(step_loss, grad_norm, state["step"] + 1):
                optimizer.step()
            else:
                state["skipped"] += 1
                say(f"step {state['step'] + 1}: non-finite loss/gradient, step skipped")
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["tokens"] += int(totals[2])
            state["data"] = sampler.state_dict()
            seconds = time.perf_counter() - t0
            state["elapsed"] += seconds
            losses = {"loss": step_loss, "mlm_loss": mlm_loss}
            if use_nsp:
                losses["nsp_loss"] = nsp_loss or 0.0
            window.add(float(totals[2]), seconds, **losses)
            bar.update(
                step=state["step"],
                elapsed=state["elapsed"],
                loss=step_loss,
                lr=lr,
                tokens_per_s=window.tokens_per_s,
            )
            if state["step"] % tc.log_every == 0 or done():
                logger.log(
                    state["step"],
                    "train",
                    **window.means(*losses),
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens_per_s=window.tokens_per_s,
                    tokens=state["tokens"],
                    elapsed=state["elapsed"],
                    epoch=epoch,
                    skipped=state["skipped"],
                )
                window.reset()
            if tc.eval_every and state["step"] % tc.eval_every == 0 and not done():
                results = evaluate_all(with_extra=False)
                log_eval(state["step"], results)
                bar.write(
                    f"step {state['step']}: val loss {results['val']['loss']:.3f} "
                    f"accuracy {results['val']['accuracy']:.2%}"
                    + (f"; probe accuracy {probes[-1]['accuracy']:.2%}" if probe else "")
                )
            if totals[3] > 0:
                stopped = stop.signal_name or "signal"
                break
            if tc.save_every and state["step"] % tc.save_every == 0 and not done():
                save_checkpoint()
    bar.close()
    save_checkpoint()
    if stopped:
        logger.close()
        say(
            f"stopped at step {state['step']} on {stopped}; checkpoint saved in "
            f"{out / checkpoint_name(state['step'])}. Resume with:\n"
            f"  bertforge pretrain --config {out / CONFIG_FILE}"
        )
        return {"stopped": True, "step": state["step"], "initial": state["initial_eval"]}

    final = evaluate_all()
    log_eval(state["step"], final)
    logger.close()
    result = {
        "stopped": False,
        "step": state["step"],
        "elapsed": state["elapsed"],
        "tokens": state["tokens"],
        "skipped": state["skipped"],
        "initial": state["initial_eval"],
        "random_init": state.get("random_eval"),
        "final": final,
        "probe": probes,
        "model_dir": str(out / FINAL_DIR),
        "plot": str(out / PLOT_FILE),
    }
    if main_proc:
        with atomic_directory(out / FINAL_DIR) as tmp:
            raw.save_pretrained(tmp, tokenizer=tokenizer)
        plot_training_curves(out, out / PLOT_FILE, title=f"bertforge pretrain: {out.name}")
        atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
        for name in final:
            title = f"{name} ({'validation split' if name == 'val' else 'extra evaluation set'})"
            if cfg.init_from:  # start vs adapted, beside the same network from random init
                columns = {
                    "random init": (state.get("random_eval") or {}).get(name, {}),
                    "start": state["initial_eval"][name],
                    f"adapted ({state['step']} steps)": final[name],
                }
            else:
                columns = {
                    "random init": state["initial_eval"][name],
                    f"trained ({state['step']} steps)": final[name],
                }
            say("\n" + comparison_table(columns, title))
        if probes:
            say(
                f"\ndownstream probe (logistic regression on frozen mean-pooled features, "
                f"{probes[-1]['examples']:,} test rows of {pc.test}): accuracy "
                + " -> ".join(f"{p['accuracy']:.2%} (step {p['step']})" for p in probes)
            )
        say(
            f"\nmodel: {out / FINAL_DIR}\nplot:  {out / PLOT_FILE}\nmetrics: {out / 'metrics.jsonl'}"
        )
    D.barrier()
    return result


__all__ = [
    "CONFIG_FILE",
    "FINAL_DIR",
    "PLOT_FILE",
    "pretrain",
]
