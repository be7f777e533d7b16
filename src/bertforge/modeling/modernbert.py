"""ModernBERT (Warner et al. 2024), read top to bottom: embeddings, rotary positions, attention,
feed-forward, layer, encoder, heads, task models.

Module and parameter names equal transformers' ``modeling_modernbert`` (5.x), so a state dict
moves between the two with no renaming table: ``model.embeddings.tok_embeddings``,
``model.layers.{i}.attn_norm`` (an identity in layer 0: no weight), ``attn.Wqkv`` (q, k and v
blocks), ``attn.Wo``, ``mlp_norm``, ``mlp.Wi`` (the GeGLU's two halves), ``mlp.Wo``,
``model.final_norm``, the heads' ``head.dense`` / ``head.norm``, the MLM ``decoder`` (its weight
the token table) and the task models' ``classifier``.

The computation is transformers'; what differs is for speed only and keeps the values at the
real tokens (``tests/test_modernbert.py`` checks each path against transformers or the plain
computation):

* unpadding: with padding in the batch, every token-wise op (embedding norm, projections,
  rotary positions, feed-forward, LayerNorms, heads) runs on the N real tokens only; attention
  alone goes back to the (B, T) grid (transformers' CPU path runs the whole padded grid);
* sliding-window layers attend through :func:`~bertforge.modeling.ops.window_attention`, in
  blocks of the window when the sequence is longer than 3 windows: no (T, T) scores;
* each block ends with :func:`~bertforge.modeling.ops.residual_norm`: the output product, the
  residual sum and the *next* LayerNorm (the next layer's ``attn_norm``, the MLP's
  ``mlp_norm``, or ``final_norm``) in one C pass forward and one back in fp32 CPU training;
* the GeGLU, gelu(first half of ``Wi``'s output) x second half, is one C pass forward and one
  back on fp32 CPU rows (:func:`~bertforge.modeling.ops.gated_activation`), keeping only
  ``Wi``'s output for the backward;
* with MLM labels the head and the 50k-wide decoder run at the labelled positions only (sparse
  prediction, transformers' ``sparse_prediction``), the decoder and its cross-entropy fused
  (:func:`~bertforge.modeling.ops.decoder_cross_entropy`), and the last layer's queries,
  ``Wo`` and feed-forward run there too (keys and values at every row: the sparse last layer);
  the token classifier, training, likewise at the labelled positions.

Every forward takes ``token_type_ids`` as BERT's does and ignores it: ModernBERT has no segment
embeddings (a pair is [CLS] a [SEP] b [SEP]), and the commands BERT shares pass them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge.modeling.checkpoint import load_pretrained, save_pretrained
from bertforge.modeling.config import ModernBertConfig
from bertforge.modeling.model import (
    IGNORE_INDEX,
    BertModelOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
    WordEmbeddings,
    has_padding,
)
from bertforge.modeling.ops import (
    activation,
    attention,
    decoder_cross_entropy,
    decoder_logits,
    dropout,
    gated_activation,
    linear,
    query_attention,
    query_slots,
    repad,
    residual_norm,
    round_up,
    shape_multiple,
    unpad,
    unpadded_index,
    window_attention,
)


# ---- where the tokens sit ---------------------------------------------------------------------
@dataclass
class Rows:
    """The batch as flat rows: what every layer needs to know besides the hidden states, which
    are (n, H) rows, either every position of the (B, T) grid in order (``index`` None) or the
    real tokens first (``index`` their flat positions; n may exceed the N real ones by some
    padding rows when counts are rounded: ``unpadded_index``)."""

    B: int
    T: int
    keys: Tensor | None
    """(B, T) True at real tokens, or None when nothing is padded."""
    index: Tensor | None
    """(n,) flat grid positions of the rows, None when the rows are the whole grid."""
    real: int
    """N, the real tokens among the rows (the first N)."""
    positions: Tensor
    """(n,) each row's position in its sequence (what the rotary angles turn by)."""
    output_attentions: bool = False

    def to_grid(self, x: Tensor) -> Tensor:
        """(n, C) rows -> (B, T, C), zeros at padding."""
        if self.index is None:
            return x.view(self.B, self.T, -1)
        return repad(x[: self.real], self.index[: self.real], self.B, self.T)

    def from_grid(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (n, C) rows."""
        return x.reshape(self.B * self.T, -1) if self.index is None else unpad(x, self.index)

    def rows_of(self, flat: Tensor) -> Tensor:
        """The rows holding the given flat grid positions (each a real token)."""
        if self.index is None:
            return flat
        where = torch.full((self.B * self.T,), -1, dtype=torch.long, device=flat.device)
        where[self.index] = torch.arange(self.index.numel(), device=flat.device)
        return where[flat]

    def sequence_of_rows(self) -> Tensor:
        """(N,) the sequence each real row belongs to."""
        if self.index is None:
            return torch.arange(self.B, device=self.positions.device).repeat_interleave(self.T)
        return torch.div(self.index[: self.real], self.T, rounding_mode="floor")


def batch_rows(input_ids: Tensor, attention_mask: Tensor | None, multiple: int = 1) -> Rows:
    """The :class:`Rows` of a (B, T) batch: its real tokens when some are padded and no graph is
    being compiled (a compiled graph keeps one shape; attention masks the padding), else the
    grid. ``multiple``: round the real count up to it (bf16 on a CPU: ``shape_multiple``)."""
    B, T = input_ids.shape
    device = input_ids.device
    if attention_mask is None or not has_padding(attention_mask):
        positions = torch.arange(T, device=device).repeat(B)
        return Rows(B, T, None, None, B * T, positions)
    keys = attention_mask.to(device, torch.bool)
    if torch.compiler.is_compiling():
        return Rows(B, T, keys, None, B * T, torch.arange(T, device=device).repeat(B))
    index, real = unpadded_index(keys.flatten(), multiple)  # (n,)
    return Rows(B, T, keys, index, real, index % T)


# ---- embeddings --------------------------------------------------------------------------------
def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout: no positions (rotary, in attention), no segments."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = WordEmbeddings(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.norm = layer_norm(config)
        self.dropout_p = config.embedding_dropout

    def forward(self, ids: Tensor) -> Tensor:
        """(n,) token ids -> (n, H)."""
        return dropout(self.norm(self.tok_embeddings(ids)), self.dropout_p, self.training)


# ---- rotary positions --------------------------------------------------------------------------
def rotary_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """(cos, sin), each (n, head_dim), of the rotary angles at ``positions`` (n,): frequency
    ``theta ** (-2i / head_dim)`` for the i-th pair, the two halves of the head repeating it
    (the rotate-half layout of GPT-NeoX and transformers). fp32 throughout, as transformers."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = 1.0 / (theta ** (exponent / head_dim))  # (hs/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (n, hs/2)
    angles = torch.cat([angles, angles], dim=-1)  # (n, hs)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` over (..., hs) ``x`` and tables that broadcast to it
    (e.g. (n, nh, hs) and (n, 1, hs)), where rotate_half(x) = (-x2, x1) for the halves x1, x2
    of the head; computed in fp32. The tables' two halves are equal (:func:`rotary_tables`),
    so the rotated half is added into the product in place (no concatenated copy)."""
    xf = x.float()
    h = xf.shape[-1] // 2
    x1, x2, s = xf[..., :h], xf[..., h:], sin[..., :h]
    out = xf * cos
    out[..., :h].addcmul_(x2, s, value=-1.0)
    out[..., h:].addcmul_(x1, s)
    return out.to(x.dtype)


# ---- attention ---------------------------------------------------------------------------------
class ModernBertAttention(nn.Module):
    """One GEMM for q, k and v (``Wqkv``), rotary positions on q and k, global or sliding-window
    attention as the layer's type says, then ``Wo`` (applied by the layer: it fuses with the
    residual sum and the next LayerNorm)."""

    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        H = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.Wqkv = nn.Linear(H, 3 * H, bias=config.attention_bias)
        self.Wo = nn.Linear(H, H, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        local = config.layer_types[layer_idx] == "sliding_attention"
        self.window = config.window if local else None
        """Keys seen either side in a sliding-window layer; None in a global one."""

    def forward(
        self, x: Tensor, rows: Rows, rope: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor | None]:
        """(n, H) normalised rows -> (n, H) attention output before ``Wo`` (and the (B, nh, T, T)
        probabilities with ``rows.output_attentions``). ``rope``: the (n, 1, hs) cos and sin of
        the rows' positions for this layer's type."""
        n, H = x.shape
        nh, hs = self.num_heads, self.head_dim
        B, T = rows.B, rows.T
        qk, v = self.rotated(x, rope)
        qkv = torch.cat([qk, v], dim=1).view(n, 3 * H)  # (n, 3H)
        qkv = rows.to_grid(qkv) if rows.index is not None else qkv.view(B, T, 3 * H)
        p = self.dropout_p if self.training else 0.0
        if rows.output_attentions:
            y, probs = self.explicit(qkv, rows.keys)
        elif self.window is None and p > 0 and x.device.type == "cpu":
            mask = None if rows.keys is None else rows.keys[:, None, None, :]
            y, probs = attention(qkv, nh, mask, p, True), None  # the fused softmax + dropout
        else:
            q, k, v = qkv.view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B,nh,T,hs)
            if self.window is None:
                mask = None if rows.keys is None else rows.keys[:, None, None, :]
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            else:
                y = window_attention(q, k, v, rows.keys, self.window, p, self.training)
            y, probs = y.transpose(1, 2).reshape(B, T, H), None  # (B, T, H)
        return rows.from_grid(y), probs

    def rotated(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """``Wqkv`` of the (n, H) rows: q and k turned by their rotary angles, (n, 2, nh, hs),
        and v, (n, 1, nh, hs). ``rope``: the (n, 1, hs) cos and sin, broadcast over q and k."""
        qkv = linear(x, self.Wqkv.weight, self.Wqkv.bias, None)
        qkv = qkv.view(x.shape[0], 3, self.num_heads, self.head_dim)
        cos, sin = rope
        return rotate(qkv[:, :2], cos[:, None], sin[:, None]), qkv[:, 2:]

    def forward_rows(
        self, x: Tensor, rows: Rows, rope: tuple[Tensor, Tensor], picked: Tensor
    ) -> Tensor:
        """The attention output before ``Wo`` at the rows ``picked`` only (the sparse last
        layer): (m, H), equal to ``forward(x, rows, rope)[0][picked]``. Keys and values come
        from every row, queries and their scores from the picked ones, each sequence's in a
        (B, R) block (:func:`query_slots`), a sliding window as a per-query band mask. A window
        layer longer than 3 windows attends in full instead (no (T, T) scores: the blocks of
        :func:`window_attention`) and keeps the picked rows."""
        n, H = x.shape
        nh, B, T = self.num_heads, rows.B, rows.T
        if rows.output_attentions or (self.window is not None and 3 * self.window < T):
            return self.forward(x, rows, rope)[0][picked]
        qk, v = self.rotated(x, rope)
        kv = torch.cat([qk[:, 1:], v], dim=1).view(n, 2 * H)  # rotated k, then v
        kv = rows.to_grid(kv) if rows.index is not None else kv.view(B, T, 2 * H)
        grid = picked if rows.index is None else rows.index[picked]  # positions in (B, T)
        seq = torch.div(grid, T, rounding_mode="floor")
        slot, R = query_slots(seq, T, x)
        queries = qk.new_zeros(B, R, H).index_put((seq, slot), qk[picked, 0].reshape(-1, H))
        mask = None if rows.keys is None else rows.keys[:, None, None, :]  # (B, 1, 1, T)
        if self.window is not None and self.window < T - 1:
            at = torch.zeros(B, R, dtype=torch.long, device=x.device).index_put(
                (seq, slot), grid % T
            )
            band = (at[:, :, None] - torch.arange(T, device=x.device)).abs() <= self.window
            mask = band[:, None] if mask is None else band[:, None] & mask  # (B, 1, R, T)
        y = query_attention(queries, kv, nh, mask, self.dropout_p, self.training)  # (B, R, H)
        return y[seq, slot]

    def explicit(self, qkv: Tensor, keys: Tensor | None) -> tuple[Tensor, Tensor]:
        """The plain computation with its (B, nh, T, T) probabilities (the explorer's maps, and
        what the fast paths are tested against): (B, T, H) output, probabilities."""
        B, T, H3 = qkv.shape
        nh, hs = self.num_heads, self.head_dim
        q, k, v = qkv.view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs)
        scores = (q / math.sqrt(hs)) @ k.transpose(-2, -1)  # (B, nh, T, T)
        allowed = torch.ones(T, T, dtype=torch.bool, device=qkv.device)
        if self.window is not None:
            i = torch.arange(T, device=qkv.device)
            allowed = (i[:, None] - i[None, :]).abs() <= self.window
        allowed = allowed[None, None] if keys is None else allowed & keys[:, None, None, :]
        probs = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1)
        y = dropout(probs, self.dropout_p, self.training) @ v  # (B, nh, T, hs)
        return y.transpose(1, 2).reshape(B, T, H3 // 3), probs


# ---- feed-forward ------------------------------------------------------------------------------
class ModernBertMLP(nn.Module):
    """GeGLU: ``Wi`` gives two halves, act(first) x second, dropout, then ``Wo`` (applied by the
    layer, fused with the residual sum and the next LayerNorm)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        H, inner = config.hidden_size, config.intermediate_size
        self.Wi = nn.Linear(H, 2 * inner, bias=config.mlp_bias)
        self.Wo = nn.Linear(inner, H, bias=config.mlp_bias)
        self.act = config.hidden_activation
        self.dropout_p = config.mlp_dropout

    def gate(self, x: Tensor) -> Tensor:
        """(n, H) -> (n, inner): everything before ``Wo``. ``Wi``'s product goes through
        :func:`~bertforge.modeling.ops.linear` (oneDNN's fp32 training products on AMD, as
        BERT's), then the GeGLU is one C pass each way on fp32 CPU rows
        (:func:`~bertforge.modeling.ops.gated_activation`)."""
        h = linear(x, self.Wi.weight, self.Wi.bias, None)  # (n, 2 inner): gated half, gate
        return dropout(gated_activation(h, self.act), self.dropout_p, self.training)


