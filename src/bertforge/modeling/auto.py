"""Which class of which architecture to build for a job: :func:`model_class` maps a config
(BERT's or ModernBERT's, as ``config.json`` says) and a model kind to the class, so that the
commands pick the architecture from the checkpoint instead of naming BERT's classes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from torch import nn

from bertforge.modeling.config import AnyConfig, ModernBertConfig, load_config
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.modeling.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)

ModelKind = Literal["encoder", "masked_lm", "sequence", "token", "question_answering"]

BERT: dict[str, type[nn.Module]] = {
    "encoder": BertModel,
    "masked_lm": BertForMaskedLM,
    "sequence": BertForSequenceClassification,
    "token": BertForTokenClassification,
    "question_answering": BertForQuestionAnswering,
}
MODERNBERT: dict[str, type[nn.Module]] = {
    "encoder": ModernBertModel,
    "masked_lm": ModernBertForMaskedLM,
    "sequence": ModernBertForSequenceClassification,
    "token": ModernBertForTokenClassification,
    "question_answering": ModernBertForQuestionAnswering,
}


def model_class(config: AnyConfig | str | Path, kind: ModelKind) -> type[nn.Module]:
    """The class of ``kind`` for ``config``'s architecture (a config, or a model directory whose
    ``config.json`` is read)."""
    if not isinstance(config, AnyConfig):
        config = load_config(config)
    return (MODERNBERT if isinstance(config, ModernBertConfig) else BERT)[kind]


def is_modern(model: nn.Module) -> bool:
    """Whether ``model`` is one of the ModernBERT classes."""
    return isinstance(getattr(model, "config", None), ModernBertConfig)


__all__ = ["BERT", "MODERNBERT", "ModelKind", "is_modern", "model_class"]
