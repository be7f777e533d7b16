"""`make demo` end to end (scripts/demo.sh) with a 40-step pretraining budget: every step
runs with the real commands and configs/demo.yaml, and the output holds what a newcomer is
promised (the random-init vs trained table, the fill-mask lines, the no-context baseline)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.modeling.model import BertForMaskedLM
from bertforge.tokenizer.wordpiece import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # the whole demo, a few minutes


def test_demo_script_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "BERTFORGE_DEMO_DIR": str(out),
        "BERTFORGE_DEMO_STEPS": "40",
        "BERTFORGE_DEMO_SEED": "3",
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    for step in ("== 1/4", "== 2/4", "== 3/4", "== 4/4"):
        assert step in proc.stdout
    assert "random init" in log and "masked-token accuracy" in log
    assert "seed 3" in proc.stdout
    masks = re.findall(r"^    \[MASK\] -> (.+)$", proc.stdout, flags=re.MULTILINE)
    assert len(masks) == 6  # one line per demo sentence
    assert all(len(re.findall(r"\(\d+%\)", line)) == 5 for line in masks)  # top 5 each
    assert re.search(r"no context \(token frequencies\) loss \d+\.\d{3}", proc.stdout)

    # the artefacts the script points to are real: a loadable model with its own tokenizer,
    # trained on the demo's data with the seed it was given
    model_dir = out / "run" / "model"
    model = BertForMaskedLM.from_pretrained(model_dir)
    tokenizer = Tokenizer.from_file(model_dir)
    assert model.config.vocab_size == tokenizer.vocab_size
    assert "seed: 3" in (out / "run" / "pretrain_config.yaml").read_text()
    assert (out / "run" / "curves.png").stat().st_size > 0
