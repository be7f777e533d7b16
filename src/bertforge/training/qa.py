"""What ``bertforge finetune --task question_answering`` adds to the fine-tuning loop: the data
(questions read, split and cut into windows with their answer positions), the validation (the
best span per question pooled over its windows, scored by SQuAD v1.1 EM/F1) and the end-of-run
report. The loop itself is ``bertforge.training.finetune``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.qa import QAExample, QAWindows, encode_windows, read_qa
from bertforge.errors import BertforgeError
from bertforge.evaluation.qa import (
    evaluate_qa_model,
    leading_words_baseline,
    mean_answer_words,
    qa_report,
    squad_metrics,
)
from bertforge.training.config import FinetuneConfig

BASELINE = "whatever the question; as many words as the mean training answer has"
"""What the question-answering baseline predicts (see :func:`leading_words_baseline`)."""


@dataclass
class QAExamples:
    """A split's questions (the loop counts them with ``len``)."""

    examples: list[QAExample]

    def __len__(self) -> int:
        return len(self.examples)


@dataclass
class QATaskData:
    """Training and validation questions of a fine-tuning run, windowed for the model (the
    fields the loop reads have ``TaskData``'s names)."""

    train: QAExamples
    val: QAExamples
    windows_train: QAWindows
    windows_val: QAWindows
    targets: np.ndarray
    """(W, 2) start and end position of every training window."""
    warnings: list[str]
    answer_words: int
    """The baseline's answer length: the mean training answer's words."""
    id2label: None = None
    scale: None = None

    @property
    def encoded_train(self) -> list[tuple[np.ndarray, int]]:
        return self.windows_train.encoded

    @property
    def encoded_val(self) -> list[tuple[np.ndarray, int]]:
        return self.windows_val.encoded

    def batch_labels(self, rows: Sequence[int], length: int) -> torch.Tensor:
        """(B, 2) start and end positions of training windows ``rows`` (``length``, the batch's
        padded length, is for token labels: unused here)."""
        return torch.as_tensor(self.targets[np.asarray(rows)])


def split_by_context(
    examples: list[QAExample], fraction: float, seed: int
) -> tuple[list[QAExample], list[QAExample]]:
    """(train, validation): a ``fraction`` of the distinct contexts (with all their questions) is
    held out, so no validation question reads a context seen in training."""
    if not 0.0 < fraction < 1.0:
        raise BertforgeError(f"--validation_fraction {fraction} must lie strictly between 0 and 1")
    contexts = list(dict.fromkeys(e.context for e in examples))
    rng = np.random.default_rng(seed)
    held = {contexts[i] for i in rng.permutation(len(contexts))[: round(fraction * len(contexts))]}
    train = [e for e in examples if e.context not in held]
    val = [e for e in examples if e.context in held]
    if not train or not val:
        raise BertforgeError(
            f"--validation_fraction {fraction} of {len(contexts)} context(s) leaves an empty "
            "split; give more data, a --validation file, or another fraction"
        )
    return train, val


def load_qa_task(cfg: FinetuneConfig, tokenizer: Any) -> QATaskData:
    """Read, split and window the run's questions."""
    train, warnings = read_qa(cfg.train, encoding_errors=cfg.encoding_errors)
    if cfg.validation:
        val, more = read_qa(cfg.validation, encoding_errors=cfg.encoding_errors)
        warnings += more
    else:
        train, val = split_by_context(train, cfg.validation_fraction, cfg.seed)
    windows = dict(max_length=cfg.max_length, doc_stride=cfg.doc_stride, labels=True)
    windows_train = encode_windows(tokenizer, train, **windows)
    windows_val = encode_windows(tokenizer, val, **windows)
    return QATaskData(
        QAExamples(train),
        QAExamples(val),
        windows_train,
        windows_val,
        windows_train.targets,
        warnings,
        mean_answer_words(train),
    )


def validate_qa(run: Any, model: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Metrics and answers of ``model`` on the run's validation questions."""
    data: QATaskData = run.data
    return evaluate_qa_model(
        model,
        data.windows_val,
        data.val.examples,
        run.tokenizer.pad_id,
        batch_size=run.cfg.eval_batch_size,
        precision=run.precision,
        max_answer_length=run.cfg.max_answer_length,
    )


def qa_baseline(examples: list[QAExample], n_words: int) -> dict[str, float]:
    """EM and F1 of :func:`leading_words_baseline` on ``examples``."""
    guesses = leading_words_baseline(examples, n_words)
    return squad_metrics(guesses, {e.id: e.answers for e in examples})


def finish_qa(run: Any, model: Any, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The best model's validation metrics and report (with the baseline), for ``finish``."""
    data: QATaskData = run.data
    metrics, _ = validate_qa(run, model)
    report = qa_report(metrics, run.val_baseline, data.answer_words, BASELINE)
    return metrics, report


__all__ = [
    "BASELINE",
    "QATaskData",
    "finish_qa",
    "load_qa_task",
    "qa_baseline",
    "split_by_context",
    "validate_qa",
]
