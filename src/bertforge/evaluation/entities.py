"""Entity-level scores of IOB tag sequences as pure functions: the entities of a sequence as
conlleval reads them, micro precision/recall/F1 over exact (type, start, end) matches with
per-type scores, and token accuracy; the numbers ``seqeval``'s default mode reports
(``tests/test_tagging.py`` checks them against seqeval on real files).

How conlleval (and seqeval without ``mode="strict"``) reads a sequence: an entity opens at a
``B-X``, at an ``I-X`` after ``O`` or at the start, and at any ``B-``/``I-`` whose type differs
from the tag before it; it closes before ``O``, before a ``B-``, and before a change of type.
So ``I-PER I-PER`` is one PER entity and ``B-PER I-LOC`` two entities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertforge.data.iob import Entity, entities

__all__ = ["Entity", "entities", "entity_scores", "format_entity_report"]


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


def entity_scores(
    true: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
) -> dict[str, Any]:
    """Scores of predicted against true tag sequences (one list of tags per sentence):
    ``precision``, ``recall``, ``f1`` (micro over exact entity matches), ``token_accuracy``,
    ``entities`` (true entities) and ``per_type`` ``{type: {precision, recall, f1, support}}``.
    A score whose denominator is 0 is 0, as seqeval's default."""
    if len(true) != len(predicted):
        raise ValueError(f"{len(true)} true sentences but {len(predicted)} predicted")
    gold: set[tuple[int, Entity]] = set()
    guess: set[tuple[int, Entity]] = set()
    correct_tokens = tokens = 0
    for s, (t, p) in enumerate(zip(true, predicted, strict=True)):
        if len(t) != len(p):
            raise ValueError(f"sentence {s}: {len(t)} true tags but {len(p)} predicted")
        gold.update((s, e) for e in entities(t))
        guess.update((s, e) for e in entities(p))
        correct_tokens += sum(a == b for a, b in zip(t, p, strict=True))
        tokens += len(t)
    hits = gold & guess
    per_type = {}
    for kind in sorted({e[0] for _, e in gold | guess}):
        n_true = sum(e[0] == kind for _, e in gold)
        n_pred = sum(e[0] == kind for _, e in guess)
        n_hit = sum(e[0] == kind for _, e in hits)
        p, r = _ratio(n_hit, n_pred), _ratio(n_hit, n_true)
        per_type[kind] = {"precision": p, "recall": r, "f1": _f1(p, r), "support": n_true}
    precision, recall = _ratio(len(hits), len(guess)), _ratio(len(hits), len(gold))
    return {
        "precision": precision,
        "recall": recall,
        "f1": _f1(precision, recall),
        "token_accuracy": _ratio(correct_tokens, tokens),
        "entities": len(gold),
        "per_type": per_type,
    }


def format_entity_report(scores: dict[str, Any]) -> str:
    """The per-type table with the micro average below it (seqeval's ``classification_report``
    layout), and token accuracy."""
    width = max([len(k) for k in scores["per_type"]] + [9])
    head = f"{'':>{width}}  precision     recall         f1    support"
    rows = [
        f"{kind:>{width}}  {v['precision']:9.4f}  {v['recall']:9.4f}  {v['f1']:9.4f}  {v['support']:9d}"
        for kind, v in scores["per_type"].items()
    ]
    micro = (
        f"{'micro avg':>{width}}  {scores['precision']:9.4f}  {scores['recall']:9.4f}  "
        f"{scores['f1']:9.4f}  {scores['entities']:9d}"
    )
    return "\n".join([head, *rows, "", micro, f"token accuracy {scores['token_accuracy']:.4f}"])


__all__ = ["Entity", "entities", "entity_scores", "format_entity_report"]
