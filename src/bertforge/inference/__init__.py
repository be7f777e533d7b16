"""Using a trained model: ``fill_mask``, ``classify`` and ``embed`` (``predict``), ``tag``
(``tagging``: named entities with character offsets), ``answer`` (``qa``: extractive question
answering), and what a model looked at: ``attention_maps`` and ``integrated_gradients``
(``explain``); what the CLI commands and the server call."""

from bertforge.inference.explain import Attribution, attention_maps, integrated_gradients
from bertforge.inference.predict import classify, embed, fill_mask, sequence_logits
from bertforge.inference.qa import answer
from bertforge.inference.tagging import tag, token_logits

__all__ = [
    "Attribution",
    "answer",
    "attention_maps",
    "classify",
    "embed",
    "fill_mask",
    "integrated_gradients",
    "sequence_logits",
    "tag",
    "token_logits",
]
