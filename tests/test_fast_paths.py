"""The Guard: every fast path of the model computes the same function as the plain computation.

Fast paths: sparse MLM prediction (head on the masked positions only), skipped padding (token-wise
ops on the real tokens only), the cheaper CPU dropout and the explicit attention it runs in, the
in-place buffers of inference, and bf16 autocast. The C kernel itself: tests/test_kernels.py.
Timings live in benchmarks/, never here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from bertforge import BertForPreTraining, BertForSequenceClassification, BertModel
from bertforge.modeling.kernels import cross_entropy_kernels, dropout_kernel
from bertforge.modeling.ops import CrossEntropy, cross_entropy, dropout, torch_dropout


@pytest.fixture(autouse=True)
def _restore_global_rng():
    """These tests seed torch's global RNG; put it back so that later tests see no difference."""
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


def padded_batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Five sequences of different lengths (one full), with MLM and NSP labels on real tokens."""
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 16
    lengths = torch.tensor([16, 9, 3, 12, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    ids = torch.randint(5, vocab, (B, T), generator=g) * mask
    types = (torch.arange(T)[None, :] >= lengths[:, None] // 2).long() * mask
    labels = torch.full_like(ids, -100)
    chosen = mask.bool() & (torch.rand(B, T, generator=g) < 0.3)
    chosen[:, 1] = True  # every sequence has at least one label
    labels[chosen] = torch.randint(5, vocab, (int(chosen.sum()),), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (B,), generator=g),
    }


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=name)


@pytest.mark.parametrize("padded", [True, False])
def test_sparse_prediction_and_skipped_padding_equal_the_plain_pretraining_loss(
    tiny_config, padded
):
    """Fast: labels given -> padding skipped + head on masked rows, the last layer's queries and
    attention at those rows only. Plain: dense (B, T, V) logits over the batch, cross-entropy
    with ignore_index. Same loss, same gradients; with and without padding."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size)
    if not padded:  # every position a real token (the ids there are [PAD]'s: just another token)
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    fast = model(**batch)
    fast.loss.backward()
    fast_grads = grads(model)
    model.zero_grad()

    plain = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    V = tiny_config.vocab_size
    assert plain.prediction_logits.shape == (*batch["input_ids"].shape, V)
    mlm = F.cross_entropy(plain.prediction_logits.reshape(-1, V), batch["labels"].reshape(-1))
    nsp = F.cross_entropy(plain.seq_relationship_logits, batch["next_sentence_label"])
    (mlm + nsp).backward()

    n_masked = int((batch["labels"] != -100).sum())
    assert fast.prediction_logits.shape == (n_masked, V)
    torch.testing.assert_close(fast.mlm_loss, mlm, atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.loss, mlm + nsp, atol=1e-6, rtol=0)
    assert_grads_close(fast_grads, grads(model))


def test_skipped_padding_keeps_real_tokens_and_zeroes_the_padding(tiny_config):
    torch.manual_seed(1)
    model = BertModel(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size, seed=1)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    plain = model(*args)
    fast = model(*args, skip_padding=True)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(
        fast.last_hidden_state[real], plain.last_hidden_state[real], atol=1e-5, rtol=0
    )
    assert fast.last_hidden_state[~real].abs().max() == 0
    torch.testing.assert_close(fast.pooler_output, plain.pooler_output, atol=1e-5, rtol=0)
    # a batch without padding takes the plain path either way: bit-identical
    ids, mask = batch["input_ids"][:1], batch["attention_mask"][:1]  # the full-length sequence
    a = model(ids, mask, skip_padding=True).last_hidden_state
    b = model(ids, mask).last_hidden_state
    assert torch.equal(a, b)