# ---- layer and encoder -------------------------------------------------------------------------
class ModernBertEncoderLayer(nn.Module):
    """Pre-norm: x + attn(attn_norm(x)), then + mlp(mlp_norm(.)). Layer 0's ``attn_norm`` is an
    identity: the embeddings end in a LayerNorm already."""

    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if layer_idx == 0 else layer_norm(config)
        self.attn = ModernBertAttention(config, layer_idx)
        self.mlp_norm = layer_norm(config)
        self.mlp = ModernBertMLP(config)
        self.attention_type = config.layer_types[layer_idx]

    def forward(
        self,
        x: Tensor,
        normed: Tensor,
        rows: Rows,
        rope: tuple[Tensor, Tensor],
        next_norm: nn.LayerNorm,
        picked: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``x`` the (n, H) residual stream and ``normed`` = ``attn_norm(x)`` (computed where x
        was summed) -> (x after the layer, ``next_norm`` of it, attention probabilities).
        ``next_norm`` is the next layer's ``attn_norm`` or the encoder's ``final_norm``: each
        block's end sums and normalises in one pass (``residual_norm``). ``picked`` (the last
        layer of sparse prediction): the output at those rows only, (m, H) each, the attention's
        queries, ``Wo`` and the feed-forward running there alone (no probabilities)."""
        if picked is None:
            y, probs = self.attn(normed, rows, rope)
        else:
            y, probs, x = self.attn.forward_rows(normed, rows, rope, picked), None, x[picked]
        p = self.attn.dropout_p  # transformers' out_drop after Wo
        h, x = residual_norm(y, self.attn.Wo, x, self.mlp_norm, p, self.training)
        h, x = residual_norm(self.mlp.gate(h), self.mlp.Wo, x, next_norm, 0.0, self.training)
        return x, h, probs


class ModernBertPreTrainedModel(nn.Module):
    """Base of every ModernBERT model: transformers' initialisation, ``from_pretrained`` and
    ``save_pretrained``."""

    config_class = ModernBertConfig
    encoder_name = "model."
    """The encoder's prefix in a task model's state dict (transformers' ``base_model_prefix``)."""
    base_prefix = "model."
    """This class's prefix of the encoder ("" for ModernBertModel)."""
    word_table = "embeddings.tok_embeddings"
    """The token table under the encoder (the tied decoder shares it)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        """transformers' initialisation: truncated normals (cut at ``initializer_cutoff_factor``
        standard deviations) of std ``initializer_range`` for the embeddings and the input
        products, ``initializer_range / sqrt(2 x layers)`` for the output products and the
        head, ``hidden_size ** -0.5`` for a classifier; zero biases, unit LayerNorms; the
        padding row of the token table zero."""
        c = self.config
        std_in, cut = c.initializer_range, c.initializer_cutoff_factor
        std_out = c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)

        def init(module: nn.Linear | nn.Embedding, std: float) -> None:
            nn.init.trunc_normal_(module.weight, 0.0, std, -cut * std, cut * std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

        for name, module in self.named_modules():
            if isinstance(module, ModernBertEmbeddings):
                init(module.tok_embeddings, std_in)
                if module.tok_embeddings.padding_idx is not None:
                    with torch.no_grad():
                        module.tok_embeddings.weight[module.tok_embeddings.padding_idx].zero_()
            elif isinstance(module, (ModernBertAttention, ModernBertMLP)):
                init(module.Wqkv if isinstance(module, ModernBertAttention) else module.Wi, std_in)
                init(module.Wo, std_out)
            elif isinstance(module, ModernBertPredictionHead):
                init(module.dense, std_out)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif name == "classifier" and isinstance(module, nn.Linear):
                init(module, c.hidden_size**-0.5)
            elif name == "decoder" and isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)  # its weight is the token table

    @classmethod
    def from_pretrained(cls, directory: str | Path, **config_overrides: Any) -> Any:
        """Load our or transformers' ModernBERT directory (config.json + model.safetensors) into
        this class; heads the checkpoint lacks start freshly initialised. Eval mode."""
        return load_pretrained(cls, directory, **config_overrides)

    def save_pretrained(
        self,
        directory: str | Path,
        tokenizer: Any = None,
        extra_tensors: dict[str, Tensor] | None = None,
        dtype: torch.dtype | None = None,
    ) -> Path:
        """Write config.json (naming this class) + model.safetensors (+ tokenizer) atomically
        (``dtype``: the floating-point weights stored, default as in memory)."""
        return save_pretrained(
            self, directory, tokenizer=tokenizer, extra_tensors=extra_tensors, dtype=dtype
        )


class ModernBertModel(ModernBertPreTrainedModel):
    """The encoder: embeddings, ``num_hidden_layers`` layers, ``final_norm``."""

    base_prefix = ""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(
            ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.final_norm = layer_norm(config)
        self.init_weights()

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        output_attentions: bool = False,
        at: Tensor | None = None,
    ) -> tuple[Tensor, Rows, tuple[Tensor, ...] | None]:
        """(the last hidden state as (n, H) rows, their :class:`Rows`, per-layer attention
        probabilities when asked): the encoder on the real tokens only. ``at`` (flat (B, T)
        positions of real tokens, e.g. the masked ones) asks for the last hidden state there
        only, (len(at), H) in that order: the last layer's queries, ``Wo`` and feed-forward
        then run at those rows alone (sparse prediction, as BERT's last layer)."""
        B, T = input_ids.shape
        c = self.config
        if c.max_position_embeddings < T:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings="
                f"{c.max_position_embeddings}; truncate the input (max_length)"
            )
        table = self.embeddings.tok_embeddings.weight
        rows = batch_rows(input_ids, attention_mask, shape_multiple(table))
        rows.output_attentions = output_attentions
        ids = input_ids.flatten() if rows.index is None else input_ids.flatten()[rows.index]
        x = self.embeddings(ids)  # (n, H)
        ropes = {}
        for kind in set(c.layer_types):
            cos, sin = rotary_tables(
                rows.positions, c.head_dim, c.rope_parameters[kind]["rope_theta"]
            )
            ropes[kind] = (cos[:, None], sin[:, None])  # (n, 1, hs): broadcast over heads
        h, attentions = x, []
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            next_norm = self.final_norm if last else self.layers[i + 1].attn_norm
            sparse = last and at is not None and not output_attentions
            picked = rows.rows_of(at) if sparse else None
            x, h, probs = layer(x, h, rows, ropes[layer.attention_type], next_norm, picked)
            attentions.append(probs)
        if at is not None and output_attentions:
            h = h[rows.rows_of(at)]
        return h, rows, tuple(attentions) if output_attentions else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        output_attentions: bool = False,
        token_type_ids: Tensor | None = None,
        skip_padding: bool = True,
    ) -> BertModelOutput:
        """``last_hidden_state`` (B, T, H): zero at padding (transformers' values there mean
        nothing); no pooler (``pooler_output`` None). ``skip_padding`` is BERT's option,
        always on here."""
        h, rows, attentions = self.encode(input_ids, attention_mask, output_attentions)
        return BertModelOutput(rows.to_grid(h), None, attentions)


