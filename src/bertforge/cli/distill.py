"""``bertforge distill``: :class:`~bertforge.training.distill_config.DistillConfig` from the
command line (one ``--field_name`` per field) and ``--config`` files, then
:func:`bertforge.training.distill_baselines.distill_and_report` (the distillation, then its
report where ``--report true`` asks for one)."""

from __future__ import annotations

from bertforge.cli.options import parse_config
from bertforge.training.distill_baselines import distill_and_report
from bertforge.training.distill_config import DistillConfig


def main(argv: list[str]) -> int:
    """``bertforge distill --teacher DIR --student DIR --train FILE --output DIR [options]``."""
    cfg = parse_config(
        DistillConfig,
        argv,
        prog="bertforge distill",
        description=(
            "Distill a fine-tuned teacher (classification, regression, token classification, "
            "question answering or a sentence-embedding model) into a smaller student: its soft targets and the gold labels, on labelled "
            "and unlabelled text (docs/distillation.md)."
        ),
    )
    distill_and_report(cfg)
    return 0
