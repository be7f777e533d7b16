"""Files written whole or not at all, integrity manifests, the one-writer lock of an output
directory, and text and JSON files read with errors that say what to do.

Every file bertforge writes goes through these helpers: a crash or a full disk leaves the
previous file (or nothing), never a half-written one, and new files get the umask's ordinary
mode. A directory bertforge writes (model, checkpoint, prepared data) ends with
``manifest.json``: the size and SHA-256 of each file, written last, so a reader can tell an
intact directory from an altered or partly copied one (see :func:`check_manifest`).
"""

from __future__ import annotations

import bz2
import contextlib
import contextvars
import ctypes
import errno
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from bertforge.errors import BertforgeError

# ---- failed writes and the fault-test hook -----------------------------------------------------
_WRITE_FIXES = {
    errno.ENOSPC: "free some space or choose another output directory",
    errno.EDQUOT: "free some space (disk quota) or choose another output directory",
    errno.EFBIG: "the file is larger than this file system or process allows; choose another "
    "output directory",
    errno.EROFS: "the file system is read-only; choose another output directory",
    errno.EACCES: "no permission to write there; make it writable or choose another output "
    "directory",
    errno.EPERM: "no permission to write there; make it writable or choose another output "
    "directory",
}


def write_error(path: str | Path, code: int) -> BertforgeError:
    """The one-line error for a write to ``path`` that failed with ``errno`` ``code``."""
    fix = _WRITE_FIXES.get(code, "check the disk and choose another output directory")
    return BertforgeError(f"{path}: cannot write ({os.strerror(code)}); {fix}")


_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


@contextlib.contextmanager
def writing(path: str | Path, codes: Iterable[int] = tuple(_WRITE_FIXES)) -> Iterator[None]:
    """Turn a write that fails for a reason of the disk (full, read-only, forbidden: errno in
    ``codes``) into one line naming ``path`` and the fix, instead of a traceback."""
    try:
        yield
    except OSError as err:
        if err.errno in codes:
            raise write_error(path, err.errno) from None
        raise


PAUSE_ENV = "BERTFORGE_TEST_PAUSE"
_arrivals: dict[str, int] = {}


def pause_point(stage: str) -> None:
    """A hook for fault tests, inert unless ``BERTFORGE_TEST_PAUSE=STAGE:N:MARKER`` is set: the
    N-th time this process reaches ``stage`` it creates the file MARKER and waits until MARKER
    is deleted, so a test can kill it, fill its disk or make its directory read-only exactly
    there. Stages: ``weights`` (weights written, rest of the model not yet), ``manifest`` (all
    files written, manifest not yet), ``swap`` (a directory complete, not yet renamed into place),
    ``rotate`` (a checkpoint in place, older ones not yet deleted), ``serve-ready`` (``bertforge
    serve``'s models loaded and warmed, /health not yet 200), ``serve-loaded`` (its models
    loaded, not yet warmed), ``serve-warm-pass`` (a pass of its warm-up done)."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    name, count, marker = spec.split(":", 2)
    if name != stage:
        return
    _arrivals[stage] = _arrivals.get(stage, 0) + 1
    if _arrivals[stage] != int(count):
        return
    Path(marker).write_text(str(os.getpid()))
    while Path(marker).exists():
        time.sleep(0.01)


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
        with writing(path):
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
    with writing(path):
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
    with writing(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with writing(path):
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
def atomic_directory(final: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``final`` only when the block completes.

    An interrupted block leaves at most a hidden ``.NAME.tmp-*`` directory, never a half-written
    ``final``. If ``final`` exists it is replaced: on Linux the two are exchanged in one atomic
    step (``renameat2(RENAME_EXCHANGE)``), so a crash leaves the old or the new directory, never
    neither; elsewhere the old one is renamed aside first. With ``replace=False`` a ``final``
    that appeared while the block ran (another process's) is kept and this one is an error.
    """
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise BertforgeError(f"{final}: is a file, not a directory; choose another output path")
    make_directory(final.parent)
    with writing(final.parent):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        with writing(final, _DISK_ERRORS):  # the block may read files: no EACCES here
            os.chmod(tmp, _ordinary_mode(0o777))
            yield tmp
        with writing(final):
            for f in tmp.rglob("*"):
                if f.is_file():
                    with open(f, "rb+") as fh:
                        os.fsync(fh.fileno())
            pause_point("swap")
            if not final.exists():
                os.rename(tmp, final)
            elif not replace:
                raise BertforgeError(
                    f"{final}: appeared while this one was being written (another process?); "
                    "kept it and discarded this one: choose another output, or --overwrite"
                )
            elif not _exchange(tmp, final):  # tmp now holds the old directory, removed below
                old = final.parent / f".{final.name}.old-{os.getpid()}"
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``); False where the
    system or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


