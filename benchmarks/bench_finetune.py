"""Fine-tuning step on real AG News lengths: bertforge (dynamic padding + unpadding) vs transformers
padded to 128, both from the real all-MiniLM-L6-v2 encoder with a fresh 4-class head.

A sample is ``steps`` consecutive training steps over different real batches of 32 (title +
description, truncated at 128 tokens), so each side sees the same mix of lengths.

    python benchmarks/bench_finetune.py --reps 5
"""

from __future__ import annotations

import argparse
import csv
import random
from collections.abc import Callable

import torch
from _common import SHARED_DATA, alternate, fmt, hf_adamw, hf_twin, log, markdown_table, minilm_dir

from bertforge.modeling.model import BertForSequenceClassification
from bertforge.training.optim import build_optimizer

MAX_LEN = 128


def ag_news_batches(n_batches: int, B: int = 32, seed: int = 0) -> list[dict[str, list]]:
    """``n_batches`` random batches of token id lists and labels from AG News test.csv."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_LEN)
    with open(SHARED_DATA / "ag_news" / "test.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    random.Random(seed).shuffle(rows)
    rows = rows[: n_batches * B]
    enc = tok.encode_batch([r["title"] + " " + r["description"] for r in rows])
    return [
        {
            "ids": [e.ids for e in enc[i : i + B]],
            "labels": [int(r["label"]) - 1 for r in rows[i : i + B]],
        }
        for i in range(0, len(rows), B)
    ]


def collate(batch: dict[str, list], length: int | None) -> dict[str, torch.Tensor]:
    """Pad to ``length`` (None: the longest sequence of the batch, i.e. dynamic padding)."""
    T = length or max(len(x) for x in batch["ids"])
    ids = torch.zeros(len(batch["ids"]), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(batch["ids"]):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(batch["labels"])}


def make_steps(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[dict]
) -> Callable[[], None]:
    def steps() -> None:
        for batch in batches:
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return steps


def bench_finetune(reps: int = 5, warmup: int = 1, steps: int = 4) -> tuple[str, dict]:
    torch.manual_seed(0)
    raw = ag_news_batches(steps)
    ours = BertForSequenceClassification.from_pretrained(minilm_dir(), num_labels=4).train()
    hf = hf_twin(ours, "BertForSequenceClassification").train()
    ours_batches = [collate(b, None) for b in raw]
    hf_batches = [collate(b, MAX_LEN) for b in raw]
    real = sum(int(b["attention_mask"].sum()) for b in hf_batches)
    dyn = sum(b["input_ids"].numel() for b in ours_batches)
    cases = {
        "ours": make_steps(ours, build_optimizer(ours, 2e-5), ours_batches),
        "HF": make_steps(hf, hf_adamw(hf, 2e-5), hf_batches),
    }
    log(f"finetune: timing {list(cases)} x {reps} ({steps} steps per sample)")
    t = alternate(cases, warmup=warmup, reps=reps)
    n = steps * 32
    row = [
        "fine-tune step, AG News, all-MiniLM-L6-v2 + 4-class head",
        f"{fmt(n / t['ours'].median, 1)} ± {t['ours'].spread:.0%}",
        f"{fmt(n / t['HF'].median, 1)} ± {t['HF'].spread:.0%}",
        f"**{t['HF'].median / t['ours'].median:.2f}x**",
    ]
    note = (
        f"Real tokens are {real / (steps * 32 * MAX_LEN):.0%} of HF's padded 32x128 batches; "
        f"dynamic padding alone keeps {dyn / (steps * 32 * MAX_LEN):.0%} of them."
    )
    return note, {"row": row, "ratio": t["HF"].median / t["ours"].median}


def main(argv: list[str] | None = None, checks: dict | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args(argv)
    note, res = bench_finetune(reps=args.reps, steps=args.steps)
    if checks is not None:
        checks["fine-tuning step, AG News: ours / HF padded"] = (res["ratio"], 2.0)
    header = ["measurement (samples/s)", "ours", "HF padded to 128", "ours / HF"]
    return "### Fine-tuning step\n\n" + markdown_table(header, [res["row"]]) + "\n\n" + note


if __name__ == "__main__":
    from _common import machine_markdown

    print(machine_markdown() + "\n")  # the CPU, its vector features, what `auto` picks
    print(main())
