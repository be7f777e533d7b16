"""fp32 against bf16 autocast, training steps by hidden size: the measurement behind
``bertforge.runtime.auto_precision`` (what ``--precision auto`` picks on a CPU with native bf16).

Per hidden size, one subprocess alternates fp32 and bf16 pretraining steps (MLM + NSP, AdamW,
the given batch) on the same weights and prints tokens/s of each and their ratio; a second pair of
subprocesses, one per precision, reads the peak resident memory of a few steps alone.

    python benchmarks/precision_sweep.py --hidden 128 256 384 768 --threads 1 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def layers_for(hidden: int) -> int:
    """The depth of the named model of that width (Tiny 2, Mini 4, MiniLM 6); 2 for the rest,
    which keeps the sweep short (the fp32/bf16 ratio is per layer)."""
    return {128: 2, 256: 4, 384: 6}.get(hidden, 2)


def one(hidden: int, precisions: list[str], reps: int, batch: int, vocab: int) -> dict:
    import torch
    from _common import hf_adamw  # noqa: F401  (puts src on the path like the other benchmarks)
    from bench_train import make_step, pretraining_batch

    from bertforge.modeling.config import BertConfig
    from bertforge.modeling.model import BertForPreTraining
    from bertforge.training.optim import build_optimizer

    torch.manual_seed(0)
    cfg = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers_for(hidden),
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        vocab_size=vocab,
    )
    # a new batch each step, as in training: the number of masked rows (the shape of the MLM
    # head's products) changes from step to step; with one fixed batch bf16 looks faster than
    # it trains (oneDNN builds its bf16 kernels per shape, see docs/memory.md)
    batches = [pretraining_batch(batch, 128, vocab, seed=k) for k in range(reps + 2)]
    state, cases = None, {}
    for precision in precisions:
        model = BertForPreTraining(cfg).train()
        state = state or model.state_dict()
        model.load_state_dict(state)
        opt = build_optimizer(model, 1e-4)
        cases[precision] = [make_step(model, opt, b, precision) for b in batches]
    times: dict[str, list[float]] = {p: [] for p in precisions}
    for k in range(reps + 2):
        order = precisions if k % 2 == 0 else precisions[::-1]
        for p in order:
            t0 = time.perf_counter()
            cases[p][k]()
            if k >= 2:  # the first two: warm-up
                times[p].append(time.perf_counter() - t0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "hidden": hidden,
        "layers": layers_for(hidden),
        "tok_s": {p: batch * 128 / statistics.median(t) for p, t in times.items()},
        "peak_mb": peak_mb,
    }


def run_child(args: list[str], threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 256, 384, 768])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        result = one(args.hidden[0], args.precisions, args.reps, args.batch, args.vocab)
        print(json.dumps(result))
        return
    from bertforge.runtime import cpu_model

    print(f"CPU: {cpu_model()}, {args.threads} thread(s), batch {args.batch} x 128, V={args.vocab}")
    print("| hidden | layers | fp32 tok/s | bf16 tok/s | bf16 / fp32 | peak fp32 | peak bf16 |")
    print("|---|---|---|---|---|---|---|")
    for hidden in args.hidden:
        common = ["--hidden", str(hidden), "--batch", str(args.batch), "--vocab", str(args.vocab)]
        both = run_child([*common, "--reps", str(args.reps)], args.threads)
        peaks = {
            prec: run_child([*common, "--reps", "2", "--precisions", prec], args.threads)["peak_mb"]
            for prec in ("fp32", "bf16")
        }
        fp32, bf16 = both["tok_s"]["fp32"], both["tok_s"]["bf16"]
        print(
            f"| {hidden} | {both['layers']} | {fp32:,.0f} | {bf16:,.0f} | {bf16 / fp32:.2f}x | "
            f"{peaks['fp32']:,.0f} MB | {peaks['bf16']:,.0f} MB |",
            flush=True,
        )


if __name__ == "__main__":
    main()
