"""``bertforge finetune``: fine-tune any BERT directory for classification, regression or
extractive question answering (whose data, validation and report are ``training.qa``'s);
:func:`finetune` is the loop, the named parts it calls follow it.

Per optimizer step: set the LR (a pure function of the step, or of elapsed time for a wall-clock
budget) -> take the next batch and accumulate its dynamically padded micro-batches (forward/
backward under autocast, each loss weighted by its share of the batch's rows, a tagger's by its
share of the labelled words) -> clip -> step unless the loss is non-finite -> log -> maybe
evaluate (keep the best model, stop early) / checkpoint / stop on a signal. The progress bar,
metrics log, checkpoints, resume and signal handling are the pretraining loop's
(``bertforge.progress``, ``bertforge.training.checkpoints`` and ``bertforge.training.steps``).

OUTPUT holds the best model by the validation metric (a ``BertForSequenceClassification``, or
for ``--task token_classification`` a ``BertForTokenClassification`` scored by entity F1, with
``id2label``/``label2id`` in config.json, loadable by transformers too, plus the tokenizer),
``finetune_config.json``, ``metrics.jsonl``, ``curves.png``, ``eval_results.json``, a confusion
matrix (classification) or predicted-vs-true scatter (regression) PNG, and the newest resumable
``checkpoint-*``. Regression targets may be trained normalised; the saved head is rescaled so
the model predicts in the original units. A question-answering run saves a
``BertForQuestionAnswering`` and reports SQuAD v1.1 EM/F1 (docs/tasks.md).
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from bertforge.data.encoding import batch_order, collate, pad_multiple
from bertforge.data.labelled import TaskData, check_batch_fits, load_task_data
from bertforge.data.tagging import TaggingTaskData, load_tagging_data
from bertforge.errors import BertforgeError
from bertforge.evaluation.plots import plot_training_curves, run_title
from bertforge.evaluation.tagging import evaluate_tagging_model, tag_metrics, tagging_report
from bertforge.evaluation.task_scores import (
    HIGHER_IS_BETTER,
    baseline_metrics,
    baseline_warning,
    evaluate_sequence_model,
    task_plot_name,
    task_report,
    training_baseline,
)
from bertforge.inference.predict import copy_pooling_declaration
from bertforge.io import (
    atomic_write_text,
    check_run_directory,
    disk_size,
    format_size,
    read_json_object,
)
from bertforge.modeling.auto import MODERNBERT, ModelKind
from bertforge.modeling.auto import model_class as auto_model_class
from bertforge.modeling.checkpoint import check_model_directory, check_tokenizer_fits
from bertforge.modeling.model import (
    BertForSequenceClassification,
    BertForTokenClassification,
)
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
    seed_everything,
    set_threads,
)
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training import steps
from bertforge.training.budget import longest_rows, measure_use, over_budget, plan_batches
from bertforge.training.checkpoints import (
    GracefulStop,
    check_same_run,
    intact_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    locks_output,
    remove_checkpoint,
    write_checkpoint,
)
from bertforge.training.config import FINETUNE_CONFIG, FinetuneConfig, option
from bertforge.training.embedding import (
    EmbeddingTaskData,
    embedding_report,
    embedding_step,
    load_embedding_data,
    load_embedding_model,
    memory_probe,
    save_embedding_model,
    validate_embeddings,
    validation_baselines,
)
from bertforge.training.model_card import finetune_card, write_model_card
from bertforge.training.optim import build_optimizer, set_lr
from bertforge.training.qa import QATaskData, finish_qa, load_qa_task, qa_baseline, validate_qa

CROSS_ENCODER = {"activation_fn": "torch.nn.modules.linear.Identity"}
"""config.json's ``sentence_transformers`` of a sequence classifier or regressor: the identity
as the activation of sentence-transformers' ``CrossEncoder(dir)``, so that its ``predict``
gives this model's logits (a regressor's values) and not the sigmoid it applies to a one-output
model by default."""
RESULTS_FILE = "eval_results.json"
PLOT_FILE = "curves.png"
RUN_IDENTITY = (
    "model",
    "classifier_pooling",
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
EMBEDDING_IDENTITY = ("negative_column",)
"""What a resumed embedding run must share too (the batches depend on it)."""
QA_IDENTITY = ("doc_stride",)
"""What a resumed question-answering run must share too (the windows depend on it)."""
NOT_RESULT = (
    "output",
    "progress",
    "num_threads",
    "log_every",
    "eval_batch_size",
    "keep_checkpoints",
    "keep_final_checkpoint",
)
"""Settings that leave the fine-tuned model and its scores as they are: a finished run with
other values of these only is still a run of these settings."""


@dataclass
class FinetuneState(steps.TrainState):
    """Fine-tuning's ``train_state.json``: the shared counters plus the data position, the best
    model so far and early stopping."""

    epoch: int = 0
    """The epoch being trained."""
    batch: int = 0
    """The next batch of the epoch's order."""
    best: float | None = None
    """The best validation value of the metric so far."""
    best_step: int | None = None
    """The step of the best model (the one saved in OUTPUT)."""
    bad_evals: int = 0
    """Evaluations in a row without improvement (early stopping)."""
    scale: list[float] | tuple[float, float] | None = None
    """``(mean, std)`` of z-scored regression targets."""
    finished: bool = False
    """Stopped early: the run is over even though budget is left."""
    start_eval: dict[str, float] | None = None
    """Embedding: the start model's validation scores (step 0), at the run's settings."""

    optional: ClassVar[tuple[str, ...]] = ("start_eval",)


