"""Resident memory of a command over time, phase by phase: runs it in a subprocess, samples its
RSS (``/proc/PID/status``, children included) every ``--every`` seconds and splits the run at
the lines it writes (each line starts a phase: "pretraining ...", "step 10", "saving ...").
Prints, per phase, the RSS on entry and the highest RSS seen in it, then the peak (VmHWM).

    python benchmarks/memory_profile.py -- bertforge pretrain --data D --output O \\
        --init_from MINILM --train.objective mlm --train.batch_size 32 --train.max_steps 20

With ``--where``, the command (``bertforge ARGS``) runs in this process instead, and a thread
watching the RSS prints, each time it has grown by ``--step_mb`` since the last report, the
bertforge functions on the main thread's stack: where the memory is taken.

    python benchmarks/memory_profile.py --where -- bertforge pretrain ...
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    """``field`` of ``/proc/PID/status`` in kB, summed over the process and its children
    (workers), or 0 once it is gone."""
    total = 0
    for p in [pid, *children(pid)]:
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
        total += int(m.group(1)) if m else 0
    return total


def children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    kids = [int(c) for c in found]
    return kids + [g for k in kids for g in children(k)]


def where(argv: list[str], every: float, step_mb: float) -> None:
    """Run ``bertforge argv`` here; print the stack of bertforge frames at each RSS rise."""
    import traceback

    from bertforge.cli import main as bertforge

    main_id = threading.get_ident()
    done = threading.Event()
    start = time.perf_counter()

    def watch() -> None:
        last = 0
        while not done.is_set():
            rss = rss_kb(os.getpid())
            if rss - last > step_mb * 1024:
                frame = sys._current_frames().get(main_id)
                stack = traceback.extract_stack(frame) if frame else []
                ours = [
                    f"{Path(f.filename).stem}.{f.name}:{f.lineno}"
                    for f in stack
                    if "bertforge" in f.filename and "/cli/" not in f.filename
                ]
                t = time.perf_counter() - start
                print(f"[mem] {t:6.1f}s {rss / 1024:7.0f} MB  {' > '.join(ours[-4:])}", flush=True)
                last = rss
            time.sleep(every)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        rc = bertforge(argv)
    finally:
        done.set()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"[mem] rc {rc}; peak ru_maxrss {peak / 1024:,.0f} MB", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.05)
    p.add_argument("--width", type=int, default=90, help="characters of each phase line shown")
    p.add_argument("--where", action="store_true", help="in this process, with stacks")
    p.add_argument("--step_mb", type=float, default=40.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.where:
        if command[:1] != ["bertforge"]:
            p.error("--where runs `bertforge ...` commands")
        where(command[1:], args.every, args.step_mb)
        return
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    phases: list[list] = [["(start)", 0.0, 0, 0]]  # name, t, rss on entry, max rss
    hwm = [0]
    lock = threading.Lock()

    def sample() -> None:
        while proc.poll() is None:
            rss = rss_kb(proc.pid)
            hwm[0] = max(hwm[0], rss_kb(proc.pid, "VmHWM"))
            with lock:
                phases[-1][3] = max(phases[-1][3], rss)
            time.sleep(args.every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    for raw in proc.stdout:
        # a progress bar rewrites one line with \r: each piece counts as a line
        for line in filter(None, (x.strip() for x in raw.split("\r"))):
            sys.stdout.write(line + "\n")
            rss = rss_kb(proc.pid)
            with lock:
                phases[-1][3] = max(phases[-1][3], rss)
                phases.append([line[: args.width], time.perf_counter() - start, rss, rss])
    proc.wait()
    sampler.join()
    print(f"\nrc {proc.returncode}; phases (RSS in MB; a phase runs from its line to the next):")
    print(f"{'t (s)':>7} {'entry':>7} {'max':>7}  line")
    shown = 0
    for i, (name, t, entry, top) in enumerate(phases):
        last = i == len(phases) - 1
        big = top - entry > 50 * 1024 or i == 0 or last
        if big or os.environ.get("ALL_PHASES"):
            print(f"{t:7.1f} {entry / 1024:7.0f} {top / 1024:7.0f}  {name}")
            shown += 1
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"peak: VmHWM sampled {hwm[0] / 1024:,.0f} MB; ru_maxrss {children_peak / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
