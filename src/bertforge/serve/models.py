"""The models a server holds: each loaded once with its tokenizer, as the richest of our model
classes its weights allow (a classifier, a masked LM, or the bare encoder). A directory written
by ``bertforge export --format onnx`` (``model.onnx``, no ``model.safetensors``) is served by
ONNX Runtime: ``/predict`` (an exported classifier), ``/embed``, ``/similarity`` and
``/tokenize``; the routes that need the PyTorch model's internals (``/attention``, ``/attribute``)
are not offered for it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.errors import BertforgeError
from bertforge.inference.loading import (
    LoadOptions,
    finetune_defaults,
    load_model,
    load_onnx_model,
)
from bertforge.inference.onnx import ONNX_FILE
from bertforge.inference.predict import classify as predict_classify
from bertforge.inference.predict import embed as predict_embed
from bertforge.inference.predict import fill_mask as predict_fill_mask
from bertforge.modeling.checkpoint import check_model_directory, read_safetensors
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.modeling.pooling import declared_pooling


@dataclass
class ServedModel:
    """One loaded model and what it can answer."""

    name: str
    """The name clients use (``"model": NAME``)."""
    directory: str
    model: nn.Module | Any
    """The PyTorch model, or an :class:`~bertforge.inference.onnx.OnnxModel` (``backend`` onnx)."""
    tokenizer: Any
    kind: str
    """``classifier``, ``masked-lm`` or ``encoder``: which head the weights carry."""
    options: dict[str, Any]
    """``batch_size`` and ``precision`` for the inference functions."""
    backend: str = "torch"
    """torch, or onnx for an exported directory run by ONNX Runtime."""
    finetuned: dict[str, Any] = field(default_factory=dict)
    """What ``bertforge finetune`` saved beside the weights (``finetune_config.json``: columns,
    truncation), {} for a directory it did not write."""

    @functools.cached_property
    def declared_pooling(self) -> tuple[str | None, bool]:
        """The pooling (None: none declared) and normalisation the directory declares, read
        from its sentence-transformers files once, not on every request."""
        pooling, _, normalize = declared_pooling(self.directory)
        return pooling, normalize

    @property
    def encoder(self) -> nn.Module:
        """The ``BertModel`` inside (the model itself for a bare encoder)."""
        return getattr(self.model, "bert", self.model)

    @property
    def max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    @property
    def routes(self) -> list[str]:
        """The model-specific routes this model answers."""
        common = ["/tokenize", "/embed", "/similarity", "/attention"]
        if self.backend == "onnx":  # no attention maps or gradients from ONNX Runtime
            return ["/predict", *common[:3]] if self.kind == "classifier" else common[:3]
        if self.kind == "masked-lm":
            return ["/fill-mask", *common]
        if self.kind == "classifier":
            return ["/predict", "/attribute", *common]
        return common

    @property
    def pair_columns(self) -> tuple[str, str] | None:
        """``(text_column, text_pair_column)`` of a classifier fine-tuned on text pairs, else None."""
        pair = self.finetuned.get("text_pair_column")
        return (self.finetuned.get("text_column") or "text", pair) if pair else None

    @property
    def inputs(self) -> str:
        """What ``/predict`` takes: ``pairs`` (fine-tuned on pairs), ``texts`` (fine-tuned on
        single texts), or ``texts or pairs`` (a classifier ``bertforge finetune`` did not write,
        such as an imported cross-encoder: nothing says which it expects)."""
        if self.pair_columns:
            return "pairs"
        return "texts" if self.finetuned else "texts or pairs"

    def describe(self) -> dict[str, Any]:
        """What ``/info`` says about the model."""
        config = self.model.config
        info: dict[str, Any] = {
            "name": self.name,
            "directory": self.directory,
            "kind": self.kind,
            "routes": self.routes,
            "backend": self.backend,
            "parameters": self.parameters(),
            "precision": self.options["precision"],
            "device": "cpu"
            if self.backend == "onnx"
            else str(next(self.model.parameters()).device),
            "config": config.to_dict(),
            "tokenizer": {
                "vocab_size": self.tokenizer.vocab_size,
                "lowercase": self.tokenizer.lowercase,
                "mask_token": "[MASK]",
            },
        }
        if self.kind == "classifier":
            info["task"] = "regression" if config.is_regression else "classification"
            info["labels"] = None if config.is_regression else self.labels()
            info["inputs"] = self.inputs
            if self.pair_columns:
                info["pair_columns"] = list(self.pair_columns)
        return info

    def parameters(self) -> int:
        """Number of weights (of the ONNX graph's initializers for an exported model)."""
        if self.backend == "onnx":
            return self.model.parameter_count()
        return sum(p.numel() for p in self.model.parameters())

    def warm(self) -> None:
        """Run each of the model's inference functions once on a short text, so the first
        request does not pay for first-call work (allocations, kernel selection, lazy inits)."""
        options = {**self.options, "batch_size": 1}
        text = "warm up"
        predict_embed(self.encoder, self.tokenizer, [text], "cls", max_length=16, **options)
        if self.kind == "masked-lm":
            predict_fill_mask(self.model, self.tokenizer, ["warm [MASK]"], 1, **options)
        elif self.kind == "classifier":
            pairs = ["up"] if self.pair_columns else None
            predict_classify(self.model, self.tokenizer, ["warm"], pairs, max_length=16, **options)

    def labels(self) -> list[str]:
        config = self.model.config
        id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
        return [id2label[i] for i in range(config.num_labels)]


def weights_kind(directory: str | Path) -> str:
    """Which head a model directory's weights carry: classifier, masked-lm or encoder."""

    keys = read_safetensors(Path(directory)).keys()
    if any(k.startswith("classifier.") for k in keys):
        return "classifier"
    if any(k.startswith("cls.predictions.transform") for k in keys):
        return "masked-lm"
    return "encoder"


def check_served_directory(name: str, directory: str) -> None:
    """Refuse a ``--model`` that names no directory, or a training run instead of its model
    (before anything slower runs), with the commands' own message."""
    if not Path(directory).is_dir():
        raise BertforgeError(f"--model {name}={directory}: no such model directory")
    try:
        check_model_directory(directory)
    except BertforgeError as err:
        raise BertforgeError(f"--model {name}={err}") from None


def load_served_model(name: str, directory: str, device: str, precision: str) -> ServedModel:
    """Load ``directory`` for serving under ``name`` (through the commands' own loader)."""

    check_served_directory(name, directory)
    finetuned = finetune_defaults(directory)
    args = LoadOptions(model=directory, device=device, precision=precision, batch_size=32)
    if (Path(directory) / ONNX_FILE).is_file() and not (
        Path(directory) / "model.safetensors"
    ).is_file():
        if precision == "bf16":
            args.precision = "fp32"  # an export runs the precision it was exported with
        model, tokenizer, options = load_onnx_model(args, output="last_hidden_state")
        kind = "classifier" if "logits" in model.output_names else "encoder"
        return ServedModel(name, str(directory), model, tokenizer, kind, options, "onnx", finetuned)
    kind = weights_kind(directory)
    cls = {
        "classifier": BertForSequenceClassification,
        "masked-lm": BertForMaskedLM,
        "encoder": BertModel,
    }[kind]
    model, tokenizer, options = load_model(cls, args)
    model.eval()
    return ServedModel(name, str(directory), model, tokenizer, kind, options, "torch", finetuned)


__all__ = ["ServedModel", "check_served_directory", "load_served_model", "weights_kind"]
