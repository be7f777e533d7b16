"""``bertforge finetune``: fine-tune any BERT directory for classification or regression, in one
flat loop.

Per optimizer step: set the LR (a pure function of the step, or of elapsed time for a wall-clock
budget) -> take the next dynamically padded batch -> forward/backward under autocast -> clip ->
step unless the loss is non-finite -> log -> maybe evaluate (keep the best model, stop early) /
checkpoint / stop on a signal. The progress bar, metrics log, checkpoints, resume and signal
handling are the pretraining loop's (``bertforge.runtime``).

OUTPUT holds the best model by the validation metric (a ``BertForSequenceClassification`` with
``id2label``/``label2id`` in config.json, loadable by transformers too, plus the tokenizer),
``finetune_config.json``, ``metrics.jsonl``, ``curves.png``, ``eval_results.json``, a confusion
matrix (classification) or predicted-vs-true scatter (regression) PNG, and the newest resumable
``checkpoint-*``. Regression targets may be trained normalised; the saved head is rescaled so
the model predicts in the original units.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from bertforge.checkpoint import atomic_directory, atomic_write_text
from bertforge.data.tasks import (
    TRUNCATIONS,
    batch_order,
    collate,
    encode_examples,
    load_labelled,
    stratified_split,
)
from bertforge.errors import BertforgeError
from bertforge.evaluate import (
    HIGHER_IS_BETTER,
    evaluate_sequence_model,
    save_task_plot,
    task_plot_name,
    task_report,
)
from bertforge.model import BertForSequenceClassification
from bertforge.optim import build_optimizer, lr_at, lr_at_progress, set_lr
from bertforge.plots import plot_training_curves
from bertforge.predict import FINETUNE_CONFIG
from bertforge.pretrain import set_dropout
from bertforge.runtime import (
    GracefulStop,
    MetricsLogger,
    ProgressBar,
    autocast,
    checkpoint_name,
    format_duration,
    latest_checkpoint,
    load_train_state,
    parse_duration,
    pick_device,
    pick_precision,
    rotate_checkpoints,
    save_train_state,
    seed_everything,
)
from bertforge.tokenizer import Tokenizer

RESULTS_FILE = "eval_results.json"
PLOT_FILE = "curves.png"


@dataclass
class FinetuneConfig:
    """Everything ``bertforge finetune`` needs; written resolved to OUTPUT/finetune_config.json."""

    model: str
    """Starting model directory: our pretrained model or any BERT checkpoint (config.json,
    model.safetensors, vocab.txt or tokenizer.json), e.g. all-MiniLM-L6-v2."""
    train: list[str]
    """Training file(s): .csv, .tsv or .jsonl, optionally .gz; several files are concatenated."""
    output: str
    """Output directory for the fine-tuned model, metrics, plots and checkpoints."""
    text_column: str = "text"
    """Column holding the text (the first text for pair tasks)."""
    label_column: str = "label"
    """Column holding the label: class names or integers, or numbers for regression."""
    text_pair_column: str | None = None
    """Column holding the second text of a pair task (e.g. a title and its description)."""
    task: str = "classification"
    """classification or regression."""
    validation: list[str] | None = None
    """Validation file(s); without them a stratified --validation-fraction of train is held out."""
    validation_fraction: float = 0.1
    """Share of the training file held out for validation when no --validation file is given."""
    normalize_targets: bool = True
    """Regression: train on z-scored targets (the saved head is rescaled back to the original units)."""
    max_length: int = 256
    """Tokens per example including [CLS]/[SEP]; longer texts are truncated."""
    truncation: str = "head"
    """head (keep the beginning) or head_tail (first quarter + last three quarters, Sun et al. 2019)."""
    batch_size: int = 32
    """Examples per optimizer step."""
    eval_batch_size: int = 64
    """Examples per evaluation batch."""
    lr: float = 5e-5
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm)."""
    warmup_ratio: float = 0.1
    """Fraction of training (steps or time) spent warming the LR up linearly from 0."""
    schedule: str = "linear"
    """Decay after warmup: linear, cosine or constant."""
    epochs: float = 3.0
    """Passes over the training data (fractions allowed)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (the LR schedule ends there)."""
    max_time: str | None = None
    """Wall-clock training budget such as 40m (evaluation time not counted); the LR schedule
    follows whichever of time and steps is further along."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    dropout: float | None = None
    """Dropout rate while fine-tuning (hidden, attention, classifier); None keeps the model's.
    On CPU 0 is several times faster: dropout masks cost more than the matrix products there."""
    eval_every: int = 0
    """Evaluate on validation every N steps (0 = once per epoch), and always at the end."""
    patience: int = 0
    """Stop after this many evaluations without improvement of --metric (0 = never stop early)."""
    metric: str | None = None
    """Validation metric that picks the best model: accuracy, macro_f1, mcc (default accuracy),
    or for regression spearman, pearson, mse, mae (default spearman)."""
    bucket: bool = True
    """Group examples of similar length into batches (less padding); batches stay shuffled."""
    precision: str = "auto"
    """auto (bf16 where the hardware is fast at it), bf16 or fp32."""
    device: str = "auto"
    """auto (cuda > mps > cpu), cpu, cuda, mps."""
    seed: int = 0
    """Seed for the head's initialisation, validation split, data order and dropout."""
    log_every: int = 10
    """Write the mean training loss to metrics.jsonl every N steps."""
    keep_checkpoints: int = 1
    """Resumable checkpoints (written at each evaluation and on SIGINT/SIGTERM) to keep."""
    max_nonfinite: int = 20
    """Stop after this many non-finite losses in a row (each such step is skipped)."""
    num_threads: int | None = None
    """torch CPU threads (None = torch's default)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise BertforgeError(f"--task {self.task!r}: choose classification or regression")
        if self.truncation not in TRUNCATIONS:
            raise BertforgeError(f"--truncation {self.truncation!r}: choose head or head_tail")
        if self.batch_size <= 0 or self.eval_batch_size <= 0 or self.epochs <= 0:
            raise BertforgeError("--batch-size, --eval-batch-size and --epochs must be positive")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise BertforgeError(f"--warmup-ratio {self.warmup_ratio} must lie in [0, 1)")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise BertforgeError(f"--dropout {self.dropout} must lie in [0, 1)")
        default = "spearman" if self.task == "regression" else "accuracy"
        self.metric = self.metric or default
        allowed = (
            ("spearman", "pearson", "mse", "mae")
            if self.task == "regression"
            else ("accuracy", "macro_f1", "mcc")
        )
        if self.metric not in allowed:
            raise BertforgeError(
                f"--metric {self.metric!r} does not fit --task {self.task}; "
                f"choose one of {', '.join(allowed)}"
            )


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
    columns = dict(
        text_column=cfg.text_column,
        label_column=cfg.label_column,
        text_pair_column=cfg.text_pair_column,
        task=cfg.task,
    )
    train, id2label = load_labelled(cfg.train, **columns)
    if cfg.validation:
        val, _ = load_labelled(
            cfg.validation,
            **columns,
            label2id=None if regression else {v: k for k, v in id2label.items()},
        )
    else:
        train_idx, val_idx = stratified_split(
            train.labels, cfg.validation_fraction, cfg.seed, regression=regression
        )
        train, val = train.subset(train_idx), train.subset(val_idx)
    if not regression and len(id2label) < 2:
        raise BertforgeError(
            f"{cfg.train[0]}: column {cfg.label_column!r} has a single label "
            f"{id2label[0]!r}; classification needs at least two"
        )
    scale = None
    if regression and cfg.normalize_targets:
        scale = (float(train.labels.mean()), float(train.labels.std()) or 1.0)
    targets = train.labels if scale is None else (train.labels - scale[0]) / scale[1]
    t0 = time.perf_counter()
    enc_train = encode_examples(
        tokenizer, train.texts, train.pairs, max_length=cfg.max_length, truncation=cfg.truncation
    )
    enc_val = encode_examples(
        tokenizer, val.texts, val.pairs, max_length=cfg.max_length, truncation=cfg.truncation
    )
    lengths = [len(ids) for ids, _ in enc_train]
    steps_per_epoch = math.ceil(len(enc_train) / cfg.batch_size)
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
    if model.config.max_position_embeddings < cfg.max_length:
        raise BertforgeError(
            f"--max-length {cfg.max_length} exceeds the model's "
            f"max_position_embeddings={model.config.max_position_embeddings}; lower it"
        )
    if cfg.dropout is not None:
        set_dropout(model, cfg.dropout)
    model = model.to(device)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    resolved = json.loads(json.dumps(asdict(cfg)))
    identity = {
        k: resolved[k]
        for k in (
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
    }
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
        "scale": scale,
        "run": identity,
        "finished": False,
    }
    if resume_dir is not None:
        state, _ = load_train_state(resume_dir, optimizer=optimizer)
        changed = [k for k, v in identity.items() if state["run"].get(k) != v]
        if changed:
            raise BertforgeError(
                f"{resume_dir}: --{changed[0].replace('_', '-')} was "
                f"{state['run'][changed[0]]!r}, now {identity[changed[0]]!r}; "
                "resume with the same settings or choose a new --output"
            )
        say(f"resuming from {resume_dir} at step {state['step']}")
    logger = MetricsLogger(out, resume_step=state["step"] if resume_dir is not None else None)
    atomic_write_text(out / FINETUNE_CONFIG, json.dumps(resolved, indent=2) + "\n")

    def evaluate() -> dict[str, Any]:
        metrics, _ = evaluate_sequence_model(
            model,
            enc_val,
            val.labels,
            tokenizer.pad_id,
            batch_size=cfg.eval_batch_size,
            precision=precision,
            scale=state["scale"],
        )
        return metrics

    def save_checkpoint() -> None:
        with atomic_directory(out / checkpoint_name(state["step"])) as tmp:
            model.save_pretrained(tmp, tokenizer=tokenizer)
            save_train_state(tmp, state=state, optimizer=optimizer)
        rotate_checkpoints(out, cfg.keep_checkpoints)

    def done() -> bool:
        return (
            state["finished"]
            or state["step"] >= total
            or (budget is not None and state["elapsed"] >= budget)
        )

    def learning_rate() -> float:
        warmup = round(cfg.warmup_ratio * total)
        if budget is None:
            return lr_at(
                state["step"], max_lr=cfg.lr, warmup=warmup, total=total, schedule=cfg.schedule
            )
        progress = max(state["elapsed"] / budget, state["step"] / total)
        return lr_at_progress(
            progress, max_lr=cfg.lr, warmup=cfg.warmup_ratio, schedule=cfg.schedule
        )

    say(
        f"fine-tuning {cfg.model} for {cfg.task} ({len(id2label) if id2label else 1} output(s)) on "
        f"{len(train):,} examples, validating on {len(val):,}; {precision} on {device}; "
        f"{total} steps of {cfg.batch_size}"
        + (f" or {format_duration(budget)}" if budget else "")
        + f"; encoded in {time.perf_counter() - t0:.1f}s"
    )

    # ---- the loop ----------------------------------------------------------------------------
    bar = ProgressBar(
        budget or total,
        initial=state["elapsed"] if budget else state["step"],
        by_time=budget is not None,
        enabled=cfg.progress,
    )
    window = {"loss": 0.0, "n": 0, "tokens": 0.0, "seconds": 0.0}
    streak, stopped, order, order_epoch = 0, None, [], -1
    model.train()
    with GracefulStop() as stop:
        while not done():
            if (
                order_epoch != state["epoch"]
            ):  # a pure function of (seed, epoch): resume needs no replay
                order = batch_order(
                    lengths, cfg.batch_size, seed=cfg.seed, epoch=state["epoch"], bucket=cfg.bucket
                )
                order_epoch = state["epoch"]
            if state["batch"] >= len(order):  # epoch finished: the next one has a new order
                state["epoch"], state["batch"] = state["epoch"] + 1, 0
                continue
            t0 = time.perf_counter()
            lr = learning_rate()
            set_lr(optimizer, lr)
            index = order[state["batch"]]
            batch = {
                k: v.to(device)
                for k, v in collate([enc_train[i] for i in index], tokenizer.pad_id).items()
            }
            labels = torch.as_tensor(targets[index]).to(device)
            with autocast(device, precision):
                loss = model(**batch, labels=labels).loss
            loss.backward()
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            step_loss = float(loss.detach())
            if math.isfinite(step_loss) and math.isfinite(grad_norm):
                optimizer.step()
                streak = 0
            else:  # skip: a bad batch must not poison the weights
                state["skipped"] += 1
                streak += 1
                if streak >= cfg.max_nonfinite:
                    raise BertforgeError(
                        f"the loss was non-finite for {streak} steps in a row; "
                        "lower --lr or use --precision fp32"
                    )
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["batch"] += 1
            tokens = int(batch["attention_mask"].sum())
            state["tokens"] += tokens
            seconds = time.perf_counter() - t0
            state["elapsed"] += seconds
            if math.isfinite(step_loss):
                window["loss"] += step_loss
                window["n"] += 1
            window["tokens"] += tokens
            window["seconds"] += seconds
            tok_s = window["tokens"] / max(window["seconds"], 1e-9)
            bar.update(
                state["elapsed"] if budget else state["step"],
                step=state["step"],
                loss=step_loss,
                lr=lr,
                tokens_per_s=tok_s,
            )
            if state["step"] % cfg.log_every == 0:
                logger.log(
                    state["step"],
                    "train",
                    loss=window["loss"] / max(window["n"], 1),
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens_per_s=tok_s,
                    elapsed=state["elapsed"],
                    epoch=state["epoch"] + state["batch"] / len(order),
                    skipped=state["skipped"],
                )
                window = {"loss": 0.0, "n": 0, "tokens": 0.0, "seconds": 0.0}
            if state["step"] % eval_every == 0 or done():
                metrics = evaluate()
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
    metrics, predictions = evaluate_sequence_model(
        best,
        enc_val,
        val.labels,
        tokenizer.pad_id,
        batch_size=cfg.eval_batch_size,
        precision=precision,
    )
    report = task_report(
        best.config, val.labels, predictions, baseline_value=None if scale is None else scale[0]
    )
    plot = save_task_plot(
        best.config,
        val.labels,
        predictions,
        out / task_plot_name(best.config),
        title=f"validation ({out.name})",
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


# ---- command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """One ``--option-name`` per ``FinetuneConfig`` field; the help is the field's docstring."""
    import docstring_parser

    docs = {
        p.arg_name: p.description for p in docstring_parser.parse_from_object(FinetuneConfig).params
    }
    parser = argparse.ArgumentParser(
        prog="bertforge finetune",
        description="Fine-tune a BERT model for text classification or regression.",
    )
    for f in fields(FinetuneConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        help_ = " ".join((docs.get(f.name) or "").split())
        if f.name in ("train", "validation"):
            parser.add_argument(
                flag, nargs="+", required=f.name == "train", metavar="FILE", help=help_
            )
        elif kind == "bool":
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_
            )
        else:
            base = kind.split(" |")[0]
            cast = {"int": int, "float": float}.get(base, str)
            required = f.default is MISSING
            metavar = (
                "DIR"
                if f.name in ("model", "output")
                else "C"
                if f.name.endswith("_column")
                else {"int": "N", "float": "X"}.get(base, "S")
            )
            if not required:
                help_ += f" (default: {f.default})"
            parser.add_argument(
                flag,
                type=cast,
                required=required,
                metavar=metavar,
                default=None if required else f.default,
                help=help_,
            )
    return parser


def main(argv: list[str]) -> int:
    """``bertforge finetune --model DIR --train FILE ... --output DIR [options]``."""
    finetune(FinetuneConfig(**vars(build_parser().parse_args(argv))))
    return 0


__all__ = ["FinetuneConfig", "build_parser", "finetune", "main", "save_model"]
