"""``bertforge pretrain``: the pretraining config from ``--config`` YAML files and dotted
overrides (``--train.lr 1e-4``), parsed by jsonargparse, then ``bertforge.training.pretrain.pretrain``."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from bertforge import distributed as D
from bertforge.errors import BertforgeError
from bertforge.training.config import PretrainConfig
from bertforge.training.pretrain import pretrain


def build_parser() -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="bertforge pretrain",
        description="Pretrain a BERT encoder (MLM + NSP or MLM only) on prepared data. Options "
        "come from --config YAML files and dotted overrides (--train.lr 1e-4).",
        exit_on_error=False,  # main() reports a bad option or YAML key in one line
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML preset(s), e.g. configs/mini.yaml"
    )
    parser.add_class_arguments(PretrainConfig, as_positional=False)
    return parser


def main(argv: list[str]) -> int:
    """``bertforge pretrain --config FILE.yaml [--section.option VALUE ...]``."""
    parser = build_parser()
    try:
        parsed = parser.parse_args(argv)
    except (argparse.ArgumentError, UnicodeDecodeError) as err:
        configs = [v for k, v in zip(argv, argv[1:], strict=False) if k == "--config"]
        where = f" (options from {', '.join(configs)} and the command line)" if configs else ""
        raise BertforgeError(
            f"bertforge pretrain: {' '.join(str(err).split())}{where}; "
            "see bertforge pretrain --help"
        ) from None
    try:
        namespace = parser.instantiate(parsed)
    except TypeError:  # a YAML section that is not a mapping (``model: 5``)
        raise BertforgeError(
            "bertforge pretrain: a config section is not a mapping of options (write "
            "'model:' then indented 'preset: mini', not 'model: 5'); check the --config YAML"
        ) from None
    cfg = PretrainConfig(**{f.name: namespace[f.name] for f in fields(PretrainConfig)})
    try:
        pretrain(cfg)
    finally:
        D.cleanup()
    return 0
