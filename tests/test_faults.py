"""Faults injected into real processes: ``pretrain``, ``finetune`` and ``prepare`` killed with
SIGKILL at random moments and inside checkpoint saves, a disk that fills up and one that turns
read-only during a save, and a second run started on the same output directory.

After every fault: each checkpoint that looks whole verifies against its manifest, the newest
one never goes back (nothing saved is lost), no partial directory looks whole, and running the
same command again ends on exactly the weights (or shards) of an uninterrupted run.

The runs are children forked by ``support/fork_runner.py`` (real processes running the CLI, killed with
a real SIGKILL) so the suite does not pay a torch import per run; the lock test also starts
``python -m bertforge`` itself. A save is caught half-way deterministically with the
``BERTFORGE_TEST_PAUSE`` hook (:func:`bertforge.io.pause_point`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.reliability import (
    finetune_argv,
    make_artefacts,
    prepare_argv,
    pretrain_argv,
    record,
    same_weights,
)
from support.reliability_table import FINETUNE_KILLS, PREPARE_KILLS, PRETRAIN_KILLS

from bertforge.errors import BertforgeError
from bertforge.io import PAUSE_ENV, atomic_directory, check_manifest, read_manifest
from bertforge.lock import LOCK_NAME, output_lock
from bertforge.progress import read_metrics
from bertforge.training import checkpoints
from bertforge.training.checkpoints import (
    CHECKPOINT_PREFIX,
    checkpoint_name,
    list_checkpoints,
    rotate_checkpoints,
    save_train_state,
)

HERE = Path(__file__).resolve().parent
PRETRAIN_STEPS, PRETRAIN_SAVE = 48, 4
FINETUNE_STEPS, FINETUNE_EVAL = 36, 3
# 8 steps an epoch: max_steps decides; the finished run keeps its last checkpoint to compare
FT_EXTRA = ("--log_every", "1", "--epochs", "6", "--keep_final_checkpoint")
TIMEOUT = 600.0  # seconds a child may take: generous, the CPU of a CI box may be shared


class Forker:
    """Talks to fork_runner.py: start a ``bertforge`` child, poll it, wait for it, kill it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "support" / "fork_runner.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> int:
        return self._ask(op="run", argv=argv, env=env or {}, log=str(log))["pid"]

    def poll(self, pid: int) -> int | None:
        return self._ask(op="poll", pid=pid)["status"]

    def wait(self, pid: int) -> int:
        deadline = time.monotonic() + TIMEOUT
        while (status := self.poll(pid)) is None:
            if time.monotonic() > deadline:
                self.kill(pid)
                pytest.fail(f"child {pid} still running after {TIMEOUT:.0f} s")
            time.sleep(0.02)
        return status

    def kill(self, pid: int) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return self._ask(op="wait", pid=pid)["status"]

    def close(self) -> None:
        self.proc.kill()  # its children have all been waited for
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def forker():
    f = Forker()
    yield f
    f.close()