COMPILE_MIN_STEPS = 5000
"""Unset ``--compile`` compiles a CUDA run of at least this many optimizer steps: compiling
takes tens of seconds (recompiling once when the batches' length first changes) and saves a
few milliseconds a step at fine-tuning's batch sizes."""


@dataclass
class Run:
    """What the loop works with, set up once by :func:`setup`."""

    cfg: FinetuneConfig
    out: Path
    device: torch.device
    precision: str
    budget: float | None
    total: int
    """Optimizer steps of the whole run: --max_steps, else --epochs of the training data."""
    steps_per_epoch: int
    tokenizer: Tokenizer
    data: TaskData | TaggingTaskData | QATaskData | EmbeddingTaskData
    model: torch.nn.Module
    """A BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering
    or (embedding) BertModel."""
    optimizer: torch.optim.Optimizer
    logger: MetricsLogger
    baseline: float | int
    """The training baseline's prediction (evaluation.task_scores.TRAINING_BASELINE)."""
    val_baseline: dict[str, float]
    """Its validation metrics, printed beside every validation score."""
    forward: Any = None
    """What the training step calls: ``model``, or ``torch.compile(model)`` (``--compile``)."""
    compiled: bool = False

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def done(self, state: FinetuneState) -> bool:
        spent = steps.budget_spent(
            state.step, state.elapsed, total_steps=self.total, budget=self.budget
        )
        return state.finished or spent

    def validate(self, model: torch.nn.Module, **kw: Any) -> tuple[dict[str, Any], Any]:
        """Metrics and predictions of ``model`` on the validation examples."""
        if isinstance(self.data, TaggingTaskData):
            return evaluate_tagging_model(
                model,
                self.data.val_windows,
                self.data.val_tags,
                self.tokenizer.pad_id,
                batch_size=self.cfg.eval_batch_size,
                precision=self.precision,
            )
        if self.cfg.task == "question_answering":
            return validate_qa(self, model)  # type: ignore[return-value]
        if isinstance(self.data, EmbeddingTaskData):
            return validate_embeddings(self, model)
        return evaluate_sequence_model(
            model,
            self.data.encoded_val,
            self.data.val.labels,
            self.tokenizer.pad_id,
            batch_size=self.cfg.eval_batch_size,
            precision=self.precision,
            **kw,
        )


def _offer_resume(good: Path, bad: Path) -> str:
    return f"move {bad} aside (e.g. mv {bad} {bad}.damaged) and run again to resume from it"


