"""`make bench`: every bertforge-vs-transformers measurement in one process, as one markdown report.

    python benchmarks/bench_all.py                # everything (~4 minutes on 2 cores)
    python benchmarks/bench_all.py --quick        # fewer repetitions, mini only
    python benchmarks/bench_all.py --out report.md

Runs the pretraining step (mini and small, fp32 and bf16, with MFU), the fine-tuning step on AG
News lengths, inference, and the data-pipeline benchmark (benchmarks/bench_data.py) when present.
Ratios are the numbers to read: absolute speed depends on what else the machine is doing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_finetune  # noqa: E402
import bench_infer  # noqa: E402
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
    train_args = ["--sizes", *sizes, "--reps", str(reps)]
    sections.append(bench_train.main(train_args, checks, ceiling) + "\n")
    sections.append(bench_finetune.main(["--reps", str(reps)], checks) + "\n")
    sections.append(bench_infer.main(["--reps", str(reps + 2)], checks, ceiling) + "\n")
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
