"""``benchmarks/distill_glue.py`` end to end on one tiny GLUE-shaped task: the teacher fine-tuned,
the student distilled with and without augmentation, alone and as a twin, then scored on dev
into the results table beside Google's rows."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TaskFiles

ROOT = Path(__file__).resolve().parents[1]


def write_cola(folder: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", n), ("dev.tsv", n // 3)):
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f, delimiter="\t", lineterminator="\n")
            out.writerow(["sentence", "label"])
            for _ in range(rows):
                label = rng.randint(0, 1)
                out.writerow([TaskFiles.sentence(rng, "good" if label else "bad"), label])


@pytest.mark.slow
def test_the_study_runs_and_tables_one_task(tmp_path):
    start = TaskFiles.tiny_start_model(tmp_path, kind="mlm")
    data = tmp_path / "glue"
    write_cola(data / "CoLA", 90, seed=0)
    out = tmp_path / "study"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    base = [sys.executable, str(ROOT / "benchmarks" / "distill_glue.py"), "--student", str(start)]
    base += ["--output", str(out), "--data_dir", str(data), "--tasks", "CoLA"]
    run = [*base, "--teacher", str(start), "--augment", str(start), "--lr", "3e-3"]
    done = subprocess.run(run, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for name in ("teacher-CoLA", "distilled-CoLA", "augmented-CoLA"):
        assert (out / name / "model.safetensors").is_file(), name
    assert (out / "augmented-CoLA" / "augmented.jsonl").stat().st_size > 0
    done = subprocess.run([*base, "--table"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "results.json").read_text())
    assert set(result["scores"]) == {"teacher", "twin", "alone", "distilled", "augmented"}
    assert all(-100 <= row["CoLA"] <= 100 for row in result["scores"].values())
    table = (out / "results.md").read_text()
    assert "| student distilled + TinyBERT augmentation |" in table
    assert "| Google BERT-Tiny (GLUE test) | 0.0 |" in table
    assert result["student_over_teacher_texts_per_s"]["CoLA"]["eager_b32"] > 0
