"""Scores of extractive question answering: SQuAD v1.1 exact match and F1 as the official
``evaluate-v1.1.py`` computes them, and a fine-tuned ``BertForQuestionAnswering`` scored on
labelled questions.

The official definitions: an answer is normalised by lowercasing, deleting every
``string.punctuation`` character, deleting the words ``a``, ``an`` and ``the``, and collapsing
whitespace. EM is 1 when the normalised prediction equals a normalised gold answer; F1 is the
harmonic mean of precision and recall of the normalised prediction's whitespace tokens against a
gold answer's (a bag: repeated tokens count as often as both hold them), 0 when they share none.
Each question takes the best over its gold answers; a question without a prediction scores 0.
The script reports means x 100; bertforge reports **fractions** (0.808 for the script's 80.8),
as it does accuracy and every other metric.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.qa import QAExample, QAWindows, decode_spans
from bertforge.inference.qa import window_logits

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The official normalisation: lowercase, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, gold: Sequence[str]) -> float:
    """1.0 when the normalised ``prediction`` equals any normalised gold answer, else 0.0."""
    guess = normalize_answer(prediction)
    return float(any(guess == normalize_answer(g) for g in gold))


def f1_score(prediction: str, gold: Sequence[str]) -> float:
    """The best token-overlap F1 of ``prediction`` over the gold answers."""
    guess = Counter(normalize_answer(prediction).split())
    best = 0.0
    for answer in gold:
        truth = Counter(normalize_answer(answer).split())
        shared = sum((guess & truth).values())
        if shared:
            precision, recall = shared / sum(guess.values()), shared / sum(truth.values())
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def squad_metrics(
    predictions: Mapping[str, str], gold: Mapping[str, Sequence[str]]
) -> dict[str, float]:
    """``exact_match`` and ``f1`` means over every question of ``gold`` (id -> gold texts), as
    fractions; a question missing from ``predictions`` scores 0 (the official script's rule)."""
    if not gold:
        raise ValueError("squad_metrics needs at least one question")
    em = f1 = 0.0
    for qid, answers in gold.items():
        if qid in predictions:
            em += exact_match(predictions[qid], answers)
            f1 += f1_score(predictions[qid], answers)
    return {"exact_match": em / len(gold), "f1": f1 / len(gold)}


def leading_words_baseline(examples: Sequence[QAExample], n_words: int) -> dict[str, str]:
    """The baseline of ``finetune`` and ``evaluate`` for question answering: the first
    ``n_words`` words of every context, whatever the question (a model that learned nothing)."""
    return {e.id: " ".join(e.context.split()[:n_words]) for e in examples}


def mean_answer_words(examples: Sequence[QAExample]) -> int:
    """The rounded mean length in words of the (first) gold answers, at least 1."""
    lengths = [len(e.answers[0].split()) for e in examples if e.answers]
    return max(1, round(float(np.mean(lengths)))) if lengths else 1


def evaluate_qa_model(
    model: Any,
    windows: QAWindows,
    examples: Sequence[QAExample],
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    max_answer_length: int = 30,
    n_best: int = 20,
    progress: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Metrics of a question-answering model on windowed labelled examples, and its answers by
    id. ``loss`` is the mean start/end cross-entropy over the windows (targets as in training),
    ``exact_match`` and ``f1`` the official SQuAD v1.1 scores (fractions) of the best span per
    question pooled over its windows."""
    starts, ends = window_logits(
        model, windows, pad_id, batch_size=batch_size, precision=precision, progress=progress,
        desc="evaluate",
    )  # fmt: skip
    spans = decode_spans(
        windows, examples, starts, ends, n_best=n_best, max_answer_length=max_answer_length
    )
    predictions = {e.id: s.text for e, s in zip(examples, spans, strict=True)}
    metrics: dict[str, Any] = {}
    if windows.targets is not None:
        losses = [
            (F.cross_entropy(torch.from_numpy(s)[None], torch.tensor([int(t[0])]))
             + F.cross_entropy(torch.from_numpy(e)[None], torch.tensor([int(t[1])]))) / 2
            for s, e, t in zip(starts, ends, windows.targets, strict=True)
        ]  # fmt: skip
        metrics["loss"] = float(torch.stack(losses).mean())
    metrics |= squad_metrics(predictions, {e.id: e.answers for e in examples})
    metrics["examples"] = len(examples)
    metrics["windows"] = len(windows)
    return metrics, predictions


def qa_report(
    metrics: Mapping[str, float], baseline: Mapping[str, float], n_words: int, definition: str
) -> dict[str, Any]:
    """The end-of-run / ``evaluate`` report of a question-answering model: a small EM/F1 table
    beside the :func:`leading_words_baseline`."""
    lines = [
        f"{'':<24}{'exact_match':>12}{'f1':>8}",
        f"{'this model':<24}{metrics['exact_match']:>12.4f}{metrics['f1']:>8.4f}",
        f"{'baseline':<24}{baseline['exact_match']:>12.4f}{baseline['f1']:>8.4f}",
        "(SQuAD v1.1 official EM/F1 as fractions; x 100 for the script's numbers)",
    ]
    return {
        "report_text": "\n".join(lines),
        "baseline": {
            "predicts": f"the first {n_words} word(s) of the context",
            "definition": definition,
            "words": n_words,
            **baseline,
        },
    }


__all__ = [
    "evaluate_qa_model",
    "exact_match",
    "f1_score",
    "leading_words_baseline",
    "mean_answer_words",
    "normalize_answer",
    "qa_report",
    "squad_metrics",
]
