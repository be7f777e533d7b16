"""What a model looked at: attention probabilities per layer and head, and integrated-gradients
attributions of a classifier's prediction to its input tokens.

Both are plain functions of a loaded model and a token sequence, used by ``/attention`` and
``/attribute`` and tested against references (transformers' ``output_attentions``; the
completeness property of integrated gradients). :func:`attribute` is what ``/attribute``
answers, for Python: a classifier's prediction of one sequence and the integrated gradients of
one of its outputs from the ``[CLS] [PAD]... [SEP]`` baseline.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from bertforge.modeling.auto import is_modern
from bertforge.tokenizer import Tokenizer


@torch.inference_mode()
def attention_maps(
    encoder: nn.Module, input_ids: Tensor, token_type_ids: Tensor | None = None
) -> Tensor:
    """(L, nh, T, T) attention probabilities of one sequence ``input_ids`` (T,): row i holds
    how token i's query spreads over the keys, summing to 1. ``encoder`` is a ``BertModel``;
    ``token_type_ids`` (T,) mark the second text of a pair (None: all 0, one text)."""
    was_training = encoder.training
    encoder.eval()
    types = None if token_type_ids is None else token_type_ids[None]  # (1, T)
    try:
        # attentions: L x (1, nh, T, T)
        out = encoder(input_ids[None], token_type_ids=types, output_attentions=True)
    finally:
        encoder.train(was_training)
    return torch.stack(out.attentions)[:, 0].float()  # (L, nh, T, T)


@dataclass
class Attribution:
    """Integrated gradients of one output of a sequence classifier."""

    attributions: Tensor
    """(T,) each token's share of ``output - baseline_output``."""
    output: float
    """The explained output (a label's logit, or the regression value) at the input."""
    baseline_output: float
    """The same output at the baseline."""
    delta: float
    """``attributions.sum() - (output - baseline_output)``: the integral's approximation error,
    which shrinks as the steps grow (the completeness property)."""


def integrated_gradients(
    model: nn.Module,
    input_ids: Tensor,
    baseline_ids: Tensor,
    target: int,
    steps: int = 32,
    chunk: int = 32,
    token_type_ids: Tensor | None = None,
) -> Attribution:
    """Integrated gradients (Sundararajan et al., 2017) over the word embeddings of a
    ``BertForSequenceClassification`` (or ModernBERT's, whose token table the hook replaces
    as flat rows): the straight path from the embeddings of ``baseline_ids``
    to those of ``input_ids`` (both (T,)), the gradient of logit ``target`` (column 0 for a
    regressor) averaged at ``steps`` midpoints, times the embedding difference, summed over the
    hidden size. Positions and token types (``token_type_ids`` (T,), 1 on the second text of a
    pair; None: all 0) are the input's all along the path.

    The interpolated embeddings enter through a forward hook on ``word_embeddings`` that exists
    only during this call and acts on the calling thread only, so the model's own code stays
    untouched and other threads may run the same model meanwhile; ``chunk`` points of the path
    share one forward and backward pass.
    """
    if steps < 1:
        raise ValueError(f"steps={steps} must be at least 1")
    word_embeddings = (
        model.model.embeddings.tok_embeddings
        if is_modern(model)
        else model.bert.embeddings.word_embeddings
    )
    was_training = model.training
    model.eval()
    with torch.no_grad():
        x = word_embeddings.weight[input_ids].float()  # (T, H)
        x0 = word_embeddings.weight[baseline_ids].float()  # (T, H)
    alphas = (torch.arange(steps, dtype=torch.float32) + 0.5) / steps  # midpoint rule
    grad_sum = torch.zeros_like(x)  # (T, H)
    T = input_ids.shape[0]

    def types(b: int) -> Tensor | None:
        return None if token_type_ids is None else token_type_ids.expand(b, T)  # (b, T)

    owner = threading.get_ident()
    try:
        for start in range(0, steps, chunk):
            a = alphas[start : start + chunk].to(x.device)[:, None, None]  # (b, 1, 1)
            path = (x0 + a * (x - x0)).detach().requires_grad_(True)  # (b, T, H)
            # the embedding layer adds positions in place: hand it a copy, keep ``path`` a leaf;
            # on this thread only: a server runs other requests' passes of the same model on
            # other threads meanwhile, which must see their own embeddings
            hook = word_embeddings.register_forward_hook(
                lambda m, i, o, z=path: (
                    z.clone().reshape(o.shape) if threading.get_ident() == owner else None
                )
            )
            try:
                with torch.enable_grad():
                    b = path.shape[0]
                    logits = model(input_ids.expand(b, T), token_type_ids=types(b)).logits
                    (grad,) = torch.autograd.grad(logits[:, target].sum(), path)  # (b, T, H)
            finally:
                hook.remove()
            grad_sum += grad.sum(0)
        with torch.no_grad():
            ends = torch.stack([input_ids, baseline_ids])  # (2, T)
            out = model(ends, token_type_ids=types(2)).logits[:, target].float()  # (2,)
    finally:
        model.train(was_training)
    attributions = ((x - x0) * grad_sum / steps).sum(-1)  # (T,)
    output, baseline_output = float(out[0]), float(out[1])
    delta = float(attributions.sum()) - (output - baseline_output)
    return Attribution(attributions.detach(), output, baseline_output, delta)


