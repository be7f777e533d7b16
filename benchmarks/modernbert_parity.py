"""ModernBERT parity: bertforge's classes against transformers' on the same weights, as a table.

For each head, each direction of loading (ours saved -> transformers' ``AutoModelFor*``;
transformers' ``save_pretrained`` -> ours) and each transformers attention path (``sdpa``, its
default on a CPU, and ``eager``): the largest absolute difference of the outputs at the real
tokens, fp32 and under bf16 autocast (both sides), on batches with padded rows, a pair
([CLS] a [SEP] b [SEP]) and a two-token row, at lengths inside the local window (every pair of
tokens seen), around it (band mask) and far past it (blocks of the window).

    python benchmarks/modernbert_parity.py            # the table of docs/modernbert.md

A random-init tiny config (hidden 32, 3 layers: global, local, local; a window of 4 either
side), its weights shifted off their initial values so that every norm and bias matters.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import transformers
from _common import machine_markdown, markdown_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_modernbert import CLASSES, batch, config_for  # noqa: E402

LENGTHS = (5, 11, 29, 200)


def heads_outputs(model, ids, mask, bf16: bool) -> list[torch.Tensor]:
    real = mask.bool()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        out = model(input_ids=ids, attention_mask=mask)
    if hasattr(out, "start_logits"):
        return [out.start_logits[real].float(), out.end_logits[real].float()]
    logits = out.logits.float()
    return [logits[real]] if logits.dim() == 3 else [logits]


def pair_of_models(kind: str, direction: str, attn: str, root: Path):
    ours_cls, auto = CLASSES[kind]
    config = config_for(kind, max_position_embeddings=256)
    torch.manual_seed(0)
    if direction == "ours -> transformers":
        ours = ours_cls(config)
        with torch.no_grad():
            for p in ours.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        ours.save_pretrained(root)
    else:
        theirs = getattr(transformers, ours_cls.__name__)(
            transformers.ModernBertConfig(**config.to_dict())
        )
        with torch.no_grad():
            for p in theirs.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        theirs.save_pretrained(root)
        ours = ours_cls.from_pretrained(root)
    theirs = auto.from_pretrained(root, attn_implementation=attn)
    return ours.eval(), theirs.eval()


def main() -> None:
    rows = []
    for kind in CLASSES:
        for direction in ("ours -> transformers", "transformers -> ours"):
            for attn in ("sdpa", "eager"):
                with tempfile.TemporaryDirectory() as tmp:
                    ours, theirs = pair_of_models(kind, direction, attn, Path(tmp))
                cells = []
                for bf16 in (False, True):
                    worst = 0.0
                    for T in LENGTHS:
                        ids, mask = batch(T, seed=T)
                        a = heads_outputs(ours, ids, mask, bf16)
                        b = heads_outputs(theirs, ids, mask, bf16)
                        worst = max(
                            worst, *((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
                        )
                    cells.append(f"{worst:.1e}")
                rows.append([CLASSES[kind][0].__name__, direction, attn, *cells])
    print(machine_markdown())
    print(
        f"\nlengths {', '.join(map(str, LENGTHS))} (window 4 either side), padded rows and a pair\n"
    )
    header = ["class", "loaded", "transformers' attention", "fp32 max |diff|", "bf16 max |diff|"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