# ---- integrity manifests ----------------------------------------------------------------------
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "bertforge-manifest-1"
_digests: dict[tuple[Any, ...], str] = {}  # (path, identity of the file's bytes) -> SHA-256


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks (~1 GB/s with SHA instructions). Remembered per
    process while the file's inode, size and times are unchanged, so a file hashed when written
    is not hashed again when the same process verifies it."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        if len(_digests) > 4096:
            _digests.clear()
        _digests[key] = digest.hexdigest()
    return _digests[key]


def _listed_files(directory: Path) -> list[str]:
    """Every file under ``directory`` except the manifest and hidden files (temporaries, locks)."""
    names = []
    for path in directory.rglob("*"):
        rel = path.relative_to(directory)
        hidden = any(part.startswith(".") for part in rel.parts)
        if path.is_file() and path.name != MANIFEST_NAME and not hidden:
            names.append(rel.as_posix())
    return sorted(names)


def write_manifest(directory: str | Path, names: Iterable[str] | None = None) -> Path:
    """Record the size and SHA-256 of ``names`` (relative paths; default: every file under
    ``directory``) in ``directory/manifest.json``, written atomically and last: a directory
    whose writing was interrupted has no manifest that vouches for it."""
    directory = Path(directory)
    names = _listed_files(directory) if names is None else sorted(set(names))
    files = {}
    for name in names:
        path = directory / name
        files[name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    pause_point("manifest")
    record = {"format": MANIFEST_FORMAT, "files": files}
    return atomic_write_text(directory / MANIFEST_NAME, json.dumps(record, indent=1) + "\n")


def remove_manifest(directory: str | Path) -> None:
    """Delete the manifest before rewriting files in place (it is rewritten when they are done)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(directory) / MANIFEST_NAME)


def read_manifest(directory: str | Path) -> dict[str, dict[str, Any]] | None:
    """The files a bertforge manifest records (name -> size, sha256); None when ``directory`` has
    none (written by another tool) or its ``manifest.json`` is another tool's."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return None
    damaged = f"{path}: damaged integrity manifest (%s); restore the directory from a good copy"
    try:
        record = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise BertforgeError(damaged % f"not JSON: {err}") from None
    if not isinstance(record, dict) or record.get("format") != MANIFEST_FORMAT:
        return None
    files = record.get("files")
    ok = isinstance(files, dict)
    for name, entry in files.items() if ok else ():
        ok = ok and isinstance(entry, dict) and isinstance(entry.get("size"), int)
        ok = ok and isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64
        ok = ok and not Path(name).is_absolute() and ".." not in Path(name).parts
    if not ok:
        raise BertforgeError(damaged % "malformed file list")
    return files


def check_manifest(
    directory: str | Path, names: Iterable[str] | None = None, *, hashes: bool = True
) -> list[str] | None:
    """Compare the files ``directory``'s manifest lists (those among ``names`` if given) with the
    disk: a list of problems, one line each naming the file and what differs ([] when all
    match), or None when there is no manifest. ``hashes=False`` compares sizes only (a stat per
    file; hashing reads every byte)."""
    directory = Path(directory)
    files = read_manifest(directory)
    if files is None:
        return None
    wanted = None if names is None else set(names)
    problems = []
    for name, entry in files.items():
        if wanted is not None and name not in wanted:
            continue
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing (the manifest lists {entry['size']:,} bytes)")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{path}: {size:,} bytes, the manifest recorded {entry['size']:,}")
        elif hashes and (digest := file_sha256(path)) != entry["sha256"]:
            problems.append(
                f"{path}: SHA-256 {digest[:16]}... differs from the {entry['sha256'][:16]}... "
                "recorded in its manifest (same size: the bytes were altered)"
            )
    return problems


