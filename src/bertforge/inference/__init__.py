"""Using a trained model: ``fill_mask``, ``classify`` and ``embed`` (``predict``); what the CLI
commands and the server call."""

from bertforge.inference.predict import classify, embed, fill_mask, sequence_logits

__all__ = ["classify", "embed", "fill_mask", "sequence_logits"]
