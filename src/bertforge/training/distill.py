"""``bertforge distill``: a small student learns what a fine-tuned teacher knows
(docs/distillation.md). :func:`distill` is the loop, ``finetune``'s with a teacher beside it;
the named parts it calls follow it.

Per optimizer step: set the LR -> take the next batch of training and transfer texts -> the
student's outputs against the teacher's cached ones (:func:`bertforge.training.teacher.
teacher_outputs`) and the gold labels where a text has one, as the named terms of a loss
module (:mod:`bertforge.training.distill_losses`) -> clip -> step unless non-finite -> log ->
maybe validate (keep the best student) / checkpoint / stop on a signal. The train state,
checkpoints, resume, progress bar, metrics log and signal handling are ``finetune``'s.

OUTPUT holds the best student by the validation metric, a normal model directory: a
``BertForSequenceClassification`` with the teacher's labels (regression: predicting in the
labels' units), a ``BertForTokenClassification`` with its tags (:mod:`bertforge.training.
distill_tokens`: per-word soft targets), a ``BertForQuestionAnswering`` (:mod:`bertforge.
training.distill_qa`: start/end distributions) or a ``BertModel`` in the sentence-transformers layout
(the ModernBERT classes of the same tasks for a ModernBERT student: :mod:`bertforge.training.students`), with its tokenizer and a
``finetune_config.json`` carrying the teacher's task settings (columns, maximum length), so that
``classify``, ``embed``, ``evaluate``, ``serve``, ``export`` and transformers read it as they
read a fine-tuned model; beside it ``distill_config.json``, ``metrics.jsonl``, ``curves.png``
and ``eval_results.json`` (the student's and the teacher's validation scores). The report
(``--report true``) follows the run: :mod:`bertforge.training.distill_baselines`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.corpus import CORPUS_SUFFIXES, expand_inputs, iter_documents
from bertforge.data.encoding import batch_order, collate, encode_examples, pad_multiple
from bertforge.data.labelled import LabelledData, load_labelled, random_split, stratified_split
from bertforge.data.pairs import PairData, load_pairs
from bertforge.data.tables import table_format
from bertforge.errors import BertforgeError
from bertforge.evaluation import metrics as M
from bertforge.evaluation.embedding import cosine_rows, model_vectors, score_vectors
from bertforge.evaluation.plots import plot_training_curves, run_title
from bertforge.evaluation.task_scores import evaluate_sequence_model
from bertforge.io import (
    COMPRESSED_SUFFIXES,
    atomic_write_text,
    check_run_directory,
    plain_name,
    read_json_object,
)
from bertforge.modeling.checkpoint import (
    FINETUNE_CONFIG,
    stored_float_dtype,
)
from bertforge.modeling.pooling import pool, write_pooling_declaration
from bertforge.progress import (
    MetricsLogger,
    count_progress,
    format_duration,
    parse_duration,
    plural,
)
from bertforge.runtime import (
    autocast,
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
from bertforge.training.distill_augment import Augmented, augment, load_augmenter
from bertforge.training.distill_config import DISTILL_CONFIG, DistillConfig, option
from bertforge.training.distill_layers import (
    encoder_of,
    layer_loss,
    layer_losses,
    layer_terms,
    traced,
    traced_layers,
)
from bertforge.training.distill_losses import (
    EmbeddingLoss,
    LogitsLoss,
    SpanLoss,
    combine,
    pca_projection,
)
from bertforge.training.distill_qa import (
    QADistillData,
    load_qa_data,
    qa_settings,
    teacher_qa_scores,
    validate_qa_student,
)
from bertforge.training.distill_report import check_report_task
from bertforge.training.distill_tokens import (
    TokenDistillData,
    load_token_data,
    teacher_token_scores,
    validate_tokens,
)
from bertforge.training.embedding import sentence_vectors
from bertforge.training.finetune import FinetuneState, save_model
from bertforge.training.model_card import distill_card, write_model_card
from bertforge.training.optim import build_optimizer, set_lr
from bertforge.training.students import build_student, load_student
from bertforge.training.teacher import Teacher, load_teacher, teacher_outputs

RESULTS_FILE = "eval_results.json"
PLOT_FILE = "curves.png"
CACHE_FILE = "teacher_outputs.npy"
PCA_TEXTS = 20_000
"""Teacher vectors the PCA projection is fitted on (the first training texts)."""
RUN_IDENTITY = (
    "teacher",
    "student",
    "student_layers",
    "student_preset",
    "student_num_layers",
    "student_hidden_size",
    "train",
    "unlabelled",
    "validation",
    "validation_columns",
    "validation_fraction",
    "transfer_unit",
    "max_unlabelled",
    "metric",
    "augment",
    "augment_copies",
    "augment_rate",
    "augment_candidates",
    "max_length",
    "batch_size",
    "seed",
    "hidden_weight",
    "attention_weight",
    "relation_weight",
    "relation_heads",
    "layer_map",
)
"""Settings a resumed run must share with the interrupted one (the texts and their order)."""
METRIC = {
    "classification": "accuracy",
    "regression": "spearman",
    "token_classification": "entity_f1",
    "question_answering": "f1",
    "embedding": "cosine",
}
"""The validation metric that picks the best student by default (higher is better for each)."""
METRIC_CHOICES = {
    "classification": ("accuracy", "macro_f1", "mcc", "agreement"),
    "regression": ("spearman", "pearson"),
    "token_classification": ("entity_f1", "agreement"),
    "question_answering": ("f1", "exact_match"),
    "embedding": ("cosine",),
}
"""The ``--metric`` values each teacher's task takes (all higher-is-better)."""
STS_METRICS = ("spearman", "pearson")
"""An embedding student's scores on scored validation pairs (``--validation_columns A B S``)."""
RETRIEVAL_METRICS = ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100")
"""An embedding student's scores on validation pairs without scores (``--validation_columns A B``)."""


def selection_metric(
    metric: str | None, task: str, validation_columns: list[str] | None = None
) -> str:
    """The validation metric that picks the best student of a ``task`` teacher: ``metric``
    (``--metric``) when it is one the task has, else the task's default; another is refused.
    An embedding teacher validated on pairs (``validation_columns``) adds the STS or the
    retrieval scores, and picks by spearman or mrr@10 by default."""
    choices = METRIC_CHOICES[task]
    default = METRIC[task]
    if task == "embedding" and validation_columns:
        scored = len(validation_columns) == 3
        choices = choices + (STS_METRICS if scored else RETRIEVAL_METRICS)
        default = "spearman" if scored else "mrr@10"
    if metric is None:
        return default
    if metric not in choices:
        why = ""
        if task == "embedding" and metric in STS_METRICS + RETRIEVAL_METRICS:
            why = (
                " without --validation_columns naming a score column"
                if metric in STS_METRICS
                else " without --validation_columns naming two text columns and no score"
            )
        raise BertforgeError(
            f"--metric {metric} is not a {task} metric{why}; choose one of {', '.join(choices)}"
        )
    return metric


