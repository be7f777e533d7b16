"""The report of a ``bertforge distill`` run (docs/distillation.md, "The report"):
OUTPUT/report.json and report.md, one row per model scored on the same validation rows --
the teacher, the distilled student, with ``--report_alone`` the student's start and its random
twin trained on the gold labels alone, any ``--report_compare`` directory (a fine-tune of your
own), the student's random twin (its config, fresh weights) untrained and the constant
baseline -- with each model's parameters, megabytes on disk and CPU throughput, then the
student / teacher ratios.

Throughput is texts/s of the model alone (the texts tokenised, sorted by length and padded
beforehand, the same texts for every model, each tokenised by its own tokenizer) at batch 1
and batch 32, eager
PyTorch in fp32 and ONNX Runtime on bertforge's own int8 export (what ``bertforge export
--format onnx --quantize int8`` writes), on the CPU with the threads stated. The models take
turns within each round and the best of the rounds is kept, so that a machine loaded by other
work slows every model alike and the ratios hold.

The scores come from the caller (:func:`bertforge.training.distill_baselines.report_scores`:
the validation ``distill`` runs); this module holds the constant baselines (pure functions), the
measurement and the rendering.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.data.encoding import collate, encode_examples
from bertforge.errors import BertforgeError
from bertforge.evaluation import metrics as M
from bertforge.evaluation.embedding import cosine_rows
from bertforge.evaluation.qa import squad_metrics
from bertforge.evaluation.tagging import tag_metrics
from bertforge.inference.onnx import ONNX_FILE, export_onnx, load_onnx
from bertforge.io import atomic_write_text
from bertforge.modeling.auto import is_modern
from bertforge.modeling.checkpoint import (
    WEIGHTS_NAME,
    check_model_directory,
    save_pretrained,
    stored_float_dtype,
)
from bertforge.runtime import cpu_model
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.students import load_student, student_class
from bertforge.training.teacher import teacher_task

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
BATCH_SIZES = (1, 32)
"""The batch sizes throughput is measured at: one request at a time, and a batch job."""
THROUGHPUT_COLUMNS = tuple(f"{kind}_b{b}" for kind in ("eager", "onnx_int8") for b in BATCH_SIZES)
"""The throughput keys of a row (texts/s)."""

Scorer = Callable[[nn.Module, Tokenizer], dict[str, float]]
"""(model, its tokenizer) -> its validation scores on the report's rows."""


@dataclass
class ReportRow:
    """One model of the report."""

    name: str
    """teacher, distilled student, student alone, random twin alone, compare: NAME, random twin
    (untrained), constant: ...."""
    what: str
    """What the model is, in words."""
    scores: dict[str, float | None]
    """Validation scores on the report's rows (None: undefined, NaN)."""
    parameters: int
    """Weights of the network (0: no network)."""
    bytes: int
    """Size of its ``model.safetensors`` (0: no network)."""
    megabytes: float
    """``bytes`` / 10^6."""
    onnx_int8_megabytes: float | None = None
    """Size of its int8 ``model.onnx`` (None: not exported)."""
    texts_per_second: dict[str, float | None] = field(default_factory=dict)
    """``eager_b1``, ``eager_b32``, ``onnx_int8_b1``, ``onnx_int8_b32`` (None: not measured)."""
    directory: str | None = None
    speed_of: str | None = None
    """The row whose network this one is (same config, other weights), so whose speed it has:
    not timed again."""


# ---- the constant baselines (pure) ------------------------------------------------------------


