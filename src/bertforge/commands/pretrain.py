"""``bertforge pretrain``: the pretraining config from ``--config`` YAML files and dotted
overrides (``--train.lr 1e-4``), parsed by jsonargparse, then ``bertforge.pretrain.pretrain``."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from bertforge import distributed as D
from bertforge.config import PretrainConfig
from bertforge.pretrain import pretrain


def build_parser() -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="bertforge pretrain",
        description="Pretrain a BERT encoder (MLM + NSP or MLM only) on prepared data. Options "
        "come from --config YAML files and dotted overrides (--train.lr 1e-4).",
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML preset(s), e.g. configs/mini.yaml"
    )
    parser.add_class_arguments(PretrainConfig, as_positional=False)
    return parser


def main(argv: list[str]) -> int:
    """``bertforge pretrain --config FILE.yaml [--section.option VALUE ...]``."""
    parser = build_parser()
    namespace = parser.instantiate(parser.parse_args(argv))
    cfg = PretrainConfig(**{f.name: namespace[f.name] for f in fields(PretrainConfig)})
    try:
        pretrain(cfg)
    finally:
        D.cleanup()
    return 0
