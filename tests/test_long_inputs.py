"""Long inputs on a ModernBERT: a fine-tuning at 1,024 tokens under ``--max_memory`` picks a
micro-batch below the batch from its estimate and peaks within the budget (the evaluation batch
beside what the training steps left: ``MemoryUse.eval_peak``)."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import torch

from bertforge.modeling.config import ModernBertConfig
from bertforge.modeling.modernbert import ModernBertForMaskedLM
from bertforge.runtime import format_bytes
from bertforge.tokenizer.wordpiece import Tokenizer

MB = 2**20
WORDS = [
    "good",
    "bad",
    "fine",
    "film",
    "plot",
    "actor",
    "scene",
    "long",
    "dull",
    "great",
    "story",
    "ending",
]


def _bertforge(argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "bertforge.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _long_task(root: Path) -> tuple[Path, Path]:
    """A tiny ModernBERT with 1,024 positions (hidden 32, a global and a local layer, a window
    of 64) and 8 reviews of ~1,500 words, each past 1,024 tokens."""
    rng = random.Random(0)
    corpus = root / "corpus.txt"
    corpus.write_text(" ".join(rng.choice(WORDS) for _ in range(2000)) + "\n", encoding="utf-8")
    tokenizer = Tokenizer.train(corpus, vocab_size=120, min_frequency=1)
    special = dict(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id)
    special |= dict(sep_token_id=tokenizer.sep_id, bos_token_id=tokenizer.cls_id)
    config = ModernBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        local_attention=64,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.sep_id,
        **special,
    )
    torch.manual_seed(0)
    model_dir = root / "start"
    ModernBertForMaskedLM(config).save_pretrained(model_dir, tokenizer=tokenizer)
    train = root / "train.csv"
    with train.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i in range(8):
            writer.writerow([" ".join(rng.choice(WORDS) for _ in range(1500)), i % 2])
    return model_dir, train


def test_a_1024_token_modernbert_finetune_fits_its_budget(tmp_path):
    model_dir, train = _long_task(tmp_path)
    argv = ["finetune", "--model", str(model_dir), "--train", str(train)]
    argv += ["--validation", str(train), "--max_length", "1024", "--batch_size", "8"]
    argv += ["--max_steps", "1", "--num_threads", "1", "--progress", "false"]
    done = _bertforge([*argv, "--output", str(tmp_path / "a"), "--max_memory", "8GB"])
    assert done.returncode == 0, done.stderr
    assert "micro-batch 8 (1 x 8 per step)" in done.stderr
    found = re.search(
        r"= (\d+) MB held .* \+ ([\d.]+) MB a sequence \+ ([\d.]+) MB an evaluation", done.stderr
    )
    assert found, done.stderr
    held, per_sequence, per_eval = (float(x) * MB for x in found.groups())
    assert per_sequence > per_eval > 0.5 * MB  # 1,024 tokens' activations, a quarter of them

    # 2 sequences and an evaluation one fit, 4 do not: it must accumulate 4 x 2
    budget = int(held + 2.5 * per_sequence + per_eval)
    out = tmp_path / "b"
    done = _bertforge([*argv, "--output", str(out), "--max_memory", str(budget)])
    assert done.returncode == 0, done.stderr
    assert "micro-batch 2 (4 x 2 per step)" in done.stderr, done.stderr
    results = json.loads((out / "eval_results.json").read_text())
    assert results["tokens"] == 8 * 1024  # every review cut to 1,024 tokens, none shorter
    peak = results["peak_memory_bytes"]
    assert peak <= budget, (format_bytes(peak), format_bytes(budget))
    assert "went over --max_memory" not in done.stderr
