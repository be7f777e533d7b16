"""benchmarks/bench_gpu.py (issue 40's GPU benchmark) runs end to end here in its smoke mode: a
tiny model, ours against transformers with the same weights, then the ``bertforge pretrain``
command on synthetic prepared data; the GPU peak table names the chips it knows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.training.profiling import SKIP_STEPS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_peaks_by_device_name():
    from bench_gpu import peak_tflops

    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # SXM
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA GeForce GTX 1080") is None  # flagged, not guessed


def test_the_cli_steady_rate_starts_at_the_first_log_past_the_warm_up():
    from bench_gpu import steady_rate

    def line(step, tokens, elapsed, split="train"):
        return {"split": split, "step": step, "tokens": tokens, "elapsed": elapsed}

    # 10 slow first steps (one-time costs), then 1,000 tokens per 0.1 s
    records = [line(10, 10_000, 6.0), line(20, 20_000, 7.0), line(30, 30_000, 8.0)]
    records += [line(30, 0, 0.0, split="val"), line(40, 40_000, 9.0)]
    assert steady_rate(records, 20) == (pytest.approx(10_000.0), 20)
    assert steady_rate(records, 15) == (pytest.approx(10_000.0), 20)  # the first line past it
    assert steady_rate(records, 40) is None  # one line left: no interval
    assert steady_rate(records[:1], 0) is None


@pytest.mark.slow
def test_smoke_run_measures_both_sides_and_the_cli(tmp_path):
    pytest.importorskip("transformers")
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    argv = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--device", "cpu"]
    argv += ["--dropout", "0"]  # both sides and the CLI without dropout, said in the case's name
    argv += ["--cli_profile", "2", "--profile_dir", str(tmp_path / "profiles")]
    done = subprocess.run(
        [*argv, "--json", str(out), "--markdown", str(table)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    sides = {(r["case"], r["side"]): r for r in result["rows"]}
    case = "tiny (smoke), seq 32, dropout 0"
    assert {(case, "bertforge"), (case, "transformers")} <= set(sides)
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in result["rows"])
    (cli,) = result["cli"]
    assert cli["steps"] == 2 + SKIP_STEPS + 1 + 2 and cli["tokens_per_s"] > 0
    # the CLI run traced its own loop: the summary in the JSON, the whole profile in the folder
    assert cli["profile"][0].startswith("profiled 2 steps on cpu")
    assert "aten::" in (tmp_path / "profiles" / "profile_cli_eager.txt").read_text()
    assert cli["case"].endswith("--train.compile false")  # the CPU's default: eager
    text = table.read_text()
    assert "ours / theirs" in text and "CLI / step" in text and "no MFU" in text
