"""The intermediate losses of ``bertforge distill`` (``--hidden_weight``, ``--attention_weight``,
``--relation_weight``): which are on and on which layer map (:func:`layer_losses`, checked once
with one-line errors), and what they read from a forward pass (:func:`traced`: each mapped
layer's input, output and attention probabilities, by hooks on the encoder's layers, so that the
model code stays as it is).

They compare positions, so both models must read the same tokens: the teacher's tokenizer. The
teacher runs beside the student at every step (its hidden states are T x H numbers a text and
layer: too many to cache).

Either side may be a ModernBERT. Its layers keep the residual stream un-normalised (pre-norm),
so what the hidden-state loss reads of one is each layer's output through the norm that follows
it (the next layer's ``attn_norm``, the last layer's ``final_norm``: the last hidden state), as
BERT's post-norm layers give theirs. Its queries, keys and values, for the relation loss, are
``Wqkv`` of the layer's normalised input before the rotary turn (rotated ones would add each
pair's relative position to their relations). The attention loss compares probabilities, so it
maps a sliding-window layer only to one of the same window (else the keys one side may not see
would carry the other's mass).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from bertforge.errors import BertforgeError
from bertforge.modeling.auto import is_modern
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.distill_config import DistillConfig
from bertforge.training.distill_losses import (
    AttentionLoss,
    DistillLoss,
    HiddenStateLoss,
    RelationLoss,
    uniform_layer_map,
)
from bertforge.training.teacher import Teacher


@dataclass
class Trace:
    """What one forward pass gave the intermediate losses, by layer index."""

    output: Any
    """The model's own output (logits, last hidden state)."""
    inputs: dict[int, Tensor] = field(default_factory=dict)
    """(B, T, H) input of each traced layer (its queries, keys and values are made from it)."""
    outputs: dict[int, Tensor] = field(default_factory=dict)
    """(B, T, H) output of each traced layer."""
    attentions: tuple[Tensor, ...] = ()
    """(B, nh, T, T) attention probabilities of every layer."""


def encoder_of(model: nn.Module) -> nn.Module:
    """The ``BertModel`` (``ModernBertModel``) inside a task model, or the model itself."""
    return getattr(model, "model" if is_modern(model) else "bert", model)


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """The encoder's layers: BERT's ``encoder.layer``, ModernBERT's ``layers``."""
    encoder = encoder_of(model)
    return encoder.layers if is_modern(model) else encoder.encoder.layer


def _input_hook(trace: Trace, i: int, modern: bool) -> Callable[..., None]:
    """Records layer ``i``'s input: BERT's ``forward(x, ...)``; ModernBERT's ``forward(x,
    normed, rows, ...)`` gives (n, H) rows, put back on the (B, T) grid."""

    def hook(module: nn.Module, args: tuple) -> None:
        trace.inputs[i] = args[2].to_grid(args[1]) if modern else args[0]

    return hook


def _output_hook(trace: Trace, i: int, modern: bool) -> Callable[..., None]:
    """Records layer ``i``'s output: BERT's first output; ModernBERT's ``(x, next_norm(x),
    probs)`` gives the normalised rows, on the grid."""

    def hook(module: nn.Module, args: tuple, out: tuple) -> None:
        trace.outputs[i] = args[2].to_grid(out[1]) if modern else out[0]

    return hook


def traced(model: nn.Module, call: Callable[[], Any], layers: list[int]) -> Trace:
    """Run ``call()`` (a forward of ``model`` with ``output_attentions=True``, which keeps the
    (B, T, H) layout: no unpadding) and record ``layers``' inputs and outputs (for a ModernBERT,
    the normalised input its attention reads and the normalised output: module docstring)."""
    trace = Trace(None)
    blocks = blocks_of(model)
    handles = []
    modern = is_modern(model)
    for i in layers:
        handles.append(blocks[i].register_forward_pre_hook(_input_hook(trace, i, modern)))
        handles.append(blocks[i].register_forward_hook(_output_hook(trace, i, modern)))
    try:
        trace.output = call()
    finally:
        for handle in handles:
            handle.remove()
    trace.attentions = tuple(trace.output.attentions or ())
    return trace


