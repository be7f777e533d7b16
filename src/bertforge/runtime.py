"""Where and how tensors run, for training and inference alike: the device, the precision
(autocast), seeds and the RNG state a bit-exact resume restores, and the training commands'
allocator setting (:func:`keep_freed_memory`). Checkpoint rotation and the
train-state file are in ``bertforge.training.checkpoints``; the progress bar, metrics log and
durations in ``bertforge.progress``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import random
import sys
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from bertforge.errors import BertforgeError

Precision = Literal["auto", "bf16", "fp32"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
"""Training precisions (:func:`pick_precision`)."""


# ---- memory ---------------------------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory(trim_threshold: int = 1 << 30) -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (up to ``trim_threshold`` bytes free at
    the top of the heap) instead of handing it back to the kernel at each free; the training
    commands call this at start (``BERTFORGE_MALLOC=default`` leaves malloc as it is). A
    training step frees hundreds of MB and allocates them again: by default glibc returns the
    top of its heap, and the next step's first touch of each page faults again (thousands of
    faults a step). Measured on the mini fp32 step (AMD EPYC Zen 4, alone in its process):
    ~620 ms -> ~604 ms, faults 15,000-20,000 -> ~400 a step. Allocations above 32 MB still
    come from ``mmap`` (glibc's own ceiling for its adaptive threshold); the memory the process
    holds between steps stays at the step's peak. Returns whether the setting took (False off
    Linux, off glibc, or when disabled); it is process-wide, so the library never calls it
    by itself."""
    if os.environ.get("BERTFORGE_MALLOC", "").strip().lower() == "default":
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # setting one turns off the adaptive ones
    return bool(mmap_ok and mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)))


def release_free_memory() -> bool:
    """Hand the memory malloc holds free back to the kernel (glibc's ``malloc_trim(0)``, which
    also releases whole free pages inside each thread's arena). A long-running server calls
    it now and then: requests of ever-different sizes, answered on several threads, leave
    free holes in every arena that RSS keeps counting. Returns whether it ran (False off
    Linux or glibc)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


# ---- device and precision -----------------------------------------------------------------


def pick_device(name: str = "auto", option: str = "--device") -> torch.device:
    """``auto`` picks cuda > mps > cpu; any other name (``cpu``, ``cuda:1``) is checked and used.
    ``option`` is how the command spells the setting, for its errors."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise BertforgeError(
            f"{option} {name!r} is not a device; use auto, cpu, cuda or mps"
        ) from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertforgeError(
            f"{option} {name}: CUDA is not available here; use {option} cpu or auto"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertforgeError(
            f"{option} {name}: MPS is not available here; use {option} cpu or auto"
        )
    return device


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpuinfo_field(name: str, cpuinfo: str | None) -> str | None:
    """The value of the first ``name`` line of ``cpuinfo`` (default ``/proc/cpuinfo``), or None."""
    for line in (_read_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith(name):
            return line.split(":", 1)[-1].strip()
    return None


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (the first ``model name`` line of ``/proc/cpuinfo``), else what
    :mod:`platform` knows (e.g. ``arm`` or ``x86_64``). Virtual machines often show a family name
    only (``AMD EPYC``) for CPUs of different generations: :func:`cpu_flags` tells them apart."""
    model = _cpuinfo_field("model name", cpuinfo)
    return platform.processor() or platform.machine() if model is None else model


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (the first ``flags`` line of ``/proc/cpuinfo``,
    e.g. ``avx2``, ``avx512f``, ``avx512_bf16``, ``amx_tile``); empty where there is no such file
    or line (macOS, Windows, ARM's ``Features`` line)."""
    return frozenset((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The CPU's vendor as Linux names it (``AuthenticAMD``, ``GenuineIntel``; the first
    ``vendor_id`` line of ``/proc/cpuinfo``), else an empty string."""
    return _cpuinfo_field("vendor_id", cpuinfo) or ""


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 autocast is
    emulated and several times slower than fp32."""
    return bool(cpu_flags(cpuinfo) & {"avx512_bf16", "amx_bf16"})


def pick_precision(precision: str, device: torch.device) -> Literal["bf16", "fp32"]:
    """Resolve ``auto`` to ``bf16`` where the hardware runs it fast, else ``fp32``."""
    if precision not in PRECISIONS:
        raise BertforgeError(f"--precision {precision!r} is unknown; choose auto, bf16 or fp32")
    if precision != "auto":
        return precision  # type: ignore[return-value]
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    return "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision == "bf16"``; a no-op context for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---- seeds and RNG state --------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every global RNG state, in types ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


__all__ = [
    "PRECISIONS",
    "Precision",
    "autocast",
    "cpu_flags",
    "cpu_has_fast_bf16",
    "pick_device",
    "pick_precision",
    "release_free_memory",
    "rng_state",
    "seed_everything",
    "set_rng_state",
]
