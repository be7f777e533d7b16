"""``bertforge pretrain``: :class:`~bertforge.training.config.PretrainConfig` from ``--config``
YAML files and dotted overrides (``--train.lr 1e-4``), then
:func:`bertforge.training.pretrain.pretrain`."""

from __future__ import annotations

from typing import get_args

from bertforge import distributed as D
from bertforge.cli.options import parse_config
from bertforge.training.config import Objective, PretrainConfig
from bertforge.training.pretrain import pretrain

DESCRIPTION = (
    f"Pretrain a BERT encoder (--train.objective: {', '.join(get_args(Objective))}) on prepared "
    "data. Options come from --config YAML files and dotted overrides (--train.lr 1e-4)."
)


def main(argv: list[str]) -> int:
    """``bertforge pretrain --config FILE.yaml [--section.option VALUE ...]``."""
    cfg = parse_config(PretrainConfig, argv, prog="bertforge pretrain", description=DESCRIPTION)
    try:
        pretrain(cfg)
    finally:
        D.cleanup()
    return 0
