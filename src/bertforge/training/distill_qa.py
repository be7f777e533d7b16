"""Question answering in ``bertforge distill``: the student learns the teacher's start and end
distributions over each window's tokens (:class:`~bertforge.training.distill_losses.SpanLoss`)
beside the gold spans (docs/distillation.md).

With the teacher's vocabulary (``--student_layers``, ``--student_preset``, or a student with
the teacher's tokenizer) both models read the same windows and the distributions meet position
by position. With another vocabulary they meet on characters (:func:`teacher_windows`,
:func:`carry_logits`): the student's windows are cut with its own tokenizer; for each one the
teacher reads the question and the context tokens that start within the same characters,
tokenised its way. The teacher's start probability of each of its context tokens goes to the
student token that starts at the same character, its end probability to the student token that
ends where it ends, its [CLS] (no answer here) to the [CLS]. Mass with no such student token
(a boundary inside one of the student's pieces, or past the window's end), and the question's
and separators' positions, where no answer lies, are left out and the rest renormalised: both
tokenizers split at spaces and punctuation, so every word's start and end carries over.
The student then learns the log of that
carried distribution as its soft target (the temperature softens it as it would the
teacher's logits). The teacher's logits are cached as a (windows, max_length, 2) float16
memory-mapped ``.npy`` (4 bytes a position).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.qa import (
    QAExample,
    QAWindows,
    check_windows,
    decode_spans,
    encode_windows,
    read_qa,
)
from bertforge.errors import BertforgeError
from bertforge.evaluation.qa import evaluate_qa_model, squad_metrics
from bertforge.inference.qa import window_logits
from bertforge.io import atomic_write_text
from bertforge.modeling.checkpoint import finetune_defaults
from bertforge.runtime import explain_precision
from bertforge.training.distill_config import DistillConfig
from bertforge.training.qa import split_by_context
from bertforge.training.teacher import CACHE_CHUNK, Teacher, _cache_key


def qa_settings(teacher: Teacher) -> tuple[int, int]:
    """``(doc_stride, max_answer_length)`` the teacher was fine-tuned with (else finetune's
    defaults)."""
    saved = finetune_defaults(teacher.directory)
    stride = min(int(saved.get("doc_stride") or 128), teacher.max_length // 2)
    return stride, int(saved.get("max_answer_length") or 30)


def same_vocabulary(teacher: Teacher, tokenizer: Any) -> bool:
    """Whether the student tokenises as the teacher does (then both read the same windows)."""
    return bool(tokenizer.fingerprint == teacher.tokenizer.fingerprint)


FLOOR = -1e4
"""The carried log-probability of a student position that gets none of the teacher's mass: far
below any real logit, so its probability is 0 at every temperature, and finite in float16."""


def carry_logits(logits: np.ndarray, to: np.ndarray, length: int) -> np.ndarray:
    """(length,) float32: the log of the probability mass that a teacher window's ``logits``
    (n,) put on each of a student window's ``length`` positions, teacher position ``p`` giving
    its probability to student position ``to[p]`` (-1: left out; the rest renormalised);
    :data:`FLOOR` where none arrives."""
    keep = to >= 0
    z = np.asarray(logits, np.float64)[keep]
    p = np.exp(z - z.max()) if len(z) else z
    mass = np.zeros(length, np.float64)
    np.add.at(mass, to[keep], p / p.sum() if len(p) else p)
    out = np.full(length, FLOOR, np.float32)
    some = mass > 0
    out[some] = np.log(mass[some])
    return out


def at_boundary(mine: np.ndarray, theirs: np.ndarray, first: int) -> np.ndarray:
    """For each of the teacher's token boundaries ``theirs`` (first characters, or ends), the
    position ``first + k`` of the student token ``k`` whose boundary ``mine`` (sorted) is the
    same character, -1 where no student token starts (ends) there."""
    k = np.searchsorted(mine, theirs, side="left")
    hit = k < len(mine)
    hit[hit] = mine[k[hit]] == theirs[hit]
    return np.where(hit, first + k, -1)


@dataclass
class Carried:
    """Across vocabularies: a teacher window over the characters of each student window, and
    where each of its positions' start and end probabilities go in that student window."""

    windows: QAWindows
    """The teacher's windows, one per student window, in the same order."""
    starts: list[np.ndarray]
    """Per window, (teacher positions,) the student position its start mass goes to (-1: none)."""
    ends: list[np.ndarray]
    """The same for the end mass."""
    cut: int
    """Windows whose characters hold more teacher tokens than its max_length: the teacher reads
    the first of them, and the student tokens after those get no mass."""