@dataclass
class DistillData:
    """The texts a run trains on (the labelled ones first, then the transfer texts) and
    validates on, encoded for the student, with the teacher's outputs of both."""

    texts: list[str]
    pairs: list[str] | None
    labels: np.ndarray | None
    """Gold labels as trained on (class ids, z-scored targets), 0 where a text has none."""
    labelled: np.ndarray
    """(N,) True where a training text has a gold label."""
    encoded: list[tuple[np.ndarray, int]]
    val: LabelledData
    encoded_val: list[tuple[np.ndarray, int]]
    outputs: np.ndarray
    """(N + N_val, width) teacher outputs, the training texts' rows first (memory-mapped)."""
    scale: tuple[float, float] | None = None
    """Regression: ``(mean, std)`` of the teacher's training predictions (the z-scores)."""
    val_pairs: PairData | None = None
    """An embedding teacher's ``--validation`` read as pairs (``--validation_columns``); then
    ``val`` holds their distinct texts."""

    def teacher(self, rows: np.ndarray) -> torch.Tensor:
        """The teacher's outputs of training texts ``rows``, as trained on."""
        out = torch.from_numpy(np.array(self.outputs[rows], dtype=np.float32))
        if self.scale is not None:
            out = (out - self.scale[0]) / self.scale[1]
        return out

    @property
    def val_outputs(self) -> np.ndarray:
        return np.asarray(self.outputs[len(self.texts) :])


@dataclass
class Run:
    """What the loop works with, set up once by :func:`setup`."""

    cfg: DistillConfig
    out: Path
    device: torch.device
    precision: str
    budget: float | None
    total: int
    steps_per_epoch: int
    teacher: Teacher
    tokenizer: Tokenizer
    data: DistillData | TokenDistillData | QADistillData
    model: torch.nn.Module
    loss: LogitsLoss | SpanLoss | EmbeddingLoss
    optimizer: torch.optim.Optimizer
    logger: MetricsLogger
    teacher_scores: dict[str, float]
    layers: torch.nn.ModuleList
    """The intermediate losses that are on (empty: the teacher's cached outputs alone)."""

    @property
    def task(self) -> str:
        return self.teacher.task

    @property
    def metric(self) -> str:
        """The validation metric that picks the best student (``--metric``)."""
        return selection_metric(self.cfg.metric, self.task, self.cfg.validation_columns)

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def done(self, state: FinetuneState) -> bool:
        spent = steps.budget_spent(
            state.step, state.elapsed, total_steps=self.total, budget=self.budget
        )
        return state.finished or spent


@locks_output
def distill(cfg: DistillConfig) -> dict[str, Any]:
    """Run (or resume) a distillation as configured; return the best validation results."""
    check_run_directory(cfg.output, DISTILL_CONFIG, "a distillation run")
    finished = _finished_run(cfg)
    if finished is not None:
        return finished
    run, state = setup(cfg)
    eval_every = cfg.eval_every or run.steps_per_epoch
    bar = steps.progress_bar(state, run.total, run.budget, enabled=cfg.progress)
    window = steps.RunningMeans()
    guard = steps.NonFiniteGuard(cfg.max_nonfinite, "lower --lr or use --precision fp32")
    stopped, order, order_epoch = None, [], -1
    run.model.train()
    with GracefulStop() as stop:
        while not run.done(state):
            if order_epoch != state.epoch:  # a pure function of (seed, epoch): no replay
                lengths = [len(ids) for ids, _ in run.data.encoded]
                order = batch_order(lengths, cfg.batch_size, seed=cfg.seed, epoch=state.epoch)
                order_epoch = state.epoch
            if state.batch >= len(order):
                state.epoch, state.batch = state.epoch + 1, 0
                continue
            t0 = time.perf_counter()
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
            steps.record_step(
                state,
                report,
                window,
                bar,
                run.logger,
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
    run.logger.close()
    return finish(run, state)


def setup(cfg: DistillConfig) -> tuple[Run, FinetuneState]:
    """Device, teacher, student, data and the teacher's outputs, loss, optimizer and the state
    (fresh or resumed); writes the resolved config and says what will run."""
    threads = set_threads(cfg.num_threads)
    budget = parse_duration(cfg.max_time)
    device = pick_device(cfg.device)
    out = Path(cfg.output)
    teacher = load_teacher(cfg.teacher, cfg.max_length)
    check_report_task(cfg, teacher.task)
    selection_metric(cfg.metric, teacher.task, cfg.validation_columns)  # before any write
    if cfg.validation_columns and teacher.task != "embedding":
        raise BertforgeError(
            f"--validation_columns is for an embedding teacher; a {teacher.task} teacher reads "
            "--validation in its own columns: drop --validation_columns"
        )
    if cfg.augment and teacher.task not in ("classification", "regression"):
        raise BertforgeError(
            f"--augment is for classification and regression teachers, not a {teacher.task} "
            "one; drop --augment"
        )
    seed_everything(cfg.seed)
    resume_dir = intact_checkpoint(latest_checkpoint(out))
    model, tokenizer, start = student_for(cfg, teacher, resume_dir)
    layers = layer_losses(cfg, teacher, model, tokenizer)
    resolved = steps.config_dict(cfg)

    def before_teacher(texts: int) -> None:
        """The checks that need the texts read, then OUTPUT made a distillation run (first its
        config: check_run_directory), before the teacher's pass writes its cache there."""
        if cfg.batch_size > texts:
            raise BertforgeError(
                f"--batch_size {cfg.batch_size} is larger than the {texts:,} training texts; "
                "lower it or give more text"
            )
        width = model.config.hidden_size
        if teacher.task == "embedding" and width > teacher.width:
            raise BertforgeError(
                f"the student's vectors ({width} wide) are wider than the teacher's "
                f"({teacher.width}); choose a student at most as wide"
            )
        if teacher.task == "embedding" and width < teacher.width and min(texts, PCA_TEXTS) < width:
            raise BertforgeError(
                f"{texts} training texts are too few to fit the {teacher.width} -> {width} PCA "
                "projection; give at least as many texts as the student is wide"
            )
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / DISTILL_CONFIG, json.dumps(resolved, indent=2) + "\n")

    t0 = time.perf_counter()
    data = load_data(cfg, teacher, tokenizer, cache_path(cfg), device, before_teacher)
    teacher_seconds = time.perf_counter() - t0
    steps_per_epoch = math.ceil(len(data.encoded) / cfg.batch_size)
    total = cfg.max_steps or max(1, round(cfg.epochs * steps_per_epoch))
    precision, why = explain_precision(cfg.precision, device, model.config.hidden_size)
    if cfg.dropout is not None:
        steps.set_dropout(model, cfg.dropout)
    model = model.to(device)
    loss = loss_module(cfg, teacher, data, model.config.hidden_size).to(device)
    layers = layers.to(device)
    if len(layers):  # the teacher runs beside the student at every step
        teacher.model.to(device)
    # a learned projection of the hidden-state loss trains with the student
    trained = torch.nn.ModuleList([model, layers]) if len(layers) else model
    optimizer = build_optimizer(trained, cfg.lr, cfg.weight_decay)
    identity = {k: resolved[k] for k in RUN_IDENTITY}
    state = FinetuneState(run=identity, scale=data.scale)
    if resume_dir is not None:
        state, blob = FinetuneState.load(resume_dir, optimizer)
        if len(layers):
            layers.load_state_dict(blob["layer_losses"])
        check_same_run(resume_dir, state.run, identity, option=option)
        print(f"resuming from {resume_dir} at step {state.step}", file=sys.stderr, flush=True)
    logger = MetricsLogger(out, resume_step=state.step if resume_dir is not None else None)
    scores = teacher_scores(teacher, data)
    run = Run(cfg, out, device, precision, budget, total, steps_per_epoch, teacher, tokenizer,
              data, model, loss, optimizer, logger, scores, layers)  # fmt: skip
    memory = "" if cfg.max_memory is None else "; " + plan_memory(run)
    if isinstance(data, QADistillData):  # a question's context may span several windows
        rows = f"{len(data.texts):,} questions ({len(data.windows):,} windows)"
    elif isinstance(data, TokenDistillData):  # so may a long sentence
        rows = (
            f"{len(data.texts):,} sentences ({len(data.windows):,} windows, "
            f"{int(data.labelled.sum()):,} with gold tags)"
        )
    else:
        rows = f"{len(data.texts):,} texts ({int(data.labelled.sum()):,} with gold labels)"
    params = sum(p.numel() for p in model.parameters())
    teacher_params = sum(p.numel() for p in teacher.model.parameters())
    run.say(
        f"distilling {teacher.directory} ({teacher.task}, {teacher_params / 1e6:.1f}M parameters) "
        f"into {start} ({params / 1e6:.1f}M) on {rows}, validating on {len(data.val):,}; "
        "teacher outputs ready in "
        f"{teacher_seconds:.1f}s; {precision} ({why}) on {device}, {plural(threads, 'thread')}; "
        f"{plural(total, 'step')} of batch {cfg.batch_size}"
        + (f" or {format_duration(budget)}" if budget else "")
        + memory
    )
    run.say("teacher on validation: " + _scores_line(scores))
    return run, state


