"""Read text corpora into documents, each a list of sentences.

Formats (``format="auto"`` picks one per file, see :func:`detect_format`):

- ``text``: one sentence (or paragraph) per line, a blank line between documents — the layout
  Google's BERT expects. Every line goes through :func:`split_sentences`, so a line holding a
  whole paragraph becomes its sentences and a line holding one sentence stays one.
- ``lines``: one document per line (e.g. IMDB's ``unsup`` text); auto-detected for a text file
  with several lines and no blank line in its first 8 MiB (:data:`BLANK_LINE_SCAN`: a book of
  paragraph lines, as in ``../shared/data/general``, can run for megabytes before its first
  document ends).
- ``wikitext``: ``wiki.*.tokens`` files; a `` = Title = `` heading starts a document, section
  headings (`` = = Sub = = ``) are dropped, WikiText's ``@-@``, ``@,@``, ``@.@`` are undone
  and its ``<unk>`` becomes ``[UNK]`` (one unknown token).
- ``csv``, ``tsv``, ``jsonl``: one row is one document, taken from ``text_column`` (the lines
  of a multi-line cell are read as the lines of a ``text`` document are: paragraphs).
- ``parquet``, ``arrow``: the same, from a Parquet file (``.parquet``), an Arrow file
  (``.arrow``) or a folder ``datasets.Dataset.save_to_disk`` wrote, read in record batches
  (:mod:`bertforge.data.columnar`; pyarrow, ``bertforge[parquet]``). A string column must be
  named: ``text_column``.

Files may be compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``: read as they stream). Directories
expand to the corpus files under them (:data:`CORPUS_SUFFIXES`, optionally compressed; Parquet
files too) and globs to their matches, each in sorted order; a ``save_to_disk`` folder is one
input. HTML line breaks (``<br />``, as in IMDB) become spaces.
Undecodable bytes raise :class:`~bertforge.errors.BertforgeError` naming the file and byte
offset, unless ``encoding_errors="replace"``. Everything streams: memory does not grow with the
file size.
"""

from __future__ import annotations

import csv
import glob
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, get_args

from bertforge.data.columnar import (
    ARROW_SUFFIXES,
    PARQUET_SUFFIXES,
    column_batches,
    column_names,
    columnar_parts,
    saved_by_datasets,
)
from bertforge.data.tables import BR_TAG, jsonl_rows
from bertforge.errors import BertforgeError
from bertforge.io import COMPRESSED_SUFFIXES, READ_ERRORS, open_binary, plain_name, text_lines

Format = Literal["auto", "text", "lines", "wikitext", "csv", "tsv", "jsonl", "parquet", "arrow"]
"""How an input file is read (``auto``: from its name; see the module docstring)."""
FORMATS: tuple[str, ...] = get_args(Format)
EncodingErrors = Literal["strict", "replace"]
"""What a byte that is not UTF-8 does: stop with an error, or become U+FFFD."""
Document = list[str]
CORPUS_SUFFIXES = (".txt", ".text", ".tokens", ".raw", ".csv", ".tsv", ".jsonl", ".ndjson")
CORPUS_SUFFIXES += PARQUET_SUFFIXES
"""Files a directory input expands to (a README.md beside the data is not text to train on)."""

