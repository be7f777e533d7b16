"""The MLM training step of ModernBERT against BERT at one preset (same width, depth and cost
per token by design: docs/modernbert.md, "Against our BERT of the same cost"): forward +
backward of bertforge's two masked LMs on one batch of real tokens, fp32, one thread, the
two alternating, each side's minimum and median.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_modern_vs_bert.py --preset tiny --reps 10
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import machine_markdown

from bertforge.modeling.config import BertConfig, ModernBertConfig
from bertforge.modeling.model import BertForMaskedLM
from bertforge.modeling.modernbert import ModernBertForMaskedLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--mask_rate", type=float, default=0.25)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, T, V = args.batch, args.length, args.vocab
    modern = ModernBertConfig.preset(args.preset)
    modern.vocab_size, modern.pad_token_id = V, 0
    modern.cls_token_id = modern.bos_token_id = 2
    modern.sep_token_id = modern.eos_token_id = 3
    bert = BertConfig.preset(args.preset)
    bert.vocab_size = V
    ids = torch.randint(5, V, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100)
    chosen = torch.rand(B, T) < args.mask_rate
    labels[chosen] = ids[chosen]
    models = {
        "ModernBERT": ModernBertForMaskedLM(modern).train(),
        "BERT": BertForMaskedLM(bert).train(),
    }

    def step(model: torch.nn.Module) -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        step(model)  # warm-up: kernels built, buffers allocated
    for _ in range(args.reps):
        for name, model in models.items():
            times[name].append(step(model))
    print(f"{args.preset}, batch {B} x {T} (all real tokens), vocabulary {V:,}, fp32, 1 thread\n")
    print("| model | parameters | step min | step median |")
    print("|---|---|---|---|")
    for name, model in models.items():
        t = sorted(times[name])
        params = sum(p.numel() for p in model.parameters())
        print(f"| {name} | {params:,} | {t[0] * 1e3:,.0f} ms | {t[len(t) // 2] * 1e3:,.0f} ms |")
    ratio = min(times["ModernBERT"]) / min(times["BERT"])
    print(f"\nModernBERT / BERT (minima): {ratio:.2f}x\n\n{machine_markdown()}")


if __name__ == "__main__":
    main()
