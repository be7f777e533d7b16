"""``bertforge prepare``: documents -> token shards (:func:`bertforge.data.shards.prepare`)."""

from __future__ import annotations

from bertforge.cli.options import parse_config
from bertforge.data.shards import PrepareConfig, format_summary, prepare

__all__ = ["PrepareConfig", "main"]


def main(argv: list[str]) -> int:
    """``bertforge prepare --input FILE... --tokenizer DIR --output DIR [options]``."""
    cfg = parse_config(
        PrepareConfig,
        argv,
        prog="bertforge prepare",
        description="Turn text into token shards for pretraining: NSP pairs or packed sequences.",
    )
    print(format_summary(prepare(cfg)))
    return 0