def student_for(
    cfg: DistillConfig, teacher: Teacher, resume_dir: Path | None
) -> tuple[torch.nn.Module, Tokenizer, str]:
    """``(model, tokenizer, what it is)``: the checkpoint being resumed, else the student built
    from its start (:func:`~bertforge.training.students.build_student`)."""
    if resume_dir is None:
        model, tokenizer, start = build_student(
            teacher,
            directory=cfg.student,
            layers=cfg.student_layers,
            preset=cfg.student_preset,
            num_layers=cfg.student_num_layers,
            hidden_size=cfg.student_hidden_size,
            architecture=cfg.student_architecture,
            seed=cfg.seed,
        )
    else:
        model = load_student(teacher.task, resume_dir)
        tokenizer = Tokenizer.from_file(resume_dir)
        start = str(resume_dir)
    if model.config.max_position_embeddings < teacher.max_length:
        raise BertforgeError(
            f"the student has {model.config.max_position_embeddings} positions, fewer than the "
            f"teacher's max_length {teacher.max_length}; lower --max_length"
        )
    return model, tokenizer, start


def loss_module(
    cfg: DistillConfig, teacher: Teacher, data: Any, width: int
) -> LogitsLoss | SpanLoss | EmbeddingLoss:
    """The loss of the teacher's task; an embedding student narrower than its teacher learns the
    PCA projection of the teacher's vectors (fitted on the first training texts' vectors)."""
    if teacher.task == "question_answering":
        return SpanLoss(cfg.alpha, cfg.temperature)
    if teacher.task != "embedding":
        return LogitsLoss(teacher.task == "regression", cfg.alpha, cfg.temperature)
    projection = None
    if width != teacher.width:  # narrower (before_teacher refused a wider one)
        fit = np.asarray(data.outputs[: min(PCA_TEXTS, len(data.texts))])
        projection = pca_projection(fit, width)
    return EmbeddingLoss(cfg.cosine_weight, projection, teacher.normalize)


# ---- data ------------------------------------------------------------------------------------


def transfer_texts(cfg: DistillConfig, teacher: Teacher) -> list[str]:
    """The texts of the ``--unlabelled`` corpora (documents or sentences, :data:`transfer_unit`),
    at most ``--max_unlabelled``; a file no corpus reader reads is refused."""
    if not cfg.unlabelled:
        return []
    files = expand_inputs(cfg.unlabelled)
    for path in files:
        suffix = Path(plain_name(path)).suffix
        if suffix and suffix not in CORPUS_SUFFIXES:
            raise BertforgeError(
                f"{path}: no corpus reader reads {suffix} files; give --unlabelled text "
                f"({', '.join(CORPUS_SUFFIXES)}, optionally {', '.join(COMPRESSED_SUFFIXES)}; "
                "or a datasets folder)"
            )
    unit = cfg.transfer_unit
    if unit == "auto":
        unit = "sentence" if teacher.task == "embedding" else "document"
    texts: list[str] = []
    for document in iter_documents(
        files, text_column=teacher.text_column, encoding_errors=cfg.encoding_errors
    ):
        parts = document if unit == "sentence" else [" ".join(document)] if document else []
        texts += [t for t in parts if t.strip()]
        if cfg.max_unlabelled and len(texts) >= cfg.max_unlabelled:
            texts = texts[: cfg.max_unlabelled]
            break
    if not texts:
        raise BertforgeError(f"{', '.join(cfg.unlabelled)}: no text found in --unlabelled")
    return texts