def test_qkv_one_gemm_and_three_gemms_agree(tiny_config):
    """Few tokens take three q/k/v projections, many take one fused GEMM: same hidden states."""
    torch.manual_seed(8)
    model = BertModel(tiny_config).eval()
    ids = torch.randint(5, tiny_config.vocab_size, (6, 12))  # 72 tokens >= H = 32: fused
    batched = model(ids).last_hidden_state
    for i in range(ids.shape[0]):  # 12 tokens < H: three GEMMs
        torch.testing.assert_close(
            model(ids[i : i + 1]).last_hidden_state[0], batched[i], atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("num_labels", [3, 1])
def test_classifier_gradients_with_skipped_padding_equal_the_padded_model(tiny_config, num_labels):
    """The classifier always skips the padding; the padded encoder gives the same loss/grads."""
    torch.manual_seed(2)
    tiny_config.num_labels = num_labels
    model = BertForSequenceClassification(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size, seed=2)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    labels = (
        torch.tensor([0.5, 1.0, -1.0, 2.0, 0.0])
        if num_labels == 1
        else torch.tensor([0, 2, 1, 1, 0])
    )
    fast = model(*args, labels=labels)
    fast.loss.backward()
    fast_grads = grads(model)
    model.zero_grad()
    pooled = model.bert(*args).pooler_output  # padded path
    logits = model.classifier(pooled)
    if num_labels == 1:
        loss = F.mse_loss(logits.squeeze(-1), labels)
    else:
        loss = F.cross_entropy(logits, labels)
    loss.backward()
    torch.testing.assert_close(fast.logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.loss, loss, atol=1e-6, rtol=1e-5)
    assert_grads_close(fast_grads, grads(model), atol=1e-5)
    # inference with the last layer at [CLS] only (what `classify` runs): the same logits
    with torch.inference_mode():
        full, cls_only = model(*args), model(*args, cls_only=True)
    assert full.hidden_states.shape == (*args[0].shape, tiny_config.hidden_size)
    assert cls_only.hidden_states is None
    torch.testing.assert_close(cls_only.logits, full.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(cls_only.logits, logits.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_inference_in_place_buffers_equal_the_recorded_forward(tiny_config, act):
    """Without autograd the layers reuse buffers in place (residual + bias + product in one GEMM,
    activation in place): the same values as a forward that records gradients, padded or not."""
    torch.manual_seed(9)
    tiny_config.hidden_act = act
    model = BertForPreTraining(tiny_config).eval()
    with torch.no_grad():  # non-zero biases and activations well into GELU's curve
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    batch = padded_batch(tiny_config.vocab_size, seed=9)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    inputs = [t.clone() for t in args]
    for skip in (False, True):
        recorded = model.bert(*args, skip_padding=skip)
        with torch.inference_mode():
            fast = model.bert(*args, skip_padding=skip)
        assert recorded.last_hidden_state.requires_grad and not fast.last_hidden_state.requires_grad
        for a, b in [
            (fast.last_hidden_state, recorded.last_hidden_state),
            (fast.pooler_output, recorded.pooler_output),
        ]:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with torch.no_grad():  # the sparse MLM path (last layer on the labelled rows) as well
        fast = model(**batch)
    recorded = model(**batch)
    torch.testing.assert_close(
        fast.prediction_logits, recorded.prediction_logits, atol=1e-5, rtol=0
    )
    torch.testing.assert_close(fast.loss, recorded.loss, atol=1e-6, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(inputs, args, strict=True))  # inputs untouched
    # under bf16 autocast the dtypes differ: the layers keep the out-of-place path, same values
    with torch.autocast("cpu", dtype=torch.bfloat16):
        recorded = model.bert(*args).last_hidden_state
        with torch.inference_mode():
            fast = model.bert(*args).last_hidden_state
    torch.testing.assert_close(fast, recorded, atol=0, rtol=0)


@pytest.mark.parametrize("form", ["kernel", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cross_entropy_equals_torch(dtype, form):
    """Both forms of the MLM loss (the C kernel, when this machine builds it, and the torch
    one) against float64 math: value, gradient, the gradient's dtype. Widths 1000 and 30,522
    (not multiples of the kernel's 16-float vectors: row tails), contiguous rows that lie
    further apart than V (the decoder's padded logits), targets at both ends of a row, and rows
    whose logits span 200 (exp underflows for most of the row)."""
    if form == "kernel" and cross_entropy_kernels(dtype) is None:
        pytest.skip("no C compiler here: the kernel form is not built")
    g = torch.Generator().manual_seed(7)
    for V, ld in ((1000, 1000), (30522, 30522), (30522, 30528), (1000, 1037)):
        logits = (3 * torch.randn(37, V, generator=g)).to(dtype)
        logits[5] *= 33  # a spread of ~200: the softmax of this row is nearly one-hot
        target = torch.randint(0, V, (37,), generator=g)
        target[:2] = torch.tensor([0, V - 1])
        # rows ld apart, as DecoderLinear writes them (ld > V: a view into padded rows)
        a = torch.full((37, ld), float("nan"), dtype=dtype)[:, :V].copy_(logits)
        a.requires_grad_()
        b = logits.double().requires_grad_()
        fast = cross_entropy(a, target) if form == "kernel" else CrossEntropy.apply(a, target)
        exact = F.cross_entropy(b, target)
        (2.5 * fast).backward()
        (2.5 * exact).backward()
        assert fast.dtype == torch.float32 and a.grad.dtype == dtype
        assert not a.grad.isnan().any()  # the padding between rows was never read
        torch.testing.assert_close(fast.double(), exact, atol=0, rtol=1e-6)
        if dtype == torch.float32:  # fp32 x - lse at |x| ~ 300 (row 5): 1e-5 relative
            torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-9, rtol=3e-5)
        else:  # rounded to bf16 (8 significant bits)
            torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-9, rtol=8e-3)
    # the kernel indexes rows by target: an empty batch and a target outside the vocabulary
    # behave as in the torch form (nan loss and an empty gradient; an index error)
    empty = torch.randn(0, 50).to(dtype).requires_grad_()
    loss = cross_entropy(empty, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.isnan() and empty.grad.shape == (0, 50)
    with pytest.raises(RuntimeError, match="out of bounds"):
        cross_entropy(torch.randn(3, 50).to(dtype), torch.tensor([1, 2, 50]))
    # a non-contiguous view takes the torch form, same values
    wide = (3 * torch.randn(8, 2000, generator=g)).to(dtype)[:, ::2]
    t = torch.randint(0, 1000, (8,), generator=g)
    torch.testing.assert_close(
        cross_entropy(wide, t).double(), F.cross_entropy(wide.double(), t), atol=0, rtol=1e-6
    )


@pytest.mark.parametrize("form", ["kernel", "torch"])
def test_cpu_dropout_keeps_the_right_fraction_and_rescales(form):
    """Both CPU forms: the C kernel (when this machine can build it) and the torch fallback."""
    if form == "kernel" and dropout_kernel(torch.float32) is None:
        pytest.skip("no C compiler here: the kernel form is not built")

    def drop(x: torch.Tensor, p: float) -> torch.Tensor:
        return dropout(x, p, training=True) if form == "kernel" else torch_dropout(x, p)

    torch.manual_seed(3)
    x = torch.ones(1_000_000)
    for p in (0.1, 0.5):
        y = drop(x, p)
        kept = y != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 0.003  # ~6 sigma at n = 1e6
        torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    assert not dropout(x[:10], 1.0, training=True).any()  # as F.dropout
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(x, 1.5, training=True)
    # gradient flows through kept elements only, with the same scale
    w = torch.randn(1000, 37, requires_grad=True)
    y = drop(w, 0.3)
    g = torch.randn(1000, 37)
    y.backward(g)
    torch.testing.assert_close(w.grad, g * (y != 0).float() / 0.7)
    # masks differ call to call, and follow torch's seed
    torch.manual_seed(4)
    a = drop(x[:1000], 0.5)
    torch.manual_seed(4)
    assert torch.equal(a, drop(x[:1000], 0.5))
    assert not torch.equal(a, drop(x[:1000], 0.5))


def test_training_mode_explicit_attention_equals_sdpa_without_drops(tiny_config):
    """In training on CPU, attention with dropout runs the explicit softmax path; with a dropout
    probability too small to drop anything it must equal the fused SDPA path of eval mode."""
    torch.manual_seed(5)
    tiny_config.hidden_dropout_prob = 0.0
    tiny_config.attention_probs_dropout_prob = 1e-12
    model = BertModel(tiny_config)
    batch = padded_batch(tiny_config.vocab_size, seed=5)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    explicit = model.train()(*args, skip_padding=True).last_hidden_state
    fused = model.eval()(*args, skip_padding=True).last_hidden_state
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=0)


def test_bf16_autocast_loss_and_gradients_close_to_fp32(tiny_config):
    torch.manual_seed(6)
    tiny_config.vocab_size = 1000  # a realistic softmax width for the bf16 decoder
    model = BertForPreTraining(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size, seed=6)
    fp32 = model(**batch)
    fp32.loss.backward()
    g32 = grads(model)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = model(**batch)
    bf16.loss.backward()
    g16 = grads(model)
    assert bf16.loss.dtype == torch.float32  # losses are computed in fp32
    assert abs(bf16.loss.item() - fp32.loss.item()) / fp32.loss.item() < 0.01
    for name in g32:
        if name.endswith("key.bias"):
            continue  # softmax ignores a key bias: its true gradient is 0, both are rounding noise
        cos = F.cosine_similarity(g16[name].flatten(), g32[name].flatten(), dim=0)
        assert cos > 0.98, (name, cos.item())


class ProductShapes(TorchDispatchMode):
    """The shapes of the matrix products run inside (their inputs' shapes, per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: set[tuple] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if any(p in name for p in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")):
            self.shapes.add(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


def test_bf16_row_counts_rounded_up_change_no_value_and_repeat_shapes(tiny_config, monkeypatch):
    """In bf16 on the CPU the masked rows and the real tokens are rounded up to a multiple of
    ONEDNN_ROWS (oneDNN keeps a kernel per product shape): the loss, the logits, the gradients
    and the zeros at the padding are those of the counts as they are, and two batches with
    different masked and real counts run the same product shapes."""
    from bertforge.modeling.ops import shape_multiple, unpadding

    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(8)
    model = BertForPreTraining(tiny_config).train()
    batch = padded_batch(tiny_config.vocab_size, seed=8)
    assert shape_multiple(model.bert.embeddings.word_embeddings.weight) == 1  # fp32: BLAS
    runs = {}
    for rows in (1, 32):
        monkeypatch.setattr(unpadding, "ONEDNN_ROWS", rows)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert shape_multiple(model.bert.embeddings.word_embeddings.weight) == rows
            out = model(**batch)
            hidden = model.bert(*list(batch.values())[:3], skip_padding=True).last_hidden_state
        out.loss.backward()
        runs[rows] = (out, grads(model), hidden)
    (plain, g1, h1), (rounded, g32, h32) = runs[1], runs[32]
    n_masked = int((batch["labels"] != -100).sum())  # and the real tokens: both rounded up
    assert rounded.prediction_logits.shape == plain.prediction_logits.shape == (n_masked, 120)
    torch.testing.assert_close(rounded.prediction_logits, plain.prediction_logits)
    torch.testing.assert_close(rounded.loss, plain.loss, atol=1e-5, rtol=0)
    assert_grads_close(g32, g1, atol=2e-3)  # bf16 products of other shapes round differently
    assert torch.equal(h32[~batch["attention_mask"].bool()], h1[~batch["attention_mask"].bool()])
    torch.testing.assert_close(h32, h1, atol=1e-2, rtol=0)

    shapes = []
    for seed in (8, 9):  # other masked positions and another real-token count
        other = padded_batch(tiny_config.vocab_size, seed=seed)
        other["attention_mask"][1, 9 - seed + 8 :] = 0
        with ProductShapes() as seen, torch.autocast("cpu", dtype=torch.bfloat16):
            model(**other).loss.backward()
        shapes.append(seen.shapes)
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("decoder", [True, False])
def test_word_embedding_gradient_equals_f_embedding_over_steps(decoder):
    """The word lookup (and the tied decoder's weight it hands on) sums both weight gradients
    in one reused buffer: over two steps, with the gradient accumulated in .grad and one kept by
    the caller between steps, it equals F.embedding + F.linear's (the lookup adding nothing at
    [PAD]), with the decoder or the lookup alone."""
    from bertforge.modeling.ops import DecoderLinear, word_embedding

    torch.manual_seed(3)
    V, H, pad = 50, 8, 0
    ids = torch.randint(0, V, (2, 4, 7))  # two steps of (4, 7) ids, [PAD] among them
    ids[:, 0, -2:] = pad
    grads_out = torch.randn(2, 4, 7, H)
    h = torch.randn(2, 5, H)
    bias = torch.zeros(V)

    def run(fast):
        weight = torch.randn(V, H, generator=torch.Generator().manual_seed(5)).requires_grad_()
        kept = []
        for step in range(2):
            if fast:
                x, tied = word_embedding(ids[step], weight, pad)
                logits = DecoderLinear.apply(h[step], tied, bias)
            else:
                x, logits = F.embedding(ids[step], weight, pad), F.linear(h[step], weight, bias)
            loss = (x * grads_out[step]).sum()
            if decoder:
                loss = loss + logits.pow(2).sum() / 10
            loss.backward()
            kept.append(weight.grad.clone())
            held = weight.grad  # the caller keeps it: the next step must not write over it
        torch.testing.assert_close(held, kept[1])
        return kept

    for ours, ref in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert decoder or run(True)[0][pad].abs().max() == 0


class CountOneDNN(TorchDispatchMode):
    """Counts the oneDNN products (``mkldnn::_linear_pointwise`` and its ``.binary``) run inside."""

    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "mkldnn::_linear_pointwise" in str(func.name()):
            CountOneDNN.calls += 1
        return func(*args, **(kwargs or {}))


def test_training_step_agrees_in_both_product_libraries(tiny_config, use_gemm_library):
    """The fp32 training step (dropout on: every kernel path) with its products in BLAS and in
    oneDNN (``BERTFORGE_GEMM``; oneDNN is what AMD CPUs get): the same loss and gradients up to
    fp32 rounding, on a padded batch."""
    import dataclasses

    config = dataclasses.replace(tiny_config, hidden_dropout_prob=0.1)
    results, calls = {}, {}
    for library in ("blas", "onednn"):
        use_gemm_library(library)
        torch.manual_seed(0)
        model = BertForPreTraining(config).train()
        batch = padded_batch(config.vocab_size)
        torch.manual_seed(1)  # the same dropout masks in both
        CountOneDNN.calls = 0
        with CountOneDNN():
            out = model(**batch)
            out.loss.backward()
        results[library], calls[library] = (out.loss.detach(), grads(model)), CountOneDNN.calls
    assert calls["blas"] == 0
    assert calls["onednn"] > 0 or not torch.backends.mkldnn.is_available()
    (loss_a, grads_a), (loss_b, grads_b) = results.values()
    torch.testing.assert_close(loss_a, loss_b, atol=1e-5, rtol=1e-5)
    assert_grads_close(grads_a, grads_b, atol=1e-5)


@pytest.mark.parametrize("skip_padding", [False, True])
def test_inference_agrees_in_both_product_libraries(tiny_config, use_gemm_library, skip_padding):
    """Inference (no autograd) with the layers' products in BLAS and in oneDNN, bias and GELU or
    the residual sum in oneDNN's call (``BERTFORGE_GEMM=onednn`` on a CPU with AVX-512; what AMD
    Zen 4 gets): the same hidden states up to fp32 rounding, padded and with the padding
    skipped. With autograd recording or under bf16 autocast the products stay in torch."""
    from bertforge.modeling import kernels
    from bertforge.modeling.ops import onednn_inference

    torch.manual_seed(3)
    model = BertModel(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size, seed=3)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    results, calls, used = {}, {}, {}
    for library in ("blas", "onednn"):
        use_gemm_library(library)
        CountOneDNN.calls = 0
        with torch.no_grad(), CountOneDNN():
            out = model(*args, skip_padding=skip_padding)
        results[library], calls[library] = out, CountOneDNN.calls
        x, w = torch.randn(4, 8), torch.randn(3, 8)
        assert not onednn_inference(x, w)  # autograd records here
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert not onednn_inference(x, w)
        with torch.no_grad():
            assert onednn_inference(x, w) == kernels.onednn_for_inference()
        used[library] = kernels.onednn_for_inference()
    assert calls["blas"] == 0 and not used["blas"]
    layers = tiny_config.num_hidden_layers  # per layer: GELU product, two sums (+ q/k/v)
    assert calls["onednn"] >= 3 * layers if used["onednn"] else calls["onednn"] == 0
    a, b = results["blas"], results["onednn"]
    torch.testing.assert_close(
        a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=1e-5)