def teacher_windows(
    tokenizer: Any, examples: Sequence[QAExample], student: QAWindows, max_length: int
) -> Carried:
    """The teacher's window of each student window (``tokenizer``, the teacher's): ``[CLS]
    question [SEP]`` and the context tokens that start within the student window's characters
    (as many as fit in ``max_length``), with the maps of its positions to the student's (see the
    module docstring)."""
    backend = tokenizer.backend
    questions = backend.encode_batch([e.question for e in examples], add_special_tokens=False)
    unique = list(dict.fromkeys(e.context for e in examples))
    encoded = dict(zip(unique, backend.encode_batch(unique, add_special_tokens=False), strict=True))
    context_ids = {c: e.ids for c, e in encoded.items()}
    context_offsets = {
        c: np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for c, e in encoded.items()
    }
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    rows, first, length, starts, ends = [], [], [], [], []
    cut = 0
    for w in range(len(student)):
        i = int(student.example[w])
        context, q = examples[i].context, questions[i].ids
        room = check_windows(max_length, 0, len(q), f"question {examples[i].id}: ")
        mine, theirs = student.offsets[i], context_offsets[context]  # (M, 2), (N, 2)
        f, n = int(student.first[w]), int(student.length[w])
        lo, hi = 0, 0
        if n:
            c0, c1 = mine[f, 0], mine[f + n - 1, 1]
            lo = int(np.searchsorted(theirs[:, 0], c0, side="left"))
            hi = int(np.searchsorted(theirs[:, 0], c1, side="left"))
        if hi - lo > room:
            cut += 1
            hi = lo + room
        head = [cls, *q, sep]
        ids = np.asarray([*head, *context_ids[context][lo:hi], sep], dtype=np.int32)
        rows.append((ids, len(head)))
        first.append(lo)
        length.append(hi - lo)
        start_to = np.full(len(ids), -1, np.int64)
        end_to = np.full(len(ids), -1, np.int64)
        start_to[0] = end_to[0] = 0  # no answer here: [CLS] to [CLS]
        if hi > lo:
            own = student.encoded[w][1] - f  # student position of context token k: own + k
            span = slice(len(head), len(head) + hi - lo)
            start_to[span] = at_boundary(mine[f : f + n, 0], theirs[lo:hi, 0], own + f)
            end_to[span] = at_boundary(mine[f : f + n, 1], theirs[lo:hi, 1], own + f)
        starts.append(start_to)
        ends.append(end_to)
    windows = QAWindows(
        rows,
        student.example.copy(),
        np.asarray(first, dtype=np.int64),
        np.asarray(length, dtype=np.int64),
        [context_offsets[e.context] for e in examples],
    )
    return Carried(windows, starts, ends, cut)


def join_windows(a: QAWindows, b: QAWindows, examples_in_a: int) -> QAWindows:
    """``a``'s windows then ``b``'s (whose examples follow ``a``'s ``examples_in_a``)."""
    return QAWindows(
        a.encoded + b.encoded,
        np.concatenate([a.example, b.example + examples_in_a]),
        np.concatenate([a.first, b.first]),
        np.concatenate([a.length, b.length]),
        a.offsets + b.offsets,
    )