def padded_baseline(input_ids: Tensor, tokenizer: Tokenizer) -> Tensor:
    """(T,) the baseline of :func:`attribute`: ``input_ids`` with every token but the special
    ones replaced by [PAD]: ``[CLS] [PAD] ... [PAD] [SEP]`` (a pair: ``[CLS] [PAD] ... [SEP]
    [PAD] ... [SEP]``), so only the words' contribution is measured."""
    special = torch.tensor(np.isin(input_ids.cpu().numpy(), tokenizer.special_ids))
    return torch.where(special.to(input_ids.device), input_ids, tokenizer.pad_id)


@dataclass
class ExplainedPrediction:
    """A sequence classifier's prediction of one sequence and the attribution of one output."""

    label: str | None
    """The predicted label (None for a regressor)."""
    scores: dict[str, float] | None
    """Each label's probability (None for a regressor)."""
    value: float | None
    """A regressor's output (None for a classifier)."""
    target: str | None
    """The label explained: the predicted one unless one was asked for (None for a regressor)."""
    attribution: Attribution
    """Integrated gradients of the target's logit (a regressor: its value)."""


def attribute(
    model: nn.Module,
    tokenizer: Tokenizer,
    input_ids: Tensor,
    token_type_ids: Tensor | None = None,
    target: int | None = None,
    steps: int = 32,
    chunk: int = 32,
) -> ExplainedPrediction:
    """Predict the (T,) sequence ``input_ids`` (``[CLS] text [SEP]``, or a pair's ``[CLS] a
    [SEP] b [SEP]`` with its (T,) ``token_type_ids``) with a ``BertForSequenceClassification``
    and attribute label ``target``'s logit (default: the predicted label; a regressor: its
    value) to the tokens by :func:`integrated_gradients` from :func:`padded_baseline`, ``steps``
    points on the path, ``chunk`` of them per forward and backward pass."""
    config = model.config
    if target is not None and not 0 <= target < config.num_labels:
        raise ValueError(f"target={target} is not a label index; give 0 to {config.num_labels - 1}")
    id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    labels = [id2label[i] for i in range(config.num_labels)]
    with torch.inference_mode():
        types = None if token_type_ids is None else token_type_ids[None]  # (1, T)
        logits = model(input_ids[None], token_type_ids=types).logits[0].float()  # (num_labels,)
    if config.is_regression:
        label, scores, value, name, index = None, None, float(logits[0]), None, 0
    else:
        probs = torch.softmax(logits, -1)
        label, value = labels[int(probs.argmax())], None
        scores = {n: float(p) for n, p in zip(labels, probs, strict=True)}
        index = int(probs.argmax()) if target is None else target
        name = labels[index]
    baseline = padded_baseline(input_ids, tokenizer)
    result = integrated_gradients(
        model, input_ids, baseline, index, steps, chunk, token_type_ids=token_type_ids
    )
    return ExplainedPrediction(label, scores, value, name, result)


__all__ = [
    "Attribution",
    "ExplainedPrediction",
    "attention_maps",
    "attribute",
    "integrated_gradients",
    "padded_baseline",
]