def qkv(model: nn.Module, trace: Trace, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """The (B, T, H) queries, keys and values of ``layer`` from its traced input (a
    ModernBERT's before the rotary turn)."""
    x = trace.inputs[layer]
    if is_modern(model):
        wqkv = blocks_of(model)[layer].attn.Wqkv
        q, k, v = wqkv(x).chunk(3, dim=-1)
        return q, k, v
    attention = blocks_of(model)[layer].attention.self
    return attention.query(x), attention.key(x), attention.value(x)


def attention_window(model: nn.Module, layer: int) -> int | None:
    """Keys seen either side by ``layer``'s attention: None for a global layer (every BERT
    layer)."""
    return blocks_of(model)[layer].attn.window if is_modern(model) else None


def layer_map(
    cfg: DistillConfig, student_layers: int, teacher_layers: int
) -> list[tuple[int, int]]:
    """``(student layer, teacher layer)`` pairs: --layer_map, else the copied layers of
    --student_layers, else uniform."""
    chosen = cfg.layer_map or cfg.student_layers
    if chosen is None:
        return uniform_layer_map(student_layers, teacher_layers)
    if len(chosen) != student_layers or not all(0 <= t < teacher_layers for t in chosen):
        raise BertforgeError(
            f"--layer_map {' '.join(map(str, chosen))}: give one teacher layer (0 to "
            f"{teacher_layers - 1}) for each of the student's {student_layers} layers"
        )
    return list(enumerate(chosen))


def layer_losses(
    cfg: DistillConfig, teacher: Teacher, student: nn.Module, tokenizer: Tokenizer
) -> nn.ModuleList:
    """The intermediate loss modules that are on (none: an empty list); refuses a student that
    reads other tokens, or head counts or widths that do not fit."""
    losses = nn.ModuleList()
    if not cfg.intermediate:
        return losses
    if tokenizer.fingerprint != teacher.tokenizer.fingerprint:
        raise BertforgeError(
            "the intermediate losses (--hidden_weight, --attention_weight, --relation_weight) "
            "compare positions and need the teacher's tokenizer; the student has another: use "
            "--student_layers or --student_preset, or set them to 0"
        )
    s, t = student.config, teacher.config
    pairs = layer_map(cfg, s.num_hidden_layers, t.num_hidden_layers)
    if cfg.hidden_weight:
        losses.append(HiddenStateLoss(s.hidden_size, t.hidden_size, pairs, cfg.hidden_weight))
    if cfg.attention_weight:
        if s.num_attention_heads != t.num_attention_heads:
            raise BertforgeError(
                f"--attention_weight compares heads one to one: the student has "
                f"{s.num_attention_heads}, the teacher {t.num_attention_heads}; use "
                "--relation_weight for differing head counts"
            )
        for i, j in pairs:
            windows = attention_window(student, i), attention_window(teacher.model, j)
            if windows[0] != windows[1]:
                kind = ["global" if w is None else f"a window of {w}" for w in windows]
                raise BertforgeError(
                    f"--attention_weight compares attention distributions, but the student's "
                    f"layer {i} attends {kind[0]} and the teacher's layer {j} {kind[1]}: map "
                    "layers of the same kind (--layer_map) or use --relation_weight"
                )
        losses.append(AttentionLoss(pairs, cfg.attention_weight))
    if cfg.relation_weight:
        heads = cfg.relation_heads or s.num_attention_heads
        if s.hidden_size % heads or t.hidden_size % heads:
            raise BertforgeError(
                f"--relation_heads {heads} must divide both widths ({s.hidden_size} and "
                f"{t.hidden_size}); choose a common divisor"
            )
        losses.append(RelationLoss(pairs, heads, cfg.relation_weight))
    return losses


def traced_layers(losses: nn.ModuleList) -> tuple[list[int], list[int]]:
    """The student's and the teacher's layers the losses read."""
    pairs = {pair for loss in losses for pair in loss.layer_map}
    return sorted({s for s, _ in pairs}), sorted({t for _, t in pairs})


def layer_terms(
    losses: nn.ModuleList,
    student: nn.Module,
    teacher: nn.Module,
    traces: tuple[Trace, Trace],
    mask: Tensor,
) -> dict[str, Tensor]:
    """Every intermediate loss's named terms from the two models' traces."""
    s, t = traces
    terms: dict[str, Tensor] = {}
    for loss in losses:
        if isinstance(loss, HiddenStateLoss):
            terms |= loss(s.outputs, t.outputs, mask)
        elif isinstance(loss, AttentionLoss):
            terms |= loss(s.attentions, t.attentions, mask)
        else:
            with torch.no_grad():
                teacher_qkv = {j: qkv(teacher, t, j) for _, j in loss.layer_map}
            student_qkv = {i: qkv(student, s, i) for i, _ in loss.layer_map}
            terms |= loss(student_qkv, teacher_qkv, mask)
    return terms


def layer_loss(losses: nn.ModuleList, terms: dict[str, Tensor]) -> Tensor:
    """The weighted sum of the intermediate terms."""
    total = [
        loss.loss({k: terms[k] for k in loss.weights})
        for loss in losses
        if isinstance(loss, DistillLoss)
    ]
    return torch.stack(total).sum()


__all__ = ["Trace", "layer_losses", "layer_loss", "layer_terms", "traced", "traced_layers"]
