"""bertforge: BERT from scratch, bit-compatible with Hugging Face checkpoints.

>>> from bertforge import BertConfig, BertForMaskedLM
>>> model = BertForMaskedLM(BertConfig.preset("mini"))

The packages, in the order of a model's life: ``tokenizer`` (WordPiece), ``data`` (corpora ->
token shards, masking, labelled tables), ``modeling`` (config, the model, kernels, checkpoints),
``training`` (the pretraining and fine-tuning loops), ``evaluation`` (MLM and task metrics,
plots), ``inference`` (fill-mask, classify, embed) and ``cli`` (the ``bertforge`` command, the
only place that parses arguments). Shared rooms: ``io`` (atomic writes, JSON files), ``runtime``
(device, precision, seeds), ``progress`` (progress bars, metrics log), ``distributed`` (torchrun),
``errors``.

Layers, lowest first; an import only points down (``LAYERS`` in ``tests/test_imports.py``
declares them and the test enforces it): errors -> io -> runtime/lock/progress/distributed ->
tokenizer -> modeling -> data -> inference -> evaluation -> training -> recipes/serve/verify ->
this package's public names -> cli.
"""

from bertforge.errors import BertforgeError
from bertforge.inference.predict import classify, embed, fill_mask
from bertforge.modeling.config import BertConfig, ModernBertConfig
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
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
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import FinetuneConfig, PretrainConfig
from bertforge.training.finetune import finetune
from bertforge.training.pretrain import pretrain

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertforgeError",
    "FinetuneConfig",
    "ModernBertConfig",
    "ModernBertForMaskedLM",
    "ModernBertForQuestionAnswering",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertModel",
    "PretrainConfig",
    "Tokenizer",
    "__version__",
    "classify",
    "embed",
    "fill_mask",
    "finetune",
    "pretrain",
]
