"""Extractive question answering data: SQuAD v1.1 JSON and ``datasets``-style JSONL read into
:class:`QAExample` rows, cut into overlapping token windows ``[CLS] question [SEP] context
window [SEP]`` (transformers' ``run_qa`` conventions), and the windows' answer positions.

Readers:

* SQuAD v1.1 JSON (``.json``, optionally ``.gz``/``.bz2``/``.xz``): ``{"data": [{"paragraphs": [{"context",
  "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}``;
* JSON lines (``.jsonl``, likewise), one question per row as the Hugging Face
  ``datasets`` SQuAD layout has it: ``{"id", "question", "context", "answers": {"text": [...],
  "answer_start": [...]}}``.

An answer whose text is not at its ``answer_start`` is **fixed**: it moves to the occurrence of
its text in the context nearest to the given offset, and the reader says so once, naming the
ids (the rebuilt SQuAD dev of ``../shared/data/qa`` has offsets of a first occurrence where the
annotator marked a later one; the nearest copy of the same string is the best guess). An answer
whose text does not occur in its context at all is an error naming the question id.

Windows: the context's WordPieces are cut into windows of ``max_length - len(question) - 3``
tokens, each starting ``doc_stride`` tokens before the previous one ended (``doc_stride`` is the
overlap, as in transformers' tokenizers). The tokenizer's offset mapping ties every context
token to its characters, so a decoded span is a slice of the original context. In training a
window that does not hold the whole (first) answer is labelled at [CLS] (position 0), as
``run_qa`` does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.tables import jsonl_rows
from bertforge.errors import BertforgeError
from bertforge.io import plain_name, read_text, text_lines

QA_SUFFIXES = (".json", ".jsonl")


@dataclass
class QAExample:
    """One question about one context, with its gold answers (none for unlabelled input)."""

    id: str
    question: str
    context: str
    answers: list[str] = field(default_factory=list)
    """Gold answer texts (SQuAD dev has up to six per question; scoring takes the best)."""
    starts: list[int] = field(default_factory=list)
    """Character offset of each answer in ``context`` (``context[s:s + len(text)] == text``)."""


# ---- reading ------------------------------------------------------------------------------------


def qa_format(path: str | Path) -> str:
    """``squad`` (a SQuAD JSON document) or ``jsonl`` (one question per line) from the name."""
    name = plain_name(path)
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".json"):
        return "squad"
    raise BertforgeError(
        f"{path}: unknown question-answering file type; use SQuAD .json or .jsonl rows "
        "(each optionally .gz, .bz2 or .xz)"
    )


def _field(row: Any, name: str, kind: type, where: str) -> Any:
    if not isinstance(row, dict) or name not in row:
        raise BertforgeError(f"{where}: no {name!r} field; every question needs one")
    value = row[name]
    if not isinstance(value, kind) or (kind is str and not value.strip()):
        raise BertforgeError(
            f"{where}: field {name!r} is {str(value)[:40]!r}, not a non-empty {kind.__name__}"
        )
    return value


def _answers(row: dict, where: str, labelled: bool) -> tuple[list[str], list[int]]:
    """Gold texts and starts from ``{"text": [...], "answer_start": [...]}`` (the datasets
    layout) or a list of ``{"text", "answer_start"}`` (SQuAD's)."""
    raw = row.get("answers")
    if raw is None:
        if labelled:
            raise BertforgeError(f"{where}: no 'answers' field; training and scoring need one")
        return [], []
    if isinstance(raw, dict):
        texts, starts = raw.get("text"), raw.get("answer_start")
    elif isinstance(raw, list):
        texts = [a.get("text") if isinstance(a, dict) else None for a in raw]
        starts = [a.get("answer_start") if isinstance(a, dict) else None for a in raw]
    else:
        texts = starts = None
    ok = isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts)
    if not ok or not all(isinstance(t, str) and t.strip() for t in texts):
        raise BertforgeError(
            f"{where}: 'answers' must hold 'text' and 'answer_start' lists of equal length "
            "(non-empty texts, integer offsets)"
        )
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in starts):
        raise BertforgeError(f"{where}: 'answer_start' holds {starts!r}; use integer offsets")
    if labelled and not texts:
        raise BertforgeError(f"{where}: no answer; every question needs at least one")
    return list(texts), list(starts)


