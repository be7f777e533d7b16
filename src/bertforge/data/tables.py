"""Tables on disk: CSV/TSV (with a header row) and JSON-lines files, optionally compressed
(``.gz``, ``.bz2``, ``.xz``, ``.zst``), Parquet and Arrow files and ``datasets`` folders
(:mod:`bertforge.data.columnar`), read into rows and columns, and the plain-text inputs of the
inference commands. ``labelled`` builds labelled data sets from these; ``corpus`` streams JSON
lines through :func:`jsonl_rows` too. :func:`iter_texts` streams the texts of any of them.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bertforge.data.columnar import column_batches, column_names, is_columnar, read_rows
from bertforge.errors import BertforgeError
from bertforge.io import plain_name, text_lines

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".ndjson")
BR_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)


def table_format(path: str | Path) -> str:
    """``csv``, ``tsv``, ``jsonl`` or ``columnar`` (Parquet, Arrow, a ``datasets`` folder) from a
    file name (a compression suffix is ignored)."""
    if is_columnar(path) or Path(path).is_dir():  # a folder: of Parquet files, or an error
        return "columnar"
    name = plain_name(path)
    for suffix in TABLE_SUFFIXES:
        if name.endswith(suffix):
            return {"json": "jsonl", "ndjson": "jsonl"}.get(suffix[1:], suffix[1:])
    raise BertforgeError(
        f"{path}: unknown file type; use .csv, .tsv or .jsonl (each optionally .gz, .bz2, .xz or "
        ".zst), .parquet, or a datasets save_to_disk folder"
    )


def jsonl_rows(lines: Iterable[str], path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a JSON-lines file; a line that is not
    JSON is an error naming the file and line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise BertforgeError(
                f"{path}:{number}: not valid JSON ({err.msg}); fix the line"
            ) from None
        yield number, value


def _csv_rows(
    f: Any, path: Path, delimiter: str
) -> tuple[list[str], list[dict[str, Any]], list[int]]:
    """Header, rows and each row's first line of a CSV/TSV file. A row with more or fewer fields
    than the header, or a quote that is never closed, is an error naming the file and line."""
    reader = csv.reader(f, delimiter=delimiter, strict=True)
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    start = 1
    try:
        header = next(reader, None) or []
        start = reader.line_num + 1
        for fields in reader:
            if fields:  # a blank line is no row
                if len(fields) != len(header):
                    raise BertforgeError(
                        f"{path}:{start}: {len(fields)} field{'s' * (len(fields) != 1)} where the "
                        f"header has {len(header)}; fix the row (a text holding {delimiter!r} "
                        "must be quoted)"
                    )
                rows.append(dict(zip(header, fields, strict=True)))
                lines.append(start)
            start = reader.line_num + 1
    except csv.Error as err:
        if "end of data" in str(err):
            raise BertforgeError(
                f"{path}:{start}: a quoted field opened here is never closed; close the quote, "
                'or write a quote inside a quoted field as ""'
            ) from None
        raise BertforgeError(
            f"{path}:{start}: broken quoting ({err}); quote the whole field and write a quote "
            'inside it as ""'
        ) from None
    return header, rows, lines


def read_table_lines(
    path: str | Path, encoding_errors: str = "strict"
) -> tuple[list[str], list[dict[str, Any]], list[int]]:
    """Column names, rows (dicts) and the line each row starts on, of one CSV/TSV (with a header
    row) or JSON-lines file, read by :func:`bertforge.io.text_lines` (a BOM dropped, bytes that
    are not UTF-8 named by line unless ``encoding_errors="replace"``)."""
    path = Path(path)
    fmt = table_format(path)
    if fmt == "columnar":
        return _columnar_table(path, None)
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file")
    with contextlib.closing(text_lines(path, encoding_errors)) as f:
        if fmt == "jsonl":
            rows, lines, columns = [], [], {}
            for n, row in jsonl_rows(f, path):
                if not isinstance(row, dict):
                    raise BertforgeError(f"{path}:{n}: not a JSON object; write one per line")
                rows.append(row)
                lines.append(n)
                columns.update(dict.fromkeys(row))
            column_names = list(columns)
        else:
            column_names, rows, lines = _csv_rows(f, path, "\t" if fmt == "tsv" else ",")
    if not rows:
        raise BertforgeError(f"{path}: the file is empty (no data rows); give a file with examples")
    return column_names, rows, lines


def _columnar_table(
    path: Path, columns: Sequence[str | None] | None, text: Sequence[str | None] = ()
) -> tuple[list[str], list[dict[str, Any]], list[int]]:
    """:func:`read_table_lines` of a Parquet/Arrow table: ``columns`` only (None: all), each row
    numbered from 1; a missing column, or a ``text`` one that holds no strings, is an error."""
    from_columns = [c for c in columns if c is not None] if columns is not None else None
    wanted = from_columns if from_columns is not None else column_names(path)
    names, rows = read_rows(path, wanted, text=[c for c in text if c is not None])
    if not rows:
        raise BertforgeError(f"{path}: the table is empty (no rows); give a file with examples")
    return names, rows, list(range(1, len(rows) + 1))


def read_table(path: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Column names and rows (dicts) of one CSV/TSV (with a header row) or JSON-lines file."""
    names, rows, _ = read_table_lines(path)
    return names, rows