@dataclass
class QADistillData:
    """Training and validation questions windowed for the student, with the teacher's start/end
    logits of every window (of the same windows, or across vocabularies of the teacher's windows
    over the same characters: ``carried``, ``val_carried``)."""

    train: list[QAExample]
    val: list[QAExample]
    windows: QAWindows
    val_windows: QAWindows
    outputs: np.ndarray
    """(train windows + validation windows, max_length, 2) float16 start/end logits."""
    max_answer_length: int
    carried: Carried | None = None
    val_carried: Carried | None = None
    scale: None = None

    @property
    def encoded(self) -> list[tuple[np.ndarray, int]]:
        return self.windows.encoded

    @property
    def texts(self) -> list[QAExample]:
        return self.train

    @property
    def labelled(self) -> np.ndarray:
        return np.ones(len(self.windows), dtype=bool)

    def teacher(self, rows: Sequence[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, length) start and end logits of training windows ``rows`` (across vocabularies
        the log of the teacher's distributions carried to the student's positions)."""
        out = np.zeros((len(rows), length, 2), dtype=np.float32)
        for r, i in enumerate(int(i) for i in rows):
            n = len(self.windows.encoded[i][0])
            if self.carried is None:
                out[r, :n] = self.outputs[i, :n]
                continue
            m = len(self.carried.windows.encoded[i][0])
            out[r, :n, 0] = carry_logits(self.outputs[i, :m, 0], self.carried.starts[i], n)
            out[r, :n, 1] = carry_logits(self.outputs[i, :m, 1], self.carried.ends[i], n)
        t = torch.from_numpy(out)
        return t[..., 0], t[..., 1]

    def targets(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.windows.targets is not None
        t = torch.as_tensor(self.windows.targets[np.asarray(rows)])
        return t[:, 0], t[:, 1]


def _window_outputs(
    teacher: Teacher, windows: QAWindows, cache: Path, precision: str, batch_size: int, key: str
) -> np.ndarray:
    stamp = cache.with_suffix(".json")
    if cache.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")).get("key") == key:
                return np.load(cache, mmap_mode="r")
        except ValueError:
            pass
    tmp = cache.with_name(cache.name + ".tmp")
    shape = (len(windows), teacher.max_length, 2)
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=shape)
    for start in range(0, len(windows), CACHE_CHUNK):
        end = min(start + CACHE_CHUNK, len(windows))
        part = QAWindows(
            windows.encoded[start:end],
            windows.example[start:end],
            windows.first[start:end],
            windows.length[start:end],
            windows.offsets,
        )
        starts, ends = window_logits(
            teacher.model, part, teacher.tokenizer.pad_id, batch_size=batch_size,
            precision=precision,
        )  # fmt: skip
        for w, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[start + w, : len(s), 0] = s
            out[start + w, : len(e), 1] = e
    out.flush()
    del out
    os.replace(tmp, cache)
    atomic_write_text(stamp, json.dumps({"key": key, "texts": len(windows)}) + "\n")
    return np.load(cache, mmap_mode="r")


def load_qa_data(
    cfg: DistillConfig,
    teacher: Teacher,
    tokenizer: Any,
    cache: Path,
    device: torch.device,
    before_teacher: Callable[[int], None],
) -> QADistillData:
    """Read and window the questions (--train, --validation or a held-out share of the
    contexts), then the teacher's logits of every window (cached; across vocabularies of its
    own windows over the same characters)."""
    if cfg.unlabelled:
        raise BertforgeError(
            "--unlabelled gives texts without questions, but a question_answering teacher "
            "reads question/context pairs; drop --unlabelled"
        )
    if not cfg.train:
        raise BertforgeError("a question_answering teacher needs --train questions (SQuAD/JSONL)")
    train, _ = read_qa(cfg.train, encoding_errors=cfg.encoding_errors)
    if cfg.validation:
        val, _ = read_qa(cfg.validation, encoding_errors=cfg.encoding_errors)
    else:
        train, val = split_by_context(train, cfg.validation_fraction, cfg.seed)
    stride, max_answer = qa_settings(teacher)
    options = dict(max_length=teacher.max_length, doc_stride=stride, labels=True)
    windows = encode_windows(tokenizer, train, **options)
    val_windows = encode_windows(tokenizer, val, **options)
    carried = val_carried = None
    setting = f"/qa{stride}"
    both = join_windows(windows, val_windows, len(train))
    if not same_vocabulary(teacher, tokenizer):
        carried = teacher_windows(teacher.tokenizer, train, windows, teacher.max_length)
        val_carried = teacher_windows(teacher.tokenizer, val, val_windows, teacher.max_length)
        both = join_windows(carried.windows, val_carried.windows, len(train))
        setting += f"/carried-to-{tokenizer.fingerprint}"
        cut = carried.cut + val_carried.cut
        print(
            "distill: the student's vocabulary is not the teacher's: the teacher reads each "
            "student window's characters its own way and its start/end probabilities are "
            "carried to the student's tokens by character"
            + (f" ({cut:,} windows too long for it read in part)" if cut else ""),
            file=sys.stderr,
            flush=True,
        )
    before_teacher(len(windows))
    precision, _ = explain_precision(cfg.precision, device, teacher.config.hidden_size)
    every = [e.question + "\x1f" + e.context for e in train + val]
    key = _cache_key(teacher, every, None, precision + setting)
    teacher.model.to(device)
    with torch.inference_mode():
        outputs = _window_outputs(teacher, both, cache, precision, cfg.eval_batch_size, key)
    teacher.model.to("cpu")
    return QADistillData(
        train, val, windows, val_windows, outputs, max_answer, carried, val_carried
    )


def teacher_qa_scores(data: QADistillData) -> dict[str, float]:
    """The teacher's EM/F1 on the validation questions from its cached logits (of its own
    windows)."""
    first = len(data.windows)
    windows = data.val_windows if data.val_carried is None else data.val_carried.windows
    lengths = [len(ids) for ids, _ in windows.encoded]
    starts = [np.asarray(data.outputs[first + w, :n, 0], np.float32) for w, n in enumerate(lengths)]
    ends = [np.asarray(data.outputs[first + w, :n, 1], np.float32) for w, n in enumerate(lengths)]
    spans = decode_spans(windows, data.val, starts, ends, max_answer_length=data.max_answer_length)
    predictions = {e.id: s.text for e, s in zip(data.val, spans, strict=True)}
    return squad_metrics(predictions, {e.id: e.answers for e in data.val})


def validate_qa_student(
    model: torch.nn.Module, data: QADistillData, pad_id: int, *, batch_size: int, precision: str
) -> dict[str, Any]:
    """The student's EM/F1 (and span loss) on the validation questions."""
    metrics, _ = evaluate_qa_model(
        model,
        data.val_windows,
        data.val,
        pad_id,
        batch_size=batch_size,
        precision=precision,
        max_answer_length=data.max_answer_length,
    )
    return metrics


__all__ = [
    "FLOOR",
    "Carried",
    "QADistillData",
    "carry_logits",
    "join_windows",
    "load_qa_data",
    "qa_settings",
    "same_vocabulary",
    "teacher_qa_scores",
    "teacher_windows",
    "validate_qa_student",
]