@locks_output
def finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    """Run (or resume) fine-tuning as configured; return the best validation results."""
    check_run_directory(cfg.output, FINETUNE_CONFIG, "a fine-tuning run")
    finished = _finished_run(cfg)
    if finished is not None:
        return finished
    run, state = setup(cfg)
    eval_every = cfg.eval_every or run.steps_per_epoch
    bar = steps.progress_bar(state, run.total, run.budget, enabled=cfg.progress)
    window = steps.RunningMeans()
    guard = steps.NonFiniteGuard(cfg.max_nonfinite, "lower --lr or use --precision fp32")
    watch = CoreWatch(torch.get_num_threads(), run.say)
    stopped, order, order_epoch = None, [], -1
    if isinstance(run.data, EmbeddingTaskData) and state.step == 0:
        evaluate_start(run, state, bar)
    run.model.train()
    with GracefulStop() as stop:
        while not run.done(state):
            if order_epoch != state.epoch:  # a pure function of (seed, epoch): no replay
                order = epoch_batches(run, state.epoch)
                order_epoch = state.epoch
            if state.batch >= len(order):  # epoch finished: the next one has a new order
                state.epoch, state.batch = state.epoch + 1, 0
                continue
            t0, compiled_before = time.perf_counter(), compile_seconds() if run.compiled else 0.0
            lr = steps.scheduled_lr(
                state.step, state.elapsed, cfg, total_steps=run.total, budget=run.budget
            )
            set_lr(run.optimizer, lr)
            report = train_step(run, order[state.batch])
            steps.optimizer_step(
                run.optimizer, guard, state, report.losses["loss"], report.grad_norm
            )
            state.batch += 1
            report.lr, report.seconds = lr, time.perf_counter() - t0
            if run.compiled:  # compiling is set-up, not training: kept out of the budget
                compiling = compile_seconds() - compiled_before
                report.seconds = max(report.seconds - compiling, 0.0)
                if compiling > 1.0:
                    bar.write(f"step {state.step}: compiled in {compiling:.1f} s (not charged)")
            watch.step(report.seconds / max(report.tokens, 1.0))  # batches differ in length
            steps.record_step(
                state,
                report,
                window,
                bar,
                run.logger,
                # a run shorter than --log_every still logs its last step (curves.png has points)
                log=lambda: steps.due(state.step, cfg.log_every) or run.done(state),
                state_fields=("elapsed",),
                epoch=state.epoch + state.batch / len(order),
                skipped=state.skipped,
            )
            if steps.due(state.step, eval_every) or run.done(state):
                evaluate(run, state, bar)
                save_checkpoint(run, state)
            if stop.requested:
                stopped = stop.signal_name or "signal"
                break
    bar.close()
    if stopped:
        save_checkpoint(run, state)
        run.logger.close()
        resume = "Resume by running the same command again."
        run.say(steps.stopped_message(run.out, state.step, stopped, resume))
        return {"stopped": True, "step": state.step}
    if not (run.out / "model.safetensors").is_file():  # the best model was lost: keep the last
        run.say(f"{run.out}: no best model found; saving the model of step {state.step} instead")
        save_best(run, state)
    run.logger.close()
    return finish(run, state)


