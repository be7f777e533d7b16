"""The model: ``BertConfig`` and ``ModernBertConfig`` (Hugging Face's field names, ``config``),
the Bert* modules in one file (``model``), the ModernBert* ones in another (``modernbert``),
which class of which architecture a job builds (``auto``), the fused operations and C kernels
they run on (``ops``, ``kernels``, ``csrc/``) and checkpoints in Hugging Face's layout
(``checkpoint``)."""

from bertforge.modeling.checkpoint import load_pretrained, read_safetensors, save_pretrained
from bertforge.modeling.config import PRESETS, BertConfig
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertPreTrainedModel,
)

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertPreTrainedModel",
    "load_pretrained",
    "read_safetensors",
    "save_pretrained",
]
