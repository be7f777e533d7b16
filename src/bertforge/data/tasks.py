"""Labelled data for fine-tuning: read CSV/TSV/JSONL (optionally gzip) files (through
``bertforge.data.tables``), map labels to ids, hold out a stratified validation split, tokenize
with head or head+tail truncation, and cut the examples into dynamically padded batches.

Nothing here knows about models; ``finetune``, ``evaluate`` and ``predict`` all read data
through it, so a file that trains also evaluates and classifies.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

# read_table and table_format are re-exported: callers read tables through ``tasks`` too
from bertforge.data.tables import (
    clean_text,
    read_columns,
    read_columns_lines,
    read_table,
    table_format,
)
from bertforge.errors import BertforgeError
from bertforge.tokenizer.wordpiece import valid_unicode

Truncation = Literal["head", "head_tail"]
"""How a text longer than ``max_length`` is cut: keep its head, or its head and tail."""
TRUNCATIONS: tuple[str, ...] = get_args(Truncation)
_INT = re.compile(r"[+-]?\d+")

# ---- labels ------------------------------------------------------------------------------------


def label_name(value: Any) -> str:
    """Canonical string of a label cell: ``1``, ``"1"``, ``1.0`` and ``" 1 "`` all become ``"1"``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return str(int(text)) if _INT.fullmatch(text) else text


def build_label_map(values: Sequence[Any]) -> dict[int, str]:
    """``id2label`` for the labels seen in training: integer labels in numeric order, other
    labels alphabetically (so the map does not depend on row order)."""
    names = {label_name(v) for v in values}
    names.discard("")
    if not names:
        raise BertforgeError("no labels found: the label column is empty")
    numeric = all(_INT.fullmatch(n) for n in names)
    return dict(enumerate(sorted(names, key=int) if numeric else sorted(names)))


def suspicious_labels(names: Sequence[str]) -> list[str]:
    """Labels that look like typos: not an integer where every other label is one, or rare (a
    single row beside a class of five or more, or fewer than 20 rows and under 1 % of the
    data)."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    numeric = [n for n in counts if _INT.fullmatch(n)]
    odd = [n for n in counts if not _INT.fullmatch(n)] if len(numeric) >= 2 else []
    largest = max(counts.values(), default=0)
    rare = [
        n
        for n, c in counts.items()
        if (c == 1 and largest >= 5) or (c < 20 and c < 0.01 * len(names))
    ]
    return [n for n in counts if n in odd or n in rare]


def quoted(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the full length said, so an error
    that quotes a cell (a whole review in the wrong column) stays one readable line."""
    text = repr(value)
    if len(text) <= limit:
        return text
    close = text[0] if text[0] in "'\"" else ""
    return f"{text[: limit - 3]}...{close} ({len(str(value)):,} characters)"


def _label_report(source: str, column: str, names: list[str], where: list[str]) -> str:
    """One line naming the suspicious labels with their counts and first rows."""
    odd = suspicious_labels(names)
    single_file = len({w.rsplit(":", 1)[0] for w in where}) == 1
    parts = []
    for label in odd[:5]:
        rows = [w for n, w in zip(names, where, strict=True) if n == label]
        shown = [f"line {w.rsplit(':', 1)[1]}" if single_file else w for w in rows[:3]]
        more = ", ..." if len(rows) > 3 else ""
        parts.append(
            f"{quoted(label)} ({len(rows)} row{'s' * (len(rows) != 1)}: {', '.join(shown)}{more})"
        )
    if len(odd) > 5:
        parts.append(f"and {len(odd) - 5:,} more")
    others = sorted({n for n in names} - set(odd))
    counts = ", ".join(f"{quoted(n)} x{names.count(n)}" for n in others[:8]) or "no other labels"
    return (
        f"{source}: column {column!r} holds unexpected or rare labels {'; '.join(parts)} beside "
        f"{counts}; fix those rows, or pass --allow_rare_labels (allow_rare_labels=True in Python) to train "
        "them as classes of their own"
    )


def _row(source: str, i: int, where: Sequence[str] | None) -> str:
    """Where row ``i`` is: ``file:line`` when known (the line an editor shows), else the row."""
    return where[i] if where is not None else f"{source}: row {i + 1}"


