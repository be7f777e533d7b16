"""Labels of labelled data: canonical label names, the label map built from training data, labels
that look like typos (and the one-line report naming their rows), label cells to class ids or
regression targets, and the warnings of a training split that lacks classes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertforge.errors import BertforgeError

_INT = re.compile(r"[+-]?\d+")


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


def suspicious_labels_report(source: str, column: str, names: list[str], where: list[str]) -> str:
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
    need: str = "regression needs a numeric label column",
) -> np.ndarray:
    """Numeric regression targets (or pair scores) as float32; a non-number names the row (as
    :func:`labels_to_ids`) and column, then ``need``."""
    out = np.empty(len(values), dtype=np.float32)
    for i, value in enumerate(values):
        try:
            out[i] = float(value)
        except (TypeError, ValueError):
            raise BertforgeError(
                f"{_row(source, i, where)}: column {column!r} holds {quoted(value)}, not a number; "
                + need
            ) from None
        if not np.isfinite(out[i]):
            raise BertforgeError(
                f"{_row(source, i, where)}: column {column!r} is {quoted(value)}; use finite numbers"
            )
    return out


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


__all__ = [
    "suspicious_labels_report",
    "label_name",
    "build_label_map",
    "suspicious_labels",
    "quoted",
    "labels_to_ids",
    "to_floats",
    "missing_class_warnings",
]
