"""Labelled data for fine-tuning: read CSV/TSV/JSONL (optionally compressed) files, Parquet
tables or ``datasets`` folders (through
``bertforge.data.tables``) into :class:`LabelledData` with labels mapped to ids
(``bertforge.data.labels``), hold out a stratified validation split, and make the
:class:`TaskData` of a fine-tuning run, encoded for the model (``bertforge.data.encoding``).

Nothing here knows about models; ``finetune``, ``evaluate`` and ``predict`` all read data
through it, so a file that trains also evaluates and classifies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.encoding import encode_examples
from bertforge.data.labels import (
    build_label_map,
    label_name,
    labels_to_ids,
    missing_class_warnings,
    suspicious_labels,
    suspicious_labels_report,
    to_floats,
)
from bertforge.data.tables import clean_text, read_columns_lines
from bertforge.errors import BertforgeError


@dataclass
class LabelledData:
    """Texts (and optional second texts) with their labels, in file order."""

    texts: list[str]
    """First segment of every example."""
    pairs: list[str] | None
    """Second segment (``--text_pair_column``), or None for single-text tasks."""
    labels: np.ndarray | None
    """int64 class ids, float32 regression targets, or None for unlabelled data."""

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: np.ndarray) -> LabelledData:
        pick = [int(i) for i in index]
        return LabelledData(
            [self.texts[i] for i in pick],
            None if self.pairs is None else [self.pairs[i] for i in pick],
            None if self.labels is None else self.labels[index],
        )


def load_labelled(
    paths: str | Path | Sequence[str | Path],
    *,
    text_column: str,
    label_column: str | None,
    text_pair_column: str | None = None,
    task: str = "classification",
    label2id: dict[str, int] | None = None,
    allow_rare_labels: bool = False,
    encoding_errors: str = "strict",
) -> tuple[LabelledData, dict[int, str] | None]:
    """Read a labelled data set. Returns the data and, for classification, ``id2label``.

    With ``label2id`` (a trained model's map) labels are checked against it; without it the map
    is built from this data, and labels that look like typos (:func:`suspicious_labels`) are an
    error naming their rows unless ``allow_rare_labels``. ``label_column=None`` reads texts only
    (for inference).
    """
    if task not in ("classification", "regression"):
        raise BertforgeError(f"--task {task!r} is unknown; choose classification or regression")
    source = ", ".join(map(str, [paths] if isinstance(paths, str | Path) else paths))
    (texts, pairs, raw), where = read_columns_lines(
        paths,
        [text_column, text_pair_column, label_column],
        encoding_errors,
        text=[text_column, text_pair_column],
    )
    texts = [clean_text(t) for t in texts]
    pair_list = [clean_text(t) for t in pairs] if text_pair_column else None
    if label_column is None:
        return LabelledData(texts, pair_list, None), None
    for column, cells in ((label_column, raw), (text_column, texts), (text_pair_column, pairs)):
        empty = [i for i, v in enumerate(cells) if column and (v is None or str(v).strip() == "")]
        if empty:  # an empty text would be trained (or scored) as [CLS] [SEP]
            raise BertforgeError(
                f"{where[empty[0]]}: empty {column!r} ({len(empty)} such row"
                f"{'s' * (len(empty) > 1)} in {source}); fill in or drop those rows"
            )
    if task == "regression":
        labels = to_floats(raw, label_column, source, where)
        return LabelledData(texts, pair_list, labels), None
    if label2id is None and not allow_rare_labels:
        names = [label_name(v) for v in raw]
        if suspicious_labels(names):
            raise BertforgeError(suspicious_labels_report(source, label_column, names, where))
    id2label = {i: n for n, i in label2id.items()} if label2id else build_label_map(raw)
    label2id = {n: i for i, n in id2label.items()}
    return LabelledData(texts, pair_list, labels_to_ids(raw, label2id, source, where)), id2label


SPLIT_FIX = "give more data, a --validation file, or another fraction"


def random_split(
    n: int, fraction: float, seed: int, unit: str, fix: str = SPLIT_FIX
) -> tuple[np.ndarray, np.ndarray]:
    """(train_index, validation_index) of ``n`` rows, each sorted: a random ``fraction`` held
    out (``--validation_fraction`` where the rows have no labels to stratify by). An empty
    side is an error counting the rows as ``unit`` and ending with ``fix``."""
    if not 0.0 < fraction < 1.0:
        raise BertforgeError(f"--validation_fraction {fraction} must lie strictly between 0 and 1")
    order = np.random.default_rng(seed).permutation(n)
    cut = int(round(fraction * n))
    if cut == 0 or cut == n:
        raise BertforgeError(
            f"--validation_fraction {fraction} of {n} {unit} leaves an empty split; {fix}"
        )
    return np.sort(order[cut:]), np.sort(order[:cut])


def stratified_split(
    labels: np.ndarray, fraction: float, seed: int = 0, *, regression: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(train_index, validation_index), each sorted; every class (or, for regression, every
    decile of the target) gives the same share to validation."""
    if not 0.0 < fraction < 1.0:
        raise BertforgeError(f"--validation_fraction {fraction} must lie strictly between 0 and 1")
    labels = np.asarray(labels)
    if regression:
        edges = np.quantile(labels, np.linspace(0, 1, 11)[1:-1])
        strata = np.searchsorted(edges, labels, side="right")
    else:
        strata = labels
    rng = np.random.default_rng(seed)
    val: list[np.ndarray] = []
    for value in np.unique(strata):
        members = rng.permutation(np.flatnonzero(strata == value))
        val.append(members[: int(round(fraction * len(members)))])
    val_index = np.sort(np.concatenate(val))
    if val_index.size == 0 or val_index.size == labels.size:
        raise BertforgeError(
            f"--validation_fraction {fraction} of {labels.size} examples leaves an empty split; "
            + SPLIT_FIX
        )
    return np.setdiff1d(np.arange(labels.size), val_index), val_index


@dataclass
class TaskData:
    """Training and validation examples of a fine-tuning run, encoded for the model."""

    train: LabelledData
    """Training examples (the validation share removed when it was held out of them)."""
    val: LabelledData
    """Validation examples."""
    id2label: dict[int, str] | None
    """Class names by id (classification), None for regression."""
    scale: tuple[float, float] | None
    """``(mean, std)`` of the training targets when regression trains on z-scores."""
    targets: np.ndarray
    """The training labels as trained on: class ids, or targets (z-scored with ``scale``)."""
    encoded_train: list[tuple[np.ndarray, int]]
    """:func:`encode_examples` of the training texts."""
    encoded_val: list[tuple[np.ndarray, int]]
    """:func:`encode_examples` of the validation texts."""
    warnings: list[str]
    """What looks wrong with the data without stopping the run (e.g. classes missing)."""

    def batch_labels(self, rows: Sequence[int], length: int) -> torch.Tensor:
        """The training labels of examples ``rows`` as trained on (``length``, the batch's padded
        length, is for token labels: unused here)."""
        return torch.as_tensor(self.targets[np.asarray(rows)])


def load_task_data(
    tokenizer: Any,
    train_paths: Sequence[str | Path],
    validation_paths: Sequence[str | Path] | None,
    *,
    text_column: str,
    label_column: str,
    text_pair_column: str | None,
    task: str,
    validation_fraction: float,
    seed: int,
    normalize_targets: bool,
    max_length: int,
    truncation: str,
    allow_rare_labels: bool = False,
    encoding_errors: str = "strict",
) -> TaskData:
    """Read, split and encode a fine-tuning data set. Without ``validation_paths`` a stratified
    ``validation_fraction`` of the training rows is held out (a pure function of ``seed``)."""
    regression = task == "regression"
    columns = dict(
        text_column=text_column,
        label_column=label_column,
        text_pair_column=text_pair_column,
        task=task,
        encoding_errors=encoding_errors,
    )
    train, id2label = load_labelled(train_paths, **columns, allow_rare_labels=allow_rare_labels)
    if validation_paths:
        label2id = None if regression else {v: k for k, v in id2label.items()}
        val, _ = load_labelled(validation_paths, **columns, label2id=label2id)
    else:
        train_idx, val_idx = stratified_split(
            train.labels, validation_fraction, seed, regression=regression
        )
        train, val = train.subset(train_idx), train.subset(val_idx)
    if not regression and len(id2label) < 2:
        raise BertforgeError(
            f"{train_paths[0]}: column {label_column!r} has a single label "
            f"{id2label[0]!r}; classification needs at least two"
        )
    scale = None
    if regression and normalize_targets:
        scale = (float(train.labels.mean()), float(train.labels.std()) or 1.0)
    targets = train.labels if scale is None else (train.labels - scale[0]) / scale[1]
    encode = dict(max_length=max_length, truncation=truncation)
    warnings = [] if regression else missing_class_warnings(id2label, train.labels)
    return TaskData(
        train,
        val,
        id2label,
        scale,
        targets,
        encode_examples(tokenizer, train.texts, train.pairs, **encode),
        encode_examples(tokenizer, val.texts, val.pairs, **encode),
        warnings,
    )


def check_batch_fits(batch_size: int, examples: int, held_out: bool = False) -> None:
    """Refuse a batch larger than the training set (it would be full-batch training under
    another name), as pretraining refuses one larger than its data."""
    if batch_size > examples:
        split = " (after the validation share was held out)" if held_out else ""
        raise BertforgeError(
            f"--batch_size {batch_size} is larger than the {examples:,} training examples{split}; "
            f"lower it (e.g. --batch_size {min(32, examples)}) or give more data"
        )


__all__ = [
    "LabelledData",
    "load_labelled",
    "stratified_split",
    "TaskData",
    "load_task_data",
    "check_batch_fits",
]