def clean_text(text: Any) -> str:
    """The cell as a string, HTML line breaks (``<br />``, as in IMDB) turned into spaces."""
    if text is None:
        return ""
    return BR_TAG.sub(" ", str(text))


def read_columns(
    paths: str | Path | Sequence[str | Path],
    columns: Sequence[str | None],
    encoding_errors: str = "strict",
    *,
    text: Sequence[str | None] = (),
) -> list[list[Any]]:
    """Read the named columns of one or more files (rows concatenated in order).

    ``None`` entries in ``columns`` are skipped (returned as an empty list). A missing column is
    an error that lists the columns the file has; so is a JSON-lines row without one of them.
    Of a Parquet/Arrow table only ``columns`` are read, and a column named in ``text`` must
    hold strings.
    """
    return read_columns_lines(paths, columns, encoding_errors, text=text)[0]


def read_columns_lines(
    paths: str | Path | Sequence[str | Path],
    columns: Sequence[str | None],
    encoding_errors: str = "strict",
    *,
    text: Sequence[str | None] = (),
) -> tuple[list[list[Any]], list[str]]:
    """:func:`read_columns` and, per row, where it is (``file:line``, ``file:row N`` in a
    Parquet/Arrow table) for messages."""
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise BertforgeError("no data file given")
    out: list[list[Any]] = [[] for _ in columns]
    where: list[str] = []
    for path in paths:
        columnar = table_format(path) == "columnar"
        if columnar:
            names, rows, lines = _columnar_table(Path(path), columns, text)
        else:
            names, rows, lines = read_table_lines(path, encoding_errors)
        for col in columns:
            if col is not None and col not in names:
                raise BertforgeError(
                    f"{path}: no column {col!r}; the file has columns {', '.join(map(repr, names))}"
                )
        for row, line in zip(rows, lines, strict=True):
            for col in columns:
                if col is not None and col not in row:  # a JSON line without the key
                    raise BertforgeError(
                        f"{path}:{line}: no {col!r} in this row; give every row the key"
                    )
        for i, col in enumerate(columns):
            if col is not None:
                out[i].extend(row[col] for row in rows)
        where += [f"{path}:{'row ' * columnar}{line}" for line in lines]
    return out, where


class Texts(NamedTuple):
    """What :func:`read_texts` found: the texts, their pairs (None without a pair column) and the
    (1-based) numbers of the blank lines a plain-text file had, which hold no text and are left
    out, so a caller whose output rows follow the input lines can say so."""

    texts: list[str]
    pairs: list[str] | None
    blank_lines: list[int]


