"""ModernBERT step time: bertforge vs transformers' ModernBERT on the same weights, batch and
threads, fp32 on the CPU, the two sides alternating in one loop (``_common.alternate``).

* training: forward + backward + AdamW of the masked LM, 30% of the real tokens labelled
  (ModernBERT's rate); transformers as its classes come (``sparse_prediction`` False: the
  decoder runs on every position; sdpa attention over the padded grid);
* inference: the encoder (``ModernBertModel``) on a padded batch, no gradient.

Batches are padded (lengths drawn from 50-100% of T), at T 128, 512 and 1,024 tokens with
about the same tokens a batch (16 x 128, 4 x 512, 2 x 1,024). Each cell is the median with its
spread and the minimum: on a shared machine the minimum is the sample other jobs disturbed
least. ``--precision bf16`` runs both sides under CPU autocast (bf16), their weights fp32.

``--against torch-geglu`` measures the fused GeGLU kernel instead (``ops.gated_activation``):
bertforge against itself with the GeGLU in torch ops (the kernel turned off for that side's
calls), same weights, alternating; plus the bytes autograd keeps for one forward on each side.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_modernbert.py --preset mini --reps 5
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_modernbert.py --precision bf16
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_modernbert.py --against torch-geglu
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_modernbert.py --against whole-last-layer \
        --preset tiny --shapes 64x128,8x1024

``--against whole-last-layer`` measures the sparse last layer (the masked-LM training step with
the last layer's queries, ``Wo`` and feed-forward at the labelled rows only) against the same
model running its whole last layer and picking those rows, paired, alternating.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
from collections.abc import Callable, Iterator

import torch
import transformers
from _common import Timing, alternate, fmt, log, machine_markdown, markdown_table

from bertforge.modeling.config import ModernBertConfig
from bertforge.modeling.modernbert import ModernBertForMaskedLM
from bertforge.modeling.ops import gelu as gelu_ops

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


@contextlib.contextmanager
def torch_geglu() -> Iterator[None]:
    """The GeGLU in torch ops within: ``gated_activation`` finds no kernel."""
    kernels = gelu_ops.geglu_kernels
    gelu_ops.geglu_kernels = lambda: None
    try:
        yield
    finally:
        gelu_ops.geglu_kernels = kernels


def in_torch_geglu(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with torch_geglu():
            fn()

    return run


def saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of one training forward,
    the parameters left out (both sides keep the same ones)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(kept.values())


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


def autocast(precision: str) -> contextlib.AbstractContextManager:
    """bf16: CPU autocast, as ``bertforge pretrain --train.precision bf16`` trains."""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], precision: str = "fp32"):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        with autocast(precision):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def infer(encoder: torch.nn.Module, batch: dict[str, torch.Tensor], precision: str = "fp32"):
    def run() -> None:
        with torch.no_grad(), autocast(precision):
            encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--shapes", default="16x128,4x512,2x1024", help="BxT,BxT")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument(
        "--against",
        choices=["transformers", "torch-geglu", "whole-last-layer"],
        default="transformers",
        help="transformers' ModernBERT, bertforge with the GeGLU in torch ops, or bertforge "
        "running its whole last layer in masked-LM training",
    )
    args = parser.parse_args()
    if args.against == "torch-geglu":
        return geglu_main(args)
    if args.against == "whole-last-layer":
        return last_layer_main(args)
    rows = []
    for shape in args.shapes.split(","):
        B, T = map(int, shape.split("x"))
        batch = padded_batch(B, T)
        ours, theirs = twins(args.preset)
        ours.train(), theirs.train()
        log(f"training {B}x{T}")
        pr = args.precision
        t = alternate(
            {"ours": train_step(ours, batch, pr), "transformers": train_step(theirs, batch, pr)},
            warmup=2,
            reps=args.reps,
        )
        ours.eval(), theirs.eval()
        log(f"inference {B}x{T}")
        i = alternate(
            {"ours": infer(ours.model, batch, pr), "transformers": infer(theirs.model, batch, pr)},
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
                    cell(a),
                    cell(b),
                    f"{b.median / a.median:.2f}x ({min(b.samples) / min(a.samples):.2f}x)",
                ]
            )
    print(machine_markdown())
    print(
        f"\nModernBERT preset {args.preset}, vocabulary {VOCAB}, {args.precision}, "
        f"{torch.get_num_threads()} thread(s), medians of {args.reps}\n"
    )
    header = ["", "batch", "bertforge", "transformers", "speed-up median (min)"]
    print(markdown_table(header, rows))


def cell(t: Timing) -> str:
    """One side's cell: its median in ms, the spread, and the minimum."""
    return f"{fmt(t.median * 1000)} ms ±{t.spread:.0%} (min {fmt(min(t.samples) * 1000)})"