def check_balance(cfg: DistillConfig, task: str) -> None:
    """Refuse ``--balance_transfer`` where it has nothing to balance or no proportions to keep."""
    if task != "classification":
        raise BertforgeError(
            f"--balance_transfer keeps a classifier's class proportions; this teacher is a "
            f"{task} model: drop it"
        )
    if not cfg.train:
        raise BertforgeError(
            "--balance_transfer takes the class proportions from --train's gold labels: give --train"
        )
    if not (cfg.unlabelled or cfg.augment):
        raise BertforgeError(
            "--balance_transfer balances transfer text: give --unlabelled or --augment, or drop it"
        )


def balanced_rows(
    classes: np.ndarray, labelled: np.ndarray, labels: np.ndarray, seed: int
) -> np.ndarray:
    """The transfer rows (``~labelled``) to keep, sorted, so that their classes (``classes``:
    the teacher's top class of every training row) come in the gold rows' proportions
    (``labels[labelled]``): the most rows that allow it, each class's drawn at random. A class
    the gold rows lack keeps none."""
    gold = np.bincount(labels[labelled].astype(np.int64), minlength=int(classes.max()) + 1)
    transfer = np.flatnonzero(~labelled)
    have = np.bincount(classes[transfer], minlength=len(gold))[: len(gold)]
    share = gold / gold.sum()
    total = min(have[c] / share[c] for c in range(len(gold)) if share[c] > 0)
    rng = np.random.default_rng(seed)
    keep = []
    for c in range(len(gold)):
        members = transfer[classes[transfer] == c]
        keep.append(rng.choice(members, int(total * share[c]), replace=False))
    return np.sort(np.concatenate(keep))


def transfer_pairs(cfg: DistillConfig, teacher: Teacher) -> tuple[list[str], list[str]]:
    """A pair teacher's ``--unlabelled`` transfer pairs: the rows of tables (csv/tsv/jsonl,
    Parquet, a datasets folder) in the teacher's two text columns, no labels; a row with an
    empty side is skipped, at most ``--max_unlabelled`` rows are read. Returns (texts, pairs)."""
    assert cfg.unlabelled and teacher.text_pair_column
    columns = f"{teacher.text_column!r} and {teacher.text_pair_column!r}"
    if cfg.transfer_unit == "sentence":
        raise BertforgeError(
            "--transfer_unit sentence splits running text, but the teacher reads pairs, one a "
            "table row: drop --transfer_unit"
        )
    files = expand_inputs(cfg.unlabelled)
    for path in files:
        try:
            table_format(path)
        except BertforgeError:
            raise BertforgeError(
                f"{path}: the teacher reads pairs, so --unlabelled must be a table with its "
                f"columns {columns} (csv, tsv, jsonl or Parquet), not running text"
            ) from None
    rows = load_labelled(
        files,
        text_column=teacher.text_column,
        text_pair_column=teacher.text_pair_column,
        label_column=None,
        encoding_errors=cfg.encoding_errors,
    )[0]
    assert rows.pairs is not None
    kept = [(a, b) for a, b in zip(rows.texts, rows.pairs, strict=True) if a.strip() and b.strip()]
    if cfg.max_unlabelled:
        kept = kept[: cfg.max_unlabelled]
    if not kept:
        raise BertforgeError(
            f"{', '.join(cfg.unlabelled)}: no row with both {columns} filled in --unlabelled"
        )
    return [a for a, _ in kept], [b for _, b in kept]


AUGMENTED_FILE = "augmented.jsonl"
"""The texts ``--augment`` made, one JSON object a line (``source``: the labelled row it came
from, 0-based; ``text``; ``pair`` for a pair teacher), written for the user to read."""