def read_texts(
    path: str | Path,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    encoding_errors: str = "strict",
) -> Texts:
    """Texts of an input file: a column of a CSV/TSV/JSONL file, or the non-empty lines of any
    other (plain-text) file."""
    path = Path(path)
    try:
        table_format(path)
        is_table = True
    except BertforgeError:
        is_table = False
    if not is_table:
        if text_pair_column:
            raise BertforgeError(
                f"{path}: a plain-text file holds one text per line, but text pairs need a .csv, "
                f".tsv or .jsonl file with columns {text_column or 'text'!r} and "
                f"{text_pair_column!r}"
            )
        if not path.is_file():
            raise BertforgeError(f"{path}: no such file")
        texts, blank = [], []
        for number, line in enumerate(text_lines(path, encoding_errors), start=1):
            if line.strip():
                texts.append(clean_text(line.rstrip("\r\n")))
            else:
                blank.append(number)
        if not texts:
            raise BertforgeError(f"{path}: the file is empty (no non-blank line)")
        return Texts(texts, None, blank)
    columns = [text_column or "text", text_pair_column]
    texts, pairs = read_columns(path, columns, encoding_errors, text=columns)
    return Texts(
        [clean_text(t) for t in texts],
        [clean_text(t) for t in pairs] if text_pair_column else None,
        [],
    )


def iter_texts(
    paths: str | Path | Sequence[str | Path],
    text_column: str | None = None,
    encoding_errors: str = "strict",
) -> Iterator[str]:
    """The texts of input files, streamed (memory does not grow with the files; what a command
    reading a large unlabelled corpus, such as ``distill``, calls): ``text_column`` (default
    ``text``) of CSV/TSV/JSONL files and of Parquet/Arrow tables and ``datasets`` folders (read
    in record batches), or each line of any other (plain-text) file; compressed files as they
    stream. HTML line breaks become spaces; blank texts are skipped. A missing column is an error
    naming the columns the file has."""
    column = text_column or "text"
    fix = "pass --text_column with one of them"
    for path in [paths] if isinstance(paths, str | Path) else paths:
        path = Path(path)
        try:
            fmt = table_format(path)
        except BertforgeError:
            fmt = "lines"
        if fmt == "columnar":
            values: Iterable[Any] = (
                v for b in column_batches(path, [column], text=[column], fix=fix) for v in b[column]
            )
        elif not path.is_file():
            raise BertforgeError(f"{path}: no such file")
        elif fmt == "lines":
            values = (line.rstrip("\r\n") for line in text_lines(path, encoding_errors))
        elif fmt == "jsonl":
            values = _jsonl_cells(path, column, encoding_errors)
        else:
            values = _csv_cells(path, column, "\t" if fmt == "tsv" else ",", encoding_errors)
        for value in values:
            if value is not None and str(value).strip():
                yield clean_text(value)


def _jsonl_cells(path: Path, column: str, encoding_errors: str) -> Iterator[Any]:
    for number, row in jsonl_rows(text_lines(path, encoding_errors), path):
        if not isinstance(row, dict) or column not in row:
            keys = sorted(row) if isinstance(row, dict) else []
            raise BertforgeError(
                f"{path}:{number}: no {column!r} in this row (its keys: {keys}); pass "
                "--text_column with one of them"
            )
        yield row[column]


def _csv_cells(path: Path, column: str, delimiter: str, encoding_errors: str) -> Iterator[str]:
    reader = csv.reader(text_lines(path, encoding_errors), delimiter=delimiter)
    try:
        header = next(reader, None) or []
        if column not in header:
            raise BertforgeError(
                f"{path}: no column {column!r}; the file has columns "
                f"{', '.join(map(repr, header))}; pass --text_column with one of them"
            )
        index = header.index(column)
        for fields in reader:
            if len(fields) > index:
                yield fields[index]
    except csv.Error as err:
        raise BertforgeError(f"{path}:{reader.line_num}: broken quoting ({err})") from None


__all__ = [
    "TABLE_SUFFIXES",
    "Texts",
    "clean_text",
    "iter_texts",
    "jsonl_rows",
    "read_columns",
    "read_columns_lines",
    "read_table",
    "read_table_lines",
    "read_texts",
    "table_format",
]