def paired_ratios(slow: list[float], fast: list[float]) -> str:
    """The speed-up of each repetition (its two samples ran back to back, so load that comes
    and goes touches both): median, quartiles, and how many repetitions the second side won."""
    ratios = sorted(s / f for s, f in zip(slow, fast, strict=True))
    k = len(ratios)
    q1, q2, q3 = (ratios[min(k - 1, round(q * (k - 1)))] for q in (0.25, 0.5, 0.75))
    wins = sum(r > 1 for r in ratios)
    return f"{q2:.3f}x [{q1:.3f}, {q3:.3f}], {wins}/{k}"


def geglu_main(args: argparse.Namespace) -> None:
    """``--against torch-geglu``: the fused GeGLU against the torch form, training and inference."""
    rows = []
    for shape in args.shapes.split(","):
        B, T = map(int, shape.split("x"))
        batch = padded_batch(B, T)
        base, _ = twins(args.preset)
        # two copies made alike (neither side holds the first-built model)
        fused, plain = copy.deepcopy(base), copy.deepcopy(base)
        del base
        fused.train(), plain.train()
        with torch_geglu():
            plain_bytes = saved_bytes(plain, batch)
        fused_bytes = saved_bytes(fused, batch)
        log(f"training {B}x{T}")
        t = alternate(
            {"fused": train_step(fused, batch), "torch": in_torch_geglu(train_step(plain, batch))},
            warmup=2,
            reps=args.reps,
        )
        fused.eval(), plain.eval()
        log(f"inference {B}x{T}")
        i = alternate(
            {
                "fused": infer(fused.model, batch),
                "torch": in_torch_geglu(infer(plain.model, batch)),
            },
            warmup=2,
            reps=args.reps,
        )
        tokens = int(batch["attention_mask"].sum())
        for what, timing in (("training step", t), ("inference", i)):
            a, b = timing["fused"], timing["torch"]
            kept = (
                f"{fused_bytes / 2**20:,.1f} / {plain_bytes / 2**20:,.1f} MiB"
                if what == "training step"
                else ""
            )
            rows.append(
                [
                    what,
                    f"{B} x {T} ({tokens} real)",
                    cell(a),
                    cell(b),
                    f"{b.median / a.median:.3f}x ({min(b.samples) / min(a.samples):.3f}x)",
                    paired_ratios(b.samples, a.samples),
                    kept,
                ]
            )
    print(machine_markdown())
    print(
        f"\nModernBERT preset {args.preset}, vocabulary {VOCAB}, fp32, "
        f"{torch.get_num_threads()} thread(s), medians of {args.reps}\n"
    )
    header = ["", "batch", "fused GeGLU", "torch GeGLU", "speed-up median (min)"]
    header += ["paired speed-ups: median [quartiles], wins", "autograd keeps (fused / torch)"]
    print(markdown_table(header, rows))


def whole_encode(encode: Callable) -> Callable:
    """``encode`` running every row of the last layer, then picking the asked ones (``at``):
    the computation before the sparse last layer."""

    def whole(input_ids, attention_mask, output_attentions=False, at=None):  # noqa: ANN001, ANN202
        h, rows, attentions = encode(input_ids, attention_mask, output_attentions)
        return (h if at is None else h[rows.rows_of(at)]), rows, attentions

    return whole


def last_layer_main(args: argparse.Namespace) -> None:
    """``--against whole-last-layer``: the sparse last layer against the whole one, paired."""
    rows = []
    for shape in args.shapes.split(","):
        B, T = map(int, shape.split("x"))
        batch = padded_batch(B, T)
        base, _ = twins(args.preset)
        sparse, whole = copy.deepcopy(base), copy.deepcopy(base)
        del base
        sparse.train(), whole.train()
        whole.model.encode = whole_encode(whole.model.encode)  # type: ignore[method-assign]
        log(f"training {B}x{T}")
        t = alternate(
            {"sparse": train_step(sparse, batch), "whole": train_step(whole, batch)},
            warmup=2,
            reps=args.reps,
        )
        a, b = t["sparse"], t["whole"]
        rows.append(
            [
                f"{B} x {T} ({int(batch['attention_mask'].sum())} real)",
                cell(a),
                cell(b),
                paired_ratios(b.samples, a.samples),
            ]
        )
    print(machine_markdown())
    print(
        f"\nModernBERT preset {args.preset}, vocabulary {VOCAB}, fp32, "
        f"{torch.get_num_threads()} thread(s), masked-LM training step, medians of {args.reps}\n"
    )
    header = ["batch", "sparse last layer", "whole last layer"]
    header += ["paired speed-ups: median [quartiles], wins"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
