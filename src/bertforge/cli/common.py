"""What the model-using commands (``evaluate``, ``fill-mask``, ``classify``, ``embed``) share:
their common options (dataclasses their configs extend), the defaults a fine-tuned model
directory records, and loading a model with its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from torch import nn

from bertforge.data.tasks import Truncation
from bertforge.errors import BertforgeError
from bertforge.inference.onnx import OnnxModel, load_onnx
from bertforge.io import read_json_object
from bertforge.modeling.checkpoint import check_tokenizer_fits
from bertforge.runtime import Precision, pick_device, pick_precision
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import FINETUNE_CONFIG, check_at_least, check_choice


@dataclass(kw_only=True)
class ModelOptions:
    """Options of every command that runs a saved model (``evaluate``, ``fill-mask``,
    ``classify``, ``embed``)."""

    model: str
    """Model directory: config.json, model.safetensors and the tokenizer files."""
    batch_size: int = 32
    """Texts per forward pass."""
    device: str = "auto"
    """auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps."""
    precision: Precision = "auto"
    """auto (bf16 where the hardware is fast at it), bf16 or fp32."""
    progress: bool = True
    """A progress bar on stderr while the texts run (drawn only when stderr is a terminal)."""

    def __post_init__(self) -> None:
        check_choice(self.precision, Precision, "--precision")
        check_at_least(self, lambda name: f"--{name}", batch_size=1)


Backend = Literal["torch", "onnx"]


@dataclass(kw_only=True)
class BackendOption:
    """``--backend`` of the commands that can run an exported ONNX model (``classify``, ``embed``)."""

    backend: Backend = "torch"
    """torch: the PyTorch model in --model; onnx: ONNX Runtime on a directory written by
    `bertforge export --format onnx` (pip install "bertforge[onnx]"), fp32 or int8 as exported."""

    def __post_init__(self) -> None:
        check_choice(self.backend, Backend, "--backend")


@dataclass(kw_only=True)
class TaskOptions:
    """The data options of a fine-tuned model; each unset one is what ``bertforge finetune``
    recorded in the model's finetune_config.json (see :func:`finetune_defaults`)."""

    text_column: str | None = None
    """Column holding the text in a CSV/TSV/JSONL input (default: as in fine-tuning)."""
    text_pair_column: str | None = None
    """Column holding the second text of pair tasks (default: as in fine-tuning)."""
    max_length: int | None = None
    """Tokens per example; longer texts are truncated (default: as in fine-tuning)."""
    truncation: Truncation | None = None
    """head or head_tail (default: as in fine-tuning)."""


@dataclass(kw_only=True)
class TextInputs:
    """Texts from the command line or from one file (one of them)."""

    texts: list[str] = field(default_factory=list)
    """Texts given as arguments."""
    input: str | None = None
    """File of texts: one per line, or a CSV/TSV/JSONL table (with --text_column)."""

    def __post_init__(self) -> None:
        if bool(self.texts) == bool(self.input):
            raise BertforgeError("give texts as arguments or --input FILE (one of them)")


def finetune_defaults(model_dir: str | Path) -> dict[str, Any]:
    """The resolved ``bertforge finetune`` config saved with a fine-tuned model ({} if none)."""
    path = Path(model_dir) / FINETUNE_CONFIG
    if not path.is_file():
        return {}
    return read_json_object(path, "restore it or delete it")


def load_model(
    cls: type, args: Any, require: tuple[str, str] | None = None
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """``cls.from_pretrained(args.model)`` on ``args.device``, its tokenizer, and the keyword
    options every inference function takes (``batch_size``, ``precision`` as ``args.precision``
    resolves on that device, ``progress``); ``args`` is a :class:`ModelOptions` or has its attributes. ``require = (prefix, message)`` names a head the command needs: a
    checkpoint without weights of that prefix (e.g. ``classifier.``) is an error saying message."""

    device = pick_device(args.device)
    model = cls.from_pretrained(args.model).to(device)
    missing = model.loading_info["missing"]
    if require is not None and any(k.startswith(require[0]) for k in missing):
        raise BertforgeError(f"{args.model}: {require[1]}")
    options = {
        "batch_size": args.batch_size,
        "precision": pick_precision(args.precision, device),
        "progress": getattr(args, "progress", False),
    }
    tokenizer = Tokenizer.from_file(args.model)
    check_tokenizer_fits(tokenizer, model.config, args.model)
    return model, tokenizer, options


def load_onnx_model(args: Any, output: str) -> tuple[OnnxModel, Any, dict[str, Any]]:
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
    model = load_onnx(args.model)
    if output not in model.output_names:
        raise BertforgeError(
            f"{args.model}: the exported model has no {output!r} output (it has "
            f"{', '.join(model.output_names)}); export a model with that head"
        )
    tokenizer = Tokenizer.from_file(args.model)
    return model, tokenizer, {"batch_size": args.batch_size, "precision": "fp32"}


__all__ = [
    "FINETUNE_CONFIG",
    "Backend",
    "BackendOption",
    "ModelOptions",
    "TaskOptions",
    "TextInputs",
    "finetune_defaults",
    "load_model",
    "load_onnx_model",
]
