"""``bertforge finetune``: one ``--option-name`` per ``FinetuneConfig`` field (its help the
field's docstring), then ``bertforge.training.finetune.finetune``."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from bertforge.errors import ArgumentParser
from bertforge.training.config import FinetuneConfig, LoopOptions, option
from bertforge.training.finetune import finetune


def build_parser() -> argparse.ArgumentParser:
    """One ``--option-name`` per ``FinetuneConfig`` field; the help is the field's docstring."""
    import docstring_parser

    docs = {  # the field docstrings of FinetuneConfig and of the LoopOptions it extends
        p.arg_name: p.description
        for cls in (LoopOptions, FinetuneConfig)
        for p in docstring_parser.parse_from_object(cls).params
    }
    parser = ArgumentParser(
        prog="bertforge finetune",
        description="Fine-tune a BERT model for text classification or regression.",
    )
    inherited = {f.name for f in fields(LoopOptions)}
    for f in sorted(fields(FinetuneConfig), key=lambda f: f.name in inherited):  # own ones first
        flag = option(f.name)
        kind = str(f.type)
        help_ = " ".join((docs.get(f.name) or "").split())
        if f.name in ("train", "validation"):
            parser.add_argument(
                flag, nargs="+", required=f.name == "train", metavar="FILE", help=help_
            )
        elif kind == "bool":
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_
            )
        else:
            base = kind.split(" |")[0]
            cast = {"int": int, "float": float}.get(base, str)
            required = f.default is MISSING
            metavar = (
                "DIR"
                if f.name in ("model", "output")
                else "C"
                if f.name.endswith("_column")
                else {"int": "N", "float": "X"}.get(base, "S")
            )
            if not required:
                help_ += f" (default: {f.default})"
            parser.add_argument(
                flag,
                type=cast,
                required=required,
                metavar=metavar,
                default=None if required else f.default,
                help=help_,
            )
    return parser


def main(argv: list[str]) -> int:
    """``bertforge finetune --model DIR --train FILE ... --output DIR [options]``."""
    finetune(FinetuneConfig(**vars(build_parser().parse_args(argv))))
    return 0
