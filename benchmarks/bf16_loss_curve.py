"""Does bf16 autocast learn like fp32? Two 200-step MLM runs of a mini BERT on real WikiText-2
text, identical in everything (initial weights, batches, masking, dropout masks, learning rate)
but the precision, and the gap between their loss curves.

    python benchmarks/bf16_loss_curve.py --steps 200 --batch-size 32

Prints per-window mean losses of both runs and the largest relative gap between the curves
smoothed over ``--window`` steps (the issue's criterion: within 1%).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from _common import SHARED_DATA, log, markdown_table, minilm_dir

from bertforge.data.masking import mask_tokens
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM
from bertforge.training.optim import build_optimizer, lr_at, set_lr


def wikitext_sequences(T: int) -> torch.Tensor:
    """WikiText-2 valid + test as (n, T) windows [CLS] ... [SEP], MiniLM's (BERT-base) vocab."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    text = "".join(
        (SHARED_DATA / "wikitext2" / name).read_text(encoding="utf-8")
        for name in ("wiki.valid.tokens", "wiki.test.tokens")
    )
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("=")]
    ids = [i for e in tok.encode_batch(lines, add_special_tokens=False) for i in e.ids]
    n = T - 2
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rows = [[cls, *ids[i : i + n], sep] for i in range(0, len(ids) - n, n)]
    return torch.tensor(rows)


def run(
    precision: str, data: torch.Tensor, steps: int, B: int, lr: float, seed: int
) -> list[float]:
    cfg = BertConfig.preset("mini", vocab_size=30522)
    torch.manual_seed(seed)
    model = BertForMaskedLM(cfg).train()
    opt = build_optimizer(model, lr)
    g = torch.Generator().manual_seed(seed)  # batches and masks: the same for both precisions
    ctx = (
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        if precision == "bf16"
        else contextlib.nullcontext
    )
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        ids = data[torch.randint(0, len(data), (B,), generator=g)]  # (B, T)
        special = (ids == 101) | (ids == 102)
        inputs, labels = mask_tokens(
            ids, special, mask_token_id=103, vocab_size=cfg.vocab_size, generator=g
        )
        set_lr(opt, lr_at(step, max_lr=lr, warmup=steps // 10, total=steps))
        with ctx():
            loss = model(inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0:
            log(
                f"{precision} step {step} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f} s)"
            )
    return losses


def smooth(x: list[float], w: int) -> list[float]:
    return [sum(x[i - w + 1 : i + 1]) / w for i in range(w - 1, len(x))]


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    data = wikitext_sequences(args.seq_len)
    curves = {
        prec: run(prec, data, args.steps, args.batch_size, args.lr, args.seed)
        for prec in ("fp32", "bf16")
    }
    w = args.window
    s32, s16 = smooth(curves["fp32"], w), smooth(curves["bf16"], w)
    gaps = [abs(a - b) / a for a, b in zip(s32, s16, strict=True)]
    rows = []
    for end in range(w, args.steps + 1, w):
        a = sum(curves["fp32"][end - w : end]) / w
        b = sum(curves["bf16"][end - w : end]) / w
        rows.append([f"{end - w + 1}-{end}", f"{a:.4f}", f"{b:.4f}", f"{(b - a) / a:+.2%}"])
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    text = (
        f"### bf16 vs fp32 MLM loss curve ({args.steps} steps, mini, B={args.batch_size}, "
        f"T={args.seq_len}, WikiText-2)\n\n"
        + markdown_table(["steps", "fp32 mean loss", "bf16 mean loss", "bf16 vs fp32"], rows)
        + f"\n\nLargest gap between the {w}-step moving averages: {gaps[worst]:.2%} "
        f"(at step {worst + w}); {'within' if gaps[worst] <= 0.01 else 'NOT within'} 1%."
    )
    return text


if __name__ == "__main__":
    from _common import machine_markdown

    print(machine_markdown() + "\n")  # the CPU, its vector features, what `auto` picks
    print(main())
