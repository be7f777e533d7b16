"""How an IOB tag sequence spells its entities, as conlleval reads it (and seqeval without
``mode="strict"``): an entity opens at a ``B-X``, at an ``I-X`` after ``O`` or at the start, and at
any ``B-``/``I-`` whose type differs from the tag before it; it closes before ``O``, before a
``B-``, and before a change of type. So ``I-PER I-PER`` is one PER entity and ``B-PER I-LOC`` two.

Here, below both the scores (``evaluation.entities``) and the tagger (``inference.tagging``),
because both read entities the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

Entity = tuple[str, int, int]
"""``(type, start, end)``: tokens ``start`` to ``end - 1`` of a sequence."""


def _split(tag: str) -> tuple[str, str]:
    """(``B``/``I``/``O``, type) of an IOB tag."""
    if tag == "O" or not tag:
        return "O", ""
    return tag[0], tag[2:] if tag[1:2] == "-" else tag[1:]


def entities(tags: Sequence[str]) -> list[Entity]:
    """The entities of one tag sequence, read as conlleval reads them (module docstring)."""
    found: list[Entity] = []
    start, kind = None, ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, type_ = _split(tag)
        opens = prefix == "B" or (prefix == "I" and (start is None or type_ != kind))
        if start is not None and (prefix == "O" or opens):
            found.append((kind, start, i))
            start = None
        if opens:
            start, kind = i, type_
    return found
