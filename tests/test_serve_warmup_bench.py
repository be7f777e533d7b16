"""benchmarks/serve_warmup.py (issue 53: the server's time to ready) runs end to end on the tiny
model: one start, no --ref; its table and results.json hold the time to /health's 200 and the
warm-up log's own figures, and the server stopped cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from support.serve import tiny_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_warm_up_log_figures_are_read_from_every_version():
    from serve_warmup import warm_figures

    now = (
        "warming up 2 models before /health says ready: 183 passes, 1,234,567 tokens of the "
        "shapes requests may take, on each of 1 inference thread\n"
        "warmed 2 models in 19.3 s (183 passes of the shapes requests may take, on each of 1 "
        "inference thread)\n"
    )
    assert warm_figures(now) == {"warm_seconds": 19.3, "passes": 183, "tokens": 1234567}
    before = "warmed 1 model in 0.4 s (12 passes of the shapes requests may take, on each of"
    assert warm_figures(before) == {"warm_seconds": 0.4, "passes": 12, "tokens": None}
    assert warm_figures("no warm-up at all") == dict.fromkeys(("warm_seconds", "passes", "tokens"))


def test_smoke_run_times_a_start_to_ready_and_stops_it_cleanly(tmp_path):
    tiny = tiny_models(tmp_path)["mlm"]
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    argv = [sys.executable, str(ROOT / "benchmarks" / "serve_warmup.py"), "--runs", "1"]
    argv += ["--model", f"tiny={tiny}", "--output", str(out)]
    argv += ["--server_args", "--device cpu --precision fp32 --max_input_length 32"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| this checkout |" in done.stdout and "to /health 200, s" in done.stdout
    result = json.loads((out / "results.json").read_text())
    assert list(result["sides"]) == ["this checkout"] and result["models"] == {"tiny": str(tiny)}
    (start,) = result["sides"]["this checkout"]["starts"]
    assert start["exit_code"] == 0  # SIGTERM: drained and exited 0
    assert 0 < start["warm_seconds"] < start["ready"] and start["passes"] > 0
    assert start["tokens"] > 0
    assert start["loaded"] is not None and start["loaded"] <= start["ready"]
    assert (out / "logs" / "this-1.log").read_text().count("warmed 1 model in") == 1
