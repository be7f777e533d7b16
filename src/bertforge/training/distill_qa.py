"""Question answering in ``bertforge distill``: the student learns the teacher's start and end
distributions over each window's tokens (:class:`~bertforge.training.distill_losses.SpanLoss`)
beside the gold spans (docs/distillation.md).

Both models read the same windows, so the student must share the teacher's vocabulary
(``--student_layers``, ``--student_preset``, or a student directory with the teacher's
tokenizer): the distributions are over token positions, and aligning them across two
tokenizers needs character offsets, which is not built. The teacher's logits are cached as a
(windows, max_length, 2) float16 memory-mapped ``.npy`` (4 bytes a position).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.qa import QAExample, QAWindows, decode_spans, encode_windows, read_qa
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


def check_same_vocabulary(teacher: Teacher, tokenizer: Any) -> None:
    """A QA student must read the teacher's windows: the same vocabulary."""
    if tokenizer.backend.get_vocab() != teacher.tokenizer.backend.get_vocab():
        raise BertforgeError(
            "a question_answering teacher needs a student with its vocabulary (the start/end "
            "distributions are over token positions; aligning two tokenizers by character "
            "offsets is not built): use --student_layers, --student_preset or a student with the "
            "teacher's tokenizer"
        )


@dataclass
class QADistillData:
    """Training and validation questions windowed (the same windows for both models), with the
    teacher's start/end logits of every window."""

    train: list[QAExample]
    val: list[QAExample]
    windows: QAWindows
    val_windows: QAWindows
    outputs: np.ndarray
    """(train windows + validation windows, max_length, 2) float16 start/end logits."""
    max_answer_length: int
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
        """(B, length) start and end logits of training windows ``rows``."""
        out = np.zeros((len(rows), length, 2), dtype=np.float32)
        for r, i in enumerate(rows):
            n = len(self.windows.encoded[int(i)][0])
            out[r, :n] = self.outputs[int(i), :n]
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
    contexts), then the teacher's logits of every window (cached)."""
    check_same_vocabulary(teacher, tokenizer)
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
    before_teacher(len(windows))
    precision, _ = explain_precision(cfg.precision, device, teacher.config.hidden_size)
    every = [e.question + "\x1f" + e.context for e in train + val]
    key = _cache_key(teacher, every, None, precision + f"/qa{stride}")
    both = QAWindows(
        windows.encoded + val_windows.encoded,
        np.concatenate([windows.example, val_windows.example + len(train)]),
        np.concatenate([windows.first, val_windows.first]),
        np.concatenate([windows.length, val_windows.length]),
        windows.offsets + val_windows.offsets,
    )
    teacher.model.to(device)
    with torch.inference_mode():
        outputs = _window_outputs(teacher, both, cache, precision, cfg.eval_batch_size, key)
    teacher.model.to("cpu")
    return QADistillData(train, val, windows, val_windows, outputs, max_answer)


def teacher_qa_scores(data: QADistillData) -> dict[str, float]:
    """The teacher's EM/F1 on the validation questions from its cached logits."""
    first = len(data.windows)
    lengths = [len(ids) for ids, _ in data.val_windows.encoded]
    starts = [np.asarray(data.outputs[first + w, :n, 0], np.float32) for w, n in enumerate(lengths)]
    ends = [np.asarray(data.outputs[first + w, :n, 1], np.float32) for w, n in enumerate(lengths)]
    spans = decode_spans(
        data.val_windows, data.val, starts, ends, max_answer_length=data.max_answer_length
    )
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
    "QADistillData",
    "check_same_vocabulary",
    "load_qa_data",
    "qa_settings",
    "teacher_qa_scores",
    "validate_qa_student",
]
