"""Inference with the real all-MiniLM-L6-v2 weights: BertModel encoding throughput (B=32, T=128,
real WikiText-2 text) and single-sentence fill-mask latency, bertforge vs transformers.

Both run under ``torch.inference_mode()`` on the same token ids; tokenization is not timed.

    python benchmarks/bench_infer.py --reps 7
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _common import (
    CEILING_HEADER,
    SHARED_DATA,
    alternate,
    ceiling_row,
    fmt,
    hf_twin,
    log,
    markdown_table,
    matmul_flops,
    matmul_rate,
    minilm_dir,
)

from bertforge.modeling.model import BertForMaskedLM, BertModel

SENTENCE = "The capital of France is [MASK]."


def wikitext_windows(B: int = 32, T: int = 128) -> torch.Tensor:
    """(B, T) full windows of WikiText-2 validation text: [CLS] 126 tokens [SEP]."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    text = (SHARED_DATA / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    ids = tok.encode(text[:200_000], add_special_tokens=False).ids
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    n = T - 2
    rows = [[cls, *ids[i * n : (i + 1) * n], sep] for i in range(B)]
    return torch.tensor(rows)  # (B, T)


def sentence_ids() -> torch.Tensor:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    return torch.tensor([tok.encode(SENTENCE).ids])  # (1, T)


def encode_fn(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None, **kwargs: bool
) -> Callable[[], None]:
    mask = torch.ones_like(ids) if mask is None else mask

    def run() -> None:
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, **kwargs)

    return run


def fill_mask_fn(model: torch.nn.Module, ids: torch.Tensor, pos: int) -> Callable[[], None]:
    mask = torch.ones_like(ids)

    def run() -> None:
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask).logits  # (1, T, V)
            logits[0, pos].softmax(-1).topk(5)

    return run


def bench_infer(
    reps: int = 7, warmup: int = 2, ceiling: list | None = None
) -> list[tuple[str, list[str], float]]:
    """Rows of the inference table; ``ceiling`` (if given) gets the full-window encoding's
    ceiling row (matmul-only times at the measured fp32 matmul rate)."""
    torch.manual_seed(0)
    rows = []
    ids = wikitext_windows()
    ours = BertModel.from_pretrained(minilm_dir()).eval()
    hf = hf_twin(ours, "BertModel").eval()
    cases = {"ours": encode_fn(ours, ids), "HF": encode_fn(hf, ids)}
    flops = {side: matmul_flops(fn) for side, fn in cases.items()}
    rate = matmul_rate(torch.float32)
    log(f"inference: encoding x {reps}")
    t = alternate(cases, warmup=warmup, reps=reps)
    rate = max(rate, matmul_rate(torch.float32))  # the better of two readings
    if ceiling is not None:
        seconds = {side: t[side].median for side in cases}
        ceiling.append(ceiling_row("inference full windows fp32", flops, seconds, rate))
    B = ids.shape[0]
    ratio = t["HF"].median / t["ours"].median
    rows.append(
        (
            "encoding",
            [
                "BertModel encoding, B=32 T=128 full WikiText-2 windows (sequences/s)",
                f"{fmt(B / t['ours'].median, 1)} ± {t['ours'].spread:.0%}",
                f"{fmt(B / t['HF'].median, 1)} ± {t['HF'].spread:.0%}",
                f"**{ratio:.2f}x**",
            ],
            ratio,
        )
    )

    # real sentences padded to 128, as a fixed-shape encoder sees them: ours skips the padding
    from bench_finetune import MAX_LEN, ag_news_batches, collate

    padded = collate(ag_news_batches(1)[0], MAX_LEN)
    ids, mask = padded["input_ids"], padded["attention_mask"]
    log(f"inference: padded encoding x {reps}")
    t = alternate(
        {"ours": encode_fn(ours, ids, mask, skip_padding=True), "HF": encode_fn(hf, ids, mask)},
        warmup=warmup,
        reps=reps,
    )
    ratio = t["HF"].median / t["ours"].median
    rows.append(
        (
            "encoding-padded",
            [
                f"BertModel encoding, 32 AG News texts padded to 128 ({mask.float().mean():.0%} real),"
                " ours with skip_padding (sequences/s)",
                f"{fmt(B / t['ours'].median, 1)} ± {t['ours'].spread:.0%}",
                f"{fmt(B / t['HF'].median, 1)} ± {t['HF'].spread:.0%}",
                f"**{ratio:.2f}x**",
            ],
            ratio,
        )
    )

    mlm = BertForMaskedLM.from_pretrained(minilm_dir()).eval()
    hf_mlm = hf_twin(mlm, "BertForMaskedLM").eval()
    sent = sentence_ids()
    pos = int((sent[0] == 103).nonzero()[0, 0])  # [MASK]
    log(f"inference: fill-mask x {reps * 2}")
    t = alternate(
        {"ours": fill_mask_fn(mlm, sent, pos), "HF": fill_mask_fn(hf_mlm, sent, pos)},
        warmup=warmup * 5,
        reps=reps * 2,
        inner=20,
    )
    ratio = t["HF"].median / t["ours"].median
    rows.append(
        (
            "fill-mask",
            [
                f"fill-mask latency, 1 sentence of {sent.shape[1]} tokens (ms, lower is better)",
                f"{t['ours'].median * 1e3:.2f} ± {t['ours'].spread:.0%}",
                f"{t['HF'].median * 1e3:.2f} ± {t['HF'].spread:.0%}",
                f"**{ratio:.2f}x**",
            ],
            ratio,
        )
    )
    return rows


def main(
    argv: list[str] | None = None, checks: dict | None = None, ceiling: list | None = None
) -> str:
    """The inference section; ``checks`` collects the issue's targets, ``ceiling`` (if given)
    the ceiling row of the full-window encoding instead of printing it here."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    own_ceiling = [] if ceiling is None else ceiling
    rows = bench_infer(reps=args.reps, ceiling=own_ceiling)
    if checks is not None:
        ratios = {r[0]: r[2] for r in rows}
        checks["inference encoding (full windows): ours / HF"] = (ratios["encoding"], 1.2)
        checks["inference encoding (padded text): ours / HF"] = (ratios["encoding-padded"], 1.2)
        checks["fill-mask latency: HF / ours"] = (ratios["fill-mask"], 1.0)
    header = ["measurement", "ours", "HF", "ours / HF (speed)"]
    text = "### Inference (real all-MiniLM-L6-v2 weights)\n\n" + markdown_table(
        header, [r[1] for r in rows]
    )
    if ceiling is None:
        text += "\n\n" + markdown_table(CEILING_HEADER, own_ceiling)
    return text


if __name__ == "__main__":
    from _common import machine_markdown

    print(machine_markdown() + "\n")  # the CPU, its vector features, what `auto` picks
    print(main())
