"""Tagged data for token classification (named entities): read CoNLL-style and JSONL files, check
the IOB tags, map tags to ids, and encode sentences into WordPiece windows with labels on each
word's first piece (transformers' ``run_ner`` convention).

Files:

* CoNLL-style (any name but ``.jsonl``, optionally ``.gz``/``.bz2``/``.xz``): one token per line, its tag in the
  last column (columns split by tabs, else by spaces), a blank line between sentences;
  ``-DOCSTART-`` lines are skipped and blank lines at either end do not matter.
* JSONL (``.jsonl``, likewise): one sentence per line, ``{"tokens": [...], "tags":
  [...]}``.

Tags are IOB2 (``B-X`` opens an entity, ``I-X`` continues it, ``O`` is outside). An ``I-X`` that
opens an entity (IOB1, or a slip) is rewritten to ``B-X``, which is how conlleval and seqeval read
it anyway, and said once per file. A sentence longer than ``max_length`` pieces is split into
windows at word boundaries, never cut; :func:`word_predictions` stitches the windows' predictions
back into one tag per word.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.columnar import is_columnar
from bertforge.data.encoding import check_max_length
from bertforge.data.labelled import random_split
from bertforge.data.labels import quoted
from bertforge.data.tables import read_columns, table_format
from bertforge.errors import BertforgeError
from bertforge.io import plain_name, text_lines
from bertforge.tokenizer.wordpiece import valid_unicode

IGNORE = -100
"""The label of positions without a target ([CLS], [SEP], later pieces of a word, padding)."""
DOCSTART = "-DOCSTART-"
CONLL_SUFFIXES = (".conll", ".conllu", ".iob", ".iob2", ".bio", ".ner")
"""File names ``bertforge tag`` reads as CoNLL-style without being told (``.gz``/``.bz2``/``.xz`` allowed)."""

# ---- reading -----------------------------------------------------------------------------------


@dataclass
class TaggedData:
    """Sentences of words with their tags, in file order."""

    words: list[list[str]]
    """The tokens of every sentence."""
    tags: list[list[str]] | None
    """The IOB2 tag of every token (None for untagged data)."""
    where: list[tuple[str, int, bool]] = field(default_factory=list)
    """Per sentence: (file, line of its first token, one token per line): error locations."""
    notes: list[str] = field(default_factory=list)
    """What was changed while reading (IOB1 tags rewritten), to say once."""

    def __len__(self) -> int:
        return len(self.words)

    def subset(self, index: Sequence[int]) -> TaggedData:
        pick = [int(i) for i in index]
        return TaggedData(
            [self.words[i] for i in pick],
            None if self.tags is None else [self.tags[i] for i in pick],
            [self.where[i] for i in pick] if self.where else [],
            self.notes,
        )

    def location(self, sentence: int, token: int) -> str:
        """``file:line`` of a token (of its sentence's line for JSONL)."""
        path, line, per_token = self.where[sentence]
        return f"{path}:{line + token if per_token else line}"


def _text_lines(path: Path, encoding_errors: str = "strict") -> list[str]:
    """The lines of a text file without their line ends, read by :func:`bertforge.io.text_lines`
    (the one UTF-8 rule and compression of every reader)."""
    return [line.rstrip("\r\n") for line in text_lines(path, encoding_errors)]


def _is_jsonl(path: Path) -> bool:
    return plain_name(path).endswith(".jsonl")


def read_conll(
    path: str | Path, *, tagged: bool = True, encoding_errors: str = "strict"
) -> TaggedData:
    """Sentences of a CoNLL-style file (see the module docstring). ``tagged=False`` reads the
    first column only (a file to tag)."""
    path = Path(path)
    data = TaggedData([], [] if tagged else None)
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for number, raw in enumerate(_text_lines(path, encoding_errors) + [""], start=1):
        line = raw.strip()
        if line and not line.startswith(DOCSTART):
            columns = line.split("\t") if "\t" in line else line.split()
            columns = [c.strip() for c in columns]
            if tagged and (len(columns) < 2 or not columns[0] or not columns[-1]):
                raise BertforgeError(
                    f"{path}:{number}: {quoted(raw)} is not a token and its tag; write one token "
                    "per line with its tag in the last column (tab- or space-separated) and a "
                    "blank line between sentences"
                )
            if not words:
                start = number
            words.append(columns[0])
            tags.append(columns[-1])
            continue
        if words:
            data.words.append(words)
            if data.tags is not None:
                data.tags.append(tags)
            data.where.append((str(path), start, True))
        words, tags = [], []
    return data


def read_tagged_jsonl(
    path: str | Path, *, tagged: bool = True, encoding_errors: str = "strict"
) -> TaggedData:
    """Sentences of a JSONL file with ``tokens`` and ``tags`` lists (see the module docstring)."""
    path = Path(path)
    data = TaggedData([], [] if tagged else None)
    for number, raw in enumerate(_text_lines(path, encoding_errors), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            raise BertforgeError(
                f"{path}:{number}: not a JSON object ({err.msg}); fix the line"
            ) from None
        names = ("tokens", "tags") if tagged else ("tokens",)
        lists = [row.get(n) if isinstance(row, dict) else None for n in names]
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
            raise BertforgeError(
                f"{path}:{number}: needs {' and '.join(repr(n) for n in names)} as lists of "
                'strings, e.g. {"tokens": ["Paris", "is"], "tags": ["B-LOC", "O"]}'
            )
        if tagged and len(lists[0]) != len(lists[1]):
            raise BertforgeError(
                f"{path}:{number}: {len(lists[0])} tokens but {len(lists[1])} tags; give one tag "
                "per token"
            )
        if not lists[0]:
            continue
        data.words.append([w.strip() for w in lists[0]])
        if data.tags is not None:
            data.tags.append([t.strip() for t in lists[1]])
        data.where.append((str(path), number, False))
    return data


def read_tagged(
    paths: str | Path | Sequence[str | Path],
    *,
    tagged: bool = True,
    encoding_errors: str = "strict",
) -> TaggedData:
    """Read one or more CoNLL-style or JSONL files (sentences concatenated in order); tags are
    checked (:func:`check_tags`) and IOB1 openings rewritten to IOB2. Bytes that are not UTF-8
    are an error naming file and line unless ``encoding_errors="replace"``."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    out = TaggedData([], [] if tagged else None)
    for path in paths:
        path = Path(path)
        reader = read_tagged_jsonl if _is_jsonl(path) else read_conll
        part = reader(path, tagged=tagged, encoding_errors=encoding_errors)
        if not part.words:
            raise BertforgeError(f"{path}: holds no sentence; give a CoNLL-style or JSONL file")
        if part.tags is not None:
            rewritten = check_tags(part)
            if rewritten:
                out.notes.append(
                    f"{path}: {rewritten:,} entit{'ies' if rewritten > 1 else 'y'} open with I- "
                    "(IOB1 tagging, or a slip): read as IOB2, the opening I-X as B-X (as "
                    "conlleval and seqeval count them)"
                )
            out.tags.extend(part.tags)  # type: ignore[union-attr]
        out.words.extend(part.words)
        out.where.extend(part.where)
    return out


def check_tags(data: TaggedData) -> int:
    """Check that every tag is ``O``, ``B-TYPE`` or ``I-TYPE`` (a one-line error at the first that
    is not) and rewrite an ``I-X`` that opens an entity (after ``O``, at the start, or after
    another type) to ``B-X``, in place; returns how many were rewritten."""
    rewritten = 0
    for s, tags in enumerate(data.tags or []):
        previous = "O"
        for t, tag in enumerate(tags):
            if tag != "O" and (tag[:2] not in ("B-", "I-") or len(tag) < 3):
                raise BertforgeError(
                    f"{data.location(s, t)}: tag {quoted(tag)} is not IOB; write O, B-TYPE or "
                    "I-TYPE (IOB2; IOB1 is read too)"
                )
            if tag.startswith("I-") and previous[2:] != tag[2:]:
                tags[t] = "B-" + tag[2:]
                rewritten += 1
            previous = tags[t]
    return rewritten


def build_tag_map(tags: Sequence[Sequence[str]]) -> dict[int, str]:
    """``id2label`` of the tags seen: ``O`` first, then by entity type, ``B-`` before ``I-``
    (so the map depends on the tag set only, not on the order of the sentences)."""
    names = {t for sentence in tags for t in sentence}
    ordered = sorted(names - {"O"}, key=lambda t: (t[2:], t[:2]))
    return dict(enumerate((["O"] if "O" in names else []) + ordered))


def tag_ids(
    data: TaggedData, label2id: dict[str, int], train_source: str = "training"
) -> list[np.ndarray]:
    """The tags of every sentence as int64 ids; a tag outside ``label2id`` is a one-line error
    naming its file:line."""
    out = []
    for s, tags in enumerate(data.tags or []):
        for t, tag in enumerate(tags):
            if tag not in label2id:
                known = ", ".join(label2id)
                raise BertforgeError(
                    f"{data.location(s, t)}: tag {quoted(tag)} is not among the {train_source} "
                    f"tags ({known}); fix the tag or add training sentences that have it"
                )
        out.append(np.asarray([label2id[t] for t in tags], dtype=np.int64))
    return out


def texts_to_tag(
    path: str | Path,
    text_column: str | None = None,
    form: str = "auto",
    encoding_errors: str = "strict",
) -> list[str]:
    """The texts of a file for ``bertforge tag``, exactly as written (offsets index them).

    ``form``: ``lines`` (each non-blank line a text), ``table`` (``text_column`` of a CSV/TSV/
    JSONL file), ``conll`` (each sentence of a CoNLL-style or ``tokens`` JSONL file, its tokens
    joined by spaces), or ``auto``: ``conll`` for a CoNLL suffix (``.conll``...) or a JSONL
    file with ``tokens`` and no ``--text_column``, ``table`` for another .csv/.tsv/.jsonl or a
    Parquet/Arrow table, else ``lines``. Bytes that are not UTF-8 are an error naming file and line unless
    ``encoding_errors="replace"`` (read as U+FFFD).
    """
    path = Path(path)
    name = plain_name(path)
    if form == "auto":
        form = "lines"
        if name.endswith(CONLL_SUFFIXES):
            form = "conll"
        elif is_columnar(path):
            form = "table"
        elif name.endswith((".csv", ".tsv", ".jsonl", ".json", ".ndjson")):
            form = "table"
            if table_format(path) == "jsonl" and text_column is None:
                with contextlib.closing(text_lines(path, encoding_errors)) as lines:
                    first = next((line for line in lines if line.strip()), "")
                try:
                    row = json.loads(first)
                except json.JSONDecodeError:
                    row = None
                form = "conll" if isinstance(row, dict) and "tokens" in row else "table"
    if form == "conll":
        words = read_tagged(path, tagged=False, encoding_errors=encoding_errors).words
        return [" ".join(sentence) for sentence in words]
    if form == "table":
        values = read_columns(path, [text_column or "text"], encoding_errors)[0]
        return ["" if v is None else str(v) for v in values]
    if form != "lines":
        raise BertforgeError(f"--input_format {form!r}: choose auto, lines, table or conll")
    texts = [line for line in _text_lines(path, encoding_errors) if line.strip()]
    if not texts:
        raise BertforgeError(f"{path}: the file is empty (no non-blank line)")
    return texts


# ---- encoding into windows ---------------------------------------------------------------------


@dataclass
class Windows:
    """Sentences encoded as WordPiece windows ``[CLS] pieces [SEP]`` of at most ``max_length``."""

    encoded: list[tuple[np.ndarray, int]]
    """``(ids, length)`` per window (the layout of ``encoding.collate``)."""
    labels: list[np.ndarray] | None
    """int64 label per position, ``IGNORE`` off the labelled pieces (None without tags)."""
    sentence: np.ndarray
    """The sentence of each window."""
    word: list[np.ndarray]
    """Per position, the index in its sentence of the word whose first piece sits there; -1 at
    every other position."""
    words: list[int]
    """Words per sentence."""

    def __len__(self) -> int:
        return len(self.encoded)

    def batch_labels(self, rows: Sequence[int], length: int) -> torch.Tensor:
        """(B, length) int64 labels of windows ``rows``, padded with ``IGNORE``."""
        assert self.labels is not None
        out = np.full((len(rows), length), IGNORE, dtype=np.int64)
        for r, i in enumerate(rows):
            labels = self.labels[int(i)]
            out[r, : len(labels)] = labels
        return torch.from_numpy(out)


def word_pieces(tokenizer: Any, words: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """The WordPiece ids of every word of every sentence (a word of only spaces or control
    characters has none)."""
    backend = tokenizer.backend
    batch = [list(w) for w in words]
    try:
        encodings = backend.encode_batch(batch, is_pretokenized=True, add_special_tokens=False)
    except TypeError:
        batch = [valid_unicode(w) for w in batch]
        encodings = backend.encode_batch(batch, is_pretokenized=True, add_special_tokens=False)
    out = []
    for sentence, encoding in zip(batch, encodings, strict=True):
        pieces: list[list[int]] = [[] for _ in sentence]
        for piece, word in zip(encoding.ids, encoding.word_ids, strict=True):
            if word is not None:
                pieces[word].append(piece)
        out.append(pieces)
    return out


def split_windows(lengths: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """``(first, end)`` word ranges covering a sentence whose words have ``lengths`` pieces, each
    at most ``budget`` pieces, cut only between words (a single word longer than the budget gets
    a window of its own and loses its pieces past the budget; its label sits on the first)."""
    windows, first, used = [], 0, 0
    for w, n in enumerate(lengths):
        n = min(n, budget)
        if used + n > budget and w > first:
            windows.append((first, w))
            first, used = w, 0
        used += n
    windows.append((first, len(lengths)))
    return windows


def encode_tagged(
    tokenizer: Any,
    words: Sequence[Sequence[str]],
    tag_ids: Sequence[np.ndarray] | None,
    *,
    max_length: int,
    label_all_tokens: bool = False,
    id2label: dict[int, str] | None = None,
) -> Windows:
    """Encode sentences into windows of at most ``max_length`` tokens with [CLS] and [SEP].

    The label of a word sits on its first piece, ``IGNORE`` on the others; with
    ``label_all_tokens`` the later pieces carry it too, a ``B-X`` as ``I-X`` (``id2label`` then
    names the tags), as transformers' ``run_ner --label_all_tokens`` does.
    """
    check_max_length(max_length, 3, "[CLS], [SEP] and one piece")
    budget = max_length - 2
    inside: dict[int, int] = {}
    if label_all_tokens and id2label:
        label2id = {v: k for k, v in id2label.items()}
        inside = {
            i: label2id.get("I-" + t[2:], i) for i, t in id2label.items() if t.startswith("B-")
        }
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    encoded, labels, sentence_of, word_at = [], [], [], []
    all_pieces = word_pieces(tokenizer, words)
    for s, pieces in enumerate(all_pieces):
        for first, end in split_windows([len(p) for p in pieces], budget):
            ids, where, label = [cls], [-1], [IGNORE]
            for w in range(first, end):
                kept = pieces[w][:budget]
                ids += kept
                where += [w] + [-1] * (len(kept) - 1) if kept else []
                if tag_ids is not None and kept:
                    tag = int(tag_ids[s][w])
                    later = inside.get(tag, tag) if label_all_tokens else IGNORE
                    label += [tag] + [later] * (len(kept) - 1)
            ids.append(sep)
            where.append(-1)
            label.append(IGNORE)
            encoded.append((np.asarray(ids, dtype=np.int32), len(ids)))
            word_at.append(np.asarray(where, dtype=np.int64))
            sentence_of.append(s)
            if tag_ids is not None:
                labels.append(np.asarray(label, dtype=np.int64))
    return Windows(
        encoded,
        labels if tag_ids is not None else None,
        np.asarray(sentence_of, dtype=np.int64),
        word_at,
        [len(p) for p in all_pieces],
    )


def word_predictions(
    windows: Windows, token_predictions: Sequence[np.ndarray], outside: int = 0
) -> list[np.ndarray]:
    """Stitch per-position predictions (a class id per position of each window) back into one id
    per word of each sentence: the prediction at the word's first piece; ``outside`` (the ``O``
    id) for a word without pieces."""
    out = [np.full(n, outside, dtype=np.int64) for n in windows.words]
    for w, predicted in enumerate(token_predictions):
        at = windows.word[w]
        keep = at >= 0
        out[int(windows.sentence[w])][at[keep]] = np.asarray(predicted)[keep]
    return out


# ---- a fine-tuning data set, ready for the loop ------------------------------------------------


@dataclass
class TaggingTaskData:
    """Training and validation sentences of a token-classification run, encoded for the model
    (what ``finetune`` reads of ``labelled.TaskData``, for tags)."""

    train: TaggedData
    val: TaggedData
    id2label: dict[int, str]
    """Tag names by id (``O`` first)."""
    train_windows: Windows
    val_windows: Windows
    val_tags: list[np.ndarray]
    """The validation tags as ids, per sentence."""
    warnings: list[str]
    """What was changed or split while reading, said once."""
    scale: None = None

    @property
    def encoded_train(self) -> list[tuple[np.ndarray, int]]:
        return self.train_windows.encoded

    @property
    def encoded_val(self) -> list[tuple[np.ndarray, int]]:
        return self.val_windows.encoded

    def batch_labels(self, rows: Sequence[int], length: int) -> torch.Tensor:
        """(B, length) labels of training windows ``rows``."""
        return self.train_windows.batch_labels(rows, length)

    def labelled(self, rows: Sequence[int]) -> list[int]:
        """The labelled positions of each training window of ``rows``: the loss is a mean over
        them, so they weigh a micro-batch's share of its batch."""
        labels = self.train_windows.labels
        assert labels is not None
        return [int((labels[int(i)] != IGNORE).sum()) for i in rows]


def _split_note(source: str, windows: Windows, max_length: int) -> list[str]:
    counts = np.bincount(windows.sentence, minlength=len(windows.words))
    long = int((counts > 1).sum())
    if not long:
        return []
    return [
        f"{source}: {long:,} sentence{'s' * (long > 1)} longer than --max_length {max_length} "
        f"split into {int(counts[counts > 1].sum()):,} windows at word boundaries (each word "
        "is predicted once)"
    ]


def load_tagging_data(
    tokenizer: Any,
    train_paths: Sequence[str | Path],
    validation_paths: Sequence[str | Path] | None,
    *,
    validation_fraction: float,
    seed: int,
    max_length: int,
    label_all_tokens: bool = False,
    encoding_errors: str = "strict",
) -> TaggingTaskData:
    """Read, split and encode a token-classification data set. Without ``validation_paths`` a
    random ``validation_fraction`` of the training sentences is held out (a pure function of
    ``seed``); a validation tag that training lacks is an error naming its file:line."""
    train = read_tagged(train_paths, encoding_errors=encoding_errors)
    id2label = build_tag_map(train.tags or [])
    if len(id2label) < 2:
        raise BertforgeError(
            f"{train_paths[0]}: every token has the tag {id2label.get(0, 'O')!r}; token "
            "classification needs at least two tags"
        )
    if validation_paths:
        val = read_tagged(validation_paths, encoding_errors=encoding_errors)
    else:
        train_rows, val_rows = random_split(len(train), validation_fraction, seed, "sentences")
        val, train = train.subset(val_rows), train.subset(train_rows)
    label2id = {v: k for k, v in id2label.items()}
    encode = dict(max_length=max_length, label_all_tokens=label_all_tokens, id2label=id2label)
    train_windows = encode_tagged(tokenizer, train.words, tag_ids(train, label2id), **encode)
    val_tags = tag_ids(val, label2id)
    val_windows = encode_tagged(tokenizer, val.words, val_tags, **encode)
    warnings = train.notes + (val.notes if validation_paths else [])
    warnings += _split_note("training", train_windows, max_length)
    warnings += _split_note("validation", val_windows, max_length)
    return TaggingTaskData(train, val, id2label, train_windows, val_windows, val_tags, warnings)


__all__ = [
    "DOCSTART",
    "IGNORE",
    "TaggedData",
    "Windows",
    "build_tag_map",
    "check_tags",
    "encode_tagged",
    "TaggingTaskData",
    "load_tagging_data",
    "read_conll",
    "texts_to_tag",
    "read_tagged",
    "read_tagged_jsonl",
    "split_windows",
    "tag_ids",
    "word_pieces",
    "word_predictions",
]
