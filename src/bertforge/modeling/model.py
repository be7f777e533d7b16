"""BERT, read top to bottom: embeddings, attention, layer, encoder, pooler, heads, task models.

Module and parameter names equal Hugging Face's ``modeling_bert`` so that a state dict moves
between the two with no renaming table (``LayerNorm`` keeps its capital letters for that reason).
The computation is the original post-LN BERT. What differs from a literal transcription is
for speed only and never changes the function (``tests/test_fast_paths.py`` checks each):

* attention goes through ``F.scaled_dot_product_attention`` (fused kernels), and q, k and v come
  from one GEMM;
* when MLM labels are given, the prediction head runs only on the masked positions ("sparse
  prediction", as NVIDIA's BERT and Cramming do) and the last layer computes its queries,
  attention and the rest only at those rows (and [CLS]), keys and values everywhere: the loss
  is identical, the 30k-wide decoder does ~15% of the work;
* task models skip the padding: projections, feed-forward, LayerNorm and dropout run on the real
  tokens only, attention alone on the (B, T) grid (``skip_padding``); the token classifier,
  training, runs its last layer and head at the labelled positions only (a word's first piece),
  as the MLM head does at the masked ones (``labelled_only``);
* dropout, the MLM cross-entropy, and in fp32 training the block ends (bias + dropout +
  residual + LayerNorm), attention's softmax + dropout and the feed-forward's bias + GELU use
  the fused CPU forms of ``bertforge.modeling.ops`` (C kernels when a compiler is at hand), and
  the tied decoder's weight gradient comes out contiguous;
* sums go into buffers nobody else holds (in CPU training the word table's gradient too: a
  reused zeroed buffer, not a fresh 30k x H one a step), and in inference (no autograd) the
  residual stream and the activations are updated in place: fewer new tensors, whose first
  touch costs page faults.
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
from bertforge.modeling.config import BertConfig
from bertforge.modeling.ops import (
    Dropout,
    activation,
    attention,
    autograd_free,
    decoder_cross_entropy,
    decoder_logits,
    dense_activation,
    dense_dropout_norm,
    dropout,
    linear,
    onednn_inference,
    onednn_linear,
    query_attention,
    query_slots,
    repad,
    round_up,
    shape_multiple,
    unpad,
    unpadded_index,
    word_embedding,
)

IGNORE_INDEX = -100


# ---- outputs ----------------------------------------------------------------------------------
@dataclass
class BertModelOutput:
    last_hidden_state: Tensor
    """(B, T, H) hidden state of the last layer."""
    pooler_output: Tensor | None
    """(B, H) tanh(dense([CLS])), or None for a model built without a pooler."""
    attentions: tuple[Tensor, ...] | None = None
    """Per layer (B, nh, T, T) attention probabilities, when ``output_attentions=True``."""


@dataclass
class PreTrainingOutput:
    loss: Tensor | None
    """MLM loss + NSP loss (each when its labels are given)."""
    prediction_logits: Tensor
    """(B, T, V) without labels; (n_masked, V) for the positions with labels != -100 when given."""
    seq_relationship_logits: Tensor
    """(B, 2) next-sentence logits: 0 = IsNext, 1 = NotNext."""
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None
    attentions: tuple[Tensor, ...] | None = None
    pooler_output: Tensor | None = None
    """(B, H) the pooler's output, which the next-sentence head and a classifier read."""


@dataclass
class MaskedLMOutput:
    loss: Tensor | None
    logits: Tensor
    """(B, T, V) without labels; (n_masked, V) for the labelled positions when labels are given."""
    attentions: tuple[Tensor, ...] | None = None
    cls_head_output: Tensor | None = None
    """(B, H) the head at each sequence's [CLS], when asked (ModernBERT's ``cls_head``: the
    pair-similarity loss reads it); None otherwise."""


@dataclass
class ReplacedTokenDetectionOutput:
    loss: Tensor | None
    """Generator MLM loss + ``rtd_weight`` x discriminator loss (when labels are given)."""
    prediction_logits: Tensor
    """The generator's (n_masked, V) logits at the labelled positions."""
    rtd_logits: Tensor | None = None
    """(B, T) discriminator logits: > 0 = "this token was replaced"."""
    mlm_loss: Tensor | None = None
    """The generator's mean cross-entropy per masked token."""
    rtd_loss: Tensor | None = None
    """The discriminator's mean binary cross-entropy per real token."""
    rtd_correct: Tensor | None = None
    """Real tokens the discriminator classified right (replaced or not)."""
    rtd_tokens: Tensor | None = None
    """Real tokens the discriminator scored."""
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class SequenceClassifierOutput:
    loss: Tensor | None
    logits: Tensor
    """(B, num_labels); for regression (B, 1)."""
    hidden_states: Tensor | None = None
    """(B, T, H) last hidden state; None when labels are given (the last layer ran on [CLS])."""
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class TokenClassifierOutput:
    loss: Tensor | None
    logits: Tensor
    """(B, T, num_labels); (n_labelled, num_labels) at the labelled positions with
    ``labelled_only``."""
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class QuestionAnsweringOutput:
    loss: Tensor | None
    """Mean of the start and end cross-entropies (transformers' definition)."""
    start_logits: Tensor
    """(B, T) score of each position as the answer's first token."""
    end_logits: Tensor
    """(B, T) score of each position as the answer's last token."""
    hidden_states: Tensor | None = None
    """(B, T, H) last hidden state (zero at padding: the padding is skipped)."""
    attentions: tuple[Tensor, ...] | None = None


