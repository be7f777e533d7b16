"""Files written whole or not at all, and JSON files read with errors that say what to do.

Every file bertforge writes goes through these helpers: a crash or a full disk leaves the
previous file (or nothing), never a half-written one, and new files get the umask's ordinary
mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError


# ---- atomic writes ----------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _ordinary_mode(base: int) -> int:
    """``base`` (0o666 for files, 0o777 for directories) masked by the process umask.

    ``mkstemp``/``mkdtemp`` create private (0600/0700) temporaries; what they become is an
    ordinary file or directory, so it gets the mode ``open``/``mkdir`` would have given it.
    """
    umask = os.umask(0)  # the only way to read the umask; restored at once
    os.umask(umask)
    return base & ~umask


def make_directory(path: str | Path) -> Path:
    """``mkdir -p path``; a file in the way is an error naming it, not a traceback."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise BertforgeError(
            f"{path}: a file is in the way of this directory; choose another output path "
            "or move the file"
        ) from None
    return path


def _writable_file(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise BertforgeError(f"{path}: is a directory; give a file name to write")
    make_directory(path.parent)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never half."""
    path = _writable_file(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _ordinary_mode(0o666))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds."""
    path = _writable_file(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # after the block: a writer may have replaced the file (safetensors writes 0600 files)
        os.chmod(tmp, _ordinary_mode(0o666))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``final`` only when the block completes.

    An interrupted block leaves at most a hidden ``.NAME.tmp-*`` directory, never a half-written
    ``final``. If ``final`` exists it is replaced (the old one is removed after the swap).
    """
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise BertforgeError(f"{final}: is a file, not a directory; choose another output path")
    make_directory(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        os.chmod(tmp, _ordinary_mode(0o777))
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """Read a file holding one JSON object; a damaged one raises one line naming it and ``fix``."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BertforgeError(f"{path}: not valid JSON ({err}); {fix}") from None
    if not isinstance(value, dict):
        raise BertforgeError(f"{path}: expected a JSON object, not {type(value).__name__}; {fix}")
    return value


__all__ = [
    "atomic_directory",
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_text",
    "make_directory",
    "read_json_object",
]