def _defined(scores: dict[str, float]) -> dict[str, float | None]:
    """NaN (a correlation of a constant prediction) as None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in scores.items()}


def constant_classification(
    train_labels: np.ndarray,
    val_labels: np.ndarray,
    num_labels: int,
    teacher_predictions: np.ndarray | None = None,
) -> tuple[int, dict[str, float | None]]:
    """``(class, scores)`` of always predicting the most frequent training class (the lowest
    id of a tie): its accuracy is that class's share of the validation rows; ``agreement``
    (with ``teacher_predictions``) the share of rows the teacher gives that class."""
    majority = int(
        np.bincount(np.asarray(train_labels, dtype=np.int64), minlength=num_labels).argmax()
    )
    predicted = np.full(len(val_labels), majority)
    scores: dict[str, float | None] = dict(
        M.classification_metrics(val_labels, predicted, num_labels)
    )
    if teacher_predictions is not None:
        scores["agreement"] = float(np.mean(np.asarray(teacher_predictions) == majority))
    return majority, scores


def constant_regression(
    train_targets: np.ndarray, val_targets: np.ndarray
) -> tuple[float, dict[str, float | None]]:
    """``(mean, scores)`` of always predicting the training targets' mean (its correlations
    are undefined: None)."""
    mean = float(np.mean(train_targets))
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = M.regression_metrics(val_targets, np.full(len(val_targets), mean))
    return mean, _defined(scores)


def constant_tagging(
    train_tags: np.ndarray,
    val_tags: Sequence[np.ndarray],
    config: Any,
    teacher_predictions: Sequence[np.ndarray] | None = None,
) -> tuple[int, dict[str, float | None]]:
    """``(tag, scores)`` of tagging every word with the most frequent training tag (the
    lowest id of a tie; usually ``O``, whose entity F1 is 0); ``agreement``: the share of
    validation words the teacher tags so."""
    counts = np.bincount(np.asarray(train_tags, dtype=np.int64), minlength=config.num_labels)
    majority = int(counts.argmax())
    scores: dict[str, float | None] = dict(
        tag_metrics(config, val_tags, [np.full(len(t), majority) for t in val_tags])
    )
    if teacher_predictions is not None:
        words = np.concatenate([np.asarray(t) for t in teacher_predictions] or [np.zeros(0)])
        scores["agreement"] = float(np.mean(words == majority)) if len(words) else None
    return majority, scores


def constant_span(
    train_answers: Sequence[str], val_contexts: Sequence[str], val_answers: Sequence[Sequence[str]]
) -> tuple[int, dict[str, float | None]]:
    """``(words, scores)`` of answering every question with the first ``words`` words of its
    context, ``words`` the median length in words of the gold training answers (at least 1):
    where in a context answers tend to lie and how long they are, without reading the
    question. Scored as SQuAD scores (``exact_match``, ``f1``)."""
    lengths = [len(a.split()) for a in train_answers if a.strip()]
    words = max(1, int(np.median(lengths))) if lengths else 1
    predictions = {str(i): " ".join(c.split()[:words]) for i, c in enumerate(val_contexts)}
    gold = {str(i): list(a) for i, a in enumerate(val_answers)}
    return words, dict(squad_metrics(predictions, gold))


def constant_embedding(
    train_targets: np.ndarray, val_targets: np.ndarray, normalize: bool
) -> dict[str, float | None]:
    """The scores of one vector for every text, the mean of the training targets (unit length
    where the teacher's vectors are): mean cosine and MSE to each validation target."""
    vector = np.asarray(train_targets, dtype=np.float64).mean(0)
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    got = np.broadcast_to(vector, np.shape(val_targets)).astype(np.float32)
    return {
        "cosine": float(np.mean(cosine_rows(got, np.asarray(val_targets, dtype=np.float32)))),
        "mse": float(np.mean((got - np.asarray(val_targets, dtype=np.float32)) ** 2)),
    }


# ---- sizes --------------------------------------------------------------------------------------


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def weights_bytes(directory: str | Path) -> int:
    """Size of a model directory's ``model.safetensors``."""
    return (Path(directory) / WEIGHTS_NAME).stat().st_size


# ---- throughput -------------------------------------------------------------------------------


@dataclass
class Timed:
    """One model and one runtime to time: its forward on prepared batches."""

    row: str
    kind: str
    """eager or onnx_int8."""
    forward: Callable[[dict[str, Any]], Any]
    batches: dict[int, list[dict[str, Any]]]
    """batch size -> the padded batches of the report's texts."""


def prepared_batches(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    *,
    max_length: int,
    truncation: str,
    numpy: bool,
) -> dict[int, list[dict[str, Any]]]:
    """The texts tokenised and padded (to each batch's longest) at every batch size, sorted by
    length first, as the inference commands batch them (so a batch of 32 pads little: the
    ONNX graph, unlike the eager model, computes the padding too)."""
    encoded = encode_examples(tokenizer, texts, pairs, max_length=max_length, truncation=truncation)
    encoded = sorted(encoded, key=lambda example: len(example[0]))
    out: dict[int, list[dict[str, Any]]] = {}
    for size in BATCH_SIZES:
        batches = [
            collate(encoded[i : i + size], tokenizer.pad_id) for i in range(0, len(encoded), size)
        ]
        out[size] = [{k: v.numpy() for k, v in b.items()} if numpy else b for b in batches]
    return out


def eager_forward(model: nn.Module) -> Callable[[dict[str, Any]], Any]:
    """The model's inference forward (a sequence classifier: its [CLS]-only path, as
    ``classify`` runs it), without gradients."""
    classifier = hasattr(model, "classifier") and not hasattr(model, "qa_outputs")
    per_token = type(model).__name__ in (
        "BertForTokenClassification",
        "ModernBertForTokenClassification",
    )

    def forward(batch: dict[str, Any]) -> Any:
        with torch.inference_mode():
            if classifier and not per_token:
                return model(**batch, cls_only=True).logits
            return model(**batch)

    return forward


def interleaved_rates(
    timed: list[Timed], texts: int, rounds: int, clock: Callable[[], float] = time.perf_counter
) -> dict[tuple[str, str, int], float]:
    """Texts/s of each (row, kind, batch size): after one warm-up batch each, ``rounds`` rounds
    in which every model takes its turn at every batch size; the best round is kept."""
    for t in timed:
        for batches in t.batches.values():
            t.forward(batches[0])
    rates: dict[tuple[str, str, int], float] = {}
    for _ in range(rounds):
        for t in timed:
            for size, batches in t.batches.items():
                start = clock()
                for batch in batches:
                    t.forward(batch)
                rate = texts / max(clock() - start, 1e-9)
                key = (t.row, t.kind, size)
                rates[key] = max(rates.get(key, 0.0), rate)
    return rates


def onnx_runtime() -> str | None:
    """onnxruntime's version, or None where it (or onnx) is not installed."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        return None
    return str(onnxruntime.__version__)


def onnx_forward(onnx_dir: Path, threads: int) -> tuple[Callable[[dict[str, Any]], Any], float]:
    """The forward of an exported directory in ONNX Runtime, and its model.onnx's megabytes."""
    model = load_onnx(onnx_dir, threads=threads)
    names = model.output_names
    if "logits" in names:
        forward: Callable[[dict[str, Any]], Any] = model.sequence_logits
    elif "start_logits" in names:
        forward = model.span_logits
    else:
        forward = model.hidden_states
    return forward, (onnx_dir / ONNX_FILE).stat().st_size / 1e6


# ---- the report -------------------------------------------------------------------------------


@dataclass
class Measured:
    """A model of the report with a network: where it lives and how to run it."""

    row: ReportRow
    model: nn.Module
    tokenizer: Tokenizer
    directory: Path
    """Its model directory (exported to ONNX from here)."""

    @property
    def timed(self) -> bool:
        """Whether its throughput is measured (not a network another row already times)."""
        return self.row.speed_of is None


REPORT_TASKS = (
    "classification",
    "regression",
    "token_classification",
    "question_answering",
    "embedding",
)
"""The teachers' tasks ``--report`` covers so far."""


def check_report_task(cfg: Any, task: str) -> None:
    """Refuse a report of a task it does not cover, or a --report_compare model of another
    task, before anything trains."""
    if cfg.report and task not in REPORT_TASKS:
        raise BertforgeError(
            f"--report true is for {', '.join(REPORT_TASKS)} teachers so far, not {task}; "
            "leave --report out"
        )
    for directory in cfg.report_compare or []:
        theirs = teacher_task(check_model_directory(directory))
        if theirs != task:
            raise BertforgeError(
                f"--report_compare {directory}: a {theirs} model, the teacher is for {task}; "
                "give a model of the same task (e.g. the student fine-tuned alone with "
                "bertforge finetune)"
            )


def compare_row(directory: str, task: str, score: Scorer) -> Measured:
    """A ``--report_compare`` directory (of the teacher's task: :func:`check_report_task`),
    scored like the student."""
    path = check_model_directory(directory)
    model = load_student(task, path)
    tokenizer = Tokenizer.from_file(path)
    size = weights_bytes(path)
    row = ReportRow(
        f"compare: {path.name}",
        f"`{directory}`, given with --report_compare",
        _defined(score(model, tokenizer)),
        parameter_count(model),
        size,
        size / 1e6,
        directory=str(path),
    )
    return Measured(row, model, tokenizer, path)


def fresh_twin(
    student: nn.Module, student_dir: Path, tokenizer: Tokenizer, task: str, seed: int, out: Path
) -> nn.Module:
    """The student's random twin, saved to ``out``: its config with fresh weights (from
    ``seed``), stored in the student's floating-point type."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        twin = student_class(task, is_modern(student))(student.config).eval()
    save_pretrained(twin, out, tokenizer=tokenizer, dtype=stored_float_dtype(student_dir))
    return twin


def twin_row(student: Measured, task: str, seed: int, score: Scorer, work: Path) -> Measured:
    """The student's random twin: its config with fresh weights, untrained, scored as it is."""
    directory = work / "twin"
    twin = fresh_twin(student.model, student.directory, student.tokenizer, task, seed, directory)
    size = weights_bytes(directory)
    row = ReportRow(
        "random twin (untrained)",
        "the student's config with fresh weights (seed "
        f"{seed}), not trained: what the architecture gives before any learning",
        _defined(score(twin, student.tokenizer)),
        parameter_count(twin),
        size,
        size / 1e6,
        speed_of=student.row.name,
    )
    return Measured(row, twin, student.tokenizer, directory)


def trained_row(name: str, what: str, directory: Path, task: str, score: Scorer,
                speed_of: str) -> Measured:  # fmt: skip
    """A model a report trained (the student alone, the twin alone), scored like the student."""
    model = load_student(task, directory)
    tokenizer = Tokenizer.from_file(directory)
    size = weights_bytes(directory)
    scores = _defined(score(model, tokenizer))
    row = ReportRow(name, what, scores, parameter_count(model), size, size / 1e6,
                    directory=str(directory), speed_of=speed_of)  # fmt: skip
    return Measured(row, model, tokenizer, directory)


def build_report(
    *,
    task: str,
    metric: str,
    teacher: Measured,
    student: Measured,
    trained: Sequence[Measured],
    compare: Sequence[str],
    constant: ReportRow,
    score: Scorer,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    max_length: int,
    truncation: str,
    validation_rows: int,
    threads: int,
    rounds: int,
    seed: int,
    work: Path,
) -> dict[str, Any]:
    """Score, size and time every model; the report as a JSON-ready dict."""
    models = [teacher, student, *trained, *(compare_row(d, task, score) for d in compare)]
    models.append(twin_row(student, task, seed, score, work))
    timed: list[Timed] = []
    onnx_version = onnx_runtime()
    for m in models:
        if not m.timed:
            continue
        m.model.float().eval()
        common = dict(max_length=max_length, truncation=truncation)
        eager = prepared_batches(m.tokenizer, texts, pairs, numpy=False, **common)
        timed.append(Timed(m.row.name, "eager", eager_forward(m.model), eager))
        if onnx_version is None:
            continue
        onnx_dir = work / f"onnx-{len(timed)}"
        export_onnx(m.directory, onnx_dir, quantize="int8")
        forward, megabytes = onnx_forward(onnx_dir, threads)
        m.row.onnx_int8_megabytes = round(megabytes, 3)
        batches = prepared_batches(m.tokenizer, texts, pairs, numpy=True, **common)
        timed.append(Timed(m.row.name, "onnx_int8", forward, batches))
    rates = interleaved_rates(timed, len(texts), rounds)
    for m in models:
        m.row.texts_per_second = {
            f"{kind}_b{size}": (
                round(rates[(m.row.name, kind, size)], 2)
                if (m.row.name, kind, size) in rates
                else None
            )
            for kind in ("eager", "onnx_int8")
            for size in BATCH_SIZES
        }
    rows = [m.row for m in models] + [constant]
    return {
        "task": task,
        "metric": metric,
        "validation_rows": validation_rows,
        "rows": [asdict(r) for r in rows],
        "ratio": ratio(teacher.row, student.row),
        "throughput": {
            "texts": len(texts),
            "max_length": max_length,
            "batch_sizes": list(BATCH_SIZES),
            "rounds": rounds,
            "threads": threads,
            "cpu": cpu_model(),
            "eager": f"PyTorch {torch.__version__}, fp32",
            "onnx_int8": (
                f"onnxruntime {onnx_version}, bertforge's export with --quantize int8"
                if onnx_version
                else None
            ),
            "not timed": "a row with speed_of is the network of that row (its config, other "
            "weights): its speed is that row's",
        },
    }


def ratio(teacher: ReportRow, student: ReportRow) -> dict[str, Any]:
    """Student / teacher: each score, the size and each throughput."""

    def divide(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else round(a / b, 4)

    return {
        "name": "student / teacher",
        "scores": {k: divide(v, teacher.scores.get(k)) for k, v in student.scores.items()},
        "parameters": divide(student.parameters, teacher.parameters),
        "megabytes": divide(student.bytes, teacher.bytes),
        "onnx_int8_megabytes": divide(student.onnx_int8_megabytes, teacher.onnx_int8_megabytes),
        "texts_per_second": {
            k: divide(v, teacher.texts_per_second.get(k))
            for k, v in student.texts_per_second.items()
        },
    }


def write_report(out: Path, report: dict[str, Any]) -> None:
    """OUTPUT/report.json and report.md, each atomically."""
    atomic_write_text(out / REPORT_JSON, json.dumps(report, indent=2) + "\n")
    atomic_write_text(out / REPORT_MD, render_report(report))


def read_report(out: Path) -> dict[str, Any] | None:
    """The report of a run directory, or None without one (or an unreadable one)."""
    try:
        report = json.loads((Path(out) / REPORT_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "rows" in report else None


# ---- rendering --------------------------------------------------------------------------------


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:,.{digits}f}" if abs(value) < 1000 else f"{value:,.1f}"


def report_table(report: dict[str, Any]) -> str:
    """The report's rows (and the ratio row) as one Markdown table."""
    metric = report["metric"]
    names = list(dict.fromkeys(k for r in report["rows"] for k in r["scores"]))
    names.sort(key=lambda k: k != metric)
    names = [k for k in names if k != "examples"]
    speed = ["eager b1", "eager b32", "ONNX int8 b1", "ONNX int8 b32"]
    header = ["model", *names, "parameters", "MB on disk", "ONNX int8 MB", *speed]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in report["rows"]:
        same = r.get("speed_of")
        rates = [
            f"as {same.replace('distilled ', '')}"
            if same
            else _cell(r["texts_per_second"].get(k), 1)
            for k in THROUGHPUT_COLUMNS
        ]
        if r["parameters"] == 0:
            rates = ["—"] * len(rates)
        cells = [r["name"], *(_cell(r["scores"].get(k)) for k in names)]
        cells += [_cell(r["parameters"]), _cell(r["megabytes"], 2)]
        cells += [_cell(r.get("onnx_int8_megabytes"), 2), *rates]
        lines.append("| " + " | ".join(cells) + " |")
    q = report["ratio"]
    cells = [f"*{q['name']}*", *(_cell(q["scores"].get(k), 3) for k in names)]
    cells += [_cell(q["parameters"], 3), _cell(q["megabytes"], 3)]
    cells += [_cell(q["onnx_int8_megabytes"], 3)]
    cells += [_cell(q["texts_per_second"].get(k), 2) for k in THROUGHPUT_COLUMNS]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_notes(report: dict[str, Any]) -> list[str]:
    """What the table's columns are and how they were measured."""
    t = report["throughput"]
    onnx = t["onnx_int8"] or "not measured: install bertforge[onnx] (onnx, onnxruntime)"
    return [
        f"Scores on the same {report['validation_rows']:,} validation rows for every model "
        f"(the student is picked by {report['metric']}). MB on disk: the size of "
        "`model.safetensors` in 10^6 bytes; ONNX int8 MB: the size of `model.onnx` that "
        "`bertforge export --format onnx --quantize int8` writes.",
        f"Throughput in texts/s of the model alone (texts tokenised, sorted by length and "
        f"padded beforehand, each model with its own tokenizer): the first {t['texts']:,} "
        f"validation texts at most {t['max_length']} tokens, at batch 1 and batch 32; eager: {t['eager']}; ONNX "
        f"int8: {onnx}; {t['threads']} thread(s) on {t['cpu']}; best of {t['rounds']} "
        "interleaved rounds (every model takes its turn in every round, so that other work on "
        "the machine slows each alike and the ratios hold).",
        "The random twin is the student's network with fresh weights; a model trained alone "
        "learns from the gold labels only (no teacher), for the distillation's steps; a row "
        "timed \"as student\" is the student's network, so its speed is the student's. The "
        "constant baseline is no network. The ratio row divides the student's value by the "
        "teacher's.",
    ]


def render_report(report: dict[str, Any]) -> str:
    rows = "\n".join(f"- **{r['name']}**: {r['what']}" for r in report["rows"])
    parts = [
        f"# Distillation report ({report['task']})\n",
        report_table(report) + "\n",
        rows + "\n",
        *(note + "\n" for note in report_notes(report)),
    ]
    return "\n".join(parts)


__all__ = [
    "REPORT_JSON",
    "REPORT_TASKS",
    "check_report_task",
    "REPORT_MD",
    "Measured",
    "ReportRow",
    "build_report",
    "trained_row",
    "constant_classification",
    "constant_embedding",
    "constant_regression",
    "constant_span",
    "constant_tagging",
    "fresh_twin",
    "interleaved_rates",
    "read_report",
    "render_report",
    "report_table",
    "write_report",
]