# ---- the encoder ------------------------------------------------------------------------------
@dataclass
class Layout:
    """Where the tokens of a batch sit: what every layer needs to know besides the hidden states."""

    B: int
    T: int
    mask: Tensor | None
    """(B, 1, 1, T) True at real tokens, or None when nothing is padded."""
    index: Tensor | None = None
    """(N',) flat positions of the real tokens when the padding is skipped: states are (N', H);
    N' may exceed the N real tokens by some padding positions (rounded up: ``unpadded_index``)."""
    output_attentions: bool = False
    real: int = 0
    """N, the real tokens (the first N of ``index``) when the padding is skipped."""


class WordEmbeddings(nn.Embedding):
    """``nn.Embedding`` (same parameter, same function, its hooks still called) whose gradient in
    CPU training goes into a reused zeroed buffer (:func:`~bertforge.modeling.ops.word_embedding`)
    instead of a fresh vocabulary x hidden tensor a step."""

    def forward(self, input_ids: Tensor) -> Tensor:
        return word_embedding(input_ids, self.weight, self.padding_idx)[0]


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.word_embeddings = WordEmbeddings(config.vocab_size, H, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, H)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None, words: Tensor | None = None
    ) -> Tensor:
        """``words``: the (B, T, H) word vectors of ``input_ids`` when the caller looked them up
        (a tensor of its own: the sums below go into it in place)."""
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids) if words is None else words  # (B, T, H), a new tensor
        x += self.position_embeddings.weight[:T]
        if token_type_ids is None:
            x += self.token_type_embeddings.weight[0]
        else:
            x += self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: Tensor, layout: Layout) -> tuple[Tensor, Tensor | None]:
        """``x`` is (B, T, H), or (N, H) real tokens only when ``layout.index`` is set; the output
        has the layout of ``x``. Returns the attention probabilities when asked for them."""
        H, nh, hs = x.shape[-1], self.num_heads, self.head_dim
        # One GEMM for q, k and v (the parameters stay three Linears so checkpoint keys match HF);
        # for a few tokens (one sentence) copying the 3 weights would cost more than it saves.
        if x.numel() >= H * H:
            w = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
            b = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3H,)
            qkv = linear(x, w, b, "attention.qkv")  # (B, T, 3H) or (N, 3H)
        else:
            qkv = torch.cat([self.query(x), self.key(x), self.value(x)], -1)  # (B, T, 3H)
        B, T, mask = layout.B, layout.T, layout.mask
        if layout.index is not None:  # attention needs the (B, T) grid back
            qkv = repad(qkv, layout.index, B, T)  # (B, T, 3H)
        p = self.dropout_p if self.training else 0.0
        probs = None
        if p > 0 and x.device.type == "cpu" and not layout.output_attentions:
            # SDPA has no fused CPU kernel with dropout: the explicit form, fused where it can be
            y = attention(qkv, nh, mask, p, self.training)  # (B, T, H)
        else:
            q, k, v = qkv.view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs)
            if layout.output_attentions:
                scores = (q / math.sqrt(hs)) @ k.transpose(-2, -1)  # (B, nh, T, T)
                if mask is not None:
                    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
                probs = scores.softmax(-1)
                y = dropout(probs, p, self.training) @ v  # (B, nh, T, hs)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            y = y.transpose(1, 2).reshape(B, T, H)  # (B, T, H)
        return (y if layout.index is None else unpad(y, layout.index)), probs

    def forward_rows(self, x: Tensor, layout: Layout, rows: Tensor) -> Tensor:
        """The attention output at ``rows`` only (flat positions of ``x``'s rows): (n_rows, H).
        Keys and values are computed at every token, queries and their attention only at the
        rows; each sequence's queries sit in a (B, R, H) block, R its largest count of rows.
        Equals ``forward(x, layout)[0]`` at those rows."""
        H, nh = x.shape[-1], self.num_heads
        B, T, mask = layout.B, layout.T, layout.mask
        w = torch.cat([self.key.weight, self.value.weight])  # (2H, H)
        b = torch.cat([self.key.bias, self.value.bias])  # (2H,)
        kv = linear(x, w, b, "attention.kv")  # (B, T, 2H) or (N, 2H)
        flat = x.reshape(-1, H)
        q = self.query(flat[rows])  # (n, H)
        grid = rows if layout.index is None else layout.index[rows]  # positions in (B, T)
        if layout.index is not None:
            kv = repad(kv, layout.index, B, T)  # (B, T, 2H)
        seq = torch.div(grid, T, rounding_mode="floor")  # (n,) the sequence of each row
        slot, R = query_slots(seq, T, x)  # each row's place in its sequence's (R, H) block
        queries = q.new_zeros(B, R, H).index_put((seq, slot), q)  # (B, R, H)
        y = query_attention(queries, kv.view(B, T, 2 * H), nh, mask, self.dropout_p, self.training)
        return y[seq, slot]  # (n, H)


class BertOutput(nn.Module):
    """Projection back to the hidden size, dropout, residual add and post-LN: closes both the
    attention block (``attention.output``) and the feed-forward block (``output``)."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: Tensor, residual: Tensor) -> Tensor:
        """``y`` (.., in_features), ``residual`` (.., H). In inference the residual's buffer is
        reused for the result (callers pass a residual they no longer need), or oneDNN adds the
        residual in the product's call (:func:`~bertforge.modeling.ops.onednn_inference`)."""
        w, b = self.dense.weight, self.dense.bias
        if not self.training and onednn_inference(y, w, b, residual):
            return self.LayerNorm(onednn_linear(y, w, b, add=residual))  # one oneDNN call
        if not self.training and autograd_free(y, residual, w) and residual.is_contiguous():
            # bias and product accumulate into the residual: one GEMM, no new (.., H) tensor
            out = residual.add_(b).view(-1, w.shape[0]).addmm_(y.reshape(-1, w.shape[1]), w.t())
            return self.LayerNorm(out.view_as(residual))
        return dense_dropout_norm(
            y, self.dense, residual, self.LayerNorm, self.dropout.p, self.training
        )