# ---- heads -------------------------------------------------------------------------------------
class ModernBertPredictionHead(nn.Module):
    """dense -> activation -> LayerNorm: before the MLM decoder and every task classifier."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.dense = nn.Linear(H, H, bias=config.classifier_bias)
        self.act = config.classifier_activation
        self.norm = layer_norm(config)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(activation(self.act, self.dense(x)))


def masked_positions(labels: Tensor, masked_rows: Tensor | None) -> Tensor:
    """Flat grid positions of the labelled tokens (``masked_rows`` when the caller found them)."""
    if masked_rows is not None:
        return masked_rows
    return (labels.flatten() != IGNORE_INDEX).nonzero().squeeze(1)


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """Encoder + head + the tied decoder (with a bias): pretraining and fill-mask."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight  # tied, as in HF
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        masked_rows: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        cls_head: bool = False,
    ) -> MaskedLMOutput:
        """Without labels: (B, T, V) logits. With labels (-100 where no target): the head and
        decoder at the labelled positions only, logits (n_masked, V) in row-major order, the
        loss their mean cross-entropy. ``cls_head``: also the head at each [CLS]
        (``cls_head_output``, (B, H)): the module a classifier inherits, so what pretraining
        teaches it there carries into fine-tuning (``--train.similarity_weight``)."""
        B, T = input_ids.shape
        first = torch.arange(B, device=input_ids.device) * T  # each sequence's position 0
        weight, bias = self.decoder.weight, self.decoder.bias
        if bias is None:
            bias = weight.new_zeros(weight.shape[0])
        if labels is None:
            h, rows, attentions = self.model.encode(input_ids, attention_mask, output_attentions)
            cls = self.head(h[rows.rows_of(first)]) if cls_head else None  # (B, H)
            logits = decoder_logits(self.head(rows.to_grid(h)), weight, bias)  # (B, T, V)
            return MaskedLMOutput(None, logits, attentions, cls)
        flat = masked_positions(labels, masked_rows)  # (n,)
        n = flat.numel()
        extra = round_up(n, shape_multiple(weight)) - n
        target = labels.flatten()[flat]
        if extra:  # a count that repeats (bf16 on a CPU): position 0 again, its logits dropped
            flat = torch.cat([flat, flat.new_zeros(extra)])
            target = torch.cat([target, target.new_full((extra,), IGNORE_INDEX)])
        # the last layer at the labelled positions only (and each [CLS] for cls_head, after them)
        at = torch.cat([flat, first]) if cls_head else flat
        h, rows, attentions = self.model.encode(input_ids, attention_mask, output_attentions, at)
        cls = self.head(h[n + extra :]) if cls_head else None  # (B, H)
        x = self.head(h[: n + extra])  # (n', H)
        if extra or n == 0:
            logits = decoder_logits(x, weight, bias)
            loss = F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX)
        else:
            loss, logits = decoder_cross_entropy(x, weight, bias, target)
        return MaskedLMOutput(loss, logits[:n], attentions, cls)


