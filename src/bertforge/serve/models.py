"""The models a server holds: each loaded once with its tokenizer, as the richest of our model
classes its weights allow (a classifier, a token classifier, a question-answering model, a masked
LM, or the bare encoder; ``config.json``'s ``architectures`` tells the two classifiers apart). A directory written
by ``bertforge export --format onnx`` (``model.onnx``, no ``model.safetensors``) is served by
ONNX Runtime: ``/predict`` (an exported classifier), ``/tag`` (a token classifier), ``/answer``
(a question-answering model), ``/embed``, ``/similarity`` and ``/tokenize``; the routes that need the PyTorch model's internals (``/attention``, ``/attribute``)
are not offered for it."""

from __future__ import annotations

import functools
import json
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
from bertforge.modeling.auto import is_modern
from bertforge.modeling.checkpoint import check_model_directory, read_safetensors
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
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
    """``classifier``, ``token-classifier``, ``question-answering``, ``masked-lm`` or
    ``encoder``: which head the weights carry."""
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

    @functools.cached_property
    def prompts(self) -> dict[str, str]:
        """The named prompts of a sentence-transformers directory (``prompts`` in
        ``config_sentence_transformers.json``, e.g. ``{"query": "query: "}``), {} without."""
        path = Path(self.directory) / "config_sentence_transformers.json"
        try:
            prompts = json.loads(path.read_text(encoding="utf-8")).get("prompts") or {}
        except (OSError, ValueError, AttributeError):
            return {}
        return {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {}

    @property
    def encoder(self) -> nn.Module:
        """The ``BertModel`` (or ``ModernBertModel``) inside (the model itself for a bare
        encoder)."""
        if is_modern(self.model) and hasattr(self.model, "model"):
            return self.model.model
        return getattr(self.model, "bert", self.model)

    @property
    def max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    @property
    def routes(self) -> list[str]:
        """The model-specific routes this model answers."""
        common = ["/tokenize", "/embed", "/similarity", "/attention"]
        rerank = ["/rerank"] if self.reranks else []
        if self.backend == "onnx":  # no attention maps or gradients from ONNX Runtime
            head = {"classifier": "/predict", **TASK_ROUTES}.get(self.kind)
            return [head, *common[:3], *rerank] if head else [*common[:3], *rerank]
        if self.kind == "masked-lm":
            return ["/fill-mask", *common, *rerank]
        if self.kind == "classifier":
            return ["/predict", "/attribute", *common, *rerank]
        if self.kind in TASK_ROUTES:
            return [TASK_ROUTES[self.kind], *common]
        return [*common, *rerank]

    @property
    def reranks(self) -> str | None:
        """How ``/rerank`` scores a (query, text) pair with this model: ``cross-encoder`` (a
        classifier of one output or two classes reads the pair jointly), ``embedding`` (an
        encoder or masked LM: the cosine of the two vectors), or None (a classifier of more
        classes, a token classifier, a question-answering model)."""
        if self.kind == "classifier":
            return "cross-encoder" if self.model.config.num_labels <= 2 else None
        return "embedding" if self.kind in ("encoder", "masked-lm") else None

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
            "task": TASKS[self.kind],
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
            info["regression"] = bool(config.is_regression)
            info["labels"] = None if config.is_regression else self.labels()
            info["inputs"] = self.inputs
            if self.pair_columns:
                info["pair_columns"] = list(self.pair_columns)
        if self.kind == "token-classifier":
            info["labels"] = self.labels()
        return info

    def parameters(self) -> int:
        """Number of weights (of the ONNX graph's initializers for an exported model)."""
        if self.backend == "onnx":
            return self.model.parameter_count()
        return sum(p.numel() for p in self.model.parameters())

    def labels(self) -> list[str]:
        """A classifier's or token classifier's labels, in output order."""
        config = self.model.config
        id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
        return [id2label[i] for i in range(config.num_labels)]


TASKS = {
    "classifier": "sequence-classification",
    "token-classifier": "token-classification",
    "question-answering": "question-answering",
    "masked-lm": "masked-lm",
    "encoder": "encoder",
}
"""What ``/info`` says each kind of model does (``"task"``)."""
TASK_ROUTES = {"token-classifier": "/tag", "question-answering": "/answer"}
"""The route of each task model that has one of its own."""
ARCHITECTURES = {
    "BertForTokenClassification": "token-classifier",
    "BertForQuestionAnswering": "question-answering",
    "ModernBertForTokenClassification": "token-classifier",
    "ModernBertForQuestionAnswering": "question-answering",
    "ModernBertForMaskedLM": "masked-lm",
}
"""``config.json`` ``architectures`` whose heads the weights' names alone do not tell apart (a
token classifier's ``classifier.`` is a sequence classifier's)."""


def declared_kind(directory: str | Path) -> str | None:
    """The kind ``config.json``'s ``architectures`` names, when it is a token classifier or a
    question-answering model, else None."""
    path = Path(directory) / "config.json"
    try:
        architectures = json.loads(path.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    return next((ARCHITECTURES[a] for a in architectures if a in ARCHITECTURES), None)


def weights_kind(directory: str | Path) -> str:
    """Which head a model directory carries: token-classifier or question-answering (as
    ``config.json`` declares), else by its weights' names classifier, masked-lm or encoder."""

    declared = declared_kind(directory)
    if declared is not None:
        return declared
    keys = read_safetensors(Path(directory)).keys()
    if any(k.startswith("qa_outputs.") for k in keys):
        return "question-answering"
    if any(k.startswith("classifier.") for k in keys):
        return "classifier"
    if any(k.startswith(("cls.predictions.transform", "head.dense")) for k in keys):
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
        kind = declared_kind(directory) or (
            "classifier" if "logits" in model.output_names else "encoder"
        )
        needs = {"token-classifier": "logits", "question-answering": "start_logits"}.get(kind)
        if needs is not None and needs not in model.output_names:
            raise BertforgeError(
                f"--model {name}={directory}: config.json declares a {kind} model but the export"
                f" has no {needs!r} output; export the fine-tuned model again"
            )
        return ServedModel(name, str(directory), model, tokenizer, kind, options, "onnx", finetuned)
    kind = weights_kind(directory)
    cls = {
        "classifier": BertForSequenceClassification,
        "token-classifier": BertForTokenClassification,
        "question-answering": BertForQuestionAnswering,
        "masked-lm": BertForMaskedLM,
        "encoder": BertModel,
    }[kind]
    model, tokenizer, options = load_model(cls, args)
    model.eval()
    return ServedModel(name, str(directory), model, tokenizer, kind, options, "torch", finetuned)


__all__ = [
    "TASKS",
    "TASK_ROUTES",
    "ServedModel",
    "check_served_directory",
    "declared_kind",
    "load_served_model",
    "weights_kind",
]