def setup(cfg: FinetuneConfig) -> tuple[Run, FinetuneState]:
    """Device, data, model, optimizer and the state (fresh or resumed); writes the resolved
    config and says what will run."""
    threads = set_threads(cfg.num_threads)
    budget = parse_duration(cfg.max_time)
    device = pick_device(cfg.device)
    out = Path(cfg.output)
    tokenizer = Tokenizer.from_file(check_model_directory(cfg.model))
    t0 = time.perf_counter()
    qa = cfg.task == "question_answering"
    data = load_data(cfg, tokenizer)
    for warning in data.warnings:
        print(warning, file=sys.stderr, flush=True)
    check_batch_fits(cfg.batch_size, len(data.train), held_out=not cfg.validation)
    steps_per_epoch = math.ceil(len(data.encoded_train) / cfg.batch_size)
    # --max_steps overrides --epochs, as transformers' max_steps does num_train_epochs (it capped
    # them before: --max_steps 60 stopped at the default 3 epochs' 51 steps without a word)
    total = cfg.max_steps or max(1, round(cfg.epochs * steps_per_epoch))
    seed_everything(cfg.seed)
    resume_dir = intact_checkpoint(latest_checkpoint(out), _offer_resume)
    model = load_model(cfg, tokenizer, data.id2label, resume_dir)
    precision, why = explain_precision(cfg.precision, device, model.config.hidden_size)
    if cfg.dropout is not None:
        steps.set_dropout(model, cfg.dropout)
    model = model.to(device)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    memory = (
        "" if cfg.max_memory is None else "; " + plan_memory(cfg, data, model, precision, device)
    )
    resolved = steps.config_dict(cfg)
    extra = QA_IDENTITY if qa else EMBEDDING_IDENTITY if cfg.task == "embedding" else ()
    identity = {k: resolved[k] for k in RUN_IDENTITY + extra}
    state = FinetuneState(run=identity, scale=data.scale)
    if resume_dir is not None:
        state, _ = FinetuneState.load(resume_dir, optimizer)
        check_same_run(resume_dir, state.run, identity, option=option)
        print(f"resuming from {resume_dir} at step {state.step}", file=sys.stderr, flush=True)
    # first: the file that makes OUTPUT a fine-tuning run (check_run_directory)
    atomic_write_text(out / FINETUNE_CONFIG, json.dumps(resolved, indent=2) + "\n")
    logger = MetricsLogger(out, resume_step=state.step if resume_dir is not None else None)
    # the baseline printed beside every validation score: see evaluation.task_scores.TRAINING_BASELINE
    if qa:  # the first words of each context: see bertforge.training.qa.BASELINE
        baseline = data.answer_words
        val_baseline = qa_baseline(data.val.examples, baseline)
    elif isinstance(data, EmbeddingTaskData):  # random vectors: see evaluation.embedding
        baseline, val_baseline = (
            0,
            validation_baselines(cfg, data, model.config.hidden_size)["random"],
        )
    elif isinstance(data, TaggingTaskData):  # the tag O everywhere: no entity found
        baseline = 0
        val_baseline = tag_metrics(
            model.config, data.val_tags, [np.zeros_like(t) for t in data.val_tags]
        )
    else:
        baseline = training_baseline(data.train.labels, cfg.task == "regression")
        val_baseline = baseline_metrics(model.config, data.val.labels, baseline)
    run = Run(cfg, out, device, precision, budget, total, steps_per_epoch, tokenizer, data, model,
              optimizer, logger, baseline, val_baseline)  # fmt: skip
    if isinstance(data, EmbeddingTaskData):  # its step calls the model itself
        run.compiled, compiling = False, "compile off (embedding runs are not compiled)"
    else:
        run.compiled, compiling = explain_compile(cfg.compile, device, total, COMPILE_MIN_STEPS)
    run.forward = torch.compile(model) if run.compiled else model
    micro, outputs = cfg.micro_batch, len(data.id2label) if data.id2label else 1
    if qa:
        counts = f"{len(data.train):,} examples ({len(data.encoded_train):,} windows)"
        counts += f", validating on {len(data.val):,}"
    elif isinstance(data, EmbeddingTaskData):
        counts = f"{len(data.train):,} {data.train.kind} ({cfg.embedding_loss} loss, "
        counts += f"{data.pooling} pooling), validating on {len(data.val):,}"
        outputs = model.config.hidden_size
    else:
        what = "windows" if isinstance(data, TaggingTaskData) else "examples"
        counts = f"{len(data.encoded_train):,} {what}, validating on {len(data.encoded_val):,}"
    run.say(
        f"fine-tuning {cfg.model} for {cfg.task} ({plural(2 if qa else outputs, 'output')}) on "
        f"{counts}; {precision} ({why}) on {device}, {compiling}, {plural(threads, 'thread')}; "
        f"{plural(total, 'step')} of batch {cfg.batch_size} = {cfg.batch_size // micro} x {micro}"
        + (f" or {format_duration(budget)}" if budget else "")
        + f"; encoded in {time.perf_counter() - t0:.1f}s"
        + memory
    )
    return run, state


def load_data(
    cfg: FinetuneConfig, tokenizer: Tokenizer
) -> TaskData | TaggingTaskData | QATaskData | EmbeddingTaskData:
    """The training and validation data of the task, encoded."""
    if cfg.task == "embedding":
        return load_embedding_data(cfg, tokenizer)
    if cfg.task == "question_answering":
        return load_qa_task(cfg, tokenizer)
    if cfg.task == "token_classification":
        return load_tagging_data(
            tokenizer,
            cfg.train,
            cfg.validation,
            validation_fraction=cfg.validation_fraction,
            seed=cfg.seed,
            max_length=cfg.max_length,
            label_all_tokens=cfg.label_all_tokens,
            encoding_errors=cfg.encoding_errors,
        )
    return load_task_data(
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
        allow_rare_labels=cfg.allow_rare_labels,
        encoding_errors=cfg.encoding_errors,
    )