class ModernBertForSequenceClassification(ModernBertPreTrainedModel):
    """Encoder, pooling (``cls``: the first token; ``mean``: the real tokens' mean), head,
    dropout, ``classifier``: classification (CE) or regression (MSE)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def pool(self, h: Tensor, rows: Rows) -> Tensor:
        """(B, H) from the (n, H) rows, as ``classifier_pooling`` says."""
        B, T = rows.B, rows.T
        if self.config.classifier_pooling == "cls":
            first = torch.arange(B, device=h.device) * T  # each sequence's position 0
            return h[rows.rows_of(first)]
        seq = rows.sequence_of_rows()  # (N,)
        x = h[: rows.real]
        if rows.index is None and rows.keys is not None:  # compiled: the grid, padding too
            x = x * rows.keys.reshape(-1, 1).to(x.dtype)
            counts = rows.keys.sum(1).clamp(min=1).to(h.dtype)
        else:
            counts = torch.bincount(seq, minlength=B).clamp(min=1).to(h.dtype)
        sums = h.new_zeros(B, h.shape[1]).index_add_(0, seq, x)
        return sums / counts[:, None]

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        token_type_ids: Tensor | None = None,
        cls_only: bool | None = None,
    ) -> SequenceClassifierOutput:
        """``cls_only`` (BERT's option; by default when labels are given): return no hidden
        states, only the logits."""
        h, rows, attentions = self.model.encode(input_ids, attention_mask, output_attentions)
        pooled = self.head(self.pool(h, rows))  # (B, H)
        p = self.config.classifier_dropout
        logits = self.classifier(dropout(pooled, p, self.training))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.config.is_regression:
                loss = F.mse_loss(logits.float().squeeze(-1), labels.float().view(-1))
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        cls_only = labels is not None if cls_only is None else cls_only
        hidden = None if cls_only else rows.to_grid(h)
        return SequenceClassifierOutput(loss, logits, hidden, attentions)


class ModernBertForTokenClassification(ModernBertPreTrainedModel):
    """Encoder, head, dropout and ``classifier`` on every token: a tag per token; training
    (labels given) runs the head at the labelled positions only (``labelled_only``)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        labelled_only: bool | None = None,
        token_type_ids: Tensor | None = None,
    ) -> TokenClassifierOutput:
        """Logits (B, T, C), or (n_labelled, C) in row-major order with ``labelled_only``."""
        labelled_only = labels is not None if labelled_only is None else labelled_only
        if labelled_only and labels is None:
            raise ValueError("labelled_only needs labels")
        h, rows, attentions = self.model.encode(input_ids, attention_mask, output_attentions)
        p = self.config.classifier_dropout
        if labelled_only:
            flat = masked_positions(labels, None)  # type: ignore[arg-type]
            x = h[rows.rows_of(flat)]  # (n, H)
        else:
            x = rows.to_grid(h)  # (B, T, H)
        logits = self.classifier(dropout(self.head(x), p, self.training))
        loss = None
        if labels is not None:
            target = labels.flatten()[flat] if labelled_only else labels.flatten()
            flat_logits = logits.float().reshape(-1, self.num_labels)
            loss = F.cross_entropy(flat_logits, target, ignore_index=IGNORE_INDEX)
        return TokenClassifierOutput(loss, logits, attentions)