def verify_manifest(
    directory: str | Path,
    names: Iterable[str] | None = None,
    *,
    hashes: bool = True,
    fix: str = "restore it from a good copy (or, if you changed it on purpose, delete "
    "manifest.json beside it)",
) -> bool:
    """Raise :class:`BertforgeError` (the first problem and ``fix``, one line) when the files
    don't match the manifest; True when they do, False when there is no manifest."""
    problems = check_manifest(directory, names, hashes=hashes)
    if problems:
        raise BertforgeError(f"{problems[0]}; {fix}")
    return problems is not None


ENCODING_ERRORS = ("strict", "replace")
"""What a reader does with bytes that are not UTF-8: stop (naming file and line) or read U+FFFD."""


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
"""Compressed files every reader opens transparently (gzip, bzip2, xz, zstd), streamed; zstd
needs the ``zstandard`` package (``bertforge[zstd]``) or Python 3.14's ``compression.zstd``."""
READ_ERRORS = (OSError, EOFError, lzma.LZMAError)
"""What reading a missing, truncated or corrupt (compressed) file raises."""
ZSTD_EXTRA = "pip install 'bertforge[zstd]'"
"""How to get what reads ``.zst`` files."""


def compression_suffix(name: str | Path) -> str:
    """The compression suffix ending a file name (``.gz``, ``.bz2``, ``.xz``, ``.zst``), or
    ``""``."""
    lower = str(name).lower()
    return next((s for s in COMPRESSED_SUFFIXES if lower.endswith(s)), "")


def plain_name(name: str | Path) -> str:
    """A file's name, lower-cased, without its compression suffix: what its format is read from
    (``train.csv.bz2`` -> ``train.csv``)."""
    lower = Path(name).name.lower()
    return lower.removesuffix(compression_suffix(lower))


class _ZstdReader(io.RawIOBase):
    """A zstd file decompressed as it is read, frame after frame (``zstd``, ``pzstd`` and
    ``cat a.zst b.zst`` write several). A file that ends inside a frame raises ``EOFError``, as
    gzip/bz2/xz readers do: the ``zstandard`` package's own readers return the bytes so far and
    stop silently, which would train on a truncated corpus. Corrupt data raises ``OSError``."""

    def __init__(self, path: str | Path, decompressor: Any, error: type[Exception]) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed in close())
        self._new = decompressor  # () -> an object with decompress(data), eof, unused_data
        self._error = error
        self._frame = decompressor()
        self._open_frame = False  # bytes of a frame read, its end not yet
        self._out = memoryview(b"")  # decompressed, not yet returned
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out and not self._done:
            self._fill()
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _fill(self) -> None:
        data = self._file.read(1 << 17)
        if not data:
            if self._open_frame:
                raise EOFError("zstd file ended inside a frame (truncated?)")
            self._done = True
            return
        out = []
        try:
            while data:
                out.append(self._frame.decompress(data))
                self._open_frame = not self._frame.eof
                if self._open_frame:
                    break
                data = self._frame.unused_data  # the next frame's first bytes
                self._frame = self._new()
        except self._error as err:
            raise OSError(f"corrupt zstd data: {err}") from None
        self._out = memoryview(b"".join(out))

    def close(self) -> None:
        self._file.close()
        super().close()


def _open_zstd(path: str | Path) -> BinaryIO:
    try:  # Python 3.14's standard library
        from compression import zstd  # type: ignore[import-not-found]

        return _reader(path, zstd.ZstdDecompressor, zstd.ZstdError)
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raise BertforgeError(
            f"{path}: reading .zst files needs the zstandard package; {ZSTD_EXTRA}"
        ) from None
    return _reader(path, lambda: zstandard.ZstdDecompressor().decompressobj(), zstandard.ZstdError)


def _reader(path: str | Path, decompressor: Any, error: type[Exception]) -> BinaryIO:
    return io.BufferedReader(_ZstdReader(path, decompressor, error), 1 << 20)  # type: ignore[return-value]


def open_binary(path: str | Path) -> BinaryIO:
    """A file opened for reading bytes, decompressed as it streams when its name ends in ``.gz``,
    ``.bz2``, ``.xz`` or ``.zst`` (:data:`COMPRESSED_SUFFIXES`)."""
    suffix = compression_suffix(path)
    if suffix == ".zst":
        return _open_zstd(path)
    if suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if suffix == ".bz2":
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if suffix == ".xz":
        return lzma.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")  # noqa: SIM115


