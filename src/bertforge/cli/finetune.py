"""``bertforge finetune``: :class:`~bertforge.training.config.FinetuneConfig` from the command
line (one ``--field_name`` per field) and ``--config`` files, then
:func:`bertforge.training.finetune.finetune`."""

from __future__ import annotations

from bertforge.cli.options import parse_config
from bertforge.training.config import FinetuneConfig
from bertforge.training.finetune import finetune


def main(argv: list[str]) -> int:
    """``bertforge finetune --model DIR --train FILE ... --output DIR [options]``."""
    cfg = parse_config(
        FinetuneConfig,
        argv,
        prog="bertforge finetune",
        description=(
            "Fine-tune a BERT model for text classification, regression, token classification "
            "(named entities), extractive question answering or sentence embeddings "
            "(docs/tasks.md, docs/embeddings.md)."
        ),
    )
    finetune(cfg)
    return 0
