"""Extractive question answering with a loaded ``BertForQuestionAnswering`` (or its ONNX
export): :func:`answer` finds each question's answer in its context; :func:`window_logits` runs
the windows of :func:`bertforge.data.qa.encode_windows` through the model. The command is
``bertforge answer`` (``bertforge.cli.answer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bertforge.data.qa import QAExample, QAWindows, Span, decode_spans, encode_windows
from bertforge.errors import BertforgeError
from bertforge.inference.predict import _max_length, head_batches, saved_settings

DOC_STRIDE = 128
"""Overlap of consecutive windows (tokens) when the model directory records none."""
MAX_ANSWER_LENGTH = 30
"""Longest answer in tokens when the model directory records none."""
N_BEST = 20
"""Start and end candidates per window (``run_qa``'s ``n_best_size``)."""


@torch.inference_mode()
def window_logits(
    model: Any,
    windows: QAWindows,
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    progress: bool = False,
    desc: str = "answer",
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and end logits of every window (float32, each as long as its window), in order. An
    exported :class:`~bertforge.inference.onnx.OnnxModel` runs through ONNX Runtime."""
    starts: list[np.ndarray] = [np.empty(0, np.float32)] * len(windows)
    ends: list[np.ndarray] = [np.empty(0, np.float32)] * len(windows)
    encoded = windows.encoded

    def keep(index: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        for row, w in enumerate(index):
            n = len(encoded[int(w)][0])
            starts[int(w)], ends[int(w)] = start[row, :n].copy(), end[row, :n].copy()

    def eager(batch: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        out = model(**batch)
        return out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()

    for index, (start, end) in head_batches(
        model,
        encoded,
        pad_id,
        lambda arrays: model.span_logits(arrays),
        eager,
        batch_size=batch_size,
        precision=precision,
        progress=progress,
        desc=desc,
    ):
        keep(index, start, end)
    return starts, ends


def answer(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str] | Sequence[QAExample],
    contexts: Sequence[str] | None = None,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    doc_stride: int | None = None,
    max_answer_length: int | None = None,
    n_best: int = N_BEST,
    top_k: int = 1,
    precision: str = "fp32",
    progress: bool = False,
) -> list[Span]:
    """The answer to each question in its context: a :class:`~bertforge.data.qa.Span` (text,
    character ``start``/``end`` in the context, ``score``, ``probability``), in order.

    ``questions`` are strings with ``contexts`` beside them, or :class:`QAExample` rows. A
    context longer than one window is read in windows overlapping by ``doc_stride`` tokens and
    the best span over all windows wins. ``max_length``, ``doc_stride`` and
    ``max_answer_length`` default to what fine-tuning saved beside the model
    (``finetune_config.json``), else to the model's positions, 128 and 30. ``top_k`` above 1
    puts the next-best ``top_k - 1`` distinct spans in each answer's ``alternatives``.
    """
    if max_answer_length is not None and max_answer_length < 1:
        raise BertforgeError(f"--max_answer_length {max_answer_length} must be at least 1")
    if isinstance(questions, str) or isinstance(contexts, str):
        raise BertforgeError("pass lists of questions and contexts, not single strings (wrap them)")
    if contexts is not None:
        if len(contexts) != len(questions):
            raise BertforgeError(
                f"{len(questions)} questions but {len(contexts)} contexts; give one context each"
            )
        pairs = enumerate(zip(questions, contexts, strict=True))
        examples = [QAExample(str(i), q, c) for i, (q, c) in pairs]
    else:
        examples = list(questions)  # type: ignore[arg-type]
    for e in examples:
        if not isinstance(e, QAExample) or not e.question.strip() or not e.context.strip():
            raise BertforgeError("every question needs a non-empty question and context")
    if not examples:
        return []
    settings = saved_settings(model)
    windows = encode_windows(
        tokenizer,
        examples,
        max_length=_max_length(model, max_length or settings.get("max_length")),
        doc_stride=settings.get("doc_stride", DOC_STRIDE) if doc_stride is None else doc_stride,
    )
    starts, ends = window_logits(
        model, windows, tokenizer.pad_id, batch_size=batch_size, precision=precision,
        progress=progress,
    )  # fmt: skip
    limit = max_answer_length or int(settings.get("max_answer_length", MAX_ANSWER_LENGTH))
    return decode_spans(
        windows, examples, starts, ends, n_best=n_best, max_answer_length=limit, top_k=top_k
    )


__all__ = ["DOC_STRIDE", "MAX_ANSWER_LENGTH", "N_BEST", "answer", "window_logits"]