# Lower-cased words that end with a period without ending a sentence.
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx dept est fig figs inc ltd co
    corp no nos vol vols pp p ch sec gen col lt sgt capt cmdr adm gov sen rep rev hon pres jan feb
    mar apr jun jul aug sep sept oct nov dec u.s u.k u.n a.m p.m ph.d b.a m.a d.c op ed eds esp
    ca viz""".split()  # noqa: SIM905 (a word list reads better as text)
)
_SPACES = re.compile(r"\s+")
# A candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace, then
# something that can open a sentence (optional opening quote/bracket, then a capital or a digit).
_BOUNDARY = re.compile(r"([.!?]+)([\"'”’)\]]*)\s+(?=[\"'“‘(\[]*[A-Z0-9])")
_ACRONYM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
_WIKI_TITLE = re.compile(r"^ ?= [^=].* = ?$")
_WIKI_HEADING = re.compile(r"^ ?(= )+.*( =)+ ?$")
_WIKI_JOINERS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def clean_text(text: str) -> str:
    """Replace HTML line breaks by spaces and collapse whitespace."""
    return _SPACES.sub(" ", BR_TAG.sub(" ", text)).strip()


def _ends_sentence(before: str, punct: str) -> bool:
    """Whether ``before`` + ``punct`` (text up to a candidate boundary) really ends a sentence."""
    if punct != ".":  # "!", "?", "..." and mixes end sentences
        return True
    words = before[-40:].split()
    if not words:
        return True
    word = words[-1].lstrip("\"'“‘([")
    if not word:
        return True
    if word.lower() in ABBREVIATIONS:
        return False
    # Initials ("J. R. R. Tolkien") and dotted acronyms ("U.S.A") do not end a sentence.
    is_initial = len(word) == 1 and word.isupper()
    return not is_initial and _ACRONYM.fullmatch(word) is None


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences with rules for abbreviations, initials, decimals, quotes.

    A sentence ends at ``.``, ``!`` or ``?`` (plus closing quotes or brackets) followed by
    whitespace and a capital letter or digit, unless the period belongs to a known abbreviation
    ("Dr.", "e.g.") or an initial ("J."). Decimals ("3.14") never split: no whitespace follows.
    """
    text = clean_text(text)
    if not text:
        return []
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if _ends_sentence(text[start : match.start()], match.group(1)):
            sentence = text[start : match.end()].strip()
            if sentence:
                sentences.append(sentence)
            start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _is_corpus_file(path: Path) -> bool:
    name = plain_name(path)
    return not name.startswith(".") and Path(name).suffix in CORPUS_SUFFIXES


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Expand files, directories (recursively) and globs into a stable, sorted list of files; a
    folder ``datasets``' ``save_to_disk`` wrote stays one input (its ``state.json`` orders its
    files), and a ``DatasetDict`` folder is refused naming its splits."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if saved_by_datasets(path):
            columnar_parts(path)  # the folder's own errors: a DatasetDict, a missing file
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_corpus_file(p))
            if not found:
                raise BertforgeError(
                    f"{path}: directory holds no corpus file ({', '.join(CORPUS_SUFFIXES)}, "
                    f"optionally {', '.join(COMPRESSED_SUFFIXES)}) and is no datasets folder "
                    "(no state.json); pass files to --input"
                )
            files += found
        elif path.is_file():
            files.append(path)
        elif glob.has_magic(str(item)):
            found = sorted(
                Path(p) for p in glob.glob(str(item), recursive=True) if Path(p).is_file()
            )
            if not found:
                raise BertforgeError(f"{item}: the pattern matches no file; check --input")
            files += found
        else:
            raise BertforgeError(f"{item}: no such file or directory; check --input")
    if not files:
        raise BertforgeError("no input files given; pass at least one --input")
    return files


def iter_lines(path: Path, encoding_errors: str = "strict") -> Iterator[str]:
    """Decoded lines of a (possibly compressed) file, newline kept (:func:`bertforge.io.text_lines`:
    a BOM dropped, bytes that are not UTF-8 named by file and line)."""
    return text_lines(path, encoding_errors)


BLANK_LINE_SCAN = 8 << 20
"""Bytes of a text file :func:`detect_format` reads looking for a blank line (a document end)."""


def detect_format(path: Path) -> str:
    """Guess a file's format from its name and, for text, its first lines: ``wikitext`` for a
    `` = Title = `` first line, ``lines`` for several lines and no blank one in the first
    :data:`BLANK_LINE_SCAN` bytes, else ``text``."""
    if path.is_dir() or path.name.lower().endswith(ARROW_SUFFIXES):
        return "arrow"  # a save_to_disk folder (checked by the reader) or an Arrow file
    name = plain_name(path)
    formats = (("csv", (".csv",)), ("tsv", (".tsv",)), ("jsonl", (".jsonl", ".ndjson")))
    for fmt, suffixes in (*formats, ("parquet", PARQUET_SUFFIXES)):
        if name.endswith(suffixes):
            return fmt
    if name.endswith(".tokens"):
        return "wikitext"
    try:
        with open_binary(path) as fh:
            first, count, blank, read = "", 0, False, 0
            while read < BLANK_LINE_SCAN and not (blank and first):
                # lines end at "\n" only, as the reader splits them (not at \x85, \u2028, ...)
                raw = fh.readline(BLANK_LINE_SCAN - read)
                read += len(raw)
                if not raw.endswith(b"\n"):
                    break  # the file's last line, or one cut by the scan: not counted
                count += 1
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
                if not text.strip():
                    blank = True
                elif not first:
                    first = text
    except READ_ERRORS as err:  # a truncated or corrupt archive
        raise BertforgeError(f"{path}: cannot read the file ({err}); check it") from None
    if _WIKI_TITLE.match(first):
        return "wikitext"
    if count >= 3 and not blank:
        return "lines"
    return "text"


