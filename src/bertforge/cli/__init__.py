"""The ``bertforge`` command: one subcommand per module, each owning its own parser.

Every subcommand is a function ``f(argv: list[str]) -> int`` in its module under
``bertforge.cli``; this file only routes to it
(imported lazily so ``bertforge --help`` stays fast) and turns
:class:`~bertforge.errors.BertforgeError` into a one-line message.
"""

from __future__ import annotations

import importlib
import sys

from bertforge.errors import BertforgeError

# subcommand -> (module, function ``f(argv: list[str]) -> int`` in it, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "tokenizer": (
        "bertforge.cli.tokenizer",
        "main",
        "train a WordPiece vocabulary (tokenizer train ...)",
    ),
    "prepare": ("bertforge.cli.prepare", "main", "turn text into token shards for pretraining"),
    "pretrain": (
        "bertforge.cli.pretrain",
        "main",
        "pretrain a BERT encoder (MLM, optionally NSP)",
    ),
    "finetune": (
        "bertforge.cli.finetune",
        "main",
        "fine-tune for classification or regression",
    ),
    "downstream": (
        "bertforge.cli.downstream",
        "main",
        "fine-tune a pretrained encoder and its random twin, test both",
    ),
    "evaluate": ("bertforge.cli.evaluate", "main", "evaluate an MLM or a fine-tuned model"),
    "fill-mask": (
        "bertforge.cli.predict",
        "fill_mask_main",
        "predict the [MASK] tokens of a text",
    ),
    "classify": (
        "bertforge.cli.predict",
        "classify_main",
        "classify texts with a fine-tuned model",
    ),
    "embed": ("bertforge.cli.predict", "embed_main", "embed texts into a .npy matrix"),
    "serve": (
        "bertforge.cli.serve",
        "main",
        "serve models over HTTP: JSON API and an explorer page",
    ),
}


def _usage() -> str:
    lines = ["usage: bertforge COMMAND [options]   (bertforge COMMAND --help for its options)", ""]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    entry = getattr(importlib.import_module(module_name), function_name)
    try:
        return int(entry(rest) or 0)
    except BertforgeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
