"""Profile one side's pretraining step with torch.profiler and print the top operators.

python benchmarks/profile_step.py --size mini --precision fp32 --side ours
python benchmarks/profile_step.py --size tiny --vocab 8192 --batch 64 --mask_rate 0.25 --dropout 0
    (the step of the IMDB recipe, configs/imdb-20m.yaml)
python benchmarks/profile_step.py --size mini --precision fp32 --time 12
    (no profiler: the median of 12 steps alone in this process and the minor page faults a step)
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import time

from _common import hf_adamw, hf_twin
from bench_train import make_step, pretraining_batch
from torch.profiler import ProfilerActivity, profile

from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForPreTraining
from bertforge.training.optim import build_optimizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="mini")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--side", default="ours", choices=["ours", "hf"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--batch", type=int, default=32, help="sequences per step (of 128 tokens)")
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--mask_rate", type=float, default=0.15)
    p.add_argument("--dropout", type=float, default=None, help="default: the preset's 0.1")
    p.add_argument("--time", type=int, default=0, help="time this many steps instead")
    args = p.parse_args()
    cfg = BertConfig.preset(args.size, vocab_size=args.vocab)
    if args.dropout is not None:
        cfg = dataclasses.replace(
            cfg, hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout
        )
    model = BertForPreTraining(cfg).train()
    if args.side == "hf":
        model = hf_twin(model, "BertForPreTraining").train()
        opt = hf_adamw(model)
    else:
        opt = build_optimizer(model, 1e-4)
    batch = pretraining_batch(args.batch, 128, cfg.vocab_size, rate=args.mask_rate)
    step = make_step(model, opt, batch, args.precision)
    step()
    step()
    if args.time:
        seconds, faults = [], []
        for _ in range(args.time):
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        print(
            f"{args.side} {args.size} {args.precision}: median step "
            f"{statistics.median(seconds) * 1e3:.1f} ms, {statistics.median(faults):.0f} minor "
            f"page faults a step ({args.time} steps)"
        )
        return
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    from _common import machine_markdown

    print(machine_markdown() + "\n")  # the CPU, its vector features, what `auto` picks
    main()
