"""Where and how tensors run, for training and inference alike: the device, the precision
(autocast), seeds and the RNG state a bit-exact resume restores, and the training commands'
allocator setting (:func:`keep_freed_memory`). Checkpoint rotation and the
train-state file are in ``bertforge.training.checkpoints``; the progress bar, metrics log and
durations in ``bertforge.progress``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
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


def _proc_bytes(path: str, field: str) -> int | None:
    """A ``field: N kB`` line of a ``/proc`` file in bytes; None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_memory_bytes() -> int:
    """This process's resident memory now (``VmRSS`` on Linux), 0 where the platform does not
    say."""
    return _proc_bytes("/proc/self/status", "VmRSS") or 0


def peak_memory_bytes() -> int:
    """This process's peak resident memory so far, 0 where the platform does not say. On Linux
    the high-water mark of its own address space (``VmHWM`` in ``/proc/self/status``), not
    ``ru_maxrss``: the kernel carries the latter over an ``exec`` from the process that spawned
    this one, so a command started by a 1 GB parent (a test runner, a notebook) would report
    1 GB whatever it used. Elsewhere ``ru_maxrss`` (macOS counts bytes)."""
    hwm = _proc_bytes("/proc/self/status", "VmHWM")
    if hwm is not None:
        return hwm
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def format_bytes(n: float) -> str:
    """``1.23 GB`` / ``456 MB`` / ``12 KB`` / ``100 bytes`` (powers of 1024, as ``free`` and
    ``top`` count); a size is never shown as ``0 MB``."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MB"
    return f"{n / 2**10:.0f} KB" if n >= 2**10 else f"{n:.0f} bytes"


_BYTE_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_bytes(text: str | int | float | None, option: str = "--max_memory") -> int | None:
    """``"1.5GB"``, ``"800MB"``, ``"2g"``, ``"512M"`` or a number of bytes -> bytes (powers of
    1024, as :func:`format_bytes` prints them); None for no budget (None, ``""``, ``"none"``,
    ``"off"``, 0). ``option`` names the setting in the error."""
    if text is None or str(text).strip().lower() in ("", "none", "null", "off", "0"):
        return None
    s = str(text).strip().lower().replace(" ", "")
    number = s.rstrip("bkmgti")
    unit = s[len(number) :].replace("ib", "").rstrip("b") or ""
    try:
        value = float(number) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise BertforgeError(f"{option} {text!r} is not a memory size; write e.g. 1.5GB or 800MB")
    return int(value)


ONEDNN_CACHE_CAPACITY = 64
"""Kernels oneDNN and torch's ideep layer keep, each (both default to 1,024): see
:func:`bound_kernel_caches`."""

PRETRAIN_CACHE_CAPACITY = 32
"""The same for ``bertforge pretrain``, whose rounded row counts repeat from step to step: the
MiniLM adaptation at 32 peaked at 1.46 GB against 1.68 GB at 64 and stepped as fast (median
step 2.69 s against 3.36 s, two runs side by side); fine-tuning, whose batches change length,
ran 3-5% slower at 32 in two such pairs (docs/memory.md), and keeps 64."""


def bound_kernel_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> bool:
    """Cap the kernels oneDNN (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and torch's ideep layer
    (``LRU_CACHE_CAPACITY``) keep, unless the user set them; the training and evaluation commands
    call this at start, before the first product. Under bf16 autocast oneDNN builds a kernel per
    product shape and keeps it, several MB each; the shapes change every step (the masked-token
    count, the real tokens of padded batches), and a MiniLM adaptation in bf16 grew ~100 MB a
    step up to the 1,024 kernels each cache holds by default (docs/memory.md). 64 holds the
    kernels one step reuses (45 distinct in a MiniLM step, the same for deeper models of that
    width, whose layers share shapes) and bounds the rest; pretraining, whose row counts are
    rounded up to repeat (:func:`~bertforge.modeling.ops.shape_multiple`), takes
    :data:`PRETRAIN_CACHE_CAPACITY`. Returns whether it set anything."""
    changed = False
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        if name not in os.environ:
            os.environ[name] = str(capacity)
            changed = True
    return changed


# ---- threads ------------------------------------------------------------------------------


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: what ``taskset`` or a container's
    cpuset allows), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


_TORCH_THREADS = torch.get_num_threads()  # torch's default: physical cores, or OMP_NUM_THREADS


def default_threads() -> int:
    """One thread per core this process may use: torch's default (the physical cores, or
    ``OMP_NUM_THREADS``; a second hyperthread per core slows the products down), at most the
    CPUs of the process's affinity mask (:func:`usable_cpus`), which torch does not read."""
    return max(1, min(_TORCH_THREADS, usable_cpus()))