def load_model(
    cfg: FinetuneConfig,
    tokenizer: Tokenizer,
    id2label: dict[int, str] | None,
    resume_dir: Path | None,
) -> torch.nn.Module:
    """The checkpoint to resume, or ``cfg.model`` with a fresh head for the task (embedding: its
    encoder alone)."""
    cls = model_class(cfg.task, resume_dir or cfg.model)
    pooling = classifier_pooling(cfg, cls)
    if cfg.task == "embedding":
        model = load_embedding_model(cfg, resume_dir)
    elif cfg.task == "question_answering":
        model = cls.from_pretrained(
            resume_dir or cfg.model, num_labels=2, id2label=None, problem_type=None
        )
    elif resume_dir is not None:
        model = cls.from_pretrained(resume_dir)
    elif cfg.task == "token_classification":
        model = cls.from_pretrained(cfg.model, num_labels=len(id2label or {}), id2label=id2label)
    elif cfg.task == "regression":
        model = cls.from_pretrained(
            cfg.model,
            num_labels=1,
            problem_type="regression",
            sentence_transformers=CROSS_ENCODER,
            **pooling,
        )
    else:
        model = cls.from_pretrained(
            cfg.model,
            num_labels=len(id2label or {}),
            id2label=id2label,
            problem_type="single_label_classification",
            sentence_transformers=CROSS_ENCODER,
            **pooling,
        )
    check_tokenizer_fits(tokenizer, model.config, cfg.model)
    if model.config.max_position_embeddings < cfg.max_length:
        raise BertforgeError(
            f"--max_length {cfg.max_length} exceeds the model's "
            f"max_position_embeddings={model.config.max_position_embeddings}; lower "
            f"--max_length to {model.config.max_position_embeddings}, or start from a model "
            "with more positions (pretrain --model.max_position_embeddings)"
        )
    return model


def classifier_pooling(cfg: FinetuneConfig, cls: type[torch.nn.Module]) -> dict[str, str]:
    """The config override of ``--classifier_pooling`` (none when unset; its value and task
    are checked by :class:`FinetuneConfig`), refused for a BERT, whose pooler reads [CLS]."""
    if cfg.classifier_pooling is None:
        return {}
    if cls not in MODERNBERT.values():
        raise BertforgeError(
            f"--classifier_pooling: {cfg.model} is a BERT, whose classifier reads its pooler "
            "over [CLS]; the option chooses a ModernBERT's pooling: drop it"
        )
    return {"classifier_pooling": cfg.classifier_pooling}


def model_class(task: str, model_dir: str | Path) -> type[torch.nn.Module]:
    """The model of a task, in the architecture of the model in ``model_dir``: a token
    classifier for token_classification, a span scorer for question_answering, the encoder
    alone for embedding, else a sequence classifier."""
    kinds: dict[str, ModelKind] = {
        "embedding": "encoder",
        "token_classification": "token",
        "question_answering": "question_answering",
    }
    return auto_model_class(model_dir, kinds.get(task, "sequence"))


def plan_memory(
    cfg: FinetuneConfig,
    data: TaskData | TaggingTaskData | QATaskData | EmbeddingTaskData,
    model: torch.nn.Module,
    precision: str,
    device: torch.device,
) -> str:
    """``--max_memory``: measure this model's memory on the longest training examples
    (:mod:`bertforge.training.budget`), then set ``--micro_batch_size`` and
    ``--eval_batch_size`` to the largest that fit; returns the start line's account, or raises
    saying what would fit."""
    longest = longest_rows(data.encoded_train)
    pad_id = model.config.pad_token_id

    def forward(k: int) -> torch.Tensor:
        rows = longest[:k]
        batch = collate([data.encoded_train[i] for i in rows], pad_id)
        batch = {key: v.to(device) for key, v in batch.items()}
        labels = data.batch_labels(np.array(rows), batch["input_ids"].shape[1]).to(device)
        if cfg.task == "question_answering":
            batch |= {"start_positions": labels[:, 0], "end_positions": labels[:, 1]}
        else:
            batch["labels"] = labels
        with autocast(device, precision):
            return model(**batch).loss

    if isinstance(data, EmbeddingTaskData):  # a mini-batch of GradCache's replay
        forward = memory_probe(data, model, pad_id, device=device, precision=precision)
    bf16_cpu = precision == "bf16" and device.type == "cpu"
    use = measure_use(forward, model, resident_memory_bytes(), bf16_cpu)
    budget = parse_bytes(cfg.max_memory)
    plan = plan_batches(
        budget, use, cfg.batch_size, cfg.micro_batch, cfg.eval_batch_size, "--max_memory"
    )
    cfg.micro_batch_size, cfg.eval_batch_size = plan.micro, plan.eval_batch
    return plan.describe(budget, use, cfg.batch_size, "--max_memory")