class BertAttention(nn.Module):
    """The heads (``self``) and their output block, named as in HF; ``BertLayer`` runs both."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertOutput(config, config.hidden_size)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = config.hidden_act

    def forward(self, x: Tensor) -> Tensor:
        return dense_activation(x, self.dense, self.act)  # (.., intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config, config.intermediate_size)

    def forward(
        self, x: Tensor, layout: Layout, rows: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``rows``: flat positions of the only outputs wanted; the result is then (n_rows, H)."""
        if rows is not None and not layout.output_attentions:
            # k and v are needed at every token, queries and the rest only at the rows
            y, probs = self.attention.self.forward_rows(x, layout, rows), None  # (n, H)
        else:
            y, probs = self.attention.self(x, layout)
            if rows is not None:
                y = y.reshape(-1, y.shape[-1])[rows]  # (n, H)
        if rows is not None:
            x = x.reshape(-1, x.shape[-1])[rows]  # (n, H)
        x = self.attention.output(y, x)
        return self.output(self.intermediate(x), x), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self, x: Tensor, layout: Layout, rows: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """``rows``: compute the last layer's output at these flat positions only (see BertModel)."""
        attentions = []
        for i, layer in enumerate(self.layer):
            x, probs = layer(x, layout, rows if i == len(self.layer) - 1 else None)
            attentions.append(probs)
        return x, tuple(attentions) if layout.output_attentions else None


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, H) from [CLS]


# ---- shared base: initialisation and checkpoints -----------------------------------------------
def sinusoidal_positions(num_positions: int, dim: int, std: float) -> Tensor:
    """(num_positions, dim) sines and cosines of the Transformer (Vaswani et al. 2017; wavelengths
    2 pi to 10,000 x 2 pi, sines in the first half of the columns, cosines in the second), scaled
    to standard deviation ``std``. Neighbouring positions start with similar vectors and their
    similarity depends only on the distance, where a normal(0, std) table starts every position
    unrelated to every other."""
    half = dim // 2
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    frequency = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float64) / half)
    angle = position * frequency  # (P, half)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, :half], table[:, half : 2 * half] = angle.sin(), angle.cos()
    return (table * std * math.sqrt(2.0)).float()  # sin^2 and cos^2 average 1/2