class ModernBertForQuestionAnswering(ModernBertPreTrainedModel):
    """Encoder, head, dropout and a two-output ``classifier``: each token's start and end
    score (extractive QA, transformers' layout)."""

    def __init__(self, config: ModernBertConfig) -> None:
        if config.num_labels != 2:  # transformers' classifier has num_labels outputs: 2 here
            config = dataclasses.replace(config, num_labels=2, id2label=None)
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool = False,
        token_type_ids: Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        """With ``start_positions`` / ``end_positions`` (B,) the loss is the mean of the two
        cross-entropies, padding masked out of the softmax (as our BERT's; transformers'
        leaves padding in)."""
        h, rows, attentions = self.model.encode(input_ids, attention_mask, output_attentions)
        p = self.config.classifier_dropout
        hidden = rows.to_grid(h)  # (B, T, H)
        logits = self.classifier(dropout(self.head(hidden), p, self.training))  # (B, T, 2)
        start, end = logits.float().unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            if attention_mask is not None:
                padding = attention_mask == 0
                start = start.masked_fill(padding, torch.finfo(start.dtype).min)
                end = end.masked_fill(padding, torch.finfo(end.dtype).min)
            loss = (
                F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)
            ) / 2
        return QuestionAnsweringOutput(loss, start, end, hidden, attentions)


__all__ = [
    "ModernBertModel",
    "ModernBertPreTrainedModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertForQuestionAnswering",
    "Rows",
    "batch_rows",
    "rotary_tables",
    "rotate",
]