def train_step(run: Run, rows: np.ndarray) -> steps.StepReport:
    """Forward/backward of the batch ``rows`` in dynamically padded micro-batches (each loss
    weighted by its share of the rows, or of the labelled words for a tagger) and gradient
    clipping (embedding: :func:`~bertforge.training.embedding.embedding_step`)."""
    if isinstance(run.data, EmbeddingTaskData):
        return embedding_step(run, rows)
    data, device = run.data, run.device
    totals = {"loss": 0.0, "tokens": 0}

    def loss_of(part: tuple[Any, float]) -> torch.Tensor:
        rows, share = part
        examples = [data.encoded_train[i] for i in rows]
        padded = collate(examples, run.tokenizer.pad_id, pad_multiple(device), run.cfg.max_length)
        batch = {k: v.to(device) for k, v in padded.items()}
        labels = data.batch_labels(rows, batch["input_ids"].shape[1]).to(device)
        if run.cfg.task == "question_answering":  # (B, 2) start and end positions
            batch |= {"start_positions": labels[:, 0], "end_positions": labels[:, 1]}
        else:
            batch["labels"] = labels
        with autocast(device, run.precision):
            loss = run.forward(**batch).loss
        # a mean over this micro-batch's rows (words) -> its share of the mean over the batch
        totals["loss"] += float(loss.detach()) * share
        totals["tokens"] += int(batch["attention_mask"].sum())
        return loss * share

    # a tagger's loss is a mean over labelled words (transformers'), the others' over rows
    units = data.labelled(rows) if isinstance(data, TaggingTaskData) else None
    steps.accumulate(steps.micro_batches(rows, run.cfg.micro_batch, units), loss_of)
    grad_norm = steps.clip_gradients(run.model.parameters(), run.cfg.max_grad_norm)
    return steps.StepReport(0.0, grad_norm, totals["tokens"], 0.0, {"loss": totals["loss"]})


def evaluate(run: Run, state: FinetuneState, bar: Any) -> None:
    """Validate; keep the model when the metric improved, count the evaluations without
    improvement and stop early after --patience of them."""
    cfg = run.cfg
    metrics, _ = run.validate(run.model, scale=state.scale)
    run.logger.log(state.step, "val", **metrics)
    value = metrics[cfg.metric]
    if _improved(value, state.best, cfg.metric):
        state.best, state.best_step, state.bad_evals = value, state.step, 0
        save_best(run, state)
    else:
        state.bad_evals += 1
    loss = f"val loss {metrics['loss']:.4f} " if "loss" in metrics and cfg.metric != "loss" else ""
    bar.write(
        f"step {state.step}: {loss}{cfg.metric} "
        f"{value:.4f} (best {state.best:.4f} at step {state.best_step}) | "
        f"baseline {run.val_baseline[cfg.metric]:.4f}"
    )
    if cfg.patience and state.bad_evals >= cfg.patience:
        bar.write(f"no improvement in {cfg.patience} evaluations: stopping early")
        state.finished = True


def evaluate_start(run: Run, state: FinetuneState, bar: Any) -> None:
    """An embedding run's start model scored as every later evaluation is (the same validation
    data, --max_length, pooling and precision), logged at step 0: the curve starts where the
    start model stood, and "did fine-tuning help?" is read at equal settings. It is not a
    candidate for the best model (OUTPUT holds a fine-tuned one)."""
    cfg, data = run.cfg, run.data
    assert isinstance(data, EmbeddingTaskData)
    metrics, _ = run.validate(run.model)
    run.logger.log(0, "val", **metrics)
    state.start_eval = metrics
    bar.write(
        f"step 0 (the start model, {cfg.max_length} tokens, {data.pooling} pooling): "
        f"{cfg.metric} {metrics[cfg.metric]:.4f} | baseline {run.val_baseline[cfg.metric]:.4f}"
    )


def save_checkpoint(run: Run, state: FinetuneState) -> None:
    write_checkpoint(
        run.out,
        run.model,
        run.tokenizer,
        state=state.to_json(),
        optimizer=run.optimizer,
        keep=run.cfg.keep_checkpoints,
    )


