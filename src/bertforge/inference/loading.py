"""Loading a model directory for inference: the weights (eager, or an ONNX export) with their
tokenizer and the options every inference function takes, and the defaults a fine-tuned model
recorded. Shared by the model-using commands (``bertforge.cli``) and the server
(``bertforge.serve``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.inference.onnx import OnnxModel, load_onnx
from bertforge.modeling.auto import for_directory, head_prefix
from bertforge.modeling.checkpoint import (
    check_model_directory,
    check_tokenizer_fits,
    finetune_defaults,
)
from bertforge.runtime import pick_device, pick_precision
from bertforge.tokenizer.wordpiece import Tokenizer


@dataclass
class LoadOptions:
    """Which model to load on which device, as :func:`load_model` and :func:`load_onnx_model` read
    it (the server builds one; a command's ``ModelOptions`` carries the same attributes)."""

    model: str
    """Model directory."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:1, mps."""
    precision: str = "auto"
    """auto, bf16 or fp32."""
    batch_size: int = 32
    """Texts per forward pass."""
    progress: bool = False
    """A progress bar while texts run."""
    num_threads: int | None = None
    """CPU threads (None: leave torch's setting)."""


TASK_COMMANDS = {
    "BertForSequenceClassification": ("a text classifier", "bertforge classify"),
    "BertForTokenClassification": ("a token classifier", "bertforge tag"),
    "BertForQuestionAnswering": ("a question-answering model", "bertforge answer"),
    "ModernBertForSequenceClassification": ("a text classifier", "bertforge classify"),
    "ModernBertForTokenClassification": ("a token classifier", "bertforge tag"),
    "ModernBertForQuestionAnswering": ("a question-answering model", "bertforge answer"),
}
"""What a fine-tuned model's ``architectures`` says it is, and the command that uses it."""
FINETUNE_TASKS = {
    "BertForSequenceClassification": "classification",
    "BertForTokenClassification": "token_classification",
    "BertForQuestionAnswering": "question_answering",
    "ModernBertForSequenceClassification": "classification",
    "ModernBertForTokenClassification": "token_classification",
    "ModernBertForQuestionAnswering": "question_answering",
}
"""The ``bertforge finetune --task`` that makes each of those models."""


def other_task(config: Any, wanted: type) -> str | None:
    """For a command that needs a ``wanted`` model: what a fine-tuned model of another task is
    and the command for it (from config.json's ``architectures``), or None."""
    for name in getattr(config, "architectures", None) or []:
        if name in TASK_COMMANDS and name != wanted.__name__:
            what, command = TASK_COMMANDS[name]
            return (
                f"{what} ({name}), not the kind of model this command runs; use {command}, or "
                "fine-tune a model for this task (bertforge finetune --task "
                f"{FINETUNE_TASKS.get(wanted.__name__, '...')})"
            )
    return None


def load_model(
    cls: type, args: LoadOptions, require: tuple[str, str] | None = None
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """``cls.from_pretrained(args.model)`` on ``args.device``, its tokenizer, and the keyword
    options every inference function takes (``batch_size``, ``precision`` as ``args.precision``
    resolves on that device, ``progress``); ``args`` is a :class:`LoadOptions` or a command's
    ``ModelOptions`` (the same attributes). ``require = (prefix, message)`` names a head the
    command needs: a checkpoint without weights of that prefix (e.g. ``classifier.``) is an error
    saying message."""

    if getattr(args, "num_threads", None):
        torch.set_num_threads(args.num_threads)
    device = pick_device(args.device)
    cls = for_directory(cls, args.model)  # BERT's class or ModernBERT's, as config.json says
    model = cls.from_pretrained(args.model).to(device)
    missing = model.loading_info["missing"]
    if require is not None and (other := other_task(model.config, cls)):
        raise BertforgeError(f"{args.model}: {other}")  # a classifier's head fits a tagger's
    if require is not None and any(k.startswith(head_prefix(cls, require[0])) for k in missing):
        raise BertforgeError(f"{args.model}: {require[1]}")
    options = {
        "batch_size": args.batch_size,
        "precision": pick_precision(args.precision, device, model.config.hidden_size),
        "progress": getattr(args, "progress", False),
    }
    tokenizer = Tokenizer.from_file(args.model)
    check_tokenizer_fits(tokenizer, model.config, args.model)
    return model, tokenizer, options


def load_onnx_model(args: LoadOptions, output: str) -> tuple[OnnxModel, Any, dict[str, Any]]:
    """The ``--backend onnx`` form of :func:`load_model`: ``args.model`` is an export directory,
    loaded into ONNX Runtime on the CPU. ``output`` names the graph output the command needs
    (``logits``, ``last_hidden_state``): an export without it is an error."""
    if args.device not in ("auto", "cpu"):
        raise BertforgeError(f"--backend onnx runs on the CPU; drop --device {args.device}")
    if args.precision == "bf16":
        raise BertforgeError(
            "--backend onnx runs the precision it was exported with; drop --precision bf16 "
            "(for int8: bertforge export --quantize int8)"
        )
    # the same "no such model directory" / "a training run" errors as the PyTorch backend
    check_model_directory(args.model)
    model = load_onnx(args.model, threads=getattr(args, "num_threads", None))
    if output not in model.output_names:
        raise BertforgeError(
            f"{args.model}: the exported model has no {output!r} output (it has "
            f"{', '.join(model.output_names)}); export a model with that head"
        )
    tokenizer = Tokenizer.from_file(args.model)
    return model, tokenizer, {"batch_size": args.batch_size, "precision": "fp32"}


__all__ = ["LoadOptions", "finetune_defaults", "load_model", "load_onnx_model"]
