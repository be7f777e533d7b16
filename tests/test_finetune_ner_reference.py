"""benchmarks/finetune_ner_reference.py (issue 39: entity F1 and training time beside
transformers' Trainer): the transformers side labels the same pieces as ours, and ``--smoke``
runs both sides end to end on real WikiANN sentences."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_run_ner_labels_are_ours_on_real_sentences(shared_data, minilm_dir):
    transformers = pytest.importorskip("transformers")
    from finetune_ner_reference import hf_encode, read_conll

    from bertforge.data.tagging import IGNORE, build_tag_map, encode_tagged
    from bertforge.tokenizer.wordpiece import Tokenizer

    sents = read_conll(shared_data / "ner" / "wnut17" / "test.conll")[:60]
    label2id = {v: k for k, v in build_tag_map([t for _, t in sents]).items()}
    hf_tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    rows, firsts = hf_encode(hf_tok, sents, label2id, max_length=512)
    tags = [np.array([label2id[t] for t in s[1]]) for s in sents]
    ours = encode_tagged(
        Tokenizer.from_file(minilm_dir), [w for w, _ in sents], tags, max_length=512
    )
    assert len(ours.encoded) == len(rows)  # no sentence needed a second window
    for i, row in enumerate(rows):
        assert ours.encoded[i][0].tolist() == row["input_ids"]
        assert list(ours.labels[i]) == row["labels"]
        assert len(firsts[i]) == len(sents[i][0])
        assert [row["labels"][p] for p in firsts[i]] == list(tags[i])
    assert any(np.sum(np.asarray(r["labels"]) == IGNORE) > 2 for r in rows)  # later pieces


@pytest.mark.slow
def test_smoke_runs_both_sides_and_prints_the_table(shared_data, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("seqeval")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        BERTFORGE_SHARED_DATA=str(shared_data),
    )
    script = ROOT / "benchmarks" / "finetune_ner_reference.py"
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["counts"]["train"] == 32
    for side in ("bertforge", "transformers"):
        r = result[side]
        assert 0.0 <= r["entity_f1"] <= 1.0 and r["steps"] >= 2
        assert r["train_seconds"] > 0 and r["peak_rss_mb"] > 100
        assert 0.0 <= r["entity_f1_whole"] <= 1.0 and r["cut_test_sentences"] >= 0
    assert result["f1_diff"] == pytest.approx(
        result["bertforge"]["entity_f1"] - result["transformers"]["entity_f1"]
    )
    assert "| bertforge |" in done.stdout and "| transformers Trainer |" in done.stdout
    assert "training time ratio" in done.stdout
