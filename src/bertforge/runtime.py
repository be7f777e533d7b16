"""What every training loop needs around the math: device and precision, seeds and RNG state,
graceful stop on signals, checkpoint rotation and the train-state file. Shared by ``pretrain`` and
``finetune`` so both behave the same. The progress bar, metrics log and durations live in
``bertforge.progress``; the step-level helpers both loops share in ``bertforge.training``.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bertforge.config import PRECISIONS
from bertforge.errors import BertforgeError
from bertforge.progress import read_metrics  # re-exported: benchmarks import it here

# ---- device and precision -----------------------------------------------------------------


def pick_device(name: str = "auto") -> torch.device:
    """``auto`` picks cuda > mps > cpu; any other name (``cpu``, ``cuda:1``) is checked and used."""
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
            f"--device {name!r} is not a device; use auto, cpu, cuda or mps"
        ) from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertforgeError(
            f"--device {name}: CUDA is not available here; use --device cpu or auto"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertforgeError(
            f"--device {name}: MPS is not available here; use --device cpu or auto"
        )
    return device


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 autocast is
    emulated and several times slower than fp32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set(re.findall(r"\b(avx512_bf16|amx_bf16)\b", cpuinfo))
    return bool(flags)


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


# ---- graceful stop --------------------------------------------------------------------------


class GracefulStop:
    """Turn SIGINT/SIGTERM into a request the loop polls: it finishes the current step, writes a
    checkpoint and exits 0. A second signal interrupts at once (KeyboardInterrupt).

    Use as a context manager; previous handlers are restored on exit. Outside the main thread
    (where Python cannot install handlers) it stays passive.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(
            f"\n{self.signal_name} received: finishing this step and saving a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


# ---- checkpoints and train state ------------------------------------------------------------

CHECKPOINT_PREFIX = "checkpoint-"
TRAIN_STATE_JSON = "train_state.json"
TRAIN_STATE_TORCH = "train_state.pt"


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoint directories in ``out_dir``, oldest first (by step)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = []
    for path in out_dir.iterdir():
        m = re.fullmatch(CHECKPOINT_PREFIX + r"(\d+)", path.name)
        if m and path.is_dir() and (path / TRAIN_STATE_JSON).is_file():
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def rotate_checkpoints(out_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (``keep <= 0`` keeps all); returns the
    deleted paths."""
    if keep <= 0:
        return []
    doomed = list_checkpoints(out_dir)[:-keep]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def save_train_state(
    directory: str | Path,
    *,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    extra_tensors: dict[str, Any] | None = None,
) -> None:
    """Write ``train_state.json`` (counters, schedule position, data position: JSON values) and
    ``train_state.pt`` (optimizer state, RNG states, ``extra_tensors``) into ``directory``.

    Both are written atomically; call this inside ``atomic_directory`` so a checkpoint is whole or
    absent.
    """
    from bertforge.checkpoint import atomic_write_bytes, atomic_write_text

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    blob: dict[str, Any] = {"rng": rng_state()}
    if optimizer is not None:
        blob["optimizer"] = optimizer.state_dict()
    if extra_tensors:
        blob.update(extra_tensors)
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    atomic_write_bytes(directory / TRAIN_STATE_TORCH, buffer.getvalue())
    atomic_write_text(
        directory / TRAIN_STATE_JSON, json.dumps(state, indent=2, sort_keys=True) + "\n"
    )


def load_train_state(
    directory: str | Path,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
    keys: Iterable[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read what :func:`save_train_state` wrote; load the optimizer and RNG states in place.

    Returns ``(state, blob)``: the JSON counters and the raw torch payload (for extra tensors).
    A state without one of ``keys``, or files that do not load, is a damaged checkpoint: the
    error says to delete it (the run then resumes from the checkpoint before).
    """
    directory = Path(directory)
    json_path, torch_path = directory / TRAIN_STATE_JSON, directory / TRAIN_STATE_TORCH
    if not json_path.is_file() or not torch_path.is_file():
        raise BertforgeError(
            f"{directory}: not a training checkpoint ({TRAIN_STATE_JSON} or {TRAIN_STATE_TORCH} "
            "missing); point --resume at a checkpoint-* directory or an output directory"
        )
    damaged = (
        f"{directory}: damaged checkpoint (%s); delete this directory to resume from the one "
        "before it, or start a new --output"
    )
    try:
        state = json.loads(json_path.read_text(encoding="utf-8"))
        blob = torch.load(torch_path, map_location="cpu", weights_only=True)
    except (ValueError, RuntimeError, EOFError, OSError) as err:  # JSON, zip and pickle errors
        raise BertforgeError(damaged % str(err).split(". ")[0].strip()) from None
    if not isinstance(state, dict) or not isinstance(blob, dict) or "rng" not in blob:
        raise BertforgeError(damaged % "unexpected contents")
    missing = [k for k in keys if k not in state]
    if missing:
        raise BertforgeError(damaged % f"{TRAIN_STATE_JSON} lacks {', '.join(missing)}")
    if optimizer is not None:
        if "optimizer" not in blob:
            raise BertforgeError(f"{torch_path}: no optimizer state saved; cannot resume from it")
        try:
            optimizer.load_state_dict(blob["optimizer"])
        except (ValueError, KeyError, TypeError) as err:
            raise BertforgeError(damaged % f"optimizer state: {err}") from None
    if restore_rng:
        set_rng_state(blob["rng"])
    return state, blob


__all__ = [
    "CHECKPOINT_PREFIX",
    "GracefulStop",
    "autocast",
    "checkpoint_name",
    "cpu_has_fast_bf16",
    "latest_checkpoint",
    "list_checkpoints",
    "load_train_state",
    "pick_device",
    "pick_precision",
    "read_metrics",
    "rng_state",
    "rotate_checkpoints",
    "save_train_state",
    "seed_everything",
    "set_rng_state",
]