def labels_to_ids(
    values: Sequence[Any],
    label2id: dict[str, int],
    source: str = "data",
    where: Sequence[str] | None = None,
) -> np.ndarray:
    """Label cells -> int64 ids; an unknown label names the row (``where[i]``, its file and
    line, when given) and the known labels."""
    ids = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        name = label_name(value)
        if name not in label2id:
            known = ", ".join(map(repr, label2id))
            raise BertforgeError(
                f"{_row(source, i, where)} has label {quoted(name)}, which the model does not know "
                f"(its labels: {known}); fix the row or train with this label"
            )
        ids[i] = label2id[name]
    return ids


def to_floats(
    values: Sequence[Any],
    column: str,
    source: str = "data",
    where: Sequence[str] | None = None,
) -> np.ndarray:
    """Numeric regression targets as float32; a non-number names the row (as
    :func:`labels_to_ids`) and column."""
    out = np.empty(len(values), dtype=np.float32)
    for i, value in enumerate(values):
        try:
            out[i] = float(value)
        except (TypeError, ValueError):
            raise BertforgeError(
                f"{_row(source, i, where)}: column {column!r} holds {quoted(value)}, not a number; "
                "regression needs a numeric label column"
            ) from None
        if not np.isfinite(out[i]):
            raise BertforgeError(
                f"{_row(source, i, where)}: column {column!r} is {quoted(value)}; use finite numbers"
            )
    return out


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
        paths, [text_column, text_pair_column, label_column], encoding_errors
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
            raise BertforgeError(_label_report(source, label_column, names, where))
    id2label = {i: n for n, i in label2id.items()} if label2id else build_label_map(raw)
    label2id = {n: i for i, n in id2label.items()}
    return LabelledData(texts, pair_list, labels_to_ids(raw, label2id, source, where)), id2label


# ---- validation split --------------------------------------------------------------------------


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
            "give more data, a --validation file, or another fraction"
        )
    return np.setdiff1d(np.arange(labels.size), val_index), val_index


# ---- a fine-tuning data set, ready for the loop -----------------------------------------------


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


def missing_class_warnings(id2label: dict[int, str], train_labels: np.ndarray) -> list[str]:
    """Warnings when the training split seems to lack classes: integer labels that do not run
    from 0 or 1 without gaps (the first 400 AG News rows hold only classes 3 and 4 of 1-4), or
    a class of the label map with no training row."""
    out = []
    names = [id2label[i] for i in sorted(id2label)]
    present = np.unique(np.asarray(train_labels, dtype=np.int64))
    if len(present) < len(names):
        absent = ", ".join(repr(names[i]) for i in range(len(names)) if i not in present)
        out.append(
            f"warning: the training split holds no example of {absent}; the model cannot "
            "learn it (give more or shuffled data)"
        )
    if all(_INT.fullmatch(n) for n in names):
        values = sorted(int(n) for n in names)
        first = 0 if values[0] <= 0 else 1
        gaps = [str(v) for v in range(first, values[-1]) if v not in values]
        if gaps:
            out.append(
                f"warning: the training data holds {len(values)} classes "
                f"({', '.join(map(str, values))}) where integer labels usually run from {first}: "
                f"class{'es' * (len(gaps) > 1)} {', '.join(gaps)} may be missing (a file sorted by label, or cut short?); "
                "the model can only predict the classes it saw"
            )
    return out


# ---- tokenization and batches ------------------------------------------------------------------


def _keep(ids: list[int], budget: int, truncation: str) -> list[int]:
    if len(ids) <= budget:
        return ids
    if truncation == "head":
        return ids[:budget]
    head = budget // 4  # Sun et al. (2019): the first 128 and last 382 of 510 tokens work best
    return ids[:head] + ids[len(ids) - (budget - head) :]


