"""Whole-process A/B of an environment setting: ``bertforge finetune`` of all-MiniLM-L6-v2 on a
GLUE training file, run alternately as it is and with ``--env NAME=VALUE`` (order swapped
every repetition), for the switches that a process reads once at its start and a same-process
A/B (``ab_step.py``) cannot flip: PyTorch's huge-page allocation, malloc's settings, the
kernels. Prints each side's training seconds (the fine-tuning run's own clock, the encoding
and scoring left out), their medians, the median of the per-repetition ratios, and each side's
peak resident memory and minor page faults (the child's own, from ``wait4``).

    python benchmarks/ab_env.py --env THP_MEM_ALLOC_ENABLE=1 --steps 150 --reps 4
    python benchmarks/ab_env.py --env BERTFORGE_MALLOC=default --task RTE --precision fp32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SHARED_DATA, log, machine_markdown, markdown_table, minilm_dir

COLUMNS = {
    "CoLA": ("sentence", None),
    "SST-2": ("sentence", None),
    "RTE": ("sentence1", "sentence2"),
}


def run_once(args: argparse.Namespace, env: dict[str, str], output: Path) -> dict[str, float]:
    """One fine-tuning process; its training seconds, peak resident MB and minor page faults
    (the whole process's)."""
    text, pair = COLUMNS[args.task]
    train = SHARED_DATA / "glue" / args.task / "train.tsv"
    if not train.is_file():
        raise SystemExit(f"{train} is missing: set BERTFORGE_SHARED_DATA to the shared data")
    command = [
        sys.executable, "-m", "bertforge", "finetune", "--model", str(minilm_dir()),
        "--task", "classification", "--train", str(train), "--text_column", text,
        "--label_column", "label", "--validation_fraction", "0.05", "--max_steps", str(args.steps),
        "--batch_size", str(args.batch_size), "--max_length", "128", "--lr", "5e-5",
        "--precision", args.precision, "--num_threads", str(args.num_threads), "--seed", "0",
        "--progress", "false", "--output", str(output),
    ]  # fmt: skip
    if pair:
        command += ["--text_pair_column", pair]
    log_path = output.with_suffix(".log")  # a file, not a pipe: a long run's log cannot fill it
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        tail = log_path.read_text(errors="replace")[-2000:]
        raise SystemExit(f"the fine-tuning run failed:\n{tail}")
    result = json.loads((output / "eval_results.json").read_text())
    return {
        "train_seconds": result["train_seconds"],
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "page_faults": usage.ru_minflt,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="NAME=VALUE, the B side's setting")
    parser.add_argument("--task", choices=tuple(COLUMNS), default="CoLA")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="bf16")
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    name, sep, value = args.env.partition("=")
    if not sep or not name:
        raise SystemExit(f"--env {args.env!r}: give NAME=VALUE, e.g. BERTFORGE_KERNELS=0")
    base = {k: v for k, v in os.environ.items() if k != name}
    base["OMP_NUM_THREADS"] = str(args.num_threads)
    sides = {"as is": base, args.env: {**base, name: value}}
    times: dict[str, list[float]] = {side: [] for side in sides}
    peaks: dict[str, list[float]] = {side: [] for side in sides}
    faults: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for side in order:
                start = time.perf_counter()
                r = run_once(args, sides[side], Path(tmp) / f"{rep}-{list(sides).index(side)}")
                times[side].append(r["train_seconds"])
                peaks[side].append(r["peak_rss_mb"])
                faults[side].append(r["page_faults"])
                log(f"rep {rep} {side}: train {r['train_seconds']:.1f} s, peak "
                    f"{r['peak_rss_mb']:.0f} MB ({time.perf_counter() - start:.0f} s in all)")  # fmt: skip
    a, b = sides
    ratios = [tb / ta for ta, tb in zip(times[a], times[b], strict=True)]
    rows = [
        [
            side,
            ", ".join(f"{t:.1f}" for t in times[side]),
            f"{statistics.median(times[side]):.1f}",
            f"{statistics.median(peaks[side]):.0f}",
            f"{statistics.median(faults[side]):,.0f}",
        ]
        for side in sides
    ]
    table = markdown_table(
        ["side", "train s per rep", "median", "peak RSS MB (median)", "page faults (median)"], rows
    )
    print(
        f"\n{args.task}, {args.steps} steps of batch {args.batch_size}, {args.precision}, "
        f"{args.num_threads} thread(s), {args.reps} reps alternating\n\n{table}\n\n"
        f"time with {args.env} / as is, per rep: {', '.join(f'{r:.3f}' for r in ratios)}; "
        f"median {statistics.median(ratios):.3f}x\n\n{machine_markdown()}"
    )


if __name__ == "__main__":
    main()
