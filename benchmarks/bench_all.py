"""`make bench`: every bertforge-vs-transformers measurement, as one markdown report.

    python benchmarks/bench_all.py                # everything (~5 minutes on 2 cores)
    python benchmarks/bench_all.py --quick        # fewer repetitions, mini only
    python benchmarks/bench_all.py --out report.md

Runs the pretraining step (mini and small, fp32 and bf16, with MFU), the fine-tuning step on AG
News lengths, inference, and the data-pipeline benchmark (benchmarks/bench_data.py) when present.
Ratios are the numbers to read: absolute speed depends on what else the machine is doing.

Each section runs in a fresh Python process (both sides still alternate within it): a process
that has just trained four models holds a large heap, which changes how fast the next section's
fresh tensors come (page faults), so in one process a section's ratio depended on what ran before
it (full-window encoding: 0.97-1.05x after the training section, 1.06-1.22x on its own).
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_train  # noqa: E402
from _common import CEILING_HEADER, log, machine_markdown, markdown_table  # noqa: E402


def data_section() -> str | None:
    """Output of benchmarks/bench_data.py (the data pipeline's own benchmark), if it exists."""
    script = HERE / "bench_data.py"
    if not script.is_file():
        return None
    log("data: running benchmarks/bench_data.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"### Data pipeline\n\nbench_data.py failed (exit {done.returncode}):\n\n```\n{done.stderr[-2000:]}\n```"
    return "### Data pipeline (benchmarks/bench_data.py)\n\n" + done.stdout.strip()


def _run_section(module: str, argv: list[str], threads: int | None) -> tuple[str, dict, list]:
    """One section's ``main`` (in a child process): its markdown, target checks, ceiling rows."""
    if threads:
        torch.set_num_threads(threads)
    checks: dict[str, tuple[float, float]] = {}
    ceiling: list[list[str]] = []
    section = importlib.import_module(module)
    if module == "bench_finetune":
        return section.main(argv, checks), checks, ceiling
    return section.main(argv, checks, ceiling), checks, ceiling


def in_fresh_process(module: str, argv: list[str], threads: int | None) -> tuple[str, dict, list]:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_run_section, (module, argv, threads))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repetitions, mini only")
    p.add_argument("--reps", type=int, default=None, help="repetitions per case (default 5)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--skip-data", action="store_true", help="do not run bench_data.py")
    p.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    reps = args.reps or (3 if args.quick else 5)
    start = time.time()
    command = "python benchmarks/bench_all.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    sections = [
        "## bertforge vs transformers\n",
        f"Command: `{command.strip()}`  \nDate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
        machine_markdown() + "\n",
    ]
    sizes = ["mini"] if args.quick else ["mini", "small"]
    checks: dict[str, tuple[float, float]] = {}
    ceiling: list[list[str]] = []
    for module, section_args in [
        ("bench_train", ["--sizes", *sizes, "--reps", str(reps)]),
        ("bench_finetune", ["--reps", str(reps)]),
        ("bench_infer", ["--reps", str(reps + 2)]),
    ]:
        text, section_checks, section_ceiling = in_fresh_process(module, section_args, args.threads)
        sections.append(text + "\n")
        checks.update(section_checks)
        ceiling.extend(section_ceiling)
    rows = [
        [
            name,
            f"{v:.0%}" if "MFU" in name else f"{v:.2f}x",
            f">= {t:.0%}" if "MFU" in name else f">= {t:.1f}x",
            "yes" if v >= t else "**no**",
        ]
        for name, (v, t) in checks.items()
    ]
    sections.insert(
        3,
        "### Targets of the issue\n\n"
        + markdown_table(["measurement", "measured", "target", "met"], rows)
        + "\n\n### Ceiling: the best ratio our FLOPs allow\n\n"
        + markdown_table(CEILING_HEADER, ceiling)
        + "\n\n"
        + bench_train.CEILING_NOTE
        + "\n",
    )
    if not args.skip_data:
        data = data_section()
        if data:
            sections.append(data + "\n")
    sections.append(f"Total benchmark time: {time.time() - start:,.0f} s")
    report = "\n".join(sections)
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