def _piece_ids(backend: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text without special tokens (unpaired surrogates read as U+FFFD)."""
    try:
        encodings = backend.encode_batch(list(texts), add_special_tokens=False)
    except TypeError:
        encodings = backend.encode_batch(valid_unicode(texts), add_special_tokens=False)
    return [e.ids for e in encodings]


def check_max_length(max_length: int, minimum: int, why: str) -> None:
    """The one rule for ``--max_length`` in every command: an explicit value below ``minimum``
    (0 included) is an error; leaving the option out picks the model's or the run's own."""
    if max_length < minimum:
        raise BertforgeError(
            f"--max_length {max_length}: must be at least {minimum} ({why}); leave it out for "
            "the default"
        )


def encode_examples(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
    truncation: str = "head",
) -> list[tuple[np.ndarray, int]]:
    """Token ids ``[CLS] a [SEP] (b [SEP])`` per example, as ``(ids, length_of_segment_a)``.

    ``truncation="head"`` keeps the first tokens; ``"head_tail"`` keeps the first quarter and the
    last three quarters of the budget (endings of reviews carry their verdict). For pairs the
    longer text is shortened first.
    """
    if truncation not in TRUNCATIONS:
        raise BertforgeError(
            f"--truncation {truncation!r} is unknown; choose {' or '.join(TRUNCATIONS)}"
        )
    specials = 3 if pairs is not None else 2
    check_max_length(
        max_length,
        specials + 1,
        "[CLS], [SEP] and one token" if pairs is None else "[CLS], two [SEP] and one token",
    )
    budget = max_length - specials
    a_ids = _piece_ids(tokenizer.backend, texts)
    b_ids = None if pairs is None else _piece_ids(tokenizer.backend, pairs)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    out: list[tuple[np.ndarray, int]] = []
    for i, a in enumerate(a_ids):
        if b_ids is None:
            ids = [cls, *_keep(a, budget, truncation), sep]
            out.append((np.asarray(ids, dtype=np.int32), len(ids)))
            continue
        b = b_ids[i]
        la, lb = len(a), len(b)
        if la + lb > budget:  # longest first: trim the longer side until both fit
            half = budget // 2
            if la > half and lb > half:
                la, lb = budget - half, half
            elif la > lb:
                la = budget - lb
            else:
                lb = budget - la
        first = [cls, *_keep(a, la, truncation), sep]
        ids = first + _keep(b, lb, truncation) + [sep]
        out.append((np.asarray(ids, dtype=np.int32), len(first)))
    return out


def collate(examples: Sequence[tuple[np.ndarray, int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest example of the batch: ``input_ids``, ``attention_mask``,
    ``token_type_ids``, each (B, T) int64."""
    T = max(len(ids) for ids, _ in examples)
    B = len(examples)
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    attention = np.zeros((B, T), dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    for row, (ids, len_a) in enumerate(examples):
        input_ids[row, : len(ids)] = ids
        attention[row, : len(ids)] = 1
        types[row, len_a : len(ids)] = 1
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention),
        "token_type_ids": torch.from_numpy(types),
    }


def batch_order(
    lengths: Sequence[int],
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    bucket: bool = True,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Example indices grouped into batches for one epoch, a pure function of (seed, epoch).

    With ``bucket`` the shuffled examples are sorted by length inside windows of 50 batches, so
    a batch pads little, and the batches are shuffled again (the order stays random). Without
    ``shuffle`` (evaluation) examples are taken in order, or sorted by length with ``bucket``.
    A resumed run recomputes the order and skips the batches already done.
    """
    n = len(lengths)
    lengths = np.asarray(lengths)
    if not shuffle:
        order = np.argsort(-lengths, kind="stable") if bucket else np.arange(n)
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    if bucket:
        window = batch_size * 50
        order = np.concatenate(
            [
                chunk[np.argsort(-lengths[chunk], kind="stable")]
                for chunk in np.array_split(order, max(1, -(-n // window)))
            ]
        )
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if bucket:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def iterate_batches(
    encoded: Sequence[tuple[np.ndarray, int]],
    order: Sequence[np.ndarray],
    pad_id: int,
) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """``(indices, padded batch)`` for each batch of ``order``."""
    for index in order:
        yield index, collate([encoded[int(i)] for i in index], pad_id)


__all__ = [
    "LabelledData",
    "TRUNCATIONS",
    "Truncation",
    "TaskData",
    "batch_order",
    "build_label_map",
    "check_max_length",
    "clean_text",
    "collate",
    "encode_examples",
    "iterate_batches",
    "label_name",
    "labels_to_ids",
    "check_batch_fits",
    "load_labelled",
    "load_task_data",
    "missing_class_warnings",
    "read_columns",
    "read_table",
    "stratified_split",
    "suspicious_labels",
    "table_format",
    "to_floats",
]