def finish(run: Run, state: FinetuneState) -> dict[str, Any]:
    """The end-of-run report: the best model reloaded from disk, its validation report and
    plots, eval_results.json."""
    cfg, out, data = run.cfg, run.out, run.data
    # training is over: its gradients and AdamW's moments (12 bytes a parameter) go before the
    # best model is loaded beside the last one (a MiniLM QA run with --max_memory 1GB otherwise
    # peaked here, 0.10 GB over, after training steps that kept under it)
    run.model.zero_grad(set_to_none=True)
    run.optimizer.state.clear()
    best = model_class(cfg.task, out).from_pretrained(out).to(run.device)
    if cfg.task == "question_answering":
        plot = None
        metrics, report = finish_qa(run, best, out)
    elif isinstance(data, EmbeddingTaskData):
        plot = None
        metrics, _ = run.validate(best)
        report = embedding_report(run, metrics)
    elif isinstance(data, TaggingTaskData):
        plot = out / task_plot_name(best.config)
        metrics, predictions = run.validate(best)
        report = tagging_report(
            best.config,
            data.val_tags,
            predictions,
            plot=plot,
            plot_title=f"{cfg.task.replace('_', ' ')}: validation ({run_title(out)})",
        )
    else:
        plot = out / task_plot_name(best.config)
        metrics, predictions = run.validate(best)
        title = f"{cfg.task}: validation ({run_title(out)})"
        report = task_report(
            best.config, data.val.labels, predictions, run.baseline, plot=plot, plot_title=title
        )
    plot_training_curves(out, out / PLOT_FILE, title=f"bertforge finetune: {run_title(out)}")
    result = {
        "best_step": state.best_step,
        "steps": state.step,
        "epochs": round(state.step / run.steps_per_epoch, 3),
        "train_seconds": round(state.elapsed, 1),
        "planned_steps": run.total,
        "tokens": state.tokens,
        "skipped": state.skipped,
        "metric": cfg.metric,
        "validation": metrics,
        **report,
        "plot": None if plot is None else str(plot),
        **({"start": state.start_eval} if state.start_eval is not None else {}),
        "model_dir": str(out),
        "peak_memory_bytes": peak_memory_bytes(),
    }
    atomic_write_text(out / RESULTS_FILE, json.dumps(result, indent=2) + "\n")
    run.say(
        f"best {cfg.metric} {metrics[cfg.metric]:.4f} at step {state.best_step} of {state.step} "
        f"({format_duration(state.elapsed)} of training); model: {out}\n"
        + report.get("report_text", "")
    )
    if state.start_eval is not None:
        before = state.start_eval[cfg.metric]
        run.say(
            f"the start model ({cfg.model}, step 0, at the same {cfg.max_length} tokens): "
            f"{cfg.metric} {before:.4f}; fine-tuned {metrics[cfg.metric]:.4f} "
            f"({metrics[cfg.metric] - before:+.4f})"
        )
    base = report["baseline"]
    run.say(
        f"baseline (always {base['predicts']!r}, {base['definition']}): {cfg.metric} "
        f"{base[cfg.metric]:.4f}"
    )
    warning = baseline_warning(cfg.metric, metrics[cfg.metric], base)
    if warning:
        run.say(warning)
    over = cfg.max_memory and over_budget(
        result["peak_memory_bytes"], parse_bytes(cfg.max_memory), "--max_memory"
    )
    if over:
        run.say(over)
    # embed pools it as its start (MiniLM); an embedding run wrote its own declaration. A pair
    # model is a cross-encoder: sentence-transformers reads a modules.json as a bi-encoder's
    # (SentenceTransformer(dir) would pool it and drop the head; CrossEncoder(dir) converts)
    bi_encoder = cfg.task != "embedding" and not cfg.text_pair_column
    kept = copy_pooling_declaration(cfg.model, out) if bi_encoder else []
    if kept:
        run.say(f"kept from {cfg.model}: {', '.join(kept)} (how bertforge embed pools it)")
    run.say(_drop_finished_checkpoints(out, keep=cfg.keep_final_checkpoint))
    write_model_card(out, finetune_card(cfg, result, out, run.device))
    cut = steps.schedule_cut(
        state.step, state.elapsed, total_steps=run.total, budget=run.budget, option="--max_time"
    )
    if cut:  # last, where it is seen: the model is not the schedule's
        run.say(cut)
    return result