def read_text(path: str | Path, encoding_errors: str = "strict") -> str:
    """A whole UTF-8 text file (compressed or not, a BOM dropped) as one string; bytes that are
    not UTF-8 raise :func:`text_lines`'s one-line error naming the file and line."""
    return "".join(text_lines(path, encoding_errors))


class ReadMeter:
    """How far a command has read its input files, by their bytes on disk (a compressed file's
    compressed bytes): the files finished plus the position in the one :func:`text_lines` is
    streaming. Only the files it was made with count (a format sniff or an ``--exclude`` file
    read on the side does not). Active inside :func:`metered_reads`."""

    def __init__(self, paths: Iterable[str | Path]) -> None:
        self.sizes = {Path(p): Path(p).stat().st_size for p in paths}
        self.total = sum(self.sizes.values())
        self.finished = 0
        self._reading: BinaryIO | None = None

    def fraction(self) -> float:
        """The share of the input bytes read, 0 to 1 (1 for no input)."""
        at = 0
        if self._reading is not None:
            with contextlib.suppress(OSError, ValueError):  # closed meanwhile
                at = os.lseek(self._reading.fileno(), 0, os.SEEK_CUR)
        return min(1.0, (self.finished + at) / self.total) if self.total else 1.0

    def _opened(self, path: Path, fh: BinaryIO) -> None:
        if path in self.sizes:
            self._reading = fh

    def _closed(self, path: Path) -> None:
        if path in self.sizes:
            self.finished += self.sizes[path]
            self._reading = None


# the meter :func:`text_lines` moves: one per context (thread or task), so that two commands
# run in one process (the tests, a library user's threads) each meter only their own reads
_METER: contextvars.ContextVar[ReadMeter | None] = contextvars.ContextVar("meter", default=None)


@contextlib.contextmanager
def metered_reads(paths: Iterable[str | Path]) -> Iterator[ReadMeter]:
    """A :class:`ReadMeter` over ``paths`` that :func:`text_lines` moves while the block runs,
    in this thread (a command reads its inputs in one pass; a block inside another meters its
    own paths and gives the outer meter back)."""
    meter = ReadMeter(paths)
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def text_lines(path: str | Path, encoding_errors: str = "strict") -> Iterator[str]:
    """The lines of a UTF-8 text file (``.gz``/``.bz2``/``.xz``/``.zst`` read transparently), each
    with its newline; a byte-order mark opening the file (Excel's "CSV UTF-8" writes one) is
    dropped. Bytes that are not UTF-8 are the one error of every reader: the file, the line, the bytes and the fix
    (``encoding_errors="replace"`` reads them as U+FFFD instead)."""
    path = Path(path)
    if encoding_errors not in ENCODING_ERRORS:
        raise BertforgeError(f"--encoding_errors {encoding_errors!r}: choose strict or replace")
    packed = bool(compression_suffix(path))
    try:
        with open_binary(path) as fh:
            meter = _METER.get()
            if meter is not None:
                meter._opened(path, fh)
            for number, raw in enumerate(fh, start=1):
                try:
                    text = raw.decode("utf-8", errors=encoding_errors)
                except UnicodeDecodeError as err:
                    raise BertforgeError(not_utf8(path, number, raw, err, packed)) from None
                yield text.removeprefix("\ufeff") if number == 1 else text
            if meter is not None:
                meter._closed(path)
    except FileNotFoundError:
        raise BertforgeError(f"{path}: no such file") from None
    except READ_ERRORS as err:  # a truncated or corrupt archive
        raise BertforgeError(f"{path}: cannot read the file ({err}); check it") from None


