"""Small C kernels for the CPU, built on first use with the system C compiler.

torch has no fast way to draw a dropout mask on the CPU: ``bernoulli_`` and ``random_`` go
through one Mersenne-Twister stream, and the mask then needs a comparison, a cast and two
multiplications, each a pass over memory. ``csrc/dropout.c`` draws the mask from a counter-based
generator and scales in the same pass (4x faster than the torch form for attention
probabilities), and since the mask is a pure function of (seed, position), the backward pass
recomputes it instead of storing it.

The library is compiled once per source, compiler and CPU into ``$BERTFORGE_CACHE`` (default
``~/.cache/bertforge``), atomically, and loaded with ``ctypes``: no torch headers, no build step at
install time, about a second of compiling. Without a working compiler, or with
``BERTFORGE_KERNELS=0``, :func:`dropout_kernel` returns None and callers use torch ops.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("csrc") / "dropout.c"
#: flag sets tried in order: the first that compiles wins (clang on macOS lacks -fopenmp)
FLAG_SETS = (
    ["-O3", "-march=native", "-fopenmp"],
    ["-O3", "-fopenmp"],
    ["-O3"],
)
_ARGTYPES = [
    ctypes.c_void_p,  # x
    ctypes.c_void_p,  # out
    ctypes.c_int64,  # n
    ctypes.c_uint64,  # seed
    ctypes.c_uint32,  # threshold
    ctypes.c_float,  # scale
    ctypes.c_int,  # threads
]
_SYMBOLS = {torch.float32: "bertforge_dropout_f32", torch.bfloat16: "bertforge_dropout_bf16"}


def cache_dir() -> Path:
    """Where built kernels go: ``$BERTFORGE_CACHE``, else ``$XDG_CACHE_HOME/bertforge``."""
    if os.environ.get("BERTFORGE_CACHE"):
        return Path(os.environ["BERTFORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bertforge"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: str) -> Path | None:
    """Compile ``SOURCE`` into the cache (once per source, compiler and CPU); None on failure."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), _cpu_name().encode()]))
    target = cache_dir() / f"kernels-{platform.machine()}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for flags in FLAG_SETS:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-kernels-", suffix=".so")
        os.close(fd)
        cmd = [compiler, *flags, "-shared", "-fPIC", str(SOURCE), "-o", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=120)
            if done.returncode == 0:
                os.replace(tmp, target)  # atomic: concurrent builders (DDP ranks) race harmlessly
                return target
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return None


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("BERTFORGE_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    path = None
    if compiler:
        try:
            path = _build(compiler)
        except OSError:
            path = None
    if path is None:
        warnings.warn(
            "bertforge: could not build its C kernels (no working C compiler); dropout uses "
            "the slower torch form. Install gcc or clang, or set BERTFORGE_KERNELS=0 to silence.",
            stacklevel=3,
        )
        return None
    lib = ctypes.CDLL(str(path))  # after torch: its OpenMP runtime (libgomp.so.1) is reused
    for symbol in _SYMBOLS.values():
        getattr(lib, symbol).argtypes = _ARGTYPES
    return lib


def dropout_kernel(dtype: torch.dtype) -> Callable[[Tensor, Tensor, int, float], None] | None:
    """``f(x, out, seed, p)`` writing dropout of contiguous CPU ``x`` into ``out`` (same shape and
    dtype; may be ``x`` itself), or None when no kernel serves ``dtype`` here. Element i is kept
    when the i-th 16-bit uniform of ``seed``'s stream is >= round(p * 2^16), and scaled by
    1 / (1 - p); the same seed gives the same mask at any thread count."""
    lib = _library() if dtype in _SYMBOLS else None
    if lib is None:
        return None
    fn = getattr(lib, _SYMBOLS[dtype])

    def run(x: Tensor, out: Tensor, seed: int, p: float) -> None:
        threshold = round(p * 2**16)
        fn(
            x.data_ptr(),
            out.data_ptr(),
            x.numel(),
            seed,
            threshold,
            1.0 / (1.0 - p),
            torch.get_num_threads(),
        )

    return run


__all__ = ["cache_dir", "dropout_kernel"]
