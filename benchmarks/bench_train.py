"""Pretraining step (forward + backward + AdamW, MLM + NSP, 15% masking): bertforge vs transformers.

For each size, four cases alternate in one loop: ours and HF, each in fp32 and under bf16 autocast
(fp32 master weights on both sides). Reported: tokens/s, the ratios, and model FLOP utilisation
(MFU) against this machine's measured matmul rate.

    python benchmarks/bench_train.py --sizes mini small --reps 5

Peak resident memory is measured apart, each side in a process of its own (so that one side's
peak never counts against the other): ``warmup + reps`` steps on a new batch each (the number
of masked tokens, and so the MLM head's shapes, change from step to step as in training).
``--no_memory`` leaves it out.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _common import (
    CEILING_HEADER,
    Timing,
    alternate,
    ceiling_row,
    fmt,
    hf_adamw,
    hf_twin,
    log,
    machine_markdown,
    markdown_table,
    matmul_flops,
    matmul_rate,
)

from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForPreTraining
from bertforge.training.optim import build_optimizer

CLS, SEP, MASK, FIRST_WORD = 101, 102, 103, 1000  # BERT-base uncased layout (V = 30522)


def pretraining_batch(
    B: int, T: int, vocab: int, rate: float = 0.15, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A full-length NSP batch: [CLS] A [SEP] B [SEP], 15% of the word positions masked 80/10/10."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_WORD, vocab, (B, T), generator=g)
    cut = torch.randint(T // 4, 3 * T // 4, (B,), generator=g)
    pos = torch.arange(T)
    ids[:, 0] = CLS
    ids[torch.arange(B), cut] = SEP
    ids[:, -1] = SEP
    types = (pos[None, :] > cut[:, None]).long()  # (B, T) segment B after the middle [SEP]
    special = (ids == CLS) | (ids == SEP)
    chosen = (torch.rand(B, T, generator=g) < rate) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    r = torch.rand(B, T, generator=g)
    inputs = ids.clone()
    inputs[chosen & (r < 0.8)] = MASK
    swap = chosen & (r >= 0.8) & (r < 0.9)
    inputs[swap] = torch.randint(FIRST_WORD, vocab, (int(swap.sum()),), generator=g)
    return {
        "input_ids": inputs,
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "token_type_ids": types,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (B,), generator=g),
    }


def train_flops(cfg: BertConfig, B: int, T: int, n_masked: int) -> float:
    """Model FLOPs of one training step (3 x forward matmul FLOPs), counting the MLM decoder on the
    masked positions only: the work the step needs, whichever way it is computed."""
    H, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    ffn = cfg.intermediate_size
    per_token = L * (2 * 4 * H * H + 2 * 2 * H * ffn + 2 * 2 * T * H)  # QKV+out, FFN, QK^T and AV
    per_masked = 2 * H * H + 2 * H * V  # head transform + tied decoder
    per_sequence = 2 * H * H + 2 * H * 2  # pooler + NSP classifier
    return 3.0 * (B * T * per_token + n_masked * per_masked + B * per_sequence)


def precision_ctx(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict, precision: str
) -> Callable[[], None]:
    def step() -> None:
        with precision_ctx(precision):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


@dataclass
class TrainResult:
    size: str
    tokens: int
    flops: float
    timings: dict[str, Timing]
    matmul_flops: dict[str, float]
    """Matmul FLOPs each side's step executes ("ours", "HF"), counted by torch's flop counter."""


def bench_pretrain(
    size: str,
    B: int = 32,
    T: int = 128,
    reps: int = 5,
    warmup: int = 2,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
) -> TrainResult:
    torch.manual_seed(0)
    cfg = BertConfig.preset(size, vocab_size=30522)
    batch = pretraining_batch(B, T, cfg.vocab_size)
    n_masked = int((batch["labels"] != -100).sum())
    cases = {}
    for precision in precisions:
        ours = BertForPreTraining(cfg).train()
        hf = hf_twin(ours, "BertForPreTraining").train()
        cases[f"ours {precision}"] = make_step(ours, build_optimizer(ours, 1e-4), batch, precision)
        cases[f"HF {precision}"] = make_step(hf, hf_adamw(hf), batch, precision)
    counted = {side: matmul_flops(cases[f"{side} fp32"]) for side in ("ours", "HF")}
    log(f"pretrain {size}: timing {list(cases)} x {reps}")
    timings = alternate(cases, warmup=warmup, reps=reps)
    return TrainResult(size, B * T, train_flops(cfg, B, T, n_masked), timings, counted)


def side_peak(size: str, side: str, precision: str, steps: int, B: int = 32, T: int = 128) -> int:
    """Peak resident bytes of this process after ``steps`` training steps of one side alone
    (a new batch each step): what ``--peak_of`` prints in its own process."""
    import resource

    torch.manual_seed(0)
    cfg = BertConfig.preset(size, vocab_size=30522)
    ours = BertForPreTraining(cfg).train()
    if side == "ours":
        model, opt = ours, build_optimizer(ours, 1e-4)
    else:
        model = hf_twin(ours, "BertForPreTraining").train()
        del ours
        opt = hf_adamw(model)
    for k in range(steps):
        make_step(model, opt, pretraining_batch(B, T, cfg.vocab_size, seed=k), precision)()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_of(size: str, side: str, precision: str, steps: int) -> int:
    """:func:`side_peak` in a fresh process (this script with ``--peak_of``)."""
    import subprocess
    import sys

    argv = [sys.executable, __file__, "--peak_of", side, "--sizes", size]
    argv += ["--precisions", precision, "--reps", str(steps)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def memory_report(sizes: list[str], precisions: tuple[str, ...], steps: int) -> str:
    rows = []
    for size in sizes:
        for precision in precisions:
            log(f"pretrain {size} {precision}: peak memory, each side in its own process")
            peaks = {side: peak_of(size, side, precision, steps) for side in ("ours", "HF")}
            rows.append(
                [
                    size,
                    precision,
                    f"{peaks['ours'] / 2**20:,.0f} MB",
                    f"{peaks['HF'] / 2**20:,.0f} MB",
                    f"**{peaks['ours'] / peaks['HF']:.2f}x**",
                ]
            )
    header = ["size", "precision", "peak RSS ours", "peak RSS HF", "ours / HF"]
    note = (
        f"Peak resident memory (`ru_maxrss`) of a process that builds the model and runs {steps} "
        "steps of one side, a new batch each step."
    )
    return markdown_table(header, rows) + "\n\n" + note


def report(results: list[TrainResult], rates: dict[str, float]) -> str:
    rows = []
    for r in results:
        for precision in [p for p in ("fp32", "bf16") if f"ours {p}" in r.timings]:
            ours, hf = r.timings[f"ours {precision}"], r.timings[f"HF {precision}"]
            own_fp32 = r.timings["ours fp32"]
            rate = rates[precision]
            rows.append(
                [
                    r.size,
                    precision,
                    f"{fmt(r.tokens / ours.median)} ± {ours.spread:.0%}",
                    f"{fmt(r.tokens / hf.median)} ± {hf.spread:.0%}",
                    f"**{hf.median / ours.median:.2f}x**",
                    f"{own_fp32.median / ours.median:.2f}x" if precision == "bf16" else "1.00x",
                    f"{r.flops / ours.median / rate:.0%}",
                    f"{r.flops / hf.median / rate:.0%}",
                ]
            )
    header = [
        "size",
        "precision",
        "ours tok/s",
        "HF tok/s",
        "ours / HF",
        "ours / ours fp32",
        "MFU ours",
        "MFU HF",
    ]
    measured = ", ".join(f"{p} {r / 1e9:,.0f} GFLOP/s" for p, r in rates.items())
    rate_note = (
        f"Measured matmul rate (2048^3 `torch.matmul`): {measured}. MFU = model FLOPs of the "
        "step (decoder on the masked positions only) / step time / that rate of the step's "
        "precision."
    )
    return markdown_table(header, rows) + "\n\n" + rate_note


def ceiling_rows(results: list[TrainResult], rates: dict[str, float]) -> list[list[str]]:
    """Per size, fp32: the matmul-only time of each side's step and the best ratio any
    implementation executing our matmul FLOPs could reach against HF's measured step. (bf16 is
    left out: its 2048^3 rate is far above what the step's small GEMMs can reach.)"""
    rows = []
    for r in results:
        seconds = {side: r.timings[f"{side} fp32"].median for side in ("ours", "HF")}
        label = f"pretraining {r.size} fp32"
        rows.append(ceiling_row(label, r.matmul_flops, seconds, rates["fp32"]))
    return rows