def cooccurrence_vectors(
    counts: Tensor, dim: int, std: float, alpha: float = 0.75, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Word vectors from a (words, contexts) co-occurrence count matrix, as in Levy, Goldberg &
    Dagan 2015: positive pointwise mutual information with the context distribution smoothed
    by ``alpha``, its rank-``dim`` truncated SVD (randomised, seeded), vectors U sqrt(S), centred
    and scaled to standard deviation ``std``. Returns the (words, k) vectors, k = min(dim,
    words, contexts), and a bool (words,) mask of the rows that had any count (the others are
    zero and should keep their initialisation)."""
    row = counts.sum(1, dtype=torch.float64)
    context = counts.sum(0, dtype=torch.float64) ** alpha
    total = row.sum()
    log_row = (row / total).clamp_min(1e-300).log().float()
    log_context = (context / context.sum()).clamp_min(1e-300).log().float()
    # PMI = log p(w, c) - log p(w) - log p_alpha(c), in place: one matrix of memory, not five
    ppmi = counts.float().clone().div_(total.item()).log_()  # log 0 = -inf: clamped to 0 below
    ppmi.sub_(log_row[:, None]).sub_(log_context[None, :]).clamp_(min=0.0)
    k = min(dim, *ppmi.shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        u, s, _ = torch.svd_lowrank(ppmi, q=k, niter=4)
    vectors = (u * s.sqrt()).double()
    seen = row > 0
    vectors = torch.where(seen[:, None], vectors - vectors[seen].mean(0), 0.0)
    scale = vectors[seen].pow(2).mean().sqrt()
    return (vectors * (std / scale.clamp_min(1e-30))).float(), seen


class BertPreTrainedModel(nn.Module):
    """Base of every model: BERT's initialisation, ``from_pretrained`` and ``save_pretrained``."""

    #: prefix of the encoder inside this model's state dict ("" for BertModel, "bert." otherwise)
    base_prefix = "bert."
    #: the word table under the encoder (the tied MLM decoder shares it)
    word_table = "embeddings.word_embeddings"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        """BERT's initialisation: normal(0, initializer_range) weights, zero biases, unit LNs."""
        std = self.config.initializer_range
        for name, module in self.named_modules():
            if name.endswith("predictions.decoder"):
                continue  # its weight *is* the word-embedding matrix (with its zero [PAD] row)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
            has_bias = isinstance(module, (nn.Linear, nn.LayerNorm, BertLMPredictionHead))
            if has_bias and module.bias is not None:
                nn.init.zeros_(module.bias)

    def init_sinusoidal_positions(self, std: float | None = None) -> None:
        """Replace the position table's random start by :func:`sinusoidal_positions` of standard
        deviation ``std`` (default BERT's ``initializer_range``; ``--train.position_init
        sinusoidal``, ``--train.position_init_std``); the table still trains."""
        table = self.get_submodule(self.base_prefix + "embeddings.position_embeddings").weight
        std = self.config.initializer_range if std is None else std
        with torch.no_grad():
            table.copy_(sinusoidal_positions(*table.shape, std))

    def init_segment_embeddings(self, std: float) -> None:
        """Redraw the segment (token type) table from normal(0, ``std``) instead of BERT's
        ``initializer_range`` (``--train.segment_init_std``): next to word and position vectors
        of std 0.2, segments at 0.02 are 1% of the embedding sum's variance, and a model that
        must compare segment A with segment B (NSP) starts barely able to tell them apart. The
        table still trains."""
        table = self.get_submodule(self.base_prefix + "embeddings.token_type_embeddings").weight
        with torch.no_grad():
            table.normal_(0.0, std)

    def init_special_embeddings(self, ids: list[int], std: float) -> None:
        """Redraw the word-embedding rows of ``ids`` (the special tokens: [CLS], [SEP], [MASK],
        [UNK]; never [PAD], whose row stays zero) from normal(0, ``std``) instead of BERT's
        ``initializer_range`` (``--train.special_init_std``): next to co-occurrence word vectors
        of std 0.2, a [CLS] or [SEP] at 0.02 is 1% of its embedding sum's variance and starts
        as nothing but its position and segment. The rows still train."""
        table = self.get_submodule(self.base_prefix + "embeddings.word_embeddings").weight
        rows = [i for i in ids if i != self.config.pad_token_id]
        with torch.no_grad():
            table[rows] = torch.randn(len(rows), table.shape[1]).to(table) * std

    def init_identity_attention(self) -> None:
        """Add the identity to every layer's value and attention-output weights (BERT draws both
        from normal(0, ``initializer_range``); ``--train.attention_init identity``). At the
        start the query and key weights are small, so attention is nearly uniform, and each
        token's attention output is then about the mean of its sequence's embeddings: from step
        0 every token, [CLS] among them, sees the sequence's bag of words (with word vectors
        that mean something, e.g. ``--train.word_init cooccurrence``), as in word2vec's CBOW.
        The weights still train; the model stays a standard BERT."""
        layers = self.get_submodule(self.base_prefix + "encoder.layer")
        with torch.no_grad():
            for layer in layers:
                for linear in (layer.attention.self.value, layer.attention.output.dense):
                    linear.weight.diagonal().add_(1.0)  # in place: any device or dtype

    @classmethod
    def from_pretrained(cls, directory: str | Path, **config_overrides: Any) -> Any:
        """Load our or an HF BERT directory (config.json + model.safetensors) into this class.

        Heads the checkpoint lacks (e.g. a classifier on a pretrained encoder) keep their fresh
        initialisation; keyword arguments set config fields (``num_labels=3``,
        ``id2label={...}``). The model comes back in eval mode, as in transformers (call
        ``.train()`` to train it).
        """
        return load_pretrained(cls, directory, **config_overrides)

    def save_pretrained(
        self,
        directory: str | Path,
        tokenizer: Any = None,
        extra_tensors: dict[str, Tensor] | None = None,
        dtype: torch.dtype | None = None,
    ) -> Path:
        """Write config.json + model.safetensors (+ tokenizer files) atomically into ``directory``
        (``extra_tensors``: more weights to store beside the model's own; ``dtype``: the
        floating-point weights stored, default as in memory)."""
        return save_pretrained(
            self, directory, tokenizer=tokenizer, extra_tensors=extra_tensors, dtype=dtype
        )


class BertModel(BertPreTrainedModel):
    """The encoder: embeddings, ``num_hidden_layers`` transformer layers and the pooler."""

    base_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_attentions: bool = False,
        skip_padding: bool = False,
        rows: Tensor | None = None,
        words: Tensor | None = None,
    ) -> BertModelOutput:
        """``skip_padding`` runs every token-wise op on the real tokens only (faster on padded
        batches, same values at real tokens); hidden states at [PAD] positions are then zero,
        not HF's (meaningless) values there. Ignored with ``output_attentions``.

        ``rows`` (flat positions in the (B, T) grid, e.g. the masked tokens) asks for the last
        hidden state there only: the last layer then skips its attention output and feed-forward
        elsewhere and ``last_hidden_state`` is (n_rows, H); the pooler still sees every [CLS].

        ``words``: the (B, T, H) word vectors of ``input_ids``, looked up by the caller (a tensor
        of its own, written in place; ``masked_lm`` passes them with its tied decoder's weight).
        """
        B, T = input_ids.shape
        if self.config.max_position_embeddings < T:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; truncate the input (max_length)"
            )
        x = self.embeddings(input_ids, token_type_ids, words)  # (B, T, H)
        layout = Layout(B, T, None, None, output_attentions)
        if attention_mask is not None and has_padding(attention_mask):  # else SDPA's fastest
            layout.mask = attention_mask.to(x.device, torch.bool)[:, None, None, :]  # (B,1,1,T)
        if rows is not None and self.pooler is not None:  # append every [CLS] for the pooler
            rows = torch.cat([rows, torch.arange(B, device=rows.device) * T])  # (n + B,)
        # compiled, the padding stays (attention masks it): the real tokens' count changes every
        # batch, and shapes that stay put are what a compiled graph needs (one graph, no
        # recompiling, no wait for the device at ``nonzero``)
        unpadding = skip_padding and not output_attentions and not torch.compiler.is_compiling()
        if layout.mask is not None and unpadding:
            real = attention_mask.flatten()
            # the real tokens first, then padding up to a count that repeats (bf16 on a CPU)
            layout.index, layout.real = unpadded_index(real, shape_multiple(x))  # (N',)
            x = unpad(x, layout.index)  # (N', H)
            if rows is not None:  # the same positions, counted among the real tokens
                rows = (real.cumsum(0) - 1)[rows]
        x, attentions = self.encoder(x, layout, rows)
        if rows is None and layout.index is not None:
            n = layout.real  # the rows past it sit at padding positions: left zero
            x = repad(x[:n], layout.index[:n], B, T)  # (B, T, H)
        if self.pooler is None:
            return BertModelOutput(x, None, attentions)
        if rows is None:
            return BertModelOutput(x, self.pooler(x), attentions)
        n = x.shape[0] - B
        return BertModelOutput(x[:n], self.pooler(x[n:, None]), attentions)  # pooler: (B, 1, H)