def _drop_finished_checkpoints(out: Path, keep: bool) -> str:
    """Delete a finished run's resumable checkpoints unless ``keep``; one line with the sizes."""
    checkpoints = list_checkpoints(out)
    sizes = sum(disk_size(c) for c in checkpoints)
    if checkpoints and not keep:
        for path in checkpoints:
            remove_checkpoint(path)
        note = (
            f"; removed the finished run's resumable checkpoint ({format_size(sizes)}; "
            "--keep_final_checkpoint keeps it)"
        )
    elif checkpoints:
        note = f", of which {format_size(sizes)} is the resumable checkpoint"
    else:
        note = ""
    model = disk_size(out / "model.safetensors")
    return f"{out}: {format_size(disk_size(out))} on disk (model {format_size(model)}){note}"


def _finished_run(cfg: FinetuneConfig) -> dict[str, Any] | None:
    """The saved results when OUTPUT holds a finished run of these settings (its checkpoint
    dropped): such a run is not trained again. A finished run of other settings (any that
    changes the model, see NOT_RESULT) is refused, naming each setting that differs."""
    out = Path(cfg.output)
    if latest_checkpoint(out) is not None or not (out / RESULTS_FILE).is_file():
        return None
    saved = read_json_object(out / FINETUNE_CONFIG, "restore it or delete the directory")
    resolved = steps.config_dict(cfg)
    changed = [
        f"{option(k)} was {saved[k]!r}, now {v!r}"
        for k, v in resolved.items()
        if k not in NOT_RESULT and k in saved and saved[k] != v  # older runs record fewer
    ]
    if changed:
        raise BertforgeError(
            f"{out} holds a finished run of other settings ({'; '.join(changed)}); choose another "
            f"--output to train with these, or delete {out} to train there again"
        )
    print(
        f"{out} holds a finished run of these settings ({RESULTS_FILE}); nothing to do. "
        "Choose another --output (or delete it) to train again",
        file=sys.stderr,
    )
    return read_json_object(out / RESULTS_FILE, "restore it or delete the directory")


def _improved(value: float, best: float | None, metric: str) -> bool:
    if best is None:
        return True
    return value > best if HIGHER_IS_BETTER[metric] else value < best


def epoch_batches(run: Run, epoch: int) -> list[np.ndarray]:
    """The batches of ``epoch``, a pure function of (seed, epoch): no replay on resume."""
    cfg = run.cfg
    if isinstance(run.data, EmbeddingTaskData):
        return run.data.batches(cfg.batch_size, cfg.seed, epoch)
    lengths = [len(ids) for ids, _ in run.data.encoded_train]
    return batch_order(lengths, cfg.batch_size, seed=cfg.seed, epoch=epoch, bucket=cfg.bucket)


def save_best(run: Run, state: FinetuneState) -> None:
    """Write the run's model as the best so far (embedding: in the sentence-transformers
    layout)."""
    if isinstance(run.data, EmbeddingTaskData):
        save_embedding_model(run.model, run.out, run.tokenizer, run)
    else:
        tokenizer = run.tokenizer
        if isinstance(run.model, BertForSequenceClassification):
            # a cross-encoder truncates where it was trained: transformers' and sentence-
            # transformers' CrossEncoder(dir) read the limit from tokenizer_config.json
            tokenizer = copy.copy(tokenizer)
            tokenizer.model_max_length = run.cfg.max_length
        save_model(run.model, run.out, tokenizer, state.scale)


def save_model(
    model: BertForSequenceClassification | BertForTokenClassification,
    out: Path,
    tokenizer: Tokenizer,
    scale: tuple[float, float] | list[float] | None,
    dtype: torch.dtype | None = None,
) -> None:
    """Write the model (its floating-point weights as ``dtype``, default as in memory); for
    normalised regression fold ``y = z * std + mean`` into the head."""
    if scale is not None:
        model = copy.deepcopy(model).float()
        mean, std = scale
        with torch.no_grad():
            model.classifier.weight.mul_(std)
            model.classifier.bias.mul_(std).add_(mean)
    model.save_pretrained(out, tokenizer=tokenizer, dtype=dtype)


__all__ = [
    "FINETUNE_CONFIG",
    "FinetuneConfig",
    "FinetuneState",
    "Run",
    "finetune",
    "save_model",
]