def measure_rates(precisions: tuple[str, ...] = ("fp32", "bf16")) -> dict[str, float]:
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    return {p: matmul_rate(dtypes[p]) for p in precisions}


def add_checks(results: list[TrainResult], rates: dict[str, float], checks: dict) -> None:
    """The issue's targets for the pretraining step: (measured, target) pairs."""
    for r in results:
        t = r.timings
        if r.size == "mini":
            checks["pretraining mini fp32: ours / HF"] = (
                t["HF fp32"].median / t["ours fp32"].median,
                5.0,
            )
        if "ours bf16" in t:
            checks[f"pretraining {r.size}: ours bf16 / ours fp32"] = (
                t["ours fp32"].median / t["ours bf16"].median,
                1.4,
            )
        if r.size == "small":
            mfu = r.flops / t["ours fp32"].median / rates["fp32"]
            checks["pretraining small fp32: MFU"] = (mfu, 0.5)


CEILING_NOTE = (
    "Matmul-only time = the matmul FLOPs one step executes (forward + backward, counted by "
    "`torch.utils.flop_counter`) / the measured 2048^3 matmul rate of that precision: the step of "
    "a perfect implementation doing exactly these products. The ceiling column is HF's measured "
    "step over our matmul-only time: the best ratio any implementation with our FLOPs could reach."
)


