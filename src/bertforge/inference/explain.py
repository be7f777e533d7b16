"""What a model looked at: attention probabilities per layer and head, and integrated-gradients
attributions of a classifier's prediction to its input tokens.

Both are plain functions of a loaded model and a token sequence, used by ``/attention`` and
``/attribute`` and tested against references (transformers' ``output_attentions``; the
completeness property of integrated gradients).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor, nn


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
    ``BertForSequenceClassification``: the straight path from the embeddings of ``baseline_ids``
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
    word_embeddings = model.bert.embeddings.word_embeddings
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
                lambda m, i, o, z=path: z.clone() if threading.get_ident() == owner else None
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


__all__ = ["Attribution", "attention_maps", "integrated_gradients"]
