"""Small learnable labelled data sets and tiny start models for the fine-tuning and inference
tests (imported by test_finetune.py and test_predict.py).

The sentiment rule is one keyword: a text holding "good" is ``pos``, one holding "bad" is
``neg``; the rest is random filler. A tiny randomly initialised BERT learns it in seconds, so
accuracy far above chance shows that the loop, the labels and the saved model all work.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import torch

from bertforge import cli
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining
from bertforge.tokenizer.wordpiece import Tokenizer

FILLER = [
    "the",
    "movie",
    "was",
    "a",
    "film",
    "with",
    "some",
    "actors",
    "and",
    "a",
    "plot",
    "about",
    "people",
    "who",
    "went",
    "to",
    "see",
    "it",
    "on",
    "day",
    "one",
    "night",
    "in",
    "town",
    "story",
    "scene",
    "music",
    "time",
]


def sentence(rng: random.Random, keyword: str, repeats: int = 1) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(5, 12))]
    for _ in range(repeats):
        words.insert(rng.randint(0, len(words)), keyword)
    return " ".join(words) + " ."


def write_sentiment(path: Path, n: int, seed: int, fmt: str = "csv") -> list[dict]:
    """``n`` rows ``{"text", "label"}``; label pos/neg decided by the keyword good/bad."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        rows.append({"text": sentence(rng, "good" if label == "pos" else "bad"), "label": label})
    write_rows(path, rows, fmt)
    return rows


def write_scores(path: Path, n: int, seed: int) -> list[dict]:
    """Regression rows: ``score`` = 2 x the number of times "good" appears (0-3 times)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(0, 3)
        rows.append({"review": sentence(rng, "good", k), "score": 2 * k})
    write_rows(path, rows, "csv")
    return rows


def write_rows(path: Path, rows: list[dict], fmt: str = "csv") -> None:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(
            f, fieldnames=list(rows[0]), delimiter="\t" if fmt == "tsv" else ","
        )
        writer.writeheader()
        writer.writerows(rows)


def tiny_start_model(root: Path, kind: str = "pretraining") -> Path:
    """A tiny randomly initialised BERT with a tokenizer trained on the filler words, saved as
    a model directory (the shape of our own pretrained output)."""
    corpus = root / "corpus.txt"
    rng = random.Random(0)
    lines = [sentence(rng, rng.choice(["good", "bad", "fine"])) for _ in range(300)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer = Tokenizer.train(corpus, vocab_size=120, min_frequency=1)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    cls = BertForPreTraining if kind == "pretraining" else BertForMaskedLM
    torch.manual_seed(0)  # the same start whatever earlier tests did to the global RNG
    model = cls(config)
    out = root / f"tiny-{kind}"
    model.save_pretrained(out, tokenizer=tokenizer)
    return out


def evaluate_cli(model: Path, data: Path, output: Path, *options: str) -> int:
    """Run ``bertforge evaluate`` of ``model`` on ``data`` in fp32, the results JSON to
    ``output``; returns the exit code."""
    argv = ["evaluate", "--model", str(model), "--data", str(data), "--output", str(output)]
    return cli.main([*argv, "--precision", "fp32", *options])
