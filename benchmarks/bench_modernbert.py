"""ModernBERT step time: bertforge vs transformers' ModernBERT on the same weights, batch and
threads, fp32 on the CPU, the two sides alternating in one loop (``_common.alternate``).

* training: forward + backward + AdamW of the masked LM, 30% of the real tokens labelled
  (ModernBERT's rate); transformers as its classes come (``sparse_prediction`` False: the
  decoder runs on every position; sdpa attention over the padded grid);
* inference: the encoder (``ModernBertModel``) on a padded batch, no gradient.

Batches are padded (lengths drawn from 50-100% of T), at T 128 and 512 tokens. Each cell is the
median with its spread and the minimum: on a shared machine the minimum is the sample other
jobs disturbed least.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_modernbert.py --preset mini --reps 5
"""

from __future__ import annotations

import argparse

import torch
import transformers
from _common import alternate, fmt, log, machine_markdown, markdown_table

from bertforge.modeling.config import ModernBertConfig
from bertforge.modeling.modernbert import ModernBertForMaskedLM

VOCAB = 30522


def padded_batch(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids[:, 0] = 2
    ids[mask == 0] = 0
    chosen = (torch.rand(B, T, generator=g) < 0.3) & mask.bool()
    chosen[:, 0] = False
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def twins(preset: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    config = ModernBertConfig.preset(
        preset,
        vocab_size=VOCAB,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(config)
    hf_config = transformers.ModernBertConfig(**config.to_dict())
    hf_config._attn_implementation = "sdpa"
    theirs = transformers.ModernBertForMaskedLM(hf_config)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def infer(encoder: torch.nn.Module, batch: dict[str, torch.Tensor]):
    def run() -> None:
        with torch.no_grad():
            encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--shapes", default="16x128,4x512", help="BxT,BxT")
    args = parser.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        B, T = map(int, shape.split("x"))
        batch = padded_batch(B, T)
        ours, theirs = twins(args.preset)
        ours.train(), theirs.train()
        log(f"training {B}x{T}")
        t = alternate(
            {"ours": train_step(ours, batch), "transformers": train_step(theirs, batch)},
            warmup=2,
            reps=args.reps,
        )
        ours.eval(), theirs.eval()
        log(f"inference {B}x{T}")
        i = alternate(
            {"ours": infer(ours.model, batch), "transformers": infer(theirs.model, batch)},
            warmup=2,
            reps=args.reps,
        )
        tokens = int(batch["attention_mask"].sum())
        for what, timing in (("training step", t), ("inference", i)):
            a, b = timing["ours"], timing["transformers"]
            rows.append(
                [
                    what,
                    f"{B} x {T} ({tokens} real)",
                    f"{fmt(a.median * 1000)} ms ±{a.spread:.0%} (min {fmt(min(a.samples) * 1000)})",
                    f"{fmt(b.median * 1000)} ms ±{b.spread:.0%} (min {fmt(min(b.samples) * 1000)})",
                    f"{b.median / a.median:.2f}x ({min(b.samples) / min(a.samples):.2f}x)",
                ]
            )
    print(machine_markdown())
    print(
        f"\nModernBERT preset {args.preset}, vocabulary {VOCAB}, fp32, "
        f"{torch.get_num_threads()} thread(s), medians of {args.reps}\n"
    )
    header = ["", "batch", "bertforge", "transformers", "speed-up median (min)"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
