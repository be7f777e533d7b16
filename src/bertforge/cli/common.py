"""What the model-using commands (``evaluate``, ``fill-mask``, ``classify``, ``embed``) share:
their common options, the defaults a fine-tuned model directory records, and loading a model
with its tokenizer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io import read_json_object
from bertforge.modeling.checkpoint import check_tokenizer_fits
from bertforge.runtime import pick_device, pick_precision
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import FINETUNE_CONFIG


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (a batch size, a count)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def add_runtime_options(parser: argparse.ArgumentParser, batch_size: int = 32) -> None:
    """``--batch-size``, ``--device`` and ``--precision``."""
    parser.add_argument("--batch-size", type=positive_int, default=batch_size, metavar="N")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "bf16", "fp32"),
        help="bf16 autocast where the hardware runs it fast (default auto)",
    )


def add_task_options(
    parser: argparse.ArgumentParser, max_length_help: str = "default: as in fine-tuning"
) -> None:
    """The data options of a fine-tuned model (``--text-column`` ... ``--truncation``); each
    defaults to what ``bertforge finetune`` recorded (see :func:`finetune_defaults`)."""
    parser.add_argument(
        "--text-column", metavar="C", help="text column (default: as in fine-tuning)"
    )
    parser.add_argument(
        "--text-pair-column",
        metavar="C2",
        help="second-text column of pair tasks (default: as in fine-tuning)",
    )
    parser.add_argument("--max-length", type=int, metavar="N", help=max_length_help)
    parser.add_argument(
        "--truncation", choices=("head", "head_tail"), help="default: as in fine-tuning"
    )


def finetune_defaults(model_dir: str | Path) -> dict[str, Any]:
    """The resolved ``bertforge finetune`` config saved with a fine-tuned model ({} if none)."""
    path = Path(model_dir) / FINETUNE_CONFIG
    if not path.is_file():
        return {}
    return read_json_object(path, "restore it or delete it")


def load_model(
    cls: type, args: argparse.Namespace, require: tuple[str, str] | None = None
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """``cls.from_pretrained(args.model)`` on ``args.device``, its tokenizer, and the keyword
    options every inference function takes (``batch_size``, ``precision`` as ``args.precision``
    resolves on that device). ``require = (prefix, message)`` names a head the command needs: a
    checkpoint without weights of that prefix (e.g. ``classifier.``) is an error saying message."""

    device = pick_device(args.device)
    model = cls.from_pretrained(args.model).to(device)
    missing = model.loading_info["missing"]
    if require is not None and any(k.startswith(require[0]) for k in missing):
        raise BertforgeError(f"{args.model}: {require[1]}")
    options = {"batch_size": args.batch_size, "precision": pick_precision(args.precision, device)}
    tokenizer = Tokenizer.from_file(args.model)
    check_tokenizer_fits(tokenizer, model.config, args.model)
    return model, tokenizer, options


__all__ = [
    "FINETUNE_CONFIG",
    "add_runtime_options",
    "add_task_options",
    "finetune_defaults",
    "load_model",
    "positive_int",
]
