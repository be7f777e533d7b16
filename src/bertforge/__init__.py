"""bertforge: BERT from scratch, bit-compatible with Hugging Face checkpoints.

>>> from bertforge import BertConfig, BertForMaskedLM
>>> model = BertForMaskedLM(BertConfig.preset("mini"))
"""

from bertforge.config import BertConfig
from bertforge.errors import BertforgeError
from bertforge.model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)
from bertforge.predict import classify, embed, fill_mask
from bertforge.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "BertforgeError",
    "Tokenizer",
    "__version__",
    "classify",
    "embed",
    "fill_mask",
]
