"""``bertforge downstream``: every ``bertforge finetune`` option (the parser is finetune's), plus
the test file, the twin's initialisation seed and an optional baseline model; then
``bertforge.training.downstream.downstream``."""

from __future__ import annotations

import argparse

from bertforge.cli.finetune import build_parser as finetune_parser
from bertforge.training.config import FinetuneConfig
from bertforge.training.downstream import downstream

OWN_OPTIONS = ("test", "baseline", "init_seed")


def build_parser() -> argparse.ArgumentParser:
    """``bertforge finetune``'s options with downstream's meaning of --model/--output, + its own."""
    parser = finetune_parser()
    parser.prog = "bertforge downstream"
    parser.description = (
        "Fine-tune a pretrained encoder and its random-initialised twin (same config, tokenizer "
        "and settings; weights of a fresh initialisation) on a labelled file, score both on a "
        "test file and print them side by side: what pretraining is worth on this task. Every "
        "option of bertforge finetune applies to all models alike."
    )
    for action in parser._actions:  # the same flags; what they mean here
        if action.dest == "model":
            action.help = "The pretrained model directory (e.g. RUN/model of bertforge pretrain)."
        elif action.dest == "output":
            action.help = (
                "Output directory: one fine-tuning run per model (pretrained/, random_init/, "
                "baseline/), the twin (random_init_model/) and downstream.json."
            )
    own = parser.add_argument_group("downstream")
    own.add_argument(
        "--test",
        nargs="+",
        required=True,
        metavar="FILE",
        help="Labelled test file(s) with the same columns as --train; never used for training "
        "or model selection.",
    )
    own.add_argument(
        "--baseline",
        metavar="DIR",
        default=None,
        help="Another model fine-tuned and scored the same way, as a third column "
        "(e.g. all-MiniLM-L6-v2).",
    )
    own.add_argument(
        "--init-seed",
        type=int,
        default=0,
        metavar="N",
        help="Seed of the random twin's initialisation. (default: 0)",
    )
    return parser


def main(argv: list[str]) -> int:
    """``bertforge downstream --model DIR --train FILE --test FILE --output DIR [options]``."""
    args = vars(build_parser().parse_args(argv))
    own = {k: args.pop(k) for k in OWN_OPTIONS}
    downstream(
        FinetuneConfig(**args), own["test"], baseline=own["baseline"], init_seed=own["init_seed"]
    )
    return 0