def set_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads to ``num_threads``, or (None) to :func:`default_threads`;
    returns the count."""
    n = num_threads or default_threads()
    torch.set_num_threads(n)
    return n


def oversubscribed(
    step_seconds: list[float],
    cpu_seconds: float,
    wall_seconds: float,
    threads: int,
    load: float,
    cpus: int,
    *,
    first: int = 5,
    slower: float = 2.5,
    busy: float = 0.5,
) -> str | None:
    """Why a run's cores look oversubscribed, or None. ``step_seconds``: the step times so far
    (the first ``first`` are the reference, the last ``first`` are compared with them);
    ``cpu_seconds`` / ``wall_seconds``: the process's CPU time and the wall time of the recent
    steps; ``load``: the 1-minute load average of the machine, which has ``cpus`` CPUs (this
    run's own threads count in it). With ``threads`` > 1 and more runnable work than CPUs, the
    run is oversubscribed: each thread waits at every operation for another that the kernel has
    put aside. Said when the load reaches ``cpus`` + 1 (at least one other job's worth beside a
    run that uses every CPU; the IMDB recipe ran 5x slower so), or when it passes ``cpus`` and
    the recent steps take ``slower`` x the first ones or get less than ``busy`` x ``threads``
    CPU-seconds per second."""
    if threads <= 1 or load <= cpus or len(step_seconds) < 2 * first:
        return None
    ref = sorted(step_seconds[:first])[first // 2]
    now = sorted(step_seconds[-first:])[first // 2]
    if now > slower * ref:
        return f"steps take {now / ref:.1f}x as long as the first ones"
    if load >= cpus + 1:
        return f"{threads} threads beside other jobs"
    if wall_seconds > 0 and cpu_seconds < busy * threads * wall_seconds:
        return f"its {threads} threads got {cpu_seconds / wall_seconds:.1f} CPU-seconds per second"
    return None


class CoreWatch:
    """Says once when a run's step rate collapses because the cores are oversubscribed
    (:func:`oversubscribed`), with the fix. Call :meth:`step` after each step with its time."""

    def __init__(self, threads: int, say: Any, option: str = "--num_threads", window: int = 5):
        self.threads, self.say, self.option, self.window = threads, say, option, window
        self.steps: list[float] = []
        self.marks: list[tuple[float, float]] = []  # (wall, process CPU) after each step
        self.warned = False

    def step(self, seconds: float) -> None:
        if self.warned:
            return
        import time

        self.steps.append(seconds)
        self.marks.append((time.perf_counter(), time.process_time()))
        if len(self.steps) > 4 * self.window:  # the reference steps and the recent window
            del self.steps[self.window : -self.window]
            del self.marks[: -self.window - 1]
        if len(self.marks) <= self.window:
            return
        (w0, c0), (w1, c1) = self.marks[-self.window - 1], self.marks[-1]
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return
        why = oversubscribed(
            self.steps, c1 - c0, w1 - w0, self.threads, load, usable_cpus(), first=self.window
        )
        if why is not None:
            self.warned = True
            self.say(
                f"warning: the CPU cores are oversubscribed (load {load:.1f} on {usable_cpus()} "
                f"CPUs; {why}). Run with {self.option} 1 (one thread per job) for a steadier, "
                "often faster run"
            )


@functools.cache
def _glibc() -> Any | None:
    """glibc's ``libc.so.6`` through ctypes, or None off Linux or glibc (looked up once: the
    server trims every second)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number for the mmap threshold (``malloc.h``)."""


def fix_mmap_threshold(nbytes: int) -> bool:
    """Serve every allocation of ``nbytes`` or more from its own mapping, returned to the kernel
    when freed (glibc's ``mallopt(M_MMAP_THRESHOLD)``). By default glibc raises this threshold
    each time such a block is freed (up to 32 MB), after which the large, ever-different tensors
    of a server's merged batches come from the heaps and leave holes in them that trimming
    cannot return: the resident memory of a 5-minute soak grew 7.7%; at 4 MiB, 1.8% in a run
    beside it (docs/reliability.md). A ``MALLOC_MMAP_THRESHOLD_`` in the environment wins. Returns
    whether it was set (False off Linux or glibc)."""
    libc = _glibc()
    if libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(nbytes)))


def release_free_memory() -> bool:
    """Hand the memory malloc holds free back to the kernel (glibc's ``malloc_trim(0)``, which
    also releases whole free pages inside each thread's arena). A long-running server calls
    it now and then: requests of ever-different sizes, answered on several threads, leave
    free holes in every arena that RSS keeps counting. Returns whether it ran (False off
    Linux or glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    trim = libc.malloc_trim
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


BF16_MIN_HIDDEN = 256
"""The narrowest model (``hidden_size``) for which ``--precision auto`` trains in bf16 on a CPU
with native bf16 (AMX / AVX512-BF16); narrower models train in fp32. Measured with
``benchmarks/precision_sweep.py`` (see docs/memory.md): with a new batch each step, oneDNN
builds its bf16 kernels again for every new number of masked rows, and for BERT-Tiny (H=128)
that work, not the products, fills the step."""


def auto_precision(
    device_type: str,
    hidden_size: int | None = None,
    *,
    fast_bf16: bool,
    cuda_bf16: bool = False,
) -> tuple[Literal["bf16", "fp32"], str]:
    """What ``--precision auto`` resolves to, and why (one phrase for the start line): bf16 on a
    CUDA device that supports it, and on a CPU with native bf16 (``fast_bf16``) for models of
    ``hidden_size`` >= :data:`BF16_MIN_HIDDEN` (None: the size is unknown, bf16); else fp32."""
    if device_type == "cuda":
        if cuda_bf16:
            return "bf16", "auto: the GPU supports bf16"
        return "fp32", "auto: the GPU lacks bf16"
    if device_type != "cpu":
        return "fp32", f"auto: fp32 on {device_type}"
    if not fast_bf16:
        return (
            "fp32",
            "auto: this CPU has no native bf16 (AVX512-BF16/AMX), so bf16 would be emulated (slow)",
        )
    if hidden_size is not None and hidden_size < BF16_MIN_HIDDEN:
        return "fp32", (
            f"auto: hidden size {hidden_size} < {BF16_MIN_HIDDEN}, where fp32 trains faster and "
            "lighter than bf16 on this CPU"
        )
    size = "" if hidden_size is None else f"hidden size {hidden_size} >= {BF16_MIN_HIDDEN}, "
    return "bf16", f"auto: {size}native bf16 (AMX/AVX512-BF16) on this CPU"


def explain_precision(
    precision: str, device: torch.device, hidden_size: int | None = None
) -> tuple[Literal["bf16", "fp32"], str]:
    """``(precision, why)``: ``auto`` resolved by :func:`auto_precision` for a model of
    ``hidden_size`` on ``device``; another choice as given ("set by --precision")."""
    if precision not in PRECISIONS:
        raise BertforgeError(f"--precision {precision!r} is unknown; choose auto, bf16 or fp32")
    if precision != "auto":
        return precision, "as set"  # type: ignore[return-value]
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    fast = device.type == "cpu" and cpu_has_fast_bf16()
    return auto_precision(device.type, hidden_size, fast_bf16=fast, cuda_bf16=cuda_bf16)


def pick_precision(
    precision: str, device: torch.device, hidden_size: int | None = None
) -> Literal["bf16", "fp32"]:
    """Resolve ``auto`` to ``bf16`` where the hardware runs it fast for a model of
    ``hidden_size``, else ``fp32`` (:func:`explain_precision` says why)."""
    return explain_precision(precision, device, hidden_size)[0]


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision == "bf16"``; a no-op context for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def explain_compile(
    flag: bool | None, device: torch.device, steps: int | None = None, min_steps: int = 0
) -> tuple[bool, str]:
    """Whether a training loop runs its model through ``torch.compile``, and why (for its start
    line): ``flag`` when given (``--compile true|false``); unset, on a CUDA device (where the
    compiled step ran 1.36x the eager one for BERT-base on an H100, docs/gpu.md, and the ~30-60 s of compiling
    is kept out of the time budget) and off elsewhere (on a CPU the C kernels of
    ``bertforge.modeling.ops`` already fuse what Inductor would, and compiling costs minutes).
    ``min_steps``: on CUDA only for a run of at least that many ``steps`` (fine-tuning: a short
    run does not earn back its compiling)."""
    if flag is not None:
        return flag, f"compile {'on' if flag else 'off'} (as set)"
    if device.type != "cuda":
        return False, f"compile off (the default on {device.type})"
    if steps is not None and steps < min_steps:
        return False, f"compile off (the default for a run under {min_steps:,} steps)"
    return True, "compiled (the default on CUDA; compile time not charged)"


def compile_seconds() -> float:
    """Seconds this process has spent in ``torch.compile`` so far (dynamo's tracing, the
    backend's compiling of forward graphs, and of backward graphs, which compile at their first
    backward): what the training loops keep out of a time budget. From torch's own timing
    table (``torch._dynamo.utils.compilation_time_metrics``); 0.0 where a torch lacks it."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return 0.0
    keys = ("_compile.compile_inner", "backward._backward_impl")
    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in keys))


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
    "BF16_MIN_HIDDEN",
    "PRECISIONS",
    "CoreWatch",
    "Precision",
    "auto_precision",
    "autocast",
    "bound_kernel_caches",
    "PRETRAIN_CACHE_CAPACITY",
    "compile_seconds",
    "explain_compile",
    "default_threads",
    "explain_precision",
    "format_bytes",
    "oversubscribed",
    "peak_memory_bytes",
    "set_threads",
    "usable_cpus",
    "cpu_flags",
    "cpu_has_fast_bf16",
    "pick_device",
    "pick_precision",
    "fix_mmap_threshold",
    "release_free_memory",
    "rng_state",
    "seed_everything",
    "set_rng_state",
]
