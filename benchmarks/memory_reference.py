"""transformers' peak resident memory on the MLM adaptation job of docs/memory.md: BertForMaskedLM
from all-MiniLM-L6-v2's weights, batches of 32 x 128 tokens, 15% masked (a new batch each
step), autocast in the given precision, fused AdamW; prints steps/s and ``ru_maxrss``.
Run it alone in its process (its peak is the process's).

    python benchmarks/memory_reference.py --precision bf16 --steps 20 --threads 1
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from _common import minilm_dir
from bench_train import precision_ctx, pretraining_batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(str(minilm_dir())).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    V = model.config.vocab_size
    t0 = time.perf_counter()
    for k in range(args.steps):
        batch = pretraining_batch(32, 128, V, seed=k)
        with precision_ctx(args.precision):
            loss = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                labels=batch["labels"],
            ).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"transformers BertForMaskedLM (MiniLM), {args.precision}, {args.steps} steps of 32 x 128: "
        f"{args.steps / seconds:.2f} steps/s, peak {peak:,.0f} MB"
    )


if __name__ == "__main__":
    main()
