"""``bertforge finetune``: fine-tune any BERT directory for classification or regression, in one
flat loop.

Per optimizer step: set the LR (a pure function of the step, or of elapsed time for a wall-clock
budget) -> take the next batch and accumulate its dynamically padded micro-batches (forward/
backward under autocast, each loss weighted by its share of the batch's rows) -> clip ->
step unless the loss is non-finite -> log -> maybe evaluate (keep the best model, stop early) /
checkpoint / stop on a signal. The progress bar, metrics log, checkpoints, resume and signal
handling are the pretraining loop's (``bertforge.runtime``, ``bertforge.progress`` and ``bertforge.training.steps``).

OUTPUT holds the best model by the validation metric (a ``BertForSequenceClassification`` with
``id2label``/``label2id`` in config.json, loadable by transformers too, plus the tokenizer),
``finetune_config.json``, ``metrics.jsonl``, ``curves.png``, ``eval_results.json``, a confusion
matrix (classification) or predicted-vs-true scatter (regression) PNG, and the newest resumable
``checkpoint-*``. Regression targets may be trained normalised; the saved head is rescaled so
the model predicts in the original units.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bertforge.data.tasks import batch_order, collate, load_task_data
from bertforge.errors import BertforgeError
from bertforge.evaluation.plots import plot_training_curves
from bertforge.evaluation.tasks import (
    HIGHER_IS_BETTER,
    evaluate_sequence_model,
    task_plot_name,
    task_report,
)
from bertforge.io import atomic_write_text
from bertforge.modeling.checkpoint import check_tokenizer_fits
from bertforge.modeling.model import BertForSequenceClassification
from bertforge.progress import MetricsLogger, format_duration, parse_duration
from bertforge.runtime import autocast, pick_device, pick_precision, seed_everything
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training import steps
from bertforge.training.checkpoints import (
    GracefulStop,
    check_same_run,
    checkpoint_name,
    latest_checkpoint,
    load_train_state,
    write_checkpoint,
)
from bertforge.training.config import FINETUNE_CONFIG, FinetuneConfig, option
from bertforge.training.optim import build_optimizer, set_lr

RESULTS_FILE = "eval_results.json"
PLOT_FILE = "curves.png"
RUN_IDENTITY = (
    "model",
    "train",
    "validation",
    "text_column",
    "label_column",
    "text_pair_column",
    "task",
    "max_length",
    "truncation",
    "batch_size",
    "seed",
    "bucket",
    "validation_fraction",
)
"""Settings a resumed run must share with the interrupted one (the data order depends on them)."""


def _improved(value: float, best: float | None, metric: str) -> bool:
    if best is None:
        return True
    return value > best if HIGHER_IS_BETTER[metric] else value < best


def save_model(
    model: BertForSequenceClassification,
    out: Path,
    tokenizer: Tokenizer,
    scale: tuple[float, float] | None,
) -> None:
    """Write the model; for normalised regression fold ``y = z * std + mean`` into the head."""
    if scale is not None:
        model = copy.deepcopy(model).float()
        mean, std = scale
        with torch.no_grad():
            model.classifier.weight.mul_(std)
            model.classifier.bias.mul_(std).add_(mean)
    model.save_pretrained(out, tokenizer=tokenizer)


def finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    """Run (or resume) fine-tuning as configured; return the best validation results."""
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    budget = parse_duration(cfg.max_time)
    device = pick_device(cfg.device)
    precision = pick_precision(cfg.precision, device)
    out = Path(cfg.output)
    regression = cfg.task == "regression"

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # ---- data --------------------------------------------------------------------------------
    tokenizer = Tokenizer.from_file(cfg.model)
    t0 = time.perf_counter()
    data = load_task_data(
        tokenizer,
        cfg.train,
        cfg.validation,
        text_column=cfg.text_column,
        label_column=cfg.label_column,
        text_pair_column=cfg.text_pair_column,
        task=cfg.task,
        validation_fraction=cfg.validation_fraction,
        seed=cfg.seed,
        normalize_targets=cfg.normalize_targets,
        max_length=cfg.max_length,
        truncation=cfg.truncation,
    )
    id2label, val = data.id2label, data.val
    val_set = (data.encoded_val, val.labels, tokenizer.pad_id)  # every evaluation's examples
    lengths = [len(ids) for ids, _ in data.encoded_train]
    steps_per_epoch = math.ceil(len(data.encoded_train) / cfg.batch_size)
    total = max(1, round(cfg.epochs * steps_per_epoch))
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    eval_every = cfg.eval_every or steps_per_epoch

    # ---- model, optimizer, state -------------------------------------------------------------
    seed_everything(cfg.seed)
    resume_dir = latest_checkpoint(out)
    if resume_dir is not None:
        model = BertForSequenceClassification.from_pretrained(resume_dir)
    elif regression:
        model = BertForSequenceClassification.from_pretrained(
            cfg.model, num_labels=1, problem_type="regression"
        )
    else:
        model = BertForSequenceClassification.from_pretrained(
            cfg.model,
            num_labels=len(id2label),
            id2label=id2label,
            problem_type="single_label_classification",
        )
    check_tokenizer_fits(tokenizer, model.config, cfg.model)
    if model.config.max_position_embeddings < cfg.max_length:
        raise BertforgeError(
            f"--max_length {cfg.max_length} exceeds the model's "
            f"max_position_embeddings={model.config.max_position_embeddings}; lower it"
        )
    if cfg.dropout is not None:
        steps.set_dropout(model, cfg.dropout)
    model = model.to(device)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    resolved = steps.config_dict(cfg)
    identity = {k: resolved[k] for k in RUN_IDENTITY}
    state: dict[str, Any] = {
        "step": 0,
        "epoch": 0,
        "batch": 0,
        "elapsed": 0.0,
        "tokens": 0,
        "skipped": 0,
        "best": None,
        "best_step": None,
        "bad_evals": 0,
        "scale": data.scale,
        "run": identity,
        "finished": False,
    }
    if resume_dir is not None:
        state, _ = load_train_state(resume_dir, optimizer=optimizer, keys=state)
        check_same_run(resume_dir, state["run"], identity, option=option)
        say(f"resuming from {resume_dir} at step {state['step']}")
    logger = MetricsLogger(out, resume_step=state["step"] if resume_dir is not None else None)
    atomic_write_text(out / FINETUNE_CONFIG, json.dumps(resolved, indent=2) + "\n")

    def save_checkpoint() -> None:
        write_checkpoint(
            out,
            model,
            tokenizer,
            state=state,
            optimizer=optimizer,
            keep=cfg.keep_checkpoints,
        )

    def done() -> bool:
        spent = steps.budget_spent(
            state["step"], state["elapsed"], total_steps=total, budget=budget
        )
        return state["finished"] or spent

    eval_with = dict(batch_size=cfg.eval_batch_size, precision=precision)
    micro = cfg.micro_batch

    say(
        f"fine-tuning {cfg.model} for {cfg.task} ({len(id2label) if id2label else 1} output(s)) on "
        f"{len(data.train):,} examples, validating on {len(val):,}; {precision} on {device}; "
        f"{total} steps of batch {cfg.batch_size} = {cfg.batch_size // micro} x {micro}"
        + (f" or {format_duration(budget)}" if budget else "")
        + f"; encoded in {time.perf_counter() - t0:.1f}s"
    )

    # ---- the loop ----------------------------------------------------------------------------
    bar = steps.progress_bar(state, total, budget, enabled=cfg.progress)
    window = steps.RunningMeans()
    guard = steps.NonFiniteGuard(cfg.max_nonfinite, "lower --lr or use --precision fp32")
    stopped, order, order_epoch = None, [], -1
    model.train()
    with GracefulStop() as stop:
        while not done():
            if order_epoch != state["epoch"]:  # a pure function of (seed, epoch): no replay
                order = batch_order(
                    lengths, cfg.batch_size, seed=cfg.seed, epoch=state["epoch"], bucket=cfg.bucket
                )
                order_epoch = state["epoch"]
            if state["batch"] >= len(order):  # epoch finished: the next one has a new order
                state["epoch"], state["batch"] = state["epoch"] + 1, 0
                continue
            t0 = time.perf_counter()
            lr = steps.scheduled_lr(
                state["step"], state["elapsed"], cfg, total_steps=total, budget=budget
            )
            set_lr(optimizer, lr)
            step_loss, tokens = 0.0, 0
            for rows, share in steps.micro_batches(order[state["batch"]], micro):
                examples = [data.encoded_train[i] for i in rows]
                batch = {k: v.to(device) for k, v in collate(examples, tokenizer.pad_id).items()}
                labels = torch.as_tensor(data.targets[rows]).to(device)
                with autocast(device, precision):
                    loss = model(**batch, labels=labels).loss
                # a mean over this micro-batch's rows -> its share of the mean over the batch
                (loss * share).backward()
                step_loss += float(loss.detach()) * share
                tokens += int(batch["attention_mask"].sum())
            grad_norm = steps.clip_gradients(model.parameters(), cfg.max_grad_norm)
            if guard.allows(step_loss, grad_norm, state["step"] + 1):
                optimizer.step()
            else:
                state["skipped"] += 1
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["batch"] += 1
            state["tokens"] += tokens
            seconds = time.perf_counter() - t0
            state["elapsed"] += seconds
            window.add(tokens, seconds, loss=step_loss)
            bar.update(
                step=state["step"],
                elapsed=state["elapsed"],
                loss=step_loss,
                lr=lr,
                tokens_per_s=window.tokens_per_s,
            )
            if state["step"] % cfg.log_every == 0:
                logger.log(
                    state["step"],
                    "train",
                    loss=window.means("loss")["loss"],
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens_per_s=window.tokens_per_s,
                    elapsed=state["elapsed"],
                    epoch=state["epoch"] + state["batch"] / len(order),
                    skipped=state["skipped"],
                )
                window.reset()
            if state["step"] % eval_every == 0 or done():
                metrics, _ = evaluate_sequence_model(
                    model, *val_set, scale=state["scale"], **eval_with
                )
                logger.log(state["step"], "val", **metrics)
                value = metrics[cfg.metric]
                if _improved(value, state["best"], cfg.metric):
                    state.update(best=value, best_step=state["step"], bad_evals=0)
                    save_model(model, out, tokenizer, state["scale"])
                else:
                    state["bad_evals"] += 1
                bar.write(
                    f"step {state['step']}: val loss {metrics['loss']:.4f} {cfg.metric} "
                    f"{value:.4f} (best {state['best']:.4f} at step {state['best_step']})"
                )
                if cfg.patience and state["bad_evals"] >= cfg.patience:
                    bar.write(f"no improvement in {cfg.patience} evaluations: stopping early")
                    state["finished"] = True
                save_checkpoint()
            if stop.requested:
                stopped = stop.signal_name or "signal"
                break
    bar.close()
    if stopped:
        save_checkpoint()
        logger.close()
        say(
            f"stopped at step {state['step']} on {stopped}; checkpoint saved in "
            f"{out / checkpoint_name(state['step'])}. Resume by running the same command again."
        )
        return {"stopped": True, "step": state["step"]}
    if not (out / "model.safetensors").is_file():  # the best model was lost: keep the last one
        say(f"{out}: no best model found; saving the model of step {state['step']} instead")
        save_model(model, out, tokenizer, state["scale"])
    logger.close()

    # ---- the best model, reloaded from disk: final validation report and plots ---------------
    best = BertForSequenceClassification.from_pretrained(out).to(device)
    plot = out / task_plot_name(best.config)
    metrics, predictions = evaluate_sequence_model(best, *val_set, **eval_with)
    baseline = None if data.scale is None else data.scale[0]
    title = f"validation ({out.name})"
    report = task_report(
        best.config, val.labels, predictions, baseline, plot=plot, plot_title=title
    )
    plot_training_curves(out, out / PLOT_FILE, title=f"bertforge finetune: {out.name}")
    result = {
        "best_step": state["best_step"],
        "steps": state["step"],
        "epochs": round(state["step"] / steps_per_epoch, 3),
        "train_seconds": round(state["elapsed"], 1),
        "tokens": state["tokens"],
        "skipped": state["skipped"],
        "metric": cfg.metric,
        "validation": metrics,
        **report,
        "plot": str(plot),
        "model_dir": str(out),
    }
    atomic_write_text(out / RESULTS_FILE, json.dumps(result, indent=2) + "\n")
    say(
        f"best {cfg.metric} {metrics[cfg.metric]:.4f} at step {state['best_step']} of {state['step']} "
        f"({format_duration(state['elapsed'])} of training); model: {out}\n"
        + report.get("report_text", "")
    )
    return result


__all__ = ["FINETUNE_CONFIG", "FinetuneConfig", "finetune", "save_model"]
