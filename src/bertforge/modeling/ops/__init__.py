"""Tensor operations the model uses for speed, each the same function as its plain form; one
module per concern, the fused ones beside their C file in ``modeling/csrc/``:

* ``seeded_dropout`` (``dropout.c``): :func:`dropout` / :class:`Dropout`, dropout with a cheaper
  random mask on CPU (the C kernel of :mod:`bertforge.modeling.kernels` when one is built, else
  :func:`torch_dropout`);
* ``layer_norm`` (``layer_norm.c``): :func:`dense_dropout_norm`, the end of each post-LN block
  (dense + bias + dropout + residual + LayerNorm, :class:`AddNorm`);
* ``layer_norm`` also: :func:`residual_norm`, the end of a pre-norm block (ModernBERT's):
  dense + residual + the next LayerNorm, both the sum and its norm, through the same kernels;
* ``local_attention``: :func:`window_attention`, sliding-window attention in blocks of the
  window (no (T, T) scores where the window is small), and :func:`band_mask`;
* ``softmax`` (``softmax.c``): :func:`attention`, attention with dropout
  (:class:`KernelAttention`), and :func:`query_attention`, attention from queries at some rows
  only (the sparse last layer), with :func:`query_slots`, where those queries sit;
* ``gelu`` (``gelu.c``): :func:`dense_activation`, the feed-forward's bias + GELU
  (:class:`BiasGelu`); :func:`gated_activation`, ModernBERT's GeGLU (:class:`GeGLU`); and
  :func:`activation`;
* ``loss`` (``cross_entropy.c``): :func:`cross_entropy`, mean cross-entropy with fewer passes
  over 30k-wide logits (else :class:`CrossEntropy`); :class:`DecoderLinear`, the tied decoder,
  its weight gradient contiguous, its logits in rows padded to 64 bytes (:func:`padded_rows`);
  :func:`decoder_cross_entropy`, the decoder and the MLM loss in one, the gradients written in
  the loss's pass (:class:`DecoderCrossEntropy`);
* ``products``: :func:`gemm`, the fp32 training products, in oneDNN on AMD CPUs
  (``BERTFORGE_GEMM``); :func:`onednn_linear`, an inference product with its bias and GELU or
  residual sum in one oneDNN call (AMD CPUs with AVX-512, :func:`onednn_inference`);
  :func:`linear` / :class:`ScratchLinear`, a product whose output or input gradient is a
  :func:`scratch` buffer;
* ``embedding``: :func:`word_embedding`, the word lookup, and the weight for a tied decoder
  whose gradient then sums with the lookup's in one buffer (:class:`WordEmbedding`);
* ``buffers``: :func:`scratch`, large per-step buffers, pooled per name and reused once nobody
  holds them (no page faults), and :func:`padded_rows`;
* ``unpadding``: :func:`unpad` / :func:`repad`, move between a padded (B, T) batch and its N
  real tokens; :func:`shape_multiple` / :func:`unpadded_index`, row counts rounded up where
  oneDNN builds a kernel per shape (bf16 on the CPU);
* ``common`` (``common.h``): :func:`cpu_tuned`, the fp32 kernels' check, and
  :func:`autograd_free` (in inference, activations overwrite their input).

Every name is re-exported here (``from bertforge.modeling.ops import dropout``); a test that
patches a name patches it in the module that uses it. ``tests/test_fast_paths.py`` and
``tests/test_fused_kernels.py`` check each against the plain computation (float64 for the
kernels).
"""

from bertforge.modeling.ops.buffers import clear_scratch, padded_rows, scratch
from bertforge.modeling.ops.common import autograd_free, cpu_tuned
from bertforge.modeling.ops.embedding import WordEmbedding, word_embedding
from bertforge.modeling.ops.gelu import (
    BiasGelu,
    GeGLU,
    activation,
    dense_activation,
    gated_activation,
)
from bertforge.modeling.ops.layer_norm import AddNorm, dense_dropout_norm, residual_norm
from bertforge.modeling.ops.local_attention import band_mask, window_attention
from bertforge.modeling.ops.loss import (
    CrossEntropy,
    DecoderCrossEntropy,
    DecoderLinear,
    KernelCrossEntropy,
    cross_entropy,
    decoder_cross_entropy,
    decoder_logits,
)
from bertforge.modeling.ops.products import (
    ScratchLinear,
    gemm,
    linear,
    onednn_inference,
    onednn_linear,
)
from bertforge.modeling.ops.seeded_dropout import Dropout, SeededDropout, dropout, torch_dropout
from bertforge.modeling.ops.softmax import (
    KernelAttention,
    attention,
    explicit_attention,
    query_attention,
    query_slots,
)
from bertforge.modeling.ops.unpadding import (
    ONEDNN_ROWS,
    repad,
    round_up,
    shape_multiple,
    unpad,
    unpadded_index,
)

__all__ = [
    "AddNorm",
    "BiasGelu",
    "GeGLU",
    "CrossEntropy",
    "KernelAttention",
    "KernelCrossEntropy",
    "ScratchLinear",
    "Dropout",
    "DecoderCrossEntropy",
    "DecoderLinear",
    "SeededDropout",
    "activation",
    "decoder_cross_entropy",
    "decoder_logits",
    "dense_dropout_norm",
    "residual_norm",
    "band_mask",
    "window_attention",
    "attention",
    "autograd_free",
    "clear_scratch",
    "cpu_tuned",
    "cross_entropy",
    "dense_activation",
    "gated_activation",
    "dropout",
    "explicit_attention",
    "gemm",
    "linear",
    "onednn_inference",
    "onednn_linear",
    "padded_rows",
    "query_attention",
    "query_slots",
    "repad",
    "scratch",
    "torch_dropout",
    "unpad",
    "ONEDNN_ROWS",
    "round_up",
    "shape_multiple",
    "unpadded_index",
    "word_embedding",
    "WordEmbedding",
]
