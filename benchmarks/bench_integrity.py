"""What integrity manifests cost: loading a BERT-base-sized model (110M parameters, 440 MB of
fp32 weights) with its manifest checked vs. the same directory without a manifest, and
``bertforge verify`` of it, alternating, in one process.

    flock /tmp/bertforge-heavy.lock .venv/bin/python benchmarks/bench_integrity.py

Prints the median seconds of each, their ratio and the hashing throughput.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import bertforge.io as bio
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForPreTraining
from bertforge.verify import verify


def _timed(run) -> float:
    bio._digests.clear()  # each repetition hashes again, as a fresh process would
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(reps: int = 5) -> None:
    torch.set_num_threads(2)
    root = Path(tempfile.mkdtemp(prefix="bench-integrity-"))
    try:
        checked = root / "with-manifest"
        BertForPreTraining(BertConfig()).save_pretrained(checked)
        plain = Path(shutil.copytree(checked, root / "without-manifest"))
        (plain / bio.MANIFEST_NAME).unlink()
        size = (checked / "model.safetensors").stat().st_size
        times: dict[str, list[float]] = {"load checked": [], "load unchecked": [], "verify": []}
        for rep in range(reps + 1):
            cases = [
                ("load checked", lambda: BertForPreTraining.from_pretrained(checked)),
                ("load unchecked", lambda: BertForPreTraining.from_pretrained(plain)),
                ("verify", lambda: verify(checked)),
            ]
            for name, run in cases if rep % 2 else cases[::-1]:
                seconds = _timed(run)
                if rep:  # the first round warms the page cache
                    times[name].append(seconds)
        median = {name: statistics.median(values) for name, values in times.items()}
        for name, value in median.items():
            print(f"{name:<15} {value:6.2f} s (median of {reps})")
        print(
            f"checked / unchecked load: {median['load checked'] / median['load unchecked']:.2f}x; "
            f"verify hashes {size / 1e6:,.0f} MB at {size / 1e6 / median['verify']:,.0f} MB/s"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