def augmented_rows(
    cfg: DistillConfig, gold: LabelledData, device: torch.device
) -> Augmented | None:
    """TinyBERT's augmentation of the labelled rows (``--augment``), or None without it."""
    if not cfg.augment:
        return None
    if not len(gold):
        raise BertforgeError("--augment makes new texts from --train's rows; give --train")
    model, tokenizer, options = load_augmenter(cfg.augment, str(device), cfg.eval_batch_size)
    t0 = time.perf_counter()
    made = augment(
        model, tokenizer, gold.texts, gold.pairs,
        copies=cfg.augment_copies, rate=cfg.augment_rate, k=cfg.augment_candidates,
        seed=cfg.seed, progress=cfg.progress, **options,
    )  # fmt: skip
    model.to("cpu")
    print(
        f"augment: {len(made):,} new texts from {len(gold):,} labelled ones "
        f"({len(made) / len(gold):.1f} each, --augment_copies {cfg.augment_copies}) with "
        f"{cfg.augment} in {time.perf_counter() - t0:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    return made


def write_augmented(path: Path, made: Augmented) -> None:
    lines = []
    for i, text in enumerate(made.texts):
        row: dict[str, Any] = {"source": made.source[i], "text": text}
        if made.pairs is not None:
            row["pair"] = made.pairs[i]
        lines.append(json.dumps(row, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + "\n")


def labelled_sets(cfg: DistillConfig, teacher: Teacher) -> tuple[LabelledData, LabelledData]:
    """``(train, validation)`` gold rows of a task teacher, in its columns and labels; without
    --validation a stratified share of --train is held out."""
    regression = teacher.task == "regression"
    columns = dict(
        text_column=teacher.text_column,
        label_column=teacher.label_column,
        text_pair_column=teacher.text_pair_column,
        task=teacher.task,
        label2id=None if regression else teacher.config.label2id,
        encoding_errors=cfg.encoding_errors,
    )
    empty = LabelledData([], [] if teacher.text_pair_column else None, np.zeros(0))
    train = load_labelled(cfg.train, **columns)[0] if cfg.train else empty
    if cfg.validation:
        return train, load_labelled(cfg.validation, **columns)[0]
    if not cfg.train:
        raise BertforgeError(
            f"a {teacher.task} teacher needs gold labels to validate on: give --validation "
            "(or --train, whose share --validation_fraction is held out)"
        )
    train_idx, val_idx = stratified_split(
        train.labels, cfg.validation_fraction, cfg.seed, regression=regression
    )
    return train.subset(train_idx), train.subset(val_idx)


def embedding_validation(
    files: list[str], teacher: Teacher, encoding_errors: str, columns: list[str] | None = None
) -> tuple[list[str], PairData | None]:
    """An embedding teacher's ``--validation`` texts, on which the student is scored by its
    cosine to the teacher's vectors: the teacher's text column of each file (any format
    ``--train`` reads), or, given ``columns`` (``--validation_columns``: two text columns and
    optionally a score), the distinct texts of the pairs, returned too."""
    if columns is None:
        texts = load_labelled(
            files,
            text_column=teacher.text_column,
            label_column=None,
            encoding_errors=encoding_errors,
        )[0].texts
        return texts, None
    pairs = load_pairs(
        files,
        text_column=columns[0],
        text_pair_column=columns[1],
        label_column=columns[2] if len(columns) == 3 else None,
        encoding_errors=encoding_errors,
    )
    assert pairs.positives is not None
    return list(dict.fromkeys(pairs.anchors + pairs.positives)), pairs


def pair_scores(pairs: PairData, texts: list[str], vectors: np.ndarray) -> dict[str, float]:
    """The STS or retrieval scores of ``pairs`` (``score_vectors``) given the ``vectors`` of
    their distinct ``texts`` (row i is text i's)."""
    row = {text: i for i, text in enumerate(texts)}
    return score_vectors(pairs, lambda batch: vectors[[row[t] for t in batch]])


def load_data(
    cfg: DistillConfig,
    teacher: Teacher,
    tokenizer: Tokenizer,
    cache: Path,
    device: torch.device,
    before_teacher: Callable[[int], None],
) -> DistillData | TokenDistillData | QADistillData:
    """Read the gold and transfer texts, encode them for the student (its own tokenizer) and
    get the teacher's outputs of them (its tokenizer; cached in ``cache``), calling
    ``before_teacher(training texts)`` first."""
    if cfg.balance_transfer:
        check_balance(cfg, teacher.task)
    if teacher.task == "question_answering":  # refuses --unlabelled before reading it
        return load_qa_data(cfg, teacher, tokenizer, cache, device, before_teacher)
    transfer_pair: list[str] = []
    if cfg.unlabelled and teacher.text_pair_column and teacher.task != "embedding":
        transfer, transfer_pair = transfer_pairs(cfg, teacher)
    else:
        transfer = transfer_texts(cfg, teacher)
    if teacher.task == "token_classification":
        return load_token_data(cfg, teacher, tokenizer, transfer, cache, device, before_teacher)
    augmented: Augmented | None = None
    pair_set: PairData | None = None
    if teacher.task == "embedding":
        gold: list[str] = []
        if cfg.train:
            gold = load_labelled(cfg.train, text_column=teacher.text_column, label_column=None)[
                0
            ].texts
        texts = gold + transfer
        if cfg.validation:  # the user's texts: every training text stays in training
            train = LabelledData(texts, None, None)
            val_texts, pair_set = embedding_validation(
                cfg.validation, teacher, cfg.encoding_errors, cfg.validation_columns
            )
            val = LabelledData(val_texts, None, None)
        else:
            rows, val_rows = random_split(
                len(texts),
                cfg.validation_fraction,
                cfg.seed,
                "texts",
                fix="give more text or another fraction",
            )
            train = LabelledData([texts[i] for i in rows], None, None)
            val = LabelledData([texts[i] for i in val_rows], None, None)
        labels, labelled = None, np.zeros(len(train), dtype=bool)
    else:
        gold_train, val = labelled_sets(cfg, teacher)
        augmented = augmented_rows(cfg, gold_train, device)
        pairs = None if gold_train.pairs is None else list(gold_train.pairs)
        if augmented is not None:
            transfer = augmented.texts + transfer
            if pairs is not None:
                pairs += augmented.pairs or []
        if pairs is not None:
            pairs += transfer_pair
        train = LabelledData(gold_train.texts + transfer, pairs, None)
        labels = np.zeros(len(train), dtype=gold_train.labels.dtype)
        labels[: len(gold_train)] = gold_train.labels
        labelled = np.arange(len(train)) < len(gold_train)
    val_pairs = None if val.pairs is None else list(val.pairs)
    all_pairs = None if train.pairs is None else train.pairs + (val_pairs or [])
    before_teacher(len(train))
    if augmented is not None:
        write_augmented(Path(cfg.output) / AUGMENTED_FILE, augmented)
    precision, _ = explain_precision(cfg.precision, device, teacher.config.hidden_size)
    teacher.model.to(device)
    outputs = teacher_outputs(
        teacher,
        train.texts + val.texts,
        all_pairs,
        cache,
        batch_size=cfg.eval_batch_size,
        precision=precision,
        progress=count_progress("teacher", "texts"),
    )
    teacher.model.to("cpu")  # its outputs are cached: the device is the student's
    if cfg.balance_transfer:
        assert labels is not None
        keep = balanced_rows(
            np.asarray(outputs[: len(train)]).argmax(1), labelled, labels, cfg.seed
        )
        rows = np.concatenate([np.arange(int(labelled.sum())), keep])  # the gold rows first
        print(
            f"balance: kept {len(keep):,} of {len(train) - int(labelled.sum()):,} transfer texts, "
            "in the gold labels' class proportions (--balance_transfer)",
            file=sys.stderr,
            flush=True,
        )
        outputs = np.concatenate([np.asarray(outputs[rows]), np.asarray(outputs[len(train) :])])
        train, labels, labelled = train.subset(rows), labels[rows], labelled[rows]
    scale = None
    if teacher.task == "regression":
        predicted = np.asarray(outputs[: len(train)], dtype=np.float64)[:, 0]
        scale = (float(predicted.mean()), float(predicted.std()) or 1.0)
        assert labels is not None
        labels = ((labels - scale[0]) / scale[1]).astype(np.float32)
    encode = dict(max_length=teacher.max_length, truncation=teacher.truncation)
    return DistillData(
        train.texts,
        train.pairs,
        labels,
        labelled,
        encode_examples(tokenizer, train.texts, train.pairs, **encode),
        val,
        encode_examples(tokenizer, val.texts, val_pairs, **encode),
        outputs,
        scale,
        pair_set,
    )


# ---- the step, validation and the end --------------------------------------------------------


Terms = dict[str, torch.Tensor]


def plan_memory(run: Run) -> str:
    """``--max_memory``: measure the run's training memory on its longest texts (the student's
    forward and its loss, with the teacher beside it for the intermediate losses;
    :mod:`bertforge.training.budget`), then set ``--micro_batch_size`` and
    ``--eval_batch_size`` to the largest that fit; the start line's account, or an error saying
    what would fit."""
    cfg, data = run.cfg, run.data
    longest = np.array(longest_rows(data.encoded))

    def forward(k: int) -> torch.Tensor:
        out, extra, _ = part_terms(run, longest[:k])
        loss = run.loss.loss(out)
        return loss + layer_loss(run.layers, extra) if extra else loss

    bf16_cpu = run.precision == "bf16" and run.device.type == "cpu"
    use = measure_use(forward, run.model, resident_memory_bytes(), bf16_cpu)
    run.model.zero_grad(set_to_none=True)
    budget = parse_bytes(cfg.max_memory)
    assert budget is not None  # checked: --max_memory none is None
    plan = plan_batches(
        budget, use, cfg.batch_size, cfg.micro_batch, cfg.eval_batch_size, "--max_memory"
    )
    cfg.micro_batch_size, cfg.eval_batch_size = plan.micro, plan.eval_batch
    return plan.describe(budget, use, cfg.batch_size, "--max_memory")


def train_step(run: Run, rows: np.ndarray) -> steps.StepReport:
    """Forward/backward of the batch ``rows`` against the teacher's outputs and the gold
    labels, in micro-batches of --micro_batch_size (each term weighted by the micro-batch's share
    of the batch's units: :func:`term_units`), then gradient clipping."""
    parts = [part for part, _ in steps.micro_batches(rows, run.cfg.micro_batch)]
    total = term_units(run, rows) if len(parts) > 1 else None
    gold = total is not None and total["hard"] > 0  # (a batch without: soft alone)
    losses: dict[str, float] = {}
    tokens = 0
    for part in parts:
        out, extra, n = part_terms(run, part)
        if total is not None:
            units = term_units(run, part)
            out = {k: v * (units[k] / total[k]) for k, v in out.items()}
            extra = {k: v * (units[k] / total[k]) for k, v in extra.items()}
        loss = weighted(run, out) if gold else run.loss.loss(out)
        if extra:
            loss = loss + layer_loss(run.layers, extra)
        loss.backward()
        for name, value in (("loss", loss), *((f"{k}_loss", v) for k, v in (out | extra).items())):
            losses[name] = losses.get(name, 0.0) + float(value.detach())
        tokens += n
    grad_norm = steps.clip_gradients(run.model.parameters(), run.cfg.max_grad_norm)
    return steps.StepReport(0.0, grad_norm, tokens, 0.0, losses)


def weighted(run: Run, terms: Terms) -> torch.Tensor:
    """A micro-batch's output loss in a batch with gold labels: each term at its weight, also
    where this micro-batch has no gold rows (its soft term at ``alpha``, not alone at 1)."""
    weights = run.loss.weights
    if not any(weights.get(k, 0.0) for k in terms):  # --alpha 0 and no gold rows here
        return torch.stack([v * 0.0 for v in terms.values()]).sum()
    return combine(terms, weights)


def term_units(run: Run, rows: np.ndarray) -> dict[str, float]:
    """What each loss term of the rows ``rows`` is a mean over, counted on the host: texts
    (``soft``, ``mse``) or, for a tagger, the words that learn; the gold ones (``hard``); the
    real tokens (the intermediate terms). A micro-batch's term weighs its count over the
    batch's, so that the micro-batches' gradients sum to the batch's."""
    data = run.data
    length = run.teacher.max_length
    tokens = float(sum(min(len(data.encoded[i][0]), length) for i in rows))
    inner = {"hidden": tokens, "attention": tokens, "relation": tokens}
    if isinstance(data, TokenDistillData):  # the words that learn, and those with gold tags
        where, _, _, gold = data.batch(rows, 1)
        return {"soft": float(where.numel()), "hard": float(gold.sum())} | inner
    gold = float(np.asarray(data.labelled)[rows].sum())
    return {"soft": float(len(rows)), "mse": float(len(rows)), "hard": gold} | inner


def part_terms(run: Run, rows: np.ndarray) -> tuple[Terms, Terms, int]:
    """One micro-batch's output terms (the loss module's, against the teacher and the gold
    labels), its intermediate terms (empty without them) and its real tokens."""
    data, device = run.data, run.device
    padded = collate(
        [data.encoded[i] for i in rows], run.tokenizer.pad_id, pad_multiple(device),
        run.teacher.max_length,
    )  # fmt: skip
    batch = {k: v.to(device) for k, v in padded.items()}
    tokens = int(batch["attention_mask"].sum())
    if isinstance(data, TokenDistillData):
        return (*token_terms(run, rows, batch), tokens)
    if isinstance(data, QADistillData):
        return (*span_terms(run, rows, batch), tokens)
    teacher = data.teacher(rows).to(device)
    extra: Terms = {}
    if len(run.layers):
        student, extra = layer_step(run, batch)
    elif run.task == "embedding":
        student = sentence_vectors(run.model, batch, run.teacher.pooling, device, run.precision)
    else:
        with autocast(device, run.precision):
            student = run.model(**batch, cls_only=True).logits  # (B, C)
    if run.task == "embedding":
        return run.loss(student, teacher), extra, tokens
    labels = torch.as_tensor(data.labels[rows]).to(device)
    labelled = torch.as_tensor(data.labelled[rows]).to(device)
    return run.loss(student, teacher, labels, labelled), extra, tokens


def token_terms(run: Run, rows: np.ndarray, batch: dict[str, torch.Tensor]) -> tuple[Terms, Terms]:
    """A token-classification batch: the soft and gold terms at each word's first piece, and
    the intermediate terms (empty without them)."""
    data, device = run.data, run.device
    assert isinstance(data, TokenDistillData)
    length = batch["input_ids"].shape[1]
    where, teacher, labels, labelled = (t.to(device) for t in data.batch(rows, length))
    out, extra = student_outputs(run, batch)
    logits = out.logits  # (B, T, C)
    student = logits.reshape(-1, logits.shape[-1])[where]
    return run.loss(student, teacher, labels, labelled), extra


def span_terms(run: Run, rows: np.ndarray, batch: dict[str, torch.Tensor]) -> tuple[Terms, Terms]:
    """A question-answering batch: the start/end KL to the teacher and the gold spans, and the
    intermediate terms (empty without them)."""
    data, device = run.data, run.device
    assert isinstance(data, QADistillData)
    length = batch["input_ids"].shape[1]
    teacher = tuple(t.to(device) for t in data.teacher(rows, length))
    gold = tuple(t.to(device) for t in data.targets(rows))
    out, extra = student_outputs(run, batch)
    student = (out.start_logits, out.end_logits)
    return run.loss(student, teacher, batch["attention_mask"], gold), extra


def student_outputs(run: Run, batch: dict[str, torch.Tensor]) -> tuple[Any, Terms]:
    """The student's forward over every position of ``batch`` (a tagger's or a QA model's) and,
    with intermediate losses, their terms (the teacher run beside it on the same tokens)."""
    if not len(run.layers):
        with autocast(run.device, run.precision):
            return run.model(**batch), {}
    return traced_step(run, batch, lambda: run.model(**batch, output_attentions=True))


def layer_step(run: Run, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The student's outputs (logits or pooled vectors) and the intermediate losses' terms,
    the teacher run beside it on the same batch (the same tokens)."""
    model = run.model
    if run.task == "embedding":
        out, terms = traced_step(run, batch, lambda: model(**batch, output_attentions=True))
        with autocast(run.device, run.precision):
            hidden = out.last_hidden_state.float()
            return pool(hidden, batch["attention_mask"], run.teacher.pooling or "mean"), terms
    call = lambda: model(**batch, output_attentions=True, cls_only=False)  # noqa: E731
    out, terms = traced_step(run, batch, call)
    return out.logits, terms


def traced_step(
    run: Run, batch: dict[str, torch.Tensor], call: Callable[[], Any]
) -> tuple[Any, Terms]:
    """``call()``, the student's forward of ``batch`` with ``output_attentions=True``, traced at
    the layers the intermediate losses read, beside the teacher's encoder on the same batch; the
    student's output and the losses' terms."""
    device, precision, model = run.device, run.precision, run.model
    student_layers, teacher_layers = traced_layers(run.layers)
    teacher = run.teacher.model
    with torch.no_grad(), autocast(device, precision):
        encoder = encoder_of(teacher)
        teacher_trace = traced(
            teacher, lambda: encoder(**batch, output_attentions=True), teacher_layers
        )
    with autocast(device, precision):
        trace = traced(model, call, student_layers)
        terms = layer_terms(
            run.layers, model, teacher, (trace, teacher_trace), batch["attention_mask"]
        )
    return trace.output, terms


def validate(run: Run, model: torch.nn.Module, scale: Any = None) -> dict[str, float]:
    """The student's validation scores: against the gold labels (a task teacher; ``agreement``
    with the teacher's predictions beside them), or an embedding's ``cosine`` and ``mse`` to
    the teacher's vectors as it learns them."""
    data, cfg = run.data, run.cfg
    if isinstance(data, QADistillData):
        return validate_qa_student(
            model,
            data,
            run.tokenizer.pad_id,
            batch_size=cfg.eval_batch_size,
            precision=run.precision,
        )
    if isinstance(data, TokenDistillData):
        return validate_tokens(
            model,
            data,
            run.tokenizer.pad_id,
            batch_size=cfg.eval_batch_size,
            precision=run.precision,
        )
    if run.task == "embedding":
        vectors = model_vectors(
            model,
            run.tokenizer,
            pooling=run.teacher.pooling,
            normalize=False,
            batch_size=cfg.eval_batch_size,
            max_length=run.teacher.max_length,
            precision=run.precision,
        )(data.val.texts)
        with torch.no_grad():
            got = torch.from_numpy(vectors)
            if run.teacher.normalize:
                got = F.normalize(got, dim=-1)
            teacher = torch.from_numpy(np.array(data.val_outputs, dtype=np.float32))
            target = run.loss.target(teacher.to(run.device)).cpu()
        scores = {
            "cosine": float(np.mean(cosine_rows(got.numpy(), target.numpy()))),
            "mse": float(F.mse_loss(got, target)),
            "examples": len(data.val),
        }
        if data.val_pairs is not None:
            scores.update(pair_scores(data.val_pairs, data.val.texts, vectors))
        return scores
    metrics, predictions = evaluate_sequence_model(
        model,
        data.encoded_val,
        data.val.labels,
        run.tokenizer.pad_id,
        batch_size=cfg.eval_batch_size,
        precision=run.precision,
        scale=scale,
    )
    if run.task == "classification":
        teacher = data.val_outputs.argmax(-1)
        metrics["agreement"] = float(np.mean(predictions == teacher))
    return metrics


def teacher_scores(
    teacher: Teacher, data: DistillData | TokenDistillData | QADistillData
) -> dict[str, float]:
    """The teacher's validation scores from its cached outputs (what the student aims at)."""
    if isinstance(data, TokenDistillData):
        return teacher_token_scores(teacher, data)
    if isinstance(data, QADistillData):
        return teacher_qa_scores(data)
    if teacher.task == "embedding":
        scores = {"cosine": 1.0, "mse": 0.0}
        if data.val_pairs is not None:
            vectors = np.asarray(data.val_outputs, dtype=np.float32)
            scores.update(pair_scores(data.val_pairs, data.val.texts, vectors))
        return scores
    outputs = data.val_outputs
    if teacher.task == "regression":
        return M.regression_metrics(data.val.labels, outputs[:, 0])
    predicted = outputs.argmax(-1)
    return M.classification_metrics(data.val.labels, predicted, teacher.config.num_labels)


def _scores_line(scores: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if isinstance(v, float))


def evaluate(run: Run, state: FinetuneState, bar: Any) -> None:
    """Validate; keep the student when the metric improved."""
    metric = run.metric
    metrics = validate(run, run.model, scale=state.scale)
    run.logger.log(state.step, "val", **metrics)
    value = metrics[metric]
    if state.best is None or value > state.best:
        state.best, state.best_step = value, state.step
        save_best(run, state)
    bar.write(
        f"step {state.step}: {metric} {value:.4f} (best {state.best:.4f} at step "
        f"{state.best_step}) | teacher {run.teacher_scores[metric]:.4f}"
    )


def save_best(run: Run, state: FinetuneState) -> None:
    """The student as the best so far (an embedding model in the sentence-transformers
    layout; a regressor's head rescaled to predict in the labels' units)."""
    dtype = saved_dtype(run.cfg, run.teacher)
    if run.task == "embedding":
        run.model.save_pretrained(run.out, tokenizer=run.tokenizer, dtype=dtype)
        write_pooling_declaration(
            run.out,
            run.teacher.pooling or "mean",
            run.teacher.normalize,
            run.model.config.hidden_size,
            run.teacher.max_length,
        )
    else:
        save_model(run.model, run.out, run.tokenizer, state.scale, dtype=dtype)


SAVE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def saved_dtype(cfg: DistillConfig, teacher: Teacher) -> torch.dtype | None:
    """The floating-point type the student is saved in (None: fp32, as trained): --save_dtype,
    or (auto) the teacher's stored type where that is narrower than fp32, so that a student is
    never wider on disk than its teacher."""
    if cfg.save_dtype != "auto":
        wanted = SAVE_DTYPES[cfg.save_dtype]
        return None if wanted == torch.float32 else wanted
    stored = stored_float_dtype(teacher.directory)
    narrower = stored is not None and torch.finfo(stored).bits < 32
    return stored if narrower else None


def save_checkpoint(run: Run, state: FinetuneState) -> None:
    write_checkpoint(
        run.out,
        run.model,
        run.tokenizer,
        state=state.to_json(),
        optimizer=run.optimizer,
        keep=run.cfg.keep_checkpoints,
        extra_tensors={"layer_losses": run.layers.state_dict()} if len(run.layers) else None,
    )


def task_settings(run: Run) -> dict[str, Any]:
    """The ``finetune_config.json`` of the student: the teacher's task settings, so that the
    inference commands (and a further distillation) read the student as a fine-tuned model."""
    teacher = run.teacher
    return {
        "model": str(teacher.directory),
        "task": teacher.task,
        "text_column": teacher.text_column,
        "text_pair_column": teacher.text_pair_column,
        "label_column": teacher.label_column,
        "max_length": teacher.max_length,
        "truncation": teacher.truncation,
        "pooling": teacher.pooling,
        "distilled_from": str(teacher.directory),
    } | extra_settings(run)


def extra_settings(run: Run) -> dict[str, Any]:
    """The task settings of a token classifier or a QA model beyond the columns."""
    if run.task == "token_classification":
        return {"label_all_tokens": False}
    if run.task == "question_answering":
        stride, max_answer = qa_settings(run.teacher)
        return {"doc_stride": stride, "max_answer_length": max_answer}
    return {}


def finish(run: Run, state: FinetuneState) -> dict[str, Any]:
    """The end of a run: the best student reloaded, its validation scores beside the teacher's,
    curves, eval_results.json, the task settings; the checkpoint and the teacher's cache
    dropped unless --keep_final_checkpoint."""
    cfg, out = run.cfg, run.out
    run.model.zero_grad(set_to_none=True)
    run.optimizer.state.clear()
    best = load_student(run.task, out).to(run.device)
    metrics = validate(run, best)
    plot_training_curves(out, out / PLOT_FILE, title=f"bertforge distill: {run_title(out)}")
    atomic_write_text(out / FINETUNE_CONFIG, json.dumps(task_settings(run), indent=2) + "\n")
    metric = run.metric
    result = {
        "best_step": state.best_step,
        "steps": state.step,
        "train_seconds": round(state.elapsed, 1),
        "tokens": state.tokens,
        "skipped": state.skipped,
        "task": run.task,
        "metric": metric,
        "validation": metrics,
        "teacher": run.teacher_scores,
        "parameters": sum(p.numel() for p in best.parameters()),
        "teacher_parameters": sum(p.numel() for p in run.teacher.model.parameters()),
        "model_dir": str(out),
        "peak_memory_bytes": peak_memory_bytes(),
    }
    atomic_write_text(out / RESULTS_FILE, json.dumps(result, indent=2) + "\n")
    write_model_card(out, distill_card(cfg, result, out, run.device))
    if not cfg.keep_final_checkpoint:
        for path in list_checkpoints(out):
            remove_checkpoint(path)
        if not cfg.report:  # the report reads the teacher's outputs, then drops them
            drop_teacher_cache(out)
    run.say(
        f"best {metric} {metrics[metric]:.4f} at step {state.best_step} of {state.step} "
        f"({format_duration(state.elapsed)} of training); teacher {run.teacher_scores[metric]:.4f}; "
        f"student: {out}"
    )
    run.say("student on validation: " + _scores_line(metrics))
    budget = parse_bytes(cfg.max_memory) if cfg.max_memory else None
    over = budget is not None and over_budget(result["peak_memory_bytes"], budget, "--max_memory")
    if over:
        run.say(over)
    return result


def cache_path(cfg: DistillConfig) -> Path:
    """Where the teacher's outputs are cached: ``--teacher_cache`` or OUTPUT's own file."""
    if cfg.teacher_cache is None:
        return Path(cfg.output) / CACHE_FILE
    path = Path(cfg.teacher_cache)
    if path.suffix != ".npy" or path.is_dir():
        raise BertforgeError(f"--teacher_cache {path}: give a .npy file path (e.g. teacher.npy)")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def drop_teacher_cache(out: Path) -> None:
    """Delete the teacher's cached outputs (and their key) from a run directory (a
    ``--teacher_cache`` elsewhere is the user's and stays)."""
    for name in (CACHE_FILE, Path(CACHE_FILE).with_suffix(".json").name):
        (out / name).unlink(missing_ok=True)


def _finished_run(cfg: DistillConfig) -> dict[str, Any] | None:
    """The saved results when OUTPUT holds a finished run of these settings; a finished run of
    others is refused, naming what differs."""
    out = Path(cfg.output)
    if latest_checkpoint(out) is not None or not (out / RESULTS_FILE).is_file():
        return None
    saved = read_json_object(out / DISTILL_CONFIG, "restore it or delete the directory")
    resolved = steps.config_dict(cfg)
    ignored = ("output", "progress", "num_threads", "log_every", "eval_batch_size", "report")
    ignored += ("report_compare", "report_alone", "report_texts", "report_rounds", "teacher_cache")
    changed = [
        f"{option(k)} was {saved[k]!r}, now {v!r}"
        for k, v in resolved.items()
        if k not in ignored and k in saved and saved[k] != v
    ]
    if changed:
        raise BertforgeError(
            f"{out} holds a finished run of other settings ({'; '.join(changed)}); choose another "
            f"--output, or delete {out} to distill there again"
        )
    what = "its report follows" if cfg.report else "nothing to do"
    print(f"{out} holds a finished run of these settings; {what}", file=sys.stderr)
    return read_json_object(out / RESULTS_FILE, "restore it or delete the directory")


__all__ = [
    "CACHE_FILE",
    "METRIC",
    "METRIC_CHOICES",
    "DistillConfig",
    "DistillData",
    "Run",
    "distill",
    "selection_metric",
    "cache_path",
    "drop_teacher_cache",
    "validate",
]
