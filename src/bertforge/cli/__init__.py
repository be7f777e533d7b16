"""The ``bertforge`` command: one subcommand per module, each a function ``f(argv) -> int``.

This file only routes to the subcommand (imported lazily, so ``bertforge --help`` stays fast) and
turns :class:`~bertforge.errors.BertforgeError` into a one-line ``error: ...`` with exit status 2.

Every command takes its options the same way (:mod:`bertforge.cli.options`): a typed dataclass
is the command's whole interface; jsonargparse builds ``--field_name`` (``--section.field`` for
nested dataclasses), ``--config FILE`` and ``--print_config`` from it, and ``--help`` shows each
field's docstring, type, default and ``Literal`` choices.

Adding a command ``bertforge NAME``:

1. Write its config: a ``@dataclass`` with a type and a docstring under every field (one
   spelling everywhere: ``--batch_size``, ``--device``, ``--precision``, ``--output``, ``--seed``,
   ``--progress``; reuse :class:`~bertforge.cli.common.ModelOptions` / ``TaskOptions`` /
   ``TextInputs`` or :class:`~bertforge.training.config.LoopOptions` by inheriting with
   ``@dataclass(kw_only=True)``). Choices are ``Literal[...]`` types; values are checked in
   ``__post_init__`` (once, raising ``BertforgeError`` that names the option and the fix). A
   config Python users build too lives next to its library function (``training.config``);
   one only the command uses lives in the command's module.
2. Write ``bertforge/cli/NAME.py`` with ``def main(argv: list[str]) -> int`` that calls
   ``cfg = parse_config(NameConfig, argv, prog="bertforge NAME", description="...")`` (add
   ``positional=("texts", "help")`` for bare words), then the library function, and returns 0.
   No argparse anywhere else: the library takes typed values, not argument lists.
3. Register it in ``COMMANDS`` below; ``tests/test_cli.py`` then checks its ``--help``
   (docstrings, defaults, no hyphenated option) and that it resolves; add its bad-input cases to
   ``tests/test_bad_input.py``.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from typing import get_args

from bertforge import __version__, runtime
from bertforge.errors import BertforgeError

__all__ = ["CHOICES", "COMMANDS", "command_help", "configure_process", "main"]

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
        "pretrain a BERT encoder",
    ),
    "finetune": (
        "bertforge.cli.finetune",
        "main",
        "fine-tune a model for a task",
    ),
    "distill": (
        "bertforge.cli.distill",
        "main",
        "distill a fine-tuned teacher into a smaller, faster student",
    ),
    "downstream": (
        "bertforge.cli.downstream",
        "main",
        "fine-tune a pretrained encoder and its random twin, test both",
    ),
    "benchmark": (
        "bertforge.cli.benchmark",
        "main",
        "score a model on a suite of public tasks, beside baselines",
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
    "tag": (
        "bertforge.cli.tag",
        "main",
        "find named entities with a fine-tuned token classifier",
    ),
    "embed": ("bertforge.cli.predict", "embed_main", "embed texts into a .npy matrix"),
    "rerank": (
        "bertforge.cli.rerank",
        "main",
        "rank candidate texts for a query (cross-encoder or embedding model)",
    ),
    "answer": (
        "bertforge.cli.answer",
        "main",
        "answer questions from their context (extractive QA)",
    ),
    "recipe": (
        "bertforge.cli.recipe",
        "main",
        "run a recipe",
    ),
    "serve": (
        "bertforge.cli.serve",
        "main",
        "serve models over HTTP: JSON API and an explorer page",
    ),
    "export": (
        "bertforge.cli.export",
        "main",
        "export a model to ONNX, optionally quantized",
    ),
    "verify": (
        "bertforge.cli.verify",
        "main",
        "check a model, checkpoint, run or data directory against its manifest",
    ),
}


#: command -> (its main option, the module and the name of the ``Literal`` type or catalogue
#: holding that option's choices): :func:`command_help` reads them from the code when the help is
#: printed, so a new task, suite, objective or recipe is in ``bertforge --help`` and docs/cli.md
#: without a second edit, and only ``--help`` loads those modules
CHOICES: dict[str, tuple[str, str, str]] = {
    "pretrain": ("--train.objective", "bertforge.training.config", "Objective"),
    "finetune": ("--task", "bertforge.training.config", "Task"),
    "benchmark": ("--suite", "bertforge.evaluation.benchmark", "Suite"),
    "recipe": ("NAME", "bertforge.recipes.catalog", "RECIPES"),
    "export": ("--quantize", "bertforge.inference.onnx", "Quantization"),
}


def command_help(name: str) -> str:
    """The one-line help of command ``name``: its line in :data:`COMMANDS`, then the choices of
    its main option as the code has them (:data:`CHOICES`), e.g. ``(--suite: glue, ner, ...)``."""
    help_ = COMMANDS[name][2]
    if name not in CHOICES:
        return help_
    option, module, attribute = CHOICES[name]
    found = getattr(importlib.import_module(module), attribute)
    return f"{help_} ({option}: {', '.join(get_args(found) or found)})"


def _usage() -> str:
    lines = [
        "usage: bertforge COMMAND [options]   (bertforge COMMAND --help for its options;",
        "       bertforge --version)",
        "",
    ]
    for name in COMMANDS:  # wrapped under itself: the choices are long
        lines += textwrap.wrap(
            command_help(name),
            98,
            initial_indent=f"  {name:<10} ",
            subsequent_indent=" " * 13,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


#: commands that train: :func:`bertforge.runtime.keep_freed_memory` runs before them
TRAINING_COMMANDS = frozenset(
    {"pretrain", "finetune", "distill", "downstream", "benchmark", "recipe"}
)
#: commands that print their peak resident memory at the end; oneDNN's kernel caches are
#: bounded before them (:func:`bertforge.runtime.bound_kernel_caches`)
MEMORY_COMMANDS = TRAINING_COMMANDS | {"evaluate"}
#: commands whose oneDNN kernel caches are bounded: the memory commands, and the server, whose
#: merged batches take ever-different shapes (bf16 builds a kernel per shape and keeps it)
BOUNDED_CACHE_COMMANDS = MEMORY_COMMANDS | {"serve"}


def configure_process(command: str) -> None:
    """The process-wide settings ``bertforge COMMAND`` makes before it runs: malloc keeps what a
    training step frees (:func:`bertforge.runtime.keep_freed_memory`), and oneDNN keeps a bounded
    number of kernels (:func:`bertforge.runtime.bound_kernel_caches`; fewer for pretraining,
    whose shapes repeat). A script that calls the library in a process of its own calls this to
    run as the command would (``benchmarks/finetune_ner_reference.py`` does)."""
    if command in TRAINING_COMMANDS:
        runtime.keep_freed_memory()
    if command in BOUNDED_CACHE_COMMANDS:
        pretraining = command == "pretrain"
        cap = runtime.PRETRAIN_CACHE_CAPACITY if pretraining else runtime.ONEDNN_CACHE_CAPACITY
        runtime.bound_kernel_caches(cap)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(f"bertforge {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    configure_process(name)
    entry = getattr(importlib.import_module(module_name), function_name)
    try:
        rc = int(entry(rest) or 0)
        # a bare `bertforge recipe` lists; of torchrun's workers, rank 0 speaks for the run
        if name in MEMORY_COMMANDS and rc == 0 and rest and os.environ.get("RANK", "0") == "0":
            peak = runtime.format_bytes(runtime.peak_memory_bytes())
            print(f"peak memory: {peak} resident", file=sys.stderr, flush=True)
    except BertforgeError as err:
        print(f"error: {err}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
    group = sys.modules.get("bertforge.distributed")  # (imported by the commands that use it)
    if group is not None and group.ended_group():  # a torchrun worker, its files written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
