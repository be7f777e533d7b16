"""Check what bertforge wrote against its manifests: a model, a checkpoint, a whole run (its
checkpoints, final model and time snapshots), a ``bertforge downstream`` output (each of its
runs and its random twin) or a prepared data directory (``bertforge verify DIR``).

Each directory bertforge writes ends with ``manifest.json`` (size and SHA-256 of every file,
see :func:`bertforge.io.write_manifest`). :func:`verify` finds the directories under a path,
hashes their files and returns one :class:`Finding` per directory; for a run it also names the
newest checkpoint that verifies, the one to resume from when a newer one is damaged.
:func:`verify_all` splits a downstream output into its runs and verifies each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.data.dataset import META_FILE
from bertforge.errors import BertforgeError
from bertforge.io import check_manifest, read_manifest
from bertforge.modeling.config import CONFIG_NAME
from bertforge.training.checkpoints import (
    SNAPSHOTS_DIR,
    TRAIN_STATE_JSON,
    list_checkpoints,
    newest_verified_checkpoint,
    snapshot_seconds,
)
from bertforge.training.downstream import RESULTS_FILE, TWIN_DIR

WHAT_VERIFY_TAKES = "a model, checkpoint, run, downstream output or prepared data directory"


@dataclass
class Finding:
    """The verdict on one directory."""

    kind: str
    """``model``, ``checkpoint`` or ``data``."""
    path: Path
    """The directory."""
    status: str
    """``ok`` (every file matches), ``damaged`` or ``unverified`` (no manifest: written by
    another tool or an older bertforge, nothing to compare with)."""
    problems: list[str] = field(default_factory=list)
    """One line per file that differs: the file and what differs."""
    files: int = 0
    """Files the manifest lists."""
    size: int = 0
    """Their bytes."""


@dataclass
class Report:
    """What :func:`verify` found under one path."""

    findings: list[Finding]
    """One per directory, checkpoints oldest first."""
    newest_good_checkpoint: Path | None
    """The newest checkpoint of the run that verifies (None without checkpoints)."""
    seconds: float
    """Time spent (nearly all of it hashing)."""

    @property
    def damaged(self) -> bool:
        return any(f.status == "damaged" for f in self.findings)


def _directories(path: Path) -> list[tuple[str, Path]]:
    """(kind, directory) of everything bertforge writes at ``path``."""
    if (path / TRAIN_STATE_JSON).is_file():
        return [("checkpoint", path)]
    if (path / META_FILE).is_file():
        return [("data", path)]
    found = [("model", path)] if (path / CONFIG_NAME).is_file() else []
    found += [("checkpoint", c) for c in list_checkpoints(path)]
    if (path / "model" / CONFIG_NAME).is_file():  # a pretraining run's final model
        found.append(("model", path / "model"))
    snapshots = [d for d in (path / SNAPSHOTS_DIR).glob("*") if snapshot_seconds(d) is not None]
    found += [("model", d) for d in sorted(snapshots, key=snapshot_seconds)]  # --train.snapshots
    return found


def _check(kind: str, directory: Path, hashes: bool) -> Finding:
    files = read_manifest(directory)
    if files is None:
        return Finding(kind, directory, "unverified")
    problems = check_manifest(directory, hashes=hashes) or []
    size = sum(entry["size"] for entry in files.values())
    status = "damaged" if problems else "ok"
    return Finding(kind, directory, status, problems, len(files), size)


def verify(path: str | Path, *, hashes: bool = True) -> Report:
    """Check every directory bertforge wrote at ``path`` against its manifest (``hashes=False``:
    sizes only). A path holding none of them is an error naming it."""
    path = _existing_directory(path)
    start = time.perf_counter()
    found = _directories(path)
    if not found:
        raise BertforgeError(
            f"{path}: not {WHAT_VERIFY_TAKES} (no {CONFIG_NAME}, {TRAIN_STATE_JSON}, "
            f"{META_FILE}, {RESULTS_FILE} or checkpoint-* found)"
        )
    findings = [_check(kind, directory, hashes) for kind, directory in found]
    checkpoints = [f for f in findings if f.kind == "checkpoint"]
    newest = None
    if checkpoints:
        run = checkpoints[0].path.parent
        ok = [f.path for f in checkpoints if f.status == "ok"]
        # a single checkpoint given: its older siblings count too
        newest = ok[-1] if ok else newest_verified_checkpoint(run, before=checkpoints[-1].path)
    return Report(findings, newest, time.perf_counter() - start)


def _existing_directory(path: str | Path) -> Path:
    path = Path(path)
    if path.is_file():
        raise BertforgeError(f"{path}: a file, not a directory; give {WHAT_VERIFY_TAKES}")
    if not path.is_dir():
        raise BertforgeError(f"{path}: no such directory; give {WHAT_VERIFY_TAKES}")
    return path


def downstream_runs(path: Path) -> list[Path]:
    """The model and run directories of a ``bertforge downstream`` output (``pretrained/``,
    ``random_init/``, ``baseline/``, ``random_init_model/``), sorted; [] for anything else. An
    interrupted output (its twin written, ``downstream.json`` not yet) counts too."""
    if not ((path / RESULTS_FILE).is_file() or (path / TWIN_DIR / CONFIG_NAME).is_file()):
        return []
    return sorted(d for d in path.iterdir() if d.is_dir() and _directories(d))


def verify_all(path: str | Path, *, hashes: bool = True) -> list[Report]:
    """:func:`verify` of ``path``, or of each of its runs for a ``bertforge downstream`` output
    (one :class:`Report` each)."""
    path = _existing_directory(path)
    return [verify(run, hashes=hashes) for run in downstream_runs(path) or [path]]


def format_report(report: Report) -> str:
    """One line per directory, the problems under it, then the checkpoint to resume from."""
    lines = []
    for f in report.findings:
        what = f"{f.files} files, {f.size / 1e6:,.1f} MB" if f.status != "unverified" else ""
        if f.status == "unverified":
            what = "no manifest (another tool's or an older bertforge's): nothing to compare"
        lines.append(f"{f.status.upper():<10} {f.kind:<10} {f.path}  ({what})")
        lines += [f"           {problem}" for problem in f.problems]
    if any(f.kind == "checkpoint" for f in report.findings):
        newest = report.newest_good_checkpoint
        lines.append(
            f"newest checkpoint that verifies: {newest}"
            + (f" (resume from it: --resume {newest})" if newest and report.damaged else "")
            if newest
            else "no checkpoint verifies"
        )
    total = sum(f.size for f in report.findings)
    lines.append(f"checked {total / 1e6:,.1f} MB in {report.seconds:.2f} s")
    return "\n".join(lines)


__all__ = ["Finding", "Report", "downstream_runs", "format_report", "verify", "verify_all"]