def nearest_occurrence(context: str, text: str, start: int) -> int | None:
    """The offset of the occurrence of ``text`` in ``context`` nearest to ``start`` (the earlier
    one on a tie), or None when ``text`` does not occur."""
    best, at = None, context.find(text)
    while at != -1:
        if best is None or abs(at - start) < abs(best - start):
            best = at
        at = context.find(text, at + 1)
    return best


def _squad_rows(document: Any, path: Path) -> list[tuple[dict, str, str]]:
    """``(question row, its context, where)`` of a SQuAD document."""
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise BertforgeError(
            f"{path}: not a SQuAD file (a JSON object with a 'data' list of articles); for one "
            "question per line name the file .jsonl"
        )
    rows = []
    for a, article in enumerate(document["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise BertforgeError(f"{path}: data[{a}] has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", str, where)
            qas = _field(paragraph, "qas", list, where)
            for q, qa in enumerate(qas):
                name = qa.get("id") if isinstance(qa, dict) else None
                rows.append((qa, context, f"{where}.qas[{q}]" + (f" (id {name})" if name else "")))
    return rows


def read_qa(
    paths: str | Path | Sequence[str | Path],
    *,
    labelled: bool = True,
    encoding_errors: str = "strict",
) -> tuple[list[QAExample], list[str]]:
    """Questions of SQuAD JSON / JSONL files (see the module docstring) and the warnings about
    them (answers moved to the nearest occurrence of their text). ``labelled=False`` reads
    questions without answers too (inference). Files are read by :func:`bertforge.io.text_lines`
    (``.gz``/``.bz2``/``.xz``; bytes that are not UTF-8 named by file and line unless
    ``encoding_errors="replace"``)."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    examples: list[QAExample] = []
    moved: list[str] = []
    seen: set[str] = set()
    for path in map(Path, paths):
        if qa_format(path) == "squad":
            try:
                document = json.loads(read_text(path, encoding_errors))
            except json.JSONDecodeError as err:
                raise BertforgeError(
                    f"{path}: not valid JSON ({err.msg}, line {err.lineno}); fix the file"
                ) from None
            rows = _squad_rows(document, path)
        else:
            rows = []
            for number, row in jsonl_rows(text_lines(path, encoding_errors), path):
                rows.append((row, _field(row, "context", str, f"{path}:{number}"),
                             f"{path}:{number}"))  # fmt: skip
        for row, context, where in rows:
            qid = row.get("id") if isinstance(row, dict) else None
            if not isinstance(qid, str | int) or isinstance(qid, bool) or str(qid) == "":
                raise BertforgeError(f"{where}: no 'id' field; every question needs an id")
            qid = str(qid)
            if qid in seen:
                raise BertforgeError(
                    f"{where}: question id {qid!r} appears twice; ids must be unique"
                )
            seen.add(qid)
            question = _field(row, "question", str, where)
            texts, starts = _answers(row, where, labelled)
            for i, (text, start) in enumerate(zip(texts, starts, strict=True)):
                if context[start : start + len(text)] == text:
                    continue
                found = nearest_occurrence(context, text, start)
                if found is None:
                    raise BertforgeError(
                        f"{where}: answer {text[:40]!r} (id {qid}) does not occur in its context; "
                        "fix the answer text or drop the question"
                    )
                starts[i] = found
                moved.append(qid)
            examples.append(QAExample(qid, question, context, texts, starts))
    if not examples:
        raise BertforgeError(f"{', '.join(map(str, paths))}: no questions found")
    warnings = []
    if moved:
        ids = ", ".join(dict.fromkeys(moved[:5]))
        warnings.append(
            f"warning: {len(moved)} answer(s) were not at their answer_start (ids {ids}"
            f"{', ...' if len(moved) > 5 else ''}); each was moved to the nearest occurrence of "
            "its text in the context"
        )
    return examples, warnings


# ---- windows ------------------------------------------------------------------------------------


@dataclass
class QAWindows:
    """The token windows of a list of examples, ready for the model and for decoding.

    Window ``w`` reads ``[CLS] question [SEP] context[first[w] : first[w] + length[w]] [SEP]``;
    its sequence position ``p`` (``question_end[w] <= p < question_end[w] + length[w]``) is context
    token ``first[w] + p - question_end[w]``, whose characters are ``offsets[example[w]][token]``.
    """

    encoded: list[tuple[np.ndarray, int]]
    """``(ids, length of [CLS] question [SEP])`` per window: ``collate``'s input."""
    example: np.ndarray
    """(W,) the example each window belongs to."""
    first: np.ndarray
    """(W,) the window's first context token."""
    length: np.ndarray
    """(W,) context tokens in the window."""
    offsets: list[np.ndarray]
    """Per example, (M, 2) character [start, end) of each context token."""
    targets: np.ndarray | None = None
    """(W, 2) start and end positions of the answer in the window, (0, 0) at [CLS] when it is
    not wholly inside; None without answers."""

    def __len__(self) -> int:
        return len(self.encoded)


def check_windows(max_length: int, doc_stride: int, question_tokens: int, where: str = "") -> int:
    """Context tokens per window; an error when the question leaves no room for a window longer
    than its ``doc_stride`` overlap (the windows would never advance)."""
    room = max_length - question_tokens - 3  # [CLS] question [SEP] context [SEP]
    if doc_stride < 0:
        raise BertforgeError(f"--doc_stride {doc_stride} must be 0 or more")
    if room <= doc_stride:
        raise BertforgeError(
            f"{where}--max_length {max_length} with a question of {question_tokens} tokens leaves "
            f"{max(room, 0)} context tokens per window, not more than --doc_stride {doc_stride}; "
            "raise --max_length or lower --doc_stride"
        )
    return room


def window_spans(n_tokens: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """``(first token, token count)`` of each window over ``n_tokens`` context tokens: ``room``
    tokens each, every window overlapping the previous one by ``doc_stride``; one (possibly
    empty) window for an empty context."""
    spans, start = [], 0
    while True:
        end = min(start + room, n_tokens)
        spans.append((start, end - start))
        if end >= n_tokens:
            return spans
        start = end - doc_stride


def answer_tokens(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int]:
    """The first and last context token of the characters ``[start_char, end_char)``: the last
    token starting at or before ``start_char`` and the first ending at or after ``end_char``."""
    first = int(np.searchsorted(offsets[:, 0], start_char, side="right")) - 1
    last = int(np.searchsorted(offsets[:, 1], end_char, side="left"))
    return max(first, 0), min(last, len(offsets) - 1)


def encode_windows(
    tokenizer: Any,
    examples: Sequence[QAExample],
    *,
    max_length: int,
    doc_stride: int,
    labels: bool = False,
) -> QAWindows:
    """Cut every example into windows (see the module docstring); ``labels`` adds the training
    targets of the first answer."""
    backend = tokenizer.backend
    questions = backend.encode_batch([e.question for e in examples], add_special_tokens=False)
    unique = list(dict.fromkeys(e.context for e in examples))  # SQuAD asks ~5 per context
    encoded_contexts = dict(
        zip(unique, backend.encode_batch(unique, add_special_tokens=False), strict=True)
    )
    contexts = [encoded_contexts[e.context] for e in examples]
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    encoded, example, first, length, offsets, targets = [], [], [], [], [], []
    context_offsets: dict[str, np.ndarray] = {}
    for i, (e, q, c) in enumerate(zip(examples, questions, contexts, strict=True)):
        room = check_windows(max_length, doc_stride, len(q.ids), f"question {e.id}: ")
        if e.context not in context_offsets:
            context_offsets[e.context] = np.asarray(c.offsets, dtype=np.int64).reshape(-1, 2)
        token_offsets = context_offsets[e.context]  # (M, 2)
        offsets.append(token_offsets)
        head = [cls, *q.ids, sep]
        answer = None
        if labels and e.answers and len(token_offsets):
            answer = answer_tokens(token_offsets, e.starts[0], e.starts[0] + len(e.answers[0]))
        for start, count in window_spans(len(c.ids), room, doc_stride):
            ids = np.asarray([*head, *c.ids[start : start + count], sep], dtype=np.int32)
            encoded.append((ids, len(head)))
            example.append(i)
            first.append(start)
            length.append(count)
            if labels:
                inside = answer is not None and start <= answer[0] and answer[1] < start + count
                shift = len(head) - start
                targets.append((answer[0] + shift, answer[1] + shift) if inside else (0, 0))
    return QAWindows(
        encoded,
        np.asarray(example, dtype=np.int64),
        np.asarray(first, dtype=np.int64),
        np.asarray(length, dtype=np.int64),
        offsets,
        np.asarray(targets, dtype=np.int64).reshape(-1, 2) if labels else None,
    )


# ---- decoding -----------------------------------------------------------------------------------


@dataclass
class Span:
    """A decoded answer: the characters ``[start, end)`` of the context and their score."""

    text: str
    start: int
    end: int
    score: float
    """Start logit + end logit of the span (over all windows of its example)."""
    probability: float = 0.0
    """Softmax of the scores over the example's n-best candidates."""
    alternatives: list[Span] = field(default_factory=list)
    """The next-best distinct spans, best first (``decode_spans(..., top_k=)`` above 1)."""


def window_candidates(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    question_end: int,
    length: int,
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> list[tuple[float, int, int]]:
    """``(score, first, last)`` context-token spans of one window (tokens counted from the
    window's first context token): the ``n_best`` highest start and end logits over the whole
    window, paired, keeping spans inside the context, not reversed and at most
    ``max_answer_length`` tokens long (``run_qa``'s post-processing)."""
    starts = np.argsort(start_logits, kind="stable")[::-1][:n_best]
    ends = np.argsort(end_logits, kind="stable")[::-1][:n_best]
    out = []
    for s in starts:
        if not question_end <= s < question_end + length:
            continue
        for e in ends:
            if not question_end <= e < question_end + length or e < s:
                continue
            if e - s + 1 > max_answer_length:
                continue
            score = float(start_logits[s]) + float(end_logits[e])
            out.append((score, int(s) - question_end, int(e) - question_end))
    return out


def decode_spans(
    windows: QAWindows,
    examples: Sequence[QAExample],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    top_k: int = 1,
) -> list[Span]:
    """The best span of each example over all its windows: the candidates of every window
    (:func:`window_candidates`) pooled, the highest score wins, its text the slice of the
    original context. An example without any valid candidate gets an empty answer. With
    ``top_k`` above 1 each answer lists the next ``top_k - 1`` best spans of other character
    ranges in ``alternatives`` (a span that two overlapping windows both found counts once)."""
    pooled: list[list[tuple[float, int, int]]] = [[] for _ in examples]
    for w, (ids, question_end) in enumerate(windows.encoded):
        found = window_candidates(
            np.asarray(start_logits[w][: len(ids)]),
            np.asarray(end_logits[w][: len(ids)]),
            question_end,
            int(windows.length[w]),
            n_best=n_best,
            max_answer_length=max_answer_length,
        )
        first = int(windows.first[w])
        pooled[windows.example[w]] += [(s, a + first, b + first) for s, a, b in found]
    spans = []
    for i, example in enumerate(examples):
        if not pooled[i]:
            spans.append(Span("", 0, 0, float("-inf")))
            continue
        best = sorted(pooled[i], key=lambda c: -c[0])[:n_best]
        scores = np.asarray([c[0] for c in best])
        probs = np.exp(scores - scores.max())
        probs = probs / probs.sum()
        found: list[Span] = []
        seen: set[tuple[int, int]] = set()
        for (score, a, b), p in zip(best, probs, strict=True):
            start, end = int(windows.offsets[i][a, 0]), int(windows.offsets[i][b, 1])
            if (start, end) in seen:
                continue
            seen.add((start, end))
            found.append(Span(example.context[start:end], start, end, score, float(p)))
            if len(found) >= max(1, top_k):
                break
        found[0].alternatives = found[1:]
        spans.append(found[0])
    return spans


__all__ = [
    "QAExample",
    "QAWindows",
    "Span",
    "answer_tokens",
    "check_windows",
    "decode_spans",
    "encode_windows",
    "nearest_occurrence",
    "qa_format",
    "read_qa",
    "window_candidates",
    "window_spans",
]
