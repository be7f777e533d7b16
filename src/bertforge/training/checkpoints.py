"""A run's checkpoints on disk: graceful stop on signals, ``checkpoint-<step>`` directories
written whole (model, tokenizer, train state, then a manifest of all of them) and rotated, the
train-state file, the check that a checkpoint to resume from is intact (else the newest one
that is), the check that a resumed run is the same run, and the names of a run's time snapshots
(``snapshots/model-15m``)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io import (
    atomic_directory,
    atomic_file,
    atomic_write_text,
    check_manifest,
    pause_point,
    write_manifest,
)
from bertforge.lock import output_lock
from bertforge.progress import parse_duration
from bertforge.runtime import rng_state, set_rng_state

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


def newest_verified_checkpoint(out_dir: str | Path, before: Path | None = None) -> Path | None:
    """The newest checkpoint in ``out_dir`` (older than ``before`` if given) whose files all
    match its manifest (each is hashed: a full read of the checkpoint)."""
    found = list_checkpoints(out_dir)
    names = [p.name for p in found]
    if before is not None and before.name in names:
        found = found[: names.index(before.name)]
    for path in reversed(found):
        if check_manifest(path) == []:
            return path
    return None


def intact_checkpoint(
    path: Path | None, offer: Callable[[Path, Path], str] = lambda good, bad: ""
) -> Path | None:
    """``path`` if its files match its manifest (or it has none: an older bertforge's); else
    one line naming the altered file, what differs and the newest checkpoint of the run that
    verifies, with ``offer(good, bad)``: how to resume from that one."""
    if path is None:
        return None
    problems = check_manifest(path)
    if not problems:
        return path
    good = newest_verified_checkpoint(path.parent, before=path)
    found = (
        f"the newest checkpoint that verifies is {good}: {offer(good, path)}"
        if good is not None
        else "no older checkpoint of this run verifies; start a new output directory"
    )
    raise BertforgeError(f"{problems[0]}; {path.name} is damaged, {found}")


def rotate_checkpoints(out_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (``keep <= 0`` keeps all), and the hidden
    half-written ones a killed or failed save left (the run holds the directory's lock, so no
    other process is writing them); returns the deleted checkpoints."""
    for debris in Path(out_dir).glob(f".{CHECKPOINT_PREFIX}*.tmp-*"):
        shutil.rmtree(debris, ignore_errors=True)
    if keep <= 0:
        return []
    doomed = list_checkpoints(out_dir)[:-keep]
    for path in doomed:
        remove_checkpoint(path)
    return doomed


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint directory so that a kill at any moment leaves either the whole
    checkpoint or hidden debris (which the next ``rotate_checkpoints`` removes), never a visible
    checkpoint with some of its files gone: it is renamed to ``.NAME.tmp-deleted`` first."""
    debris = path.with_name(f".{path.name}.tmp-deleted")
    shutil.rmtree(debris, ignore_errors=True)
    try:
        os.rename(path, debris)
    except FileNotFoundError:
        return
    shutil.rmtree(debris, ignore_errors=True)


# ---- time snapshots (--train.snapshots) ----------------------------------------------------

SNAPSHOTS_DIR = "snapshots"
"""Where a run keeps its time snapshots: ``snapshots/model-15m/``, ... (model directories)."""
SNAPSHOT_PREFIX = "model-"


def duration_label(seconds: float) -> str:
    """A duration as a snapshot's name spells it: whole minutes as ``15m`` (an hour is ``60m``,
    so the names read on one scale), else seconds (``90s``, ``0.5s``)."""
    if seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds:g}s"


def snapshot_dir(out: str | Path, seconds: float) -> Path:
    """``out/snapshots/model-<duration>``: the snapshot of run ``out`` at ``seconds`` of its
    budget clock."""
    return Path(out) / SNAPSHOTS_DIR / f"{SNAPSHOT_PREFIX}{duration_label(seconds)}"


def snapshot_seconds(model_dir: str | Path) -> float | None:
    """The budget-clock seconds of a snapshot directory (``RUN/snapshots/model-15m`` -> 900.0);
    None for any other directory."""
    path = Path(model_dir)
    label = path.name.removeprefix(SNAPSHOT_PREFIX)
    if path.parent.name != SNAPSHOTS_DIR or label == path.name:
        return None
    try:
        return parse_duration(label)
    except BertforgeError:
        return None


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

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    blob: dict[str, Any] = {"rng": rng_state()}
    if optimizer is not None:
        blob["optimizer"] = optimizer.state_dict()
    if extra_tensors:
        blob.update(extra_tensors)
    with atomic_file(directory / TRAIN_STATE_TORCH) as tmp:  # streamed: no copy in memory
        torch.save(blob, tmp)
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
    "SNAPSHOTS_DIR",
    "TRAIN_STATE_JSON",
    "TRAIN_STATE_TORCH",
    "check_same_run",
    "checkpoint_name",
    "duration_label",
    "latest_checkpoint",
    "intact_checkpoint",
    "list_checkpoints",
    "load_train_state",
    "locks_output",
    "newest_verified_checkpoint",
    "rotate_checkpoints",
    "save_train_state",
    "snapshot_dir",
    "snapshot_seconds",
    "write_checkpoint",
]


def check_same_run(
    resume_dir: Path, saved: dict[str, Any], now: dict[str, Any], option: Any = str
) -> None:
    """Refuse to resume when a setting the data order depends on changed; ``option(key)`` is
    how the message names the setting (e.g. ``--batch_size``)."""
    for key, value in now.items():
        if saved.get(key) != value:
            raise BertforgeError(
                f"{resume_dir}: {option(key)} was {saved.get(key)!r}, now {value!r}; "
                "resume with the same settings or start a new --output"
            )


def locks_output(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Decorate ``run(cfg)`` to hold the lock of ``cfg.output`` while it runs (one writer per
    run directory, :func:`bertforge.lock.output_lock`); under torchrun only rank 0 takes it."""

    @functools.wraps(run)
    def locked(cfg: Any) -> Any:
        if os.environ.get("RANK", "0") != "0":
            return run(cfg)
        with output_lock(cfg.output):
            return run(cfg)

    return locked


def write_checkpoint(
    out: Path,
    model: nn.Module,
    tokenizer: Any,
    *,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    keep: int,
    extra_tensors: dict[str, Any] | None = None,
) -> Path:
    """Write ``out/checkpoint-<step>`` (model, tokenizer, train state) whole or not at all, then
    delete all but the newest ``keep`` checkpoints."""
    path = out / checkpoint_name(state["step"])
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp, tokenizer=tokenizer)
        save_train_state(tmp, state=state, optimizer=optimizer, extra_tensors=extra_tensors)
        write_manifest(tmp)  # every file of the checkpoint (the model's were hashed already)
    pause_point("rotate")
    rotate_checkpoints(out, keep)
    return path
