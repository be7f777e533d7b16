"""The benchmark suites of ``bertforge benchmark``: which tasks, where their files are, how each
is scored and fine-tuned by default, the published numbers beside ours; and the pure functions
that turn predictions into a suite's scores, its average and its markdown table.

A suite is a tuple of :class:`TaskSpec` (declarations, no code): ``GLUE`` fine-tunes sequence
classifiers and regressors, ``NER`` the ``token_classification`` task and ``QA`` the
``question_answering`` task of ``bertforge finetune``.

Scores are fractions (0.8 = 80 %) everywhere in JSON; tables print GLUE points (x 100). A task's
*score* is the mean of its metrics (MRPC: F1 and accuracy; STS-B: Pearson and Spearman), the
suite's *average* the mean of its task scores: the GLUE leaderboard's convention, which Google's
table follows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from bertforge.evaluation import metrics as M

Suite = Literal["glue", "ner", "qa", "embedding"]

METRIC_NAMES = {
    "mcc": "MCC",
    "accuracy": "acc",
    "f1": "F1",
    "pearson": "Pearson",
    "spearman": "Spearman",
    "exact_match": "EM",
    "entity_f1": "entity F1",
}
"""How the tables name each metric."""


@dataclass(frozen=True)
class TaskDefaults:
    """The fine-tuning settings of one task unless the command overrides them."""

    epochs: float = 3.0
    """Passes over the training file (BERT's 3)."""
    lr: float = 5e-5
    """Peak learning rate (BERT's grid: 5e-5, 3e-5, 2e-5; the largest suits small models)."""
    batch_size: int = 32
    """Examples per optimizer step (BERT's 32)."""
    max_length: int = 128
    """Tokens per example (BERT's GLUE runs: 128); batches are padded to their longest only."""
    seeds: int = 3
    """Fine-tuning runs (seeds 0, 1, ...); the reported value is the median over them."""


@dataclass(frozen=True)
class TaskSpec:
    """One task of a suite: its files under the suite's data folder, the ``bertforge finetune``
    task and columns that train it, the metrics that score it, and published numbers."""

    name: str
    """The task's name as tables and ``--tasks`` spell it (``CoLA``)."""
    folder: str
    """Folder under the suite's data directory."""
    train: str
    """Training file in ``folder`` (a ``.gz`` twin of the name is accepted too)."""
    evaluate: str
    """The file the fine-tuned model is scored on (never used for training or selection)."""
    split: Literal["dev", "test"]
    """What ``evaluate`` is: the public dev set (GLUE) or a test set (NER, QA)."""
    kind: str
    """The ``bertforge finetune --task`` that trains it."""
    metrics: tuple[str, ...]
    """Metric keys, in the order tables print them (the task score is their mean)."""
    columns: Mapping[str, str | None] = field(default_factory=dict)
    """Fine-tuning options naming the file's columns (``text_column``, ...)."""
    positive: str | None = None
    """The label whose F1 is ``f1`` in a classification task (MRPC: ``1``, paraphrase)."""
    defaults: TaskDefaults = TaskDefaults()
    """Fine-tuning settings: see :class:`TaskDefaults`."""
    published: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """``{model: {metric: points}}`` as published (GLUE points, 0-100)."""


SINGLE = {"text_column": "sentence", "label_column": "label", "text_pair_column": None}
PAIR = {"text_column": "sentence1", "text_pair_column": "sentence2", "label_column": "label"}
# Large, stable SST-2 needs one run; the small tasks swing by points between seeds
SST2 = TaskDefaults(seeds=1)
SMALL = TaskDefaults(seeds=3)

GOOGLE_SOURCE = (
    "Google's BERT miniatures, GLUE test set (google-research/bert README, Turc et al. 2019, "
    "arXiv:1908.08962)"
)
"""Where the published numbers come from (../shared/data/glue/README.md quotes the table)."""


def _google(tiny: dict, mini: dict, small: dict, medium: dict) -> dict[str, dict[str, float]]:
    return {"BERT-Tiny": tiny, "BERT-Mini": mini, "BERT-Small": small, "BERT-Medium": medium}


GLUE: tuple[TaskSpec, ...] = (
    TaskSpec(
        "CoLA", "CoLA", "train.tsv", "dev.tsv", "dev", "classification", ("mcc",), SINGLE,
        positive="1", defaults=SMALL,
        published=_google({"mcc": 0.0}, {"mcc": 0.0}, {"mcc": 27.8}, {"mcc": 38.0}),
    ),
    TaskSpec(
        "SST-2", "SST-2", "train.tsv.gz", "dev.tsv", "dev", "classification", ("accuracy",),
        SINGLE, positive="1", defaults=SST2,
        published=_google(
            {"accuracy": 83.2}, {"accuracy": 85.9}, {"accuracy": 89.7}, {"accuracy": 89.6}
        ),
    ),
    TaskSpec(
        "MRPC", "MRPC", "train.tsv", "dev.tsv", "dev", "classification", ("f1", "accuracy"),
        PAIR, positive="1", defaults=SMALL,
        published=_google(
            {"f1": 81.1, "accuracy": 71.1},
            {"f1": 81.1, "accuracy": 71.8},
            {"f1": 83.4, "accuracy": 76.2},
            {"f1": 86.6, "accuracy": 81.6},
        ),
    ),
    TaskSpec(
        "STS-B", "STS-B", "train.tsv", "dev.tsv", "dev", "regression", ("pearson", "spearman"),
        PAIR, defaults=SMALL,
        published=_google(
            {"pearson": 74.3, "spearman": 73.6},
            {"pearson": 75.4, "spearman": 73.3},
            {"pearson": 78.8, "spearman": 77.0},
            {"pearson": 80.4, "spearman": 78.4},
        ),
    ),
    TaskSpec(
        "RTE", "RTE", "train.tsv", "dev.tsv", "dev", "classification", ("accuracy",), PAIR,
        positive="entailment", defaults=SMALL,
        published=_google(
            {"accuracy": 57.2}, {"accuracy": 57.9}, {"accuracy": 61.8}, {"accuracy": 62.2}
        ),
    ),
)  # fmt: skip
"""GLUE's five small-to-medium tasks in ../shared/data/glue (QNLI, MNLI, QQP are not there)."""

# Declared for the token-classification and QA tasks (scored from the fine-tuning run's final
# evaluation on the test file: entity-level micro F1 as seqeval; SQuAD v1.1 EM/F1).
NER: tuple[TaskSpec, ...] = (
    TaskSpec(
        "WikiANN-en", "wikiann_en", "train.conll.gz", "test.conll", "test",
        "token_classification", ("entity_f1",), defaults=TaskDefaults(seeds=1),
    ),
    TaskSpec(
        "WNUT-17", "wnut17", "train.conll", "test.conll", "test", "token_classification",
        ("entity_f1",), defaults=TaskDefaults(seeds=3),
    ),
)  # fmt: skip
QA: tuple[TaskSpec, ...] = (
    TaskSpec(
        "XQuAD-en", ".", "squad_dev_train.json.gz", "xquad_en_test.json.gz", "test",
        "question_answering", ("exact_match", "f1"),
        defaults=TaskDefaults(epochs=2, lr=1e-4, max_length=384, seeds=1),
    ),
)  # fmt: skip
SUITES: dict[str, tuple[TaskSpec, ...]] = {"glue": GLUE, "ner": NER, "qa": QA}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def select_tasks(suite: str, names: Sequence[str] | None) -> tuple[TaskSpec, ...]:
    """The suite's tasks named in ``names`` (any case, ``sst2`` = ``SST-2``; commas split), in
    the suite's order; all of them for None. An unknown name is a ``ValueError`` listing the
    suite's tasks."""
    specs = SUITES[suite]
    if not names:
        return specs
    wanted = [n.strip() for name in names for n in name.split(",") if n.strip()]
    known = {_key(s.name): s for s in specs}
    unknown = [n for n in wanted if _key(n) not in known]
    if unknown:
        raise ValueError(
            f"--tasks {', '.join(unknown)}: not a task of --suite {suite}; choose from "
            + ", ".join(s.name for s in specs)
        )
    chosen = {_key(n) for n in wanted}
    return tuple(s for s in specs if _key(s.name) in chosen)


# ---- scores ---------------------------------------------------------------------------------


def sequence_scores(
    y_true: Sequence[Any], y_pred: Sequence[Any], *, regression: bool, positive: str | None = None
) -> dict[str, float]:
    """The GLUE metrics of predictions: regression -> ``pearson``, ``spearman``; classification
    (labels compared by name) -> ``accuracy``, ``mcc`` and, with ``positive``, ``f1`` of that
    label (MRPC's F1, 0 when it is never predicted or never true)."""
    if regression:
        t, p = np.asarray(y_true, np.float64), np.asarray(y_pred, np.float64)
        return {"pearson": M.pearson(t, p), "spearman": M.spearman(t, p)}
    names = sorted({str(v) for v in y_true} | {str(v) for v in y_pred} | {positive} - {None})
    ids = {n: i for i, n in enumerate(names)}
    t = np.array([ids[str(v)] for v in y_true])
    p = np.array([ids[str(v)] for v in y_pred])
    scores = {"accuracy": M.accuracy(t, p), "mcc": M.mcc(t, p, len(names))}
    if positive is not None:
        f1 = M.precision_recall_f1(M.confusion_matrix(t, p, len(names)))[2]
        scores["f1"] = float(f1[ids[positive]])
    return scores


def constant_baseline(
    train_labels: Sequence[Any], eval_labels: Sequence[Any], spec: TaskSpec
) -> dict[str, Any]:
    """What predicting one value for every example scores: the training split's most frequent
    label (ties: the first in sorted order) or mean target (whose correlations are 0)."""
    regression = spec.kind == "regression"
    if regression:
        value: Any = float(np.mean(np.asarray(train_labels, np.float64)))
        definition = "the mean target of the training split"
    else:
        counts: dict[str, int] = {}
        for label in train_labels:
            counts[str(label)] = counts.get(str(label), 0) + 1
        value = max(sorted(counts), key=lambda name: counts[name])
        definition = "the most frequent label of the training split"
    scores = sequence_scores(
        eval_labels, [value] * len(eval_labels), regression=regression, positive=spec.positive
    )
    return {"predicts": value, "definition": definition, "scores": pick(scores, spec)}


def pick(scores: Mapping[str, float], spec: TaskSpec) -> dict[str, float]:
    """The task's metrics from ``scores``, in its order; a missing one is a ``KeyError``
    naming what was there."""
    missing = [m for m in spec.metrics if m not in scores]
    if missing:
        raise KeyError(
            f"{spec.name}: no {', '.join(missing)} among the scores ({', '.join(scores)})"
        )
    return {m: float(scores[m]) for m in spec.metrics}


def median_scores(runs: Sequence[Mapping[str, float]], metrics: Sequence[str]) -> dict[str, float]:
    """Each metric's median over runs (the mean of the middle two for an even count), taken
    metric by metric as RoBERTa and ELECTRA report GLUE dev results."""
    if not runs:
        raise ValueError("median_scores needs at least one run")
    return {m: float(statistics.median(float(r[m]) for r in runs)) for m in metrics}


def task_score(scores: Mapping[str, float], spec: TaskSpec) -> float:
    """The task's one number: the mean of its metrics (GLUE: MRPC (F1 + acc) / 2, STS-B
    (Pearson + Spearman) / 2)."""
    return float(np.mean([scores[m] for m in spec.metrics]))


def suite_average(task_scores: Mapping[str, float | None]) -> float | None:
    """The mean of the task scores; None when any is missing (an average over fewer tasks
    would not compare)."""
    values = list(task_scores.values())
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return float(np.mean(values))


def published_scores(spec: TaskSpec) -> dict[str, dict[str, float]]:
    """The published numbers as fractions: ``{model: {metric: value}}``."""
    return {
        model: {m: round(values[m] / 100, 4) for m in spec.metrics}
        for model, values in spec.published.items()
    }


__all__ = [
    "GLUE",
    "GOOGLE_SOURCE",
    "METRIC_NAMES",
    "NER",
    "QA",
    "SUITES",
    "Suite",
    "TaskDefaults",
    "TaskSpec",
    "constant_baseline",
    "median_scores",
    "pick",
    "published_scores",
    "select_tasks",
    "sequence_scores",
    "suite_average",
    "task_score",
]
