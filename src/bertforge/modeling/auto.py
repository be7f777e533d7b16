"""Which class of which architecture to build for a job: :func:`model_class` maps a config
(BERT's or ModernBERT's, as ``config.json`` says) and a model kind to the class, so that the
commands pick the architecture from the checkpoint instead of naming BERT's classes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from torch import nn

from bertforge.modeling.config import CONFIG_NAME, AnyConfig, ModernBertConfig, load_config
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
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


def for_directory(cls: type[nn.Module], directory: str | Path) -> type[nn.Module]:
    """A command's BERT class ``cls`` as the architecture of the model in ``directory`` has it:
    ``cls`` itself for a BERT (or a directory without config.json, which loading reports), the
    ModernBERT class of the same kind for a ModernBERT (``BertForPreTraining``: its masked LM)."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file() or not isinstance(load_config(path), ModernBertConfig):
        return cls
    kind = {c: k for k, c in BERT.items()} | {BertForPreTraining: "masked_lm"}
    return MODERNBERT[kind[cls]] if cls in kind else cls


MODERN_HEADS = {"cls.predictions.": "head.", "qa_outputs.": "classifier."}
"""BERT's head prefixes and ModernBERT's for the same head (a command checks its head is there)."""


def head_prefix(cls: type[nn.Module], prefix: str) -> str:
    """``prefix`` (a BERT head's, e.g. ``cls.predictions.transform``) as ``cls`` names it."""
    if cls not in MODERNBERT.values():
        return prefix
    for bert, modern in MODERN_HEADS.items():
        if prefix.startswith(bert):
            return modern
    return prefix


def bert_architectures(config: AnyConfig) -> list[str]:
    """``config.architectures`` named by BERT's classes: a ModernBERT's
    ``ModernBertForSequenceClassification`` is ``BertForSequenceClassification``, so that a
    command choosing by the kind of head reads either architecture's config the same way."""
    modern = {c.__name__: BERT[k].__name__ for k, c in MODERNBERT.items()}
    return [modern.get(name, name) for name in config.architectures or []]


def word_table(model: nn.Module) -> nn.Parameter:
    """The (V, H) word embedding table of any of the pretraining or task models (BERT's
    ``word_embeddings``, ModernBERT's ``tok_embeddings``), as each class names it."""
    return model.get_submodule(model.base_prefix + model.word_table).weight


def is_modern(model: nn.Module) -> bool:
    """Whether ``model`` is one of the ModernBERT classes."""
    return isinstance(getattr(model, "config", None), ModernBertConfig)


__all__ = [
    "BERT",
    "MODERNBERT",
    "bert_architectures",
    "ModelKind",
    "for_directory",
    "head_prefix",
    "is_modern",
    "model_class",
    "word_table",
]