def has_padding(attention_mask: Tensor) -> bool:
    """Whether ``attention_mask`` hides any position. Without padding the model passes no mask
    to attention, and SDPA may run its flash kernel. Deciding that reads the mask, a wait for
    the device outside the CPU, and a graph break under ``torch.compile``: a compiled graph
    keeps the mask (correct either way), and the training loops decide it on the host, passing
    ``attention_mask=None`` for a batch without padding."""
    if torch.compiler.is_compiling():
        return True
    return not bool(attention_mask.all())


# ---- heads -------------------------------------------------------------------------------------
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = config.hidden_act
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(activation(self.act, self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Transform, then a decoder whose weight is the word-embedding matrix (tied) plus a bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # tied as in HF: the state dict shows both names, safetensors stores each tensor once
        self.decoder.weight = word_embeddings.weight
        self.decoder.bias = self.bias

    def forward(self, x: Tensor, weight: Tensor | None = None) -> Tensor:
        """``weight``: the decoder's (tied) weight as the caller's word lookup returned it
        (:func:`~bertforge.modeling.ops.word_embedding`); default ``decoder.weight``."""
        weight = self.decoder.weight if weight is None else weight
        return decoder_logits(self.transform(x), weight, self.bias)

    def loss(
        self, x: Tensor, target: Tensor, weight: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(mean cross-entropy against ``target``, the (n', V) logits) of (n', H) rows ``x``:
        ``cross_entropy(self(x, weight), target)``, the decoder and the loss fused in training
        (:func:`~bertforge.modeling.ops.decoder_cross_entropy`). Rows past the n targets (a
        count rounded up) are computed and take no part in the loss."""
        weight = self.decoder.weight if weight is None else weight
        return decoder_cross_entropy(self.transform(x), weight, self.bias, target)


class BertOnlyMLMHead(nn.Module):
    """The MLM head under HF's name (``cls.predictions``)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)


class BertPreTrainingHeads(BertOnlyMLMHead):
    """The MLM head plus the next-sentence classifier (``cls.seq_relationship``)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertDiscriminatorHead(nn.Module):
    """ELECTRA's replaced-token head: dense, activation, then one logit per token."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = config.hidden_act
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.dense_prediction(activation(self.act, self.dense(x))).squeeze(-1)


# ---- task models -------------------------------------------------------------------------------
def masked_lm(
    model: BertForPreTraining | BertForMaskedLM,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    labels: Tensor | None,
    output_attentions: bool,
    masked_rows: Tensor | None = None,
) -> tuple[BertModelOutput, Tensor, Tensor | None]:
    """Encoder + MLM head: (encoder output, logits, loss). Without labels the logits are dense
    (B, T, V). With labels the padding is skipped, the last layer and the head run on the labelled
    positions only (row-major order: logits (n_masked, V)) and the loss is their mean CE.
    ``masked_rows``, when given, are those positions (``(labels.flatten() != -100).nonzero()``,
    found on the host by the training loop): on a GPU, finding them here is a wait for the
    device in the middle of the forward pass. In bf16 on a CPU those rows are rounded up to a
    multiple of 64 with [CLS] rows, whose logits are dropped: oneDNN then reuses a few kernels
    instead of building (and keeping) new ones for every step's masked count
    (docs/memory.md); the encoder output keeps the extra rows. Under ``torch.compile`` the
    padding is not skipped and ``masked_rows`` may end in rows whose label is -100, added by the
    loop to keep the count the same every step (``data.loader.static_masked_rows``); the loss
    ignores them, and the logits keep them."""
    if labels is None:
        rows = None
    elif masked_rows is not None:
        rows = masked_rows
    else:
        rows = (labels.flatten() != IGNORE_INDEX).nonzero().squeeze(1)
    sparse = labels is not None
    n = 0 if rows is None else rows.numel()
    table = model.bert.embeddings.word_embeddings
    extra = 0 if rows is None else round_up(n, shape_multiple(table.weight)) - n
    if extra:  # a count that repeats (bf16 on a CPU): [CLS] rows, computed and never read
        B, T = input_ids.shape
        cls = torch.arange(extra, device=rows.device) % B * T  # (extra,)
        rows = torch.cat([rows, cls])  # (n + extra,)
    words, weight = None, None
    if sparse and model.cls.predictions.decoder.weight is table.weight:  # tied, as always built
        # the decoder's weight gradient and the lookup's then sum in one buffer (CPU training)
        words, weight = word_embedding(input_ids, table.weight, table.padding_idx)
    args = (input_ids, attention_mask, token_type_ids, output_attentions, sparse, rows, words)
    out = model.bert(*args)
    if rows is None:
        return out, model.cls.predictions(out.last_hidden_state, weight), None
    if torch.compiler.is_compiling():
        # compiled, ``masked_rows`` may end in unlabelled rows the training loop added so that their
        # count stays put (``static_masked_rows``): their -100 targets take no part in the mean
        target = labels.flatten()[rows]
        logits = model.cls.predictions(out.last_hidden_state, weight)
        loss = F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX)
        return out, logits, loss
    target = labels.flatten()[rows[:n]]  # (n,): the extra rows' logits take no part
    loss, logits = model.cls.predictions.loss(out.last_hidden_state, target, weight)
    return out, logits[:n], loss


class BertForPreTraining(BertPreTrainedModel):
    """BERT's pretraining model: encoder + MLM head (tied decoder) + next-sentence head."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        output_attentions: bool = False,
        masked_rows: Tensor | None = None,
    ) -> PreTrainingOutput:
        args = (input_ids, attention_mask, token_type_ids, labels, output_attentions, masked_rows)
        out, logits, mlm_loss = masked_lm(self, *args)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        nsp_loss = None
        # eager: no pair labelled -> no loss (not a 0/0 NaN). Compiled, that test would break
        # the graph (a read of the device): the caller passes labels only when some pair has
        # one, as the training loop does
        labelled = next_sentence_label is not None and (
            torch.compiler.is_compiling() or bool((next_sentence_label >= 0).any())
        )
        if labelled:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label, ignore_index=-1)
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(losses[1:], losses[0]) if losses else None
        return PreTrainingOutput(
            loss, logits, nsp_logits, mlm_loss, nsp_loss, out.attentions, out.pooler_output
        )


def contrastive_loss(
    features: Tensor, partner: Tensor, temperature: float
) -> tuple[Tensor | None, Tensor]:
    """InfoNCE over a batch (SimCSE's and Contriever's form): each row with a partner must pick
    it out, by cosine similarity / ``temperature``, among every other row of the batch.

    ``features`` (B, H); ``partner`` (B,) the index of each row's positive, -1 for rows that are
    only negatives. Returns (mean cross-entropy over the rows with a partner, or None without
    any; the number of those rows that ranked their partner first)."""
    rows = (partner >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return None, features.new_zeros((), dtype=torch.long)
    z = F.normalize(features.float(), dim=-1)
    sim = (z[rows] @ z.t()) / temperature  # (n, B)
    sim[torch.arange(rows.numel(), device=sim.device), rows] = float("-inf")  # not itself
    target = partner[rows]
    return F.cross_entropy(sim, target), (sim.argmax(-1) == target).sum()


def weighted_bags(tokens: Tensor, token_weights: Tensor) -> Tensor:
    """Each row's weighted bag of words, (B, V): the sum of ``token_weights`` (V,) over the row's
    token ids in ``tokens`` (B, T), where -1 counts nothing."""
    counted = tokens >= 0
    ids = tokens.clamp(min=0)
    weights = token_weights.to(torch.float32)[ids] * counted
    bags = torch.zeros(
        tokens.size(0), token_weights.numel(), dtype=torch.float32, device=tokens.device
    )
    return bags.scatter_add_(1, ids, weights)


def bag_of_words_loss(
    features: Tensor,
    word_embeddings: Tensor,
    tokens: Tensor,
    token_weights: Tensor,
    shared_with: Tensor | None = None,
) -> Tensor | None:
    """Paragraph-vector (PV-DBOW) loss on a pooled feature: each row's feature, read through the
    word embeddings as a softmax over the vocabulary, must predict the words of its own text.

    ``features`` (B, H); ``word_embeddings`` (V, H); ``tokens`` (B, T) each row's token ids, -1
    where nothing is counted; ``token_weights`` (V,) how much each word counts (0 for special
    tokens, less than 1 for frequent ones). The target of a row is its weighted bag of words,
    normalised to sum to 1; the loss is the cross-entropy against it, averaged over the rows that
    have any weight (None when none has). With ``shared_with`` (B, T'), other token ids per row
    (a pair's second segment, ``tokens`` then its first), the bag is the words the two have in
    common: each word's weighted count in the one or the other, whichever is smaller."""
    bags = weighted_bags(tokens, token_weights)
    if shared_with is not None:
        bags = torch.minimum(bags, weighted_bags(shared_with, token_weights))
    total = bags.sum(1)
    rows = total > 0
    if not bool(rows.any()):
        return None
    target = bags[rows] / total[rows, None]
    logits = features[rows].float() @ word_embeddings.float().t()
    return -(target * logits.log_softmax(-1)).sum(-1).mean()


def segment_similarity(
    word_embeddings: Tensor, tokens: Tensor, segments: Tensor, token_weights: Tensor
) -> Tensor:
    """Each pair's similarity target for :func:`similarity_loss`: the cosine between its two
    segments' weighted sums of word vectors.

    ``word_embeddings`` (V, H); ``tokens`` (B, T) each row's token ids; ``segments`` (B, T) 0 for
    the first segment, 1 for the second; ``token_weights`` (V,) how much each word counts (0 for
    special tokens and padding). Returns (B,), 0 for a row with an empty segment."""
    weights = token_weights.to(torch.float32)[tokens]  # (B, T)
    vectors = word_embeddings.float()[tokens] * weights[..., None]  # (B, T, H)
    second = (segments == 1)[..., None]
    first_sum = vectors.masked_fill(second, 0.0).sum(1)  # (B, H)
    second_sum = vectors.masked_fill(~second, 0.0).sum(1)  # (B, H)
    return F.cosine_similarity(first_sum, second_sum, dim=-1, eps=1e-8)


def similarity_loss(
    prediction: Tensor, target: Tensor, rows: Tensor | None = None
) -> Tensor | None:
    """One minus the Pearson correlation of ``prediction`` and ``target`` (both (B,)) over the
    batch's ``rows`` (a (B,) bool mask; default all): a ranking signal that neither scale nor
    offset of the prediction can satisfy. None when the batch has fewer than two rows (known
    from the shape: no wait for the device); a constant target gives 1 with no gradient.
    Masked rather than indexed, so that a GPU never waits to count the rows."""
    if prediction.numel() < 2:
        return None
    w = torch.ones_like(target, dtype=torch.float32) if rows is None else rows.float()
    n = w.sum().clamp(min=1.0)
    p, t = prediction.float(), target.float()
    p = (p - (p * w).sum() / n) * w
    t = (t - (t * w).sum() / n) * w
    return 1.0 - (p * t).sum() / (p.norm() * t.norm()).clamp(min=1e-8)


def split_half_score(x: Tensor) -> Tensor:
    """(..., H) -> (...): the mean of the first H // 2 units minus the mean of the rest, a fixed
    direction with no parameters of its own (so a checkpoint keeps its keys). The all-ones
    direction (the mean of the units, what :func:`similarity_loss` reads of BERT's pooler) is
    useless after a bias-free LayerNorm whose weight is 1, as ModernBERT's head starts: the
    normalised units average to exactly 0 and no gradient reaches the encoder through it."""
    half = x.shape[-1] // 2
    if half == 0:
        raise ValueError(f"split_half_score needs at least 2 units, got {x.shape[-1]}")
    x = x.float()
    return x[..., :half].mean(-1) - x[..., half:].mean(-1)


def bag_of_words_weights(counts: Tensor, threshold: float = 1e-4) -> Tensor:
    """Word weights for :func:`bag_of_words_loss` from token counts of the training text:
    word2vec's subsampling, min(1, sqrt(threshold / frequency)), so that "the" and "," do not make
    up the target; words never seen (special tokens: give them count 0) weigh 0."""
    counts = counts.to(torch.float64)
    frequency = counts / counts.sum().clamp(min=1.0)
    weights = (threshold / frequency.clamp(min=1e-30)).sqrt().clamp(max=1.0)
    return torch.where(counts > 0, weights, torch.zeros_like(weights)).to(torch.float32)


class BertForMaskedLM(BertPreTrainedModel):
    """Encoder (no pooler) + MLM head: the MLM-only pretraining and fill-mask model."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config, self.bert.embeddings.word_embeddings)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        masked_rows: Tensor | None = None,
    ) -> MaskedLMOutput:
        args = (input_ids, attention_mask, token_type_ids, labels, output_attentions, masked_rows)
        out, logits, loss = masked_lm(self, *args)
        return MaskedLMOutput(loss, logits, out.attentions)


def generator_config(config: BertConfig) -> BertConfig:
    """The ELECTRA generator of a discriminator sized ``config``: the same width (so the two can
    share one embedding layer) and half the layers (at least one), about half the encoder's
    cost; Clark et al. (2020) found generators 1/4 to 1/2 the discriminator's size best."""
    return dataclasses.replace(config, num_hidden_layers=max(1, config.num_hidden_layers // 2))


def sample_tokens(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of (n, V) ``logits``, drawn from their softmax by inverting its CDF
    with one uniform number per row: the distribution of ``torch.multinomial``, at a fraction
    of its CPU cost (which draws V exponentials per row: 380 ms of an 830 ms ELECTRA step)."""
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    cdf = torch.softmax(logits.float(), dim=-1).cumsum_(-1)  # (n, V)
    u = torch.rand(logits.shape[0], 1, device=logits.device, generator=generator)
    u = u * cdf[:, -1:]  # the last value is 1 up to rounding
    return torch.searchsorted(cdf, u).squeeze(1).clamp_(max=logits.shape[1] - 1)


class BertGenerator(nn.Module):
    """ELECTRA's generator: a small masked-language model over the discriminator's embedding
    layer. The shared ``BertEmbeddings`` is borrowed, not registered: its weights are in the
    state dict once, under ``bert.embeddings``; the decoder is tied to the same word embeddings."""

    def __init__(self, config: BertConfig, embeddings: BertEmbeddings) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)
        del self.bert.embeddings
        object.__setattr__(self.bert, "embeddings", embeddings)  # borrowed (see the docstring)
        self.cls = BertOnlyMLMHead(config, embeddings.word_embeddings)


class BertForReplacedTokenDetection(BertPreTrainedModel):
    """ELECTRA pretraining (Clark et al. 2020), with BERT's names: a small generator
    (``generator``) predicts the masked tokens and its samples replace them; the discriminator
    (``bert``, the encoder that is kept) tells for every token whether it was replaced
    (``discriminator_predictions``). The discriminator learns from every token, not only from the
    masked 15-25%, which is why ELECTRA's encoders beat BERT's at the same small compute.

    ``bert`` is a plain BERT encoder: :meth:`save_encoder` writes it as a ``BertModel``
    checkpoint that ``transformers`` and every bertforge command load; the training
    checkpoints hold all three parts.
    """

    rtd_weight = 50.0
    """The discriminator loss's weight (ELECTRA's lambda): its per-token BCE is ~20-50x smaller
    than the generator's per-token cross-entropy."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.generator = BertGenerator(generator_config(config), self.bert.embeddings)
        self.discriminator_predictions = BertDiscriminatorHead(config)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
    ) -> ReplacedTokenDetectionOutput:
        """``input_ids`` are masked (the collator's 80/10/10) and ``labels`` hold the original
        tokens there (-100 elsewhere). The generator's samples replace the masked tokens (drawn
        from the global RNG in training, from a fixed seed in eval mode, so evaluations repeat);
        the discriminator reads the result."""
        if labels is None:
            raise ValueError("replaced-token detection needs MLM labels (the masked positions)")
        args = (input_ids, attention_mask, token_type_ids, labels, False)
        _, logits, mlm_loss = masked_lm(self.generator, *args)  # type: ignore[arg-type]
        flat = labels.flatten()
        rows = (flat != IGNORE_INDEX).nonzero().squeeze(1)
        with torch.no_grad():
            seed = None if self.training else torch.Generator(logits.device).manual_seed(0)
            sampled = sample_tokens(logits.detach(), seed)  # (n_masked,)
            original = input_ids.flatten().clone()
            original[rows] = flat[rows]
            corrupted = original.clone()
            corrupted[rows] = sampled
            replaced = (corrupted != original).view_as(input_ids).float()  # (B, T)
        out = self.bert(
            corrupted.view_as(input_ids), attention_mask, token_type_ids, output_attentions, True
        )
        rtd_logits = self.discriminator_predictions(out.last_hidden_state)  # (B, T)
        real = (
            torch.ones_like(replaced, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.to(torch.bool)
        )
        scored = rtd_logits.float()[real]
        rtd_loss = F.binary_cross_entropy_with_logits(scored, replaced[real])
        correct = ((scored > 0).float() == replaced[real]).sum()
        loss = mlm_loss + self.rtd_weight * rtd_loss if mlm_loss is not None else None
        return ReplacedTokenDetectionOutput(
            loss,
            logits,
            rtd_logits,
            mlm_loss,
            rtd_loss,
            correct,
            real.sum(),
            out.attentions,
        )

    def save_encoder(self, directory: str | Path, tokenizer: Any = None) -> Path:
        """Write the discriminator as a plain ``BertModel`` checkpoint: the pretrained encoder."""
        return save_pretrained(self.bert, directory, tokenizer=tokenizer)

    def generator_model(self) -> BertForMaskedLM:
        """The generator as a standalone ``BertForMaskedLM`` (copies of the shared embeddings,
        its layers and head): a fill-mask model, and what MLM benchmarks score."""
        model = BertForMaskedLM(self.generator.bert.config)
        state = {f"bert.embeddings.{k}": v for k, v in self.bert.embeddings.state_dict().items()}
        state |= {
            f"bert.encoder.{k}": v for k, v in self.generator.bert.encoder.state_dict().items()
        }
        state |= {f"cls.{k}": v for k, v in self.generator.cls.state_dict().items()}
        model.load_state_dict(state)
        return model


class BertForSequenceClassification(BertPreTrainedModel):
    """Encoder + pooler + dropout + linear head: classification (CE) or regression (MSE)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        p = config.classifier_dropout
        self.dropout = Dropout(config.hidden_dropout_prob if p is None else p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        cls_only: bool | None = None,
    ) -> SequenceClassifierOutput:
        """``cls_only``: the last layer computes [CLS] only, the only row the head reads (then
        no hidden states are returned); by default when labels are given (training). Inference
        that wants the logits alone passes True (``bertforge classify`` does)."""
        # The head reads [CLS] only: skip the padding, and let the last layer attend from [CLS]
        cls_only = labels is not None if cls_only is None else cls_only
        rows = input_ids.new_empty(0) if cls_only else None
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions, True, rows)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.config.is_regression:
                loss = F.mse_loss(logits.float().squeeze(-1), labels.float().view(-1))
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        hidden = out.last_hidden_state if rows is None else None
        return SequenceClassifierOutput(loss, logits, hidden, out.attentions)


class BertForTokenClassification(BertPreTrainedModel):
    """Encoder (no pooler, as transformers') + dropout + linear head on every token: a tag per
    token (named entities), cross-entropy over the positions whose label is not -100."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        p = config.classifier_dropout
        self.dropout = Dropout(config.hidden_dropout_prob if p is None else p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        labelled_only: bool | None = None,
    ) -> TokenClassifierOutput:
        """``labelled_only`` (by default when labels are given: training): the last layer and the
        head run at the labelled positions only (a word's first piece), the loss is the same, and
        the logits are (n_labelled, num_labels) in row-major order of those positions."""
        labelled_only = labels is not None if labelled_only is None else labelled_only
        rows = None
        if labelled_only:
            if labels is None:
                raise ValueError("labelled_only needs labels")
            rows = (labels.flatten() != IGNORE_INDEX).nonzero().squeeze(1)  # (n,)
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions, True, rows)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, C) or (n, C)
        loss = None
        if labels is not None:
            target = labels.flatten() if rows is None else labels.flatten()[rows]
            flat = logits.float().reshape(-1, self.num_labels)  # (B*T, C) or (n, C)
            loss = F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX)
        return TokenClassifierOutput(loss, logits, out.attentions)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Encoder (no pooler) + a linear ``qa_outputs`` giving each token a start and an end score:
    extractive question answering, transformers' layout (so its ``AutoModelForQuestionAnswering``
    loads the saved directory)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # keep the name: checkpoint keys
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool = False,
    ) -> QuestionAnsweringOutput:
        """With ``start_positions`` and ``end_positions`` (B,) the loss is the mean of the two
        cross-entropies over each sequence's positions (padding masked out of the softmax)."""
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions, True)
        logits = self.qa_outputs(out.last_hidden_state)  # (B, T, 2)
        start, end = logits.float().unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            if attention_mask is not None:  # a padded position is never the answer
                padding = attention_mask == 0
                start = start.masked_fill(padding, torch.finfo(start.dtype).min)
                end = end.masked_fill(padding, torch.finfo(end.dtype).min)
            loss = (
                F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)
            ) / 2
        return QuestionAnsweringOutput(loss, start, end, out.last_hidden_state, out.attentions)


__all__ = [
    "BertModel",
    "BertForTokenClassification",
    "TokenClassifierOutput",
    "BertForQuestionAnswering",
    "QuestionAnsweringOutput",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForReplacedTokenDetection",
    "BertForSequenceClassification",
    "BertPreTrainedModel",
    "BertModelOutput",
    "PreTrainingOutput",
    "MaskedLMOutput",
    "ReplacedTokenDetectionOutput",
    "SequenceClassifierOutput",
    "IGNORE_INDEX",
    "contrastive_loss",
    "cooccurrence_vectors",
    "split_half_score",
    "sinusoidal_positions",
]
