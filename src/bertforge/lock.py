"""One writer per output directory: ``output_lock`` holds ``DIR/.bertforge.lock`` while a run
writes there, so two runs pointed at the same directory never write it at once.

The lock is an ``flock`` on that file, which the kernel releases when its process dies, so the
file a killed run leaves behind is stale by construction: the next run sees the lock free,
names the dead holder from the file's contents and takes it over. The file records the holder's
PID, host, start time and command, which the refusal message of a second run quotes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io import make_directory, writing

LOCK_NAME = ".bertforge.lock"


def _holder(fd: int) -> str:
    """Who wrote the lock file open at ``fd``: "PID 123 on host since 18:02 UTC (command)"."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        info = json.loads(os.read(fd, 65536) or b"null")
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return ""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("started", 0)))
    return f"PID {info.get('pid')} on {info.get('host')} since {started}: {info.get('command')}"


def _take_lock(path: Path) -> int:
    while True:
        with writing(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise BertforgeError(
                f"{path.parent}: another bertforge run is writing here ({holder or 'unknown'}); "
                "wait for it to end, or choose another output directory"
            ) from None
        try:  # the holder may have removed the file between our open and our lock: retry
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def output_lock(directory: str | Path) -> Iterator[Path]:
    """Hold ``directory/.bertforge.lock`` (created with the directory if needed) while the block
    runs: a second run pointed at the same directory is refused with the holder's PID and
    command. The kernel releases the lock (``flock``) when its process dies, so the file a
    killed run leaves behind is recognised as stale and taken over. On exit the lock file is
    removed, and the directory too if the lock created it and nothing else was written."""
    directory = Path(directory)
    created = not directory.exists()
    make_directory(directory)
    path = directory / LOCK_NAME
    fd = _take_lock(path)
    try:
        stale = _holder(fd)
        if stale:
            print(
                f"note: {path}: taking over the lock of a run that ended without releasing "
                f"it ({stale})",
                file=sys.stderr,
                flush=True,
            )
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        info["command"] = " ".join(["bertforge", *sys.argv[1:]])[:500]
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(info).encode())
        yield path
    finally:
        with contextlib.suppress(OSError):  # gone, or the disk turned read-only: stale then
            os.unlink(path)
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                directory.rmdir()


__all__ = ["LOCK_NAME", "output_lock"]
