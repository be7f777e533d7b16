"""What the model-using commands (``evaluate``, ``fill-mask``, ``classify``, ``embed``) share:
their common options (dataclasses their configs extend, defined in ``bertforge.training.options``
so that the library's ``evaluate(cfg)`` can take one). Loading a model with its tokenizer and the
defaults a fine-tuned model directory records are ``bertforge.inference.loading``'s (the server
uses them too). All are re-exported here for the commands."""

from __future__ import annotations

from bertforge.inference.loading import finetune_defaults, load_model, load_onnx_model
from bertforge.training.config import FINETUNE_CONFIG
from bertforge.training.options import (
    Backend,
    BackendOption,
    ModelOptions,
    TaskOptions,
    TextInputs,
)

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
