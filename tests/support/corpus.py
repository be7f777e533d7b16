"""One text prepared both ways, as the pretraining tests need it: sentence pairs (``nsp``) and
packed sequences (``packed``) of 32 tokens, 5% held out for validation."""

from __future__ import annotations

from pathlib import Path

from bertforge.data.shards import PrepareConfig, prepare
from bertforge.tokenizer.wordpiece import Tokenizer


def prepare_both_ways(text: Path, tokenizer: Tokenizer, root: Path) -> dict[str, Path]:
    """``{"nsp": root/data-nsp, "packed": root/data-packed}``, each prepared from ``text``."""
    out = {}
    for mode in ("nsp", "packed"):
        out[mode] = root / f"data-{mode}"
        cfg = PrepareConfig(
            [str(text)],
            "",
            str(out[mode]),
            max_seq_length=32,
            mode=mode,
            validation_fraction=0.05,
            progress=False,
        )
        prepare(cfg, tokenizer)
    return out