def not_utf8(
    path: Path, line: int, raw: bytes, err: UnicodeDecodeError, packed: bool = False
) -> str:
    """The message of :func:`text_lines` for bytes of line ``line`` that are not UTF-8."""
    where = " after decompression" if packed else ""
    # UTF-16 (what Excel's "Unicode text" and Windows tools write) starts with a byte-order mark
    # and puts a zero byte beside every ASCII letter; anything else is most likely Latin-1
    utf16 = (line == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff"))) or b"\x00" in raw
    source = "utf-16" if utf16 else "latin1"
    kind = "UTF-16 text" if utf16 else "not UTF-8 text"
    replace = "" if utf16 else " or pass --encoding_errors replace to read such bytes as U+FFFD"
    return (
        f"{path}:{line}: {kind} ({raw[err.start : err.start + 4]!r} at character "
        f"{len(raw[: err.start].decode('utf-8', 'replace')) + 1}{where}); convert the file "
        f"(e.g. iconv -f {source} -t utf-8 IN > OUT){replace}"
    )


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """Read a file holding one JSON object; a damaged one raises one line naming it and ``fix``."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BertforgeError(f"{path}: not valid JSON ({err}); {fix}") from None
    if not isinstance(value, dict):
        raise BertforgeError(f"{path}: expected a JSON object, not {type(value).__name__}; {fix}")
    return value


# ---- what an output directory already holds ----------------------------------------------------
_OWN_HIDDEN = re.compile(r"\.bertforge\.lock|\..+\.(tmp|tmp-.*|old-\d+)")
"""The lock file (``.bertforge.lock``) and the temporaries of the atomic writes above: what a
running or killed bertforge command leaves in a directory it was only about to write."""
_KINDS = (
    ("a pretraining run", ("pretrain_config.yaml",)),
    ("a fine-tuning run", ("finetune_config.json",)),
    ("a prepared data set", ("meta.json",)),
    ("a model", ("model.safetensors", "config.json", "pytorch_model.bin")),
    ("a tokenizer", ("vocab.txt", "tokenizer.json")),
)
"""What bertforge writes, by the files that identify it; the first match names a directory."""


def directory_entries(directory: str | Path) -> list[str]:
    """The sorted names in ``directory`` (none if it does not exist), without bertforge's own
    lock and temporaries: what makes an output directory not empty."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if not _OWN_HIDDEN.fullmatch(p.name))


def describe_directory(directory: str | Path) -> str | None:
    """What a non-empty directory holds, for a refusal: ``"a pretraining run
    (pretrain_config.yaml, checkpoint-00000300, ...)"`` or ``"a directory of other files (notes.txt,
    ...)"``; None when it is missing or empty (see :func:`directory_entries`)."""
    directory = Path(directory)
    names = directory_entries(directory)
    if not names:
        return None
    kind, markers = "a directory of other files", []
    for what, identifying in _KINDS:
        markers = [n for n in identifying if n in names]
        if markers:
            kind = what
            break
    shown = markers + [n for n in names if n not in markers]
    shown = [n + "/" if (directory / n).is_dir() else n for n in shown]
    more = f", +{len(shown) - 4} more" if len(shown) > 4 else ""
    return f"{kind} ({', '.join(shown[:4])}{more})"


def check_run_directory(directory: str | Path, marker: str, run: str) -> None:
    """Refuse an output ``directory`` that holds anything but a run of this command (``marker``,
    the file its runs write first): a model, a tokenizer or someone's files would be mixed with
    the run's or overwritten. ``run`` names it in the error ("a fine-tuning run")."""
    directory = Path(directory)
    held = describe_directory(directory)
    if held is not None and not (directory / marker).is_file():
        raise BertforgeError(
            f"{directory} is {held}, not {run}; choose another --output (a new or empty directory)"
        )


def disk_size(path: str | Path) -> int:
    """Bytes of a file, or of every file under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def format_size(n_bytes: int) -> str:
    """``12.3 MB`` (decimal megabytes, as ``ls -h --si`` and file managers show)."""
    return f"{n_bytes / 1e6:,.1f} MB"


__all__ = [
    "COMPRESSED_SUFFIXES",
    "ENCODING_ERRORS",
    "ZSTD_EXTRA",
    "open_binary",
    "ReadMeter",
    "metered_reads",
    "not_utf8",
    "text_lines",
    "MANIFEST_NAME",
    "PAUSE_ENV",
    "disk_size",
    "format_size",
    "atomic_directory",
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_manifest",
    "check_run_directory",
    "describe_directory",
    "directory_entries",
    "file_sha256",
    "make_directory",
    "pause_point",
    "read_json_object",
    "read_manifest",
    "remove_manifest",
    "verify_manifest",
    "write_error",
    "write_manifest",
    "writing",
]
