"""The options every command that runs a saved model shares (``evaluate``, ``fill-mask``,
``classify``, ``embed``, ``tag``, ``answer``): which model on which device (:class:`ModelOptions`),
the backend (:class:`BackendOption`), the data options a fine-tuned model recorded
(:class:`TaskOptions`) and texts to run (:class:`TextInputs`). The commands' configs extend
these; the library's :func:`bertforge.training.evaluate.evaluate` takes such a config too, so they
live below the CLI (``bertforge.cli.common`` re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bertforge.data.corpus import EncodingErrors
from bertforge.data.encoding import Truncation
from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import resolve_model
from bertforge.runtime import Precision
from bertforge.training.config import check_at_least, check_choice


@dataclass(kw_only=True)
class ModelOptions:
    """Options of every command that runs a saved model (``evaluate``, ``fill-mask``,
    ``classify``, ``embed``)."""

    model: str
    """Model directory: config.json, model.safetensors and the tokenizer files (or
    all-MiniLM-L6-v2: the installed copy of the published model)."""
    batch_size: int = 32
    """Texts per forward pass."""
    device: str = "auto"
    """auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps."""
    precision: Precision = "auto"
    """auto (bf16 where the hardware is fast at it), bf16 or fp32."""
    progress: bool = True
    """A progress bar on stderr while the texts run (drawn only when stderr is a terminal)."""
    num_threads: int | None = None
    """CPU threads (default: torch's, one per core; 1 on a machine other jobs share)."""

    def __post_init__(self) -> None:
        self.model = resolve_model(self.model)
        check_choice(self.precision, Precision, "--precision")
        check_at_least(self, lambda name: f"--{name}", batch_size=1, num_threads=1)


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
    """head, head_tail or tail (default: as in fine-tuning)."""


@dataclass(kw_only=True)
class TextInputs:
    """Texts from the command line or from one file (one of them)."""

    texts: list[str] = field(default_factory=list)
    """Texts given as arguments."""
    input: str | None = None
    """File of texts: one per line, or a CSV/TSV/JSONL table, a Parquet file or a datasets
    folder (with --text_column)."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes of --input that are not UTF-8 (naming the line); replace: read them
    as U+FFFD."""

    def __post_init__(self) -> None:
        if bool(self.texts) == bool(self.input):
            raise BertforgeError("give texts as arguments or --input FILE (one of them)")


__all__ = ["Backend", "BackendOption", "ModelOptions", "TaskOptions", "TextInputs"]
