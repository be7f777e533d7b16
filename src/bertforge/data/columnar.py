"""Columnar tables: Parquet files (and folders of them), Arrow files, and the folders that
``datasets.Dataset.save_to_disk`` writes, read with pyarrow (the optional extra
``bertforge[parquet]``) in record batches: a Parquet file one row group after the other, in
batches of about 8 MB, its pages streamed, and only the columns asked for; an Arrow file one
record batch (as written) at a time. Memory does not grow with the file, nor with its row groups.

One row is one example (one document of a corpus, one row of a labelled table), as a CSV row
or a JSON line is. ``corpus`` and ``tables`` read these through :func:`column_batches` and
:func:`read_rows`; nothing here knows about documents or labels.

A ``save_to_disk`` folder holds ``dataset_info.json``, ``state.json`` (whose ``_data_files``
names its ``data-*-of-*.arrow`` files, in order) and those files, in Arrow's streaming format. A
``DatasetDict`` folder (``dataset_dict.json`` and one such folder per split) is refused with the
split folders to pass instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import read_json_object

PARQUET_SUFFIXES = (".parquet", ".pq")
"""File names read as Parquet."""
ARROW_SUFFIXES = (".arrow",)
"""File names read as Arrow (streaming or file format: ``datasets`` writes the first)."""
PARQUET_EXTRA = "pip install 'bertforge[parquet]'"
"""How to get what reads Parquet and Arrow."""
BATCH_ROWS = 4096
"""At most this many rows per record batch read from a Parquet row group."""
BATCH_BYTES = 8 << 20
"""About this many (uncompressed) bytes per record batch read from a Parquet row group: rows of
whole articles or books are long, and pyarrow's batches count rows, filling one from as many
row groups as it takes (4,096 Wikipedia articles are some 70 MB)."""
READ_BUFFER = 1 << 20
"""Bytes of a Parquet column chunk read at a time."""
_STRING_TYPES = ("string", "large_string", "string_view")


def is_dataset_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder ``datasets.Dataset.save_to_disk`` wrote (its ``state.json``)."""
    return (Path(path) / "state.json").is_file()


def saved_by_datasets(path: str | Path) -> bool:
    """Whether ``path`` is a folder ``datasets`` wrote: one data set (``state.json``) or a
    ``DatasetDict`` of them (``dataset_dict.json``; :func:`columnar_parts` refuses it, naming its
    splits). Either is one input, never a folder of files to walk."""
    path = Path(path)
    return path.is_dir() and (is_dataset_folder(path) or (path / "dataset_dict.json").is_file())


