"""transformers' own ``BertForSequenceClassification`` trained as a reranker on the pairs
``reranker_qa.py`` mines, in a plain PyTorch loop: the reference that says whether a reranker
that stays at the class prior is bertforge's doing or the start's and the budget's (issue 67).

The same recipe as ``reranker_qa.py``'s fine-tune: two classes, cross-entropy, AdamW (weight
decay 0.01), linear warm-up over 10% of the steps then linear decay, gradient clipping at 1,
longest-first truncation at ``--max_length``, batches of ``--batch_size`` in a fixed shuffled
order. Every ``--eval_every`` steps it prints the training loss and the ROC AUC of
``logit[1] - logit[0]`` on the first ``--held_out`` mined pairs (not trained on).

    OMP_NUM_THREADS=1 python benchmarks/reranker_reference.py --work /tmp/reranker-ref
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from _common import log, machine_markdown, minilm_dir
from reranker_qa import mine


def auc(labels: list[int], scores: list[float]) -> float:
    """ROC AUC: the chance that a random positive scores above a random negative (ties half)."""
    y, s = np.asarray(labels), np.asarray(scores)
    pos, neg = s[y == 1], s[y == 0]
    return float(((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None])).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/reranker-ref"))
    parser.add_argument("--start", default=None, help="start model (default all-MiniLM-L6-v2)")
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--negatives", type=int, default=3)
    parser.add_argument("--random_negatives", type=int, default=0)
    parser.add_argument("--max_length", type=int, default=160)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--held_out", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "train.jsonl").exists():
        log(f"mined: {mine(args, args.work)}")
    pairs = [json.loads(x) for x in (args.work / "train.jsonl").read_text().splitlines()]
    held, train = pairs[: args.held_out], pairs[args.held_out :]
    start = args.start or str(minilm_dir())
    tokenizer = AutoTokenizer.from_pretrained(start)
    model = BertForSequenceClassification.from_pretrained(start, num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (args.steps - s) / (args.steps - warm)))
    )

    def encode(rows: list[dict]) -> dict[str, torch.Tensor]:
        return tokenizer(
            [r["query"] for r in rows],
            [r["passage"] for r in rows],
            truncation="longest_first",
            max_length=args.max_length,
            padding=True,
            return_tensors="pt",
        )

    def held_out_auc() -> float:
        model.eval()
        scores: list[float] = []
        with torch.no_grad():
            for i in range(0, len(held), 32):
                logits = model(**encode(held[i : i + 32])).logits
                scores += (logits[:, 1] - logits[:, 0]).tolist()
        model.train()
        return auc([r["label"] for r in held], scores)

    print(f"step 0: held-out AUC {held_out_auc():.3f}", flush=True)
    order = list(range(len(train)))
    random.Random(args.seed).shuffle(order)
    losses: list[float] = []
    began = time.perf_counter()
    for step in range(args.steps):
        rows = [
            train[order[(step * args.batch_size + j) % len(order)]] for j in range(args.batch_size)
        ]
        out = model(**encode(rows), labels=torch.tensor([r["label"] for r in rows]))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
        if (step + 1) % args.eval_every == 0:
            print(
                f"step {step + 1}: training loss {np.mean(losses[-args.eval_every :]):.3f}, "
                f"held-out AUC {held_out_auc():.3f} ({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
    print(machine_markdown())


if __name__ == "__main__":
    main()