@pytest.fixture(scope="module")
def art(task_files, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults")
    art = make_artefacts(root, task_files)
    rng = random.Random(1)  # a corpus big enough that prepare runs for a while
    lines = [task_files.sentence(rng, rng.choice(["good", "bad"])) for _ in range(8000)]
    art["big_corpus"] = root / "big.txt"
    art["big_corpus"].write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    return art


def _run(forker: Forker, argv: list[str], log: Path, env: dict | None = None) -> int:
    return forker.wait(forker.start(argv, log, env))


def _pause(stage: str, n: int, marker: Path) -> dict[str, str]:
    return {PAUSE_ENV: f"{stage}:{n}:{marker}"}


def _until(condition: Callable[[], bool], forker: Forker, pid: int, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if forker.poll(pid) is not None:
            pytest.fail(f"the run ended before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def _last_step(run: Path) -> int:
    records = read_metrics(run) if (run / "metrics.jsonl").is_file() else []
    return max((r["step"] for r in records if r.get("split") == "train"), default=0)


def _whole(run: Path) -> int:
    """Every checkpoint that looks whole verifies, no visible partial directory exists, a
    model with a manifest matches it; returns the newest checkpoint's step (0 if none)."""
    if not run.exists():  # killed before it made its directory
        return 0
    visible = [p for p in run.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    checkpoints = list_checkpoints(run)
    assert sorted(visible) == sorted(checkpoints), "a partial checkpoint looks whole"
    for checkpoint in checkpoints:
        assert check_manifest(checkpoint) == [], checkpoint
    for model in (run, run / "model"):
        if (model / "config.json").is_file():
            assert check_manifest(model) in ([], None), model  # None: killed mid in-place save
    return int(checkpoints[-1].name[len(CHECKPOINT_PREFIX) :]) if checkpoints else 0


def _kill_at(
    forker: Forker,
    moment: str,
    argv: list[str],
    run: Path,
    tmp: Path,
    rng: random.Random,
    every: int,
) -> None:
    """Start ``argv`` and SIGKILL it at ``moment``: ``startup`` (a random delay after the
    start), ``step`` (a random step past the newest checkpoint) or a save stage (paused there
    by the hook, in the first save of this process)."""
    marker = tmp / "paused"
    env = {} if moment in ("startup", "step") else _pause(moment, 1, marker)
    pid = forker.start(argv, tmp / f"log-{moment}-{rng.random():.6f}.txt", env)
    if moment == "startup":
        time.sleep(rng.uniform(0.0, 0.3))
    elif moment == "step":
        target = _last_step(run) + rng.randint(1, every)
        _until(lambda: _last_step(run) >= target, forker, pid, f"step {target}")
        time.sleep(rng.uniform(0.0, 0.01))
    else:
        _until(marker.exists, forker, pid, f"the {moment} stage of a save")
    assert forker.kill(pid) == -signal.SIGKILL
    marker.unlink(missing_ok=True)


def _kill_repeatedly(forker, argv, run, tmp, moments, every, seed) -> dict[str, int]:
    rng = random.Random(seed)
    newest = 0
    for moment in moments:
        _kill_at(forker, moment, argv, run, tmp, rng, every)
        step = _whole(run)
        assert step >= newest, f"checkpoint {newest} lost after a kill at {moment}"
        newest = step
    return {"injected": len(moments), "survived": len(moments), "lost": 0}


@pytest.fixture(scope="module")
def pretrain_reference(forker, art, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("pretrain-reference") / "run"
    argv = pretrain_argv(art["data"], run, PRETRAIN_STEPS, PRETRAIN_SAVE, "--train.log_every", "1")
    assert _run(forker, argv, run.parent / "log.txt") == 0
    return run / "model" / "model.safetensors"


def _pretrain(art: dict, run: Path) -> list[str]:
    return pretrain_argv(art["data"], run, PRETRAIN_STEPS, PRETRAIN_SAVE, "--train.log_every", "1")


@pytest.mark.slow  # a dozen runs, each killed or run to its end
def test_pretrain_killed_at_random_moments_and_inside_saves_loses_nothing(
    forker, art, pretrain_reference, tmp_path
):
    run = tmp_path / "run"
    argv = _pretrain(art, run)
    counts = _kill_repeatedly(forker, argv, run, tmp_path, PRETRAIN_KILLS, PRETRAIN_SAVE, 16)
    assert _run(forker, argv, tmp_path / "final.txt") == 0
    assert _whole(run) == PRETRAIN_STEPS
    assert same_weights(run / "model" / "model.safetensors", pretrain_reference)
    record("SIGKILL pretrain", **counts)


@pytest.mark.slow  # a dozen runs, each killed or run to its end
def test_finetune_killed_at_random_moments_and_inside_saves_loses_nothing(forker, art, tmp_path):
    reference = tmp_path / "reference"
    argv = finetune_argv(art, reference, FINETUNE_STEPS, FINETUNE_EVAL, *FT_EXTRA)
    assert _run(forker, argv, tmp_path / "reference.txt") == 0
    run = tmp_path / "run"
    argv = finetune_argv(art, run, FINETUNE_STEPS, FINETUNE_EVAL, *FT_EXTRA)
    counts = _kill_repeatedly(forker, argv, run, tmp_path, FINETUNE_KILLS, FINETUNE_EVAL, 17)
    assert _run(forker, argv, tmp_path / "final.txt") == 0
    assert _whole(run) == FINETUNE_STEPS and check_manifest(run) == []
    assert same_weights(run / "model.safetensors", reference / "model.safetensors")
    last = list_checkpoints(run)[-1] / "model.safetensors"
    assert same_weights(last, list_checkpoints(reference)[-1] / "model.safetensors")
    record("SIGKILL finetune", **counts)


def _data_fingerprint(data: Path) -> dict:
    """What must be identical between two prepare runs: every file's hash, and meta.json
    without its timings."""
    files = {k: v["sha256"] for k, v in read_manifest(data).items() if k != "meta.json"}
    meta = json.loads((data / "meta.json").read_text())
    meta.pop("counts")
    return {"files": files, "meta": meta}


@pytest.mark.slow  # a dozen runs, each killed or run to its end
def test_prepare_killed_at_random_moments_leaves_nothing_that_looks_whole(forker, art, tmp_path):
    big = {**art, "corpus": art["big_corpus"]}
    reference = tmp_path / "reference"
    start = time.monotonic()
    assert _run(forker, prepare_argv(big, reference), tmp_path / "reference.txt") == 0
    duration = time.monotonic() - start
    expected = _data_fingerprint(reference)
    out = tmp_path / "data"
    argv = prepare_argv(big, out, "--overwrite")
    rng = random.Random(18)
    landed = 0
    for moment in PREPARE_KILLS:
        marker = tmp_path / "paused"
        if moment == "swap-overwrite":  # replacing a complete directory: old or new, never none
            shutil.copytree(reference, out, dirs_exist_ok=True)
        env = {} if moment == "random" else _pause("swap", 1, marker)
        pid = forker.start(argv, tmp_path / f"log-{landed}.txt", env)
        if moment == "random":
            time.sleep(rng.uniform(0.1, 0.9) * duration)
        else:
            _until(marker.exists, forker, pid, "the swap")
        assert forker.kill(pid) in (-signal.SIGKILL, 0)  # 0: it had just finished
        marker.unlink(missing_ok=True)
        landed += 1
        visible = [p.name for p in tmp_path.iterdir() if p.name.startswith("data")]
        assert visible in ([], ["data"])
        if out.exists():  # a complete directory, the old one or the new one
            assert check_manifest(out) == [] and _data_fingerprint(out) == expected
        if moment != "swap-overwrite":
            shutil.rmtree(out, ignore_errors=True)
    assert _run(forker, argv, tmp_path / "final.txt") == 0
    assert _data_fingerprint(out) == expected
    # the killed runs' hidden temporaries are gone too, each named on a line by the last run
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".data.tmp-")]
    assert "left by a killed run" in (tmp_path / "final.txt").read_text()
    record("SIGKILL prepare", injected=landed, survived=landed, lost=0)


# ---- a disk that fills up or turns read-only during a save -----------------------------------
def _fill(directory: Path) -> None:
    with open(directory / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC


def _save_fails(forker, art, run: Path, tmp_path: Path, fault: Callable[[], None], reason: str):
    """Pause a run after the weights of its second checkpoint, inject ``fault``, let it go on:
    it must stop with one line naming the file and ``reason``, the first checkpoint intact and
    no second one that looks whole."""
    marker = tmp_path / "paused"
    pid = forker.start(_pretrain(art, run), tmp_path / "log.txt", _pause("weights", 2, marker))
    _until(marker.exists, forker, pid, "the second save")
    fault()
    marker.unlink()
    assert forker.wait(pid) == 2
    lines = (tmp_path / "log.txt").read_text().strip().splitlines()
    error = [line for line in lines if line.startswith("error: ")]
    assert len(error) == 1 and "Traceback" not in "\n".join(lines), lines
    assert f"cannot write ({reason})" in error[0] and str(run) in error[0], error
    assert [c.name for c in list_checkpoints(run)] == [f"{CHECKPOINT_PREFIX}{PRETRAIN_SAVE:08d}"]
    assert _whole(run) == PRETRAIN_SAVE


def test_full_disk_during_a_save(forker, art, pretrain_reference, tmp_path):
    """A 4 MiB tmpfs fills up half-way through a checkpoint save; after space is freed the same
    command ends on the uninterrupted run's weights."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        run = disk / "run"
        _save_fails(forker, art, run, tmp_path, lambda: _fill(disk), "No space left on device")
        assert not [p.name for p in run.iterdir() if ".tmp-" in p.name]  # cleaned up
        (disk / "filler").unlink()
        assert _run(forker, _pretrain(art, run), tmp_path / "again.txt") == 0
        assert same_weights(run / "model" / "model.safetensors", pretrain_reference)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    record("full disk during a save", injected=1, survived=1, lost=0)


def test_read_only_output_directory_during_a_save(forker, art, pretrain_reference, tmp_path):
    """The run directory turns read-only (immutable as root: ``chattr +i``; else mode 0555)
    half-way through a checkpoint save; made writable again, the run completes."""
    run = tmp_path / "run"
    as_root = os.geteuid() == 0
    if as_root and shutil.which("chattr") is None:
        pytest.skip("root ignores file modes and chattr is missing")

    def read_only() -> None:
        if as_root:
            subprocess.run(["chattr", "+i", str(run)], check=True)
        else:
            run.chmod(0o555)

    reason = "Operation not permitted" if as_root else "Permission denied"
    try:
        _save_fails(forker, art, run, tmp_path, read_only, reason)
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(run)], check=False)
        else:
            run.chmod(0o755)
    assert _run(forker, _pretrain(art, run), tmp_path / "again.txt") == 0
    assert same_weights(run / "model" / "model.safetensors", pretrain_reference)
    assert not [p.name for p in run.iterdir() if ".tmp-" in p.name]  # debris removed by the rerun
    record("read-only output during a save", injected=1, survived=1, lost=0)


# ---- two runs on one output directory -------------------------------------------------------
def test_a_second_run_on_the_same_output_is_refused_and_a_stale_lock_taken_over(
    forker, art, pretrain_reference, tmp_path
):
    run = tmp_path / "run"
    marker = tmp_path / "paused"
    argv = _pretrain(art, run)
    holder = forker.start(argv, tmp_path / "holder.txt", _pause("weights", 1, marker))
    _until(marker.exists, forker, holder, "the first save")
    before = sorted(p.name for p in run.iterdir())
    second = subprocess.run(
        [sys.executable, "-m", "bertforge", *argv], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"error: {run}: another bertforge run is writing here (PID {holder} on " in lines[0]
    assert "bertforge pretrain --data" in lines[0] and "choose another output directory" in lines[0]
    assert sorted(p.name for p in run.iterdir()) == before  # the second run wrote nothing
    assert forker.kill(holder) == -signal.SIGKILL
    marker.unlink()
    assert (run / LOCK_NAME).is_file()  # left behind by the killed holder: stale
    assert _run(forker, argv, tmp_path / "third.txt") == 0
    log = (tmp_path / "third.txt").read_text()
    assert f"taking over the lock of a run that ended without releasing it (PID {holder} " in log
    assert same_weights(run / "model" / "model.safetensors", pretrain_reference)
    assert not (run / LOCK_NAME).exists()
    record("two runs on one output", injected=2, refused=1, survived=1, lost=0)


def test_output_lock_in_one_process(tmp_path):
    out = tmp_path / "new"
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(BertforgeError, match=f"PID {os.getpid()} on "), output_lock(out):
            pass
    assert not out.exists()  # created by the lock, nothing written: removed again
    (tmp_path / "kept").mkdir()
    with output_lock(tmp_path / "kept"):
        (tmp_path / "kept" / "x").write_text("x")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["x"]


def test_a_kill_inside_checkpoint_rotation_leaves_no_visible_partial_checkpoint(
    tmp_path, monkeypatch
):
    """A SIGKILL while an old checkpoint is being deleted (found by the random kills of the
    finetune test): the checkpoint is renamed out of sight before its files go, and the next
    rotation removes what is left."""
    for step in (1, 2, 3):
        save_train_state(tmp_path / checkpoint_name(step), state={"step": step})

    class Killed(BaseException):
        pass

    def killed_after_one_file(path, ignore_errors=False):
        path = Path(path)
        if path.exists():
            next(f for f in sorted(path.iterdir()) if f.is_file()).unlink()
            raise Killed

    monkeypatch.setattr(checkpoints.shutil, "rmtree", killed_after_one_file)
    with pytest.raises(Killed):
        rotate_checkpoints(tmp_path, keep=1)
    visible = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(CHECKPOINT_PREFIX))
    assert visible == [p.name for p in list_checkpoints(tmp_path)]
    assert visible == [checkpoint_name(2), checkpoint_name(3)]
    monkeypatch.undo()  # the real rmtree again
    rotate_checkpoints(tmp_path, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_name(3)]


def test_a_directory_that_appears_meanwhile_is_kept(tmp_path):
    """Two writers of one new directory (two ``prepare`` runs without --overwrite): the one that
    finishes second is refused and the first one's complete output is kept."""
    final = tmp_path / "data"
    with (
        pytest.raises(BertforgeError, match="appeared while this one was being written"),
        atomic_directory(final, replace=False) as tmp,
    ):
        (tmp / "mine").write_text("second")
        final.mkdir()  # the other writer finishes first
        (final / "theirs").write_text("first")
    assert [p.name for p in final.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no temporary left behind