def _text_documents(lines: Iterator[str]) -> Iterator[Document]:
    doc: Document = []
    for line in lines:
        if line.strip():
            doc += split_sentences(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _wikitext_documents(lines: Iterator[str]) -> Iterator[Document]:
    doc: Document = []
    for line in lines:
        line = line.rstrip("\n")
        if _WIKI_TITLE.match(line):
            if doc:
                yield doc
            doc = []
        elif _WIKI_HEADING.match(line) or not line.strip():
            continue
        else:
            for old, new in _WIKI_JOINERS:
                line = line.replace(old, new)
            # WikiText writes out-of-vocabulary words as <unk>: one [UNK] token, not "< unk >"
            line = line.replace("<unk>", "[UNK]")
            doc += split_sentences(line)
    if doc:
        yield doc


def _cell_document(cell: object) -> Document:
    """A cell's document: its lines (split at ``\n`` only, as a file's are) are paragraphs."""
    text = "" if cell is None else str(cell)
    return [s for paragraph in text.split("\n") for s in split_sentences(paragraph)]


def _columnar_documents(path: Path, text_column: str | None) -> Iterator[Document]:
    if text_column is None:
        raise BertforgeError(
            f"{path}: a table needs --text_column; the columns are {column_names(path)}; pass "
            "--text_column with one of them"
        )
    fix = "pass --text_column with one of them"
    for batch in column_batches(path, [text_column], text=[text_column], fix=fix):
        for cell in batch[text_column]:
            yield _cell_document(cell)


def _table_documents(
    path: Path, lines: Iterator[str], fmt: str, text_column: str | None
) -> Iterator[Document]:
    if fmt == "jsonl":
        for number, row in jsonl_rows(lines, path):
            if isinstance(row, str) and text_column is None:
                yield _cell_document(row)
                continue
            if not isinstance(row, dict) or text_column is None or text_column not in row:
                keys = sorted(row) if isinstance(row, dict) else []
                raise BertforgeError(
                    f"{path}:{number}: no text column {text_column!r}; the keys are {keys}; "
                    "pass --text_column with one of them"
                )
            yield _cell_document(row[text_column])
        return
    reader = csv.reader(lines, delimiter="\t" if fmt == "tsv" else ",")
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as err:
        raise BertforgeError(f"{path}: cannot parse the header as {fmt.upper()} ({err})") from None
    if text_column is None or text_column not in header:
        what = f"no column {text_column!r}" if text_column else "a table needs --text_column"
        raise BertforgeError(
            f"{path}: {what}; the columns are {header}; pass --text_column with one of them"
        )
    column = header.index(text_column)
    try:
        for row in reader:
            if len(row) > column:
                yield _cell_document(row[column])
    except csv.Error as err:
        raise BertforgeError(
            f"{path}: line {reader.line_num}: malformed {fmt.upper()} ({err})"
        ) from None


def read_documents(
    path: str | Path,
    *,
    format: str = "auto",
    text_column: str | None = None,
    encoding_errors: str = "strict",
) -> Iterator[Document]:
    """Stream the documents of one file; each is a list of non-empty sentences (may be empty)."""
    path = Path(path)
    if format not in FORMATS:
        raise BertforgeError(f"format {format!r} is unknown; choose one of {', '.join(FORMATS)}")
    if encoding_errors not in ("strict", "replace"):
        raise BertforgeError(f"--encoding_errors {encoding_errors!r}: choose strict or replace")
    if not path.is_file() and not (path.is_dir() and format in ("auto", "arrow", "parquet")):
        raise BertforgeError(f"{path}: no such file; check --input")
    fmt = detect_format(path) if format == "auto" else format
    if fmt in ("parquet", "arrow"):
        yield from _columnar_documents(path, text_column)
        return
    lines = iter_lines(path, encoding_errors)
    if fmt in ("csv", "tsv", "jsonl"):
        yield from _table_documents(path, lines, fmt, text_column)
    elif fmt == "wikitext":
        yield from _wikitext_documents(lines)
    elif fmt == "lines":
        for line in lines:
            if line.strip():
                yield split_sentences(line)
    else:
        yield from _text_documents(lines)


def iter_documents(
    inputs: Iterable[str | Path],
    *,
    format: str = "auto",
    text_column: str | None = None,
    encoding_errors: str = "strict",
) -> Iterator[Document]:
    """Stream the documents of every input (files, directories, globs) in a stable order."""
    for path in expand_inputs(inputs):
        yield from read_documents(
            path, format=format, text_column=text_column, encoding_errors=encoding_errors
        )