def is_table_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder the table readers take as one table: one ``datasets`` wrote
    (:func:`saved_by_datasets`) or one holding Parquet files (the Hub's ``data/`` layout)."""
    path = Path(path)
    if not path.is_dir():
        return False
    return saved_by_datasets(path) or any(
        q.name.lower().endswith(PARQUET_SUFFIXES) for q in path.rglob("*")
    )


def is_columnar(path: str | Path) -> bool:
    """Whether ``path`` is read here: a ``.parquet``/``.pq``/``.arrow`` file or a
    ``save_to_disk`` folder."""
    path = Path(path)
    return path.name.lower().endswith(PARQUET_SUFFIXES + ARROW_SUFFIXES) or is_dataset_folder(path)


def columnar_parts(path: str | Path) -> list[Path]:
    """The files holding the rows of ``path``, in row order: the file itself; a ``save_to_disk``
    folder's Arrow files (as its ``state.json`` lists them); or the Parquet files under a folder,
    sorted (the Hub's ``data/train-00000-of-00004.parquet`` layout). A folder that is none of
    these is an error saying what it holds and what to pass."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BertforgeError(f"{path}: no such file or directory")
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if is_dataset_folder(p))
        raise BertforgeError(
            f"{path}: a DatasetDict of the splits {splits}, not one data set; pass one split's "
            f"folder (e.g. {path / (splits[0] if splits else 'train')})"
        )
    if is_dataset_folder(path):
        return _dataset_files(path)
    found = sorted(p for p in path.rglob("*") if p.name.lower().endswith(PARQUET_SUFFIXES))
    if not found:
        raise BertforgeError(
            f"{path}: not a data set folder (no state.json as datasets' save_to_disk writes, no "
            f"{'/'.join(PARQUET_SUFFIXES)} file under it); pass such a folder or the files"
        )
    return found


def _dataset_files(folder: Path) -> list[Path]:
    fix = "save the data set again with datasets' Dataset.save_to_disk"
    state = read_json_object(folder / "state.json", fix)
    entries = state.get("_data_files")
    names = [e.get("filename") for e in entries if isinstance(e, dict)] if entries else []
    if not names or not all(isinstance(n, str) for n in names):
        raise BertforgeError(f"{folder / 'state.json'}: no _data_files list of Arrow files; {fix}")
    files = [folder / n for n in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise BertforgeError(
            f"{folder}: state.json lists {', '.join(missing)}, which the folder lacks; copy the "
            f"whole folder, or {fix}"
        )
    return files


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet  # noqa: F401 (imported for pyarrow.parquet below)
    except ImportError:
        raise BertforgeError(
            f"{path}: reading Parquet and Arrow data needs pyarrow; {PARQUET_EXTRA}"
        ) from None
    return pyarrow


def _open(path: Path, pa: Any) -> tuple[Any, Iterator[Any]]:
    """(schema, record batches) of one Parquet or Arrow file, read lazily."""
    if path.name.lower().endswith(PARQUET_SUFFIXES):
        # buffered: a column chunk's pages stream (unbuffered, pyarrow reads a row group's whole
        # chunk first, as it does when pre-buffering: one written as one row group is read whole)
        parquet = pa.parquet.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)
        return parquet.schema_arrow, parquet
    source = pa.OSFile(str(path))  # plain reads, not a memory map: RSS stays one batch
    try:
        stream = pa.ipc.open_stream(source)
        return stream.schema, stream
    except pa.ArrowInvalid:  # not the streaming format: Arrow's file format (random access)
        source.seek(0)
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))


def column_names(path: str | Path) -> list[str]:
    """The columns of a Parquet/Arrow file or data set folder (of its first file)."""
    path = Path(path)
    pa = _pyarrow(path)
    first = columnar_parts(path)[0]
    with _read_errors(first, pa):
        schema, _ = _open(first, pa)
    return list(schema.names)


def column_batches(
    path: str | Path, columns: Sequence[str], *, text: Sequence[str] = (), fix: str = ""
) -> Iterator[dict[str, list[Any]]]:
    """The values of ``columns`` of every row of ``path`` (a file or folder, see
    :func:`columnar_parts`), one dict of lists per record batch, in row order. A missing column
    is an error naming the columns the file has (and ``fix``, e.g. "pass --text_column with one
    of them"); a column in ``text`` that does not hold strings is an error naming its type."""
    path = Path(path)
    pa = _pyarrow(path)
    for part in columnar_parts(path):
        with _read_errors(part, pa):
            schema, batches = _open(part, pa)
            _check_columns(part, pa, schema, columns, text, fix)
            if isinstance(batches, pa.parquet.ParquetFile):
                batches = _row_group_batches(batches, columns)
            for batch in batches:
                yield {c: batch.column(c).to_pylist() for c in columns}


def _row_group_batches(parquet: Any, columns: Sequence[str]) -> Iterator[Any]:
    """The record batches of a Parquet file, one row group after the other, each of about
    :data:`BATCH_BYTES` (at most :data:`BATCH_ROWS` rows, at least one)."""
    for index in range(parquet.metadata.num_row_groups):
        group = parquet.metadata.row_group(index)
        rows = group.num_rows * BATCH_BYTES // max(group.total_byte_size, 1)
        size = max(1, min(BATCH_ROWS, rows))
        yield from parquet.iter_batches(batch_size=size, row_groups=[index], columns=list(columns))


def read_rows(
    path: str | Path, columns: Sequence[str], *, text: Sequence[str] = (), fix: str = ""
) -> tuple[list[str], list[dict[str, Any]]]:
    """Every column name and every row (a dict of ``columns``) of ``path``: a labelled table
    read whole (:func:`column_batches` checks the columns)."""
    rows: list[dict[str, Any]] = []
    for batch in column_batches(path, columns, text=text, fix=fix):
        rows += [
            dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)
        ]
    return column_names(path), rows


def _check_columns(
    path: Path, pa: Any, schema: Any, columns: Sequence[str], text: Sequence[str], fix: str
) -> None:
    described = ", ".join(f"{f.name} ({f.type})" for f in schema)
    for column in columns:
        if column not in schema.names:
            raise BertforgeError(
                f"{path}: no column {column!r}; the columns are {described}"
                + (f"; {fix}" if fix else "")
            )
    for column in text:
        kind = schema.field(column).type
        value = kind.value_type if pa.types.is_dictionary(kind) else kind  # categorical strings
        if str(value) not in _STRING_TYPES:
            raise BertforgeError(
                f"{path}: column {column!r} holds {kind}, not text; the columns are {described}; "
                "pass --text_column naming a string column"
            )


@contextlib.contextmanager
def _read_errors(path: Path, pa: Any) -> Iterator[None]:
    """Turn pyarrow's errors on a damaged or foreign file into one line naming it."""
    try:
        yield
    except (pa.ArrowException, OSError) as err:
        what = "Parquet" if path.name.lower().endswith(PARQUET_SUFFIXES) else "Arrow"
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
        raise BertforgeError(
            f"{path}: cannot read it as {what} ({first}); check the file (truncated, or not "
            "this format?)"
        ) from None


__all__ = [
    "ARROW_SUFFIXES",
    "PARQUET_EXTRA",
    "PARQUET_SUFFIXES",
    "column_batches",
    "column_names",
    "columnar_parts",
    "is_columnar",
    "is_dataset_folder",
    "read_rows",
]