def main(
    argv: list[str] | None = None, checks: dict | None = None, ceiling: list | None = None
) -> str:
    """The pretraining section. ``checks`` collects the issue's targets; ``ceiling`` (if given)
    collects the ceiling rows instead of printing them in this section."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["mini", "small"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp32", "bf16"],
        default=["fp32", "bf16"],
        help="fp32 alone on a CPU without native bf16, where autocast's bf16 is emulated and slow",
    )
    p.add_argument("--no_memory", action="store_true", help="leave out the peak-memory table")
    p.add_argument("--peak_of", choices=["ours", "HF"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peak_of:  # a child of memory_report: one side alone, its peak on stdout
        precision = args.precisions[0]
        print(side_peak(args.sizes[0], args.peak_of, precision, args.reps))
        return ""
    if "fp32" not in args.precisions:
        p.error("--precisions needs fp32 (the ratios and the ceiling are against it)")
    rates = measure_rates(tuple(args.precisions))
    kwargs = {"reps": args.reps, "warmup": args.warmup, "precisions": tuple(args.precisions)}
    results = [bench_pretrain(s, **kwargs) for s in args.sizes]
    # the machine is shared: take the better of two readings
    rates_after = measure_rates(tuple(args.precisions))
    rates = {k: max(rates[k], rates_after[k]) for k in rates}
    if checks is not None:
        add_checks(results, rates, checks)
    text = "### Pretraining step (B=32, T=128, MLM + NSP, AdamW)\n\n" + report(results, rates)
    if not args.no_memory:
        steps = args.warmup + args.reps
        text += "\n\n" + memory_report(args.sizes, tuple(args.precisions), steps)
    rows = ceiling_rows(results, rates)
    if ceiling is not None:
        ceiling.extend(rows)
        return text
    return f"{text}\n\n{markdown_table(CEILING_HEADER, rows)}\n\n{CEILING_NOTE}"


if __name__ == "__main__":
    import sys

    if "--peak_of" in sys.argv:
        main()
    else:
        print(machine_markdown() + "\n")
        print(main())
