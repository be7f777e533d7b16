"""Using a trained model: ``fill_mask``, ``classify`` and ``embed`` (``predict``), ``tag``
(``tagging``: named entities with character offsets), ``answer`` (``qa``: extractive question
answering), and what a model looked at: ``attention_maps``, ``integrated_gradients`` and
``attribute`` (a prediction and its attribution, as ``/attribute`` answers; ``explain``); what the CLI commands and the server call."""

from bertforge.inference.explain import (
    Attribution,
    ExplainedPrediction,
    attention_maps,
    attribute,
    integrated_gradients,
)
from bertforge.inference.predict import classify, embed, fill_mask, sequence_logits
from bertforge.inference.qa import answer
from bertforge.inference.tagging import tag, token_logits

__all__ = [
    "Attribution",
    "ExplainedPrediction",
    "answer",
    "attention_maps",
    "attribute",
    "classify",
    "embed",
    "fill_mask",
    "integrated_gradients",
    "sequence_logits",
    "tag",
    "token_logits",
]
