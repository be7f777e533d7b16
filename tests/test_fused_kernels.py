"""The fused training kernels of bertforge.modeling (C, built for real with the system compiler)
against float64 math: bias + dropout + residual add + LayerNorm, attention's softmax + dropout, bias +
exact GELU, each forward and backward, at odd sizes (row tails shorter than the kernels' 16-float
vectors), on non-contiguous inputs, and with the torch forms they fall back to. The dropout masks
of the kernels are recovered from the kernels themselves (a row of ones comes out as its mask),
so that the float64 reference applies exactly the same mask.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertForPreTraining
from bertforge.modeling import ops
from bertforge.modeling.kernels import add_norm_kernels, bias_gelu_kernels, softmax_dropout_kernels
from bertforge.modeling.ops import buffers, layer_norm, softmax

pytestmark = pytest.mark.usefixtures("two_threads")  # the kernels' threaded paths
HAVE_COMPILER = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
needs_kernels = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def _restore_global_rng():
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


def next_seed(seed: int) -> int:
    """The dropout seed a kernel op draws first after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return int(torch.randint(0, 2**62, (1,)).item())


def row_mask(n: int, H: int, seed: int, p: float) -> torch.Tensor:
    """The row-wise dropout factors (0 or 1 / (1 - p)) of the kernels for an (n, H) matrix."""
    forward = add_norm_kernels()[0]
    keep = torch.ones(n, H)  # overwritten with h = 1 * keep
    forward(keep, None, None, torch.ones(H), torch.zeros(H), 1e-5, seed, p)
    return keep


@needs_kernels
def test_kernels_build_here():
    """A compiler is present, so every fused kernel must build (no silent fallback)."""
    assert add_norm_kernels() is not None
    assert softmax_dropout_kernels() is not None
    assert bias_gelu_kernels() is not None


@needs_kernels
def test_row_mask_has_the_right_rate_is_independent_and_thread_free():
    p, n, H = 0.5, 4096, 256  # q = 64 words per row: elements j and j + 64 share one word
    keep = row_mask(n, H, 11, p)
    dropped = keep.flatten() == 0
    assert set(keep.unique().tolist()) == {0.0, 2.0}
    for lag in (1, 64, 128, 256):  # neighbours, word-mates, next row
        both = (dropped[:-lag] & dropped[lag:]).float().mean().item()
        assert abs(both - p * p) < 0.005, (lag, both)
    for q in (0.1, 0.9):
        rate = (row_mask(n, H, 12, q) == 0).float().mean().item()
        assert abs(rate - q) < 0.004, (q, rate)
    assert not torch.equal(keep, row_mask(n, H, 12, p))  # another seed, another mask
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(row_mask(n, H, 11, p), keep)
    finally:
        torch.set_num_threads(threads)


@needs_kernels
@pytest.mark.parametrize("H", [3, 37, 256])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_dense_dropout_norm_equals_float64(H, p):
    """Bias, dropout, residual add and LayerNorm after a product, every gradient included."""
    g = torch.Generator().manual_seed(H)
    n, d_in = 23, 19
    dense, norm = torch.nn.Linear(d_in, H), torch.nn.LayerNorm(H, eps=1e-5)
    with torch.no_grad():  # every input from the seeded generator: the same test in every run
        dense.weight.copy_(torch.randn(H, d_in, generator=g) / d_in**0.5)
        for t in (dense.bias, norm.weight, norm.bias):
            t.copy_(torch.randn(H, generator=g))
    x0 = (3 * torch.randn(d_in, n, generator=g)).t()  # non-contiguous input
    res0 = torch.randn(H, n, generator=g).t()  # non-contiguous residual
    grad_out = torch.randn(H, n, generator=g).t()  # non-contiguous incoming gradient
    x, res = x0.clone().requires_grad_(), res0.clone().requires_grad_()
    torch.manual_seed(4)
    out = ops.dense_dropout_norm(x, dense, res, norm, p, training=True)
    out.backward(grad_out)
    assert torch.equal(x.detach(), x0) and torch.equal(res.detach(), res0)  # inputs untouched

    keep = row_mask(n, H, next_seed(4), p) if p > 0 else torch.ones(n, H)
    exact_params = [t.detach().double().requires_grad_() for t in (dense.weight, dense.bias)]
    exact_params += [t.detach().double().requires_grad_() for t in (norm.weight, norm.bias)]
    x64, r64 = x0.double().requires_grad_(), res0.double().requires_grad_()
    w64, b64, g64, beta64 = exact_params
    exact = F.layer_norm(F.linear(x64, w64, b64) * keep.double() + r64, (H,), g64, beta64, 1e-5)
    exact.backward(grad_out.double())

    torch.testing.assert_close(out.double(), exact, atol=2e-5, rtol=1e-5)
    for name, got, want in [
        ("x", x.grad, x64.grad),
        ("residual", res.grad, r64.grad),
        ("dense.weight", dense.weight.grad, w64.grad),
        ("dense.bias", dense.bias.grad, b64.grad),
        ("norm.weight", norm.weight.grad, g64.grad),
        ("norm.bias", norm.bias.grad, beta64.grad),
    ]:
        # through a LayerNorm of 3 features the fp32 gradients reach ~100 for some draws, and
        # torch's own fp32 path then errs by ~1e-5 of the largest: the tolerance scales with it
        atol = 2e-5 * max(1.0, float(want.abs().max()))
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=1e-4, msg=name)
    if p > 0:
        assert 0 < (keep == 0).float().mean() < 0.6


@needs_kernels
def test_add_norm_writes_the_sum_over_y_and_refuses_a_stale_graph():
    """The kernel form writes the pre-norm sum over ``y`` and marks it modified: a graph that
    still needs the old ``y`` fails loudly instead of computing a wrong gradient."""
    kernels = add_norm_kernels()
    norm = torch.nn.LayerNorm(8)
    x, res = torch.randn(5, 8, requires_grad=True), torch.randn(5, 8)
    y = x * 2  # a new tensor (not a view) that nothing keeps
    out, h = ops.AddNorm.apply(y, None, res, norm.weight, norm.bias, 0.0, 1e-5, kernels)
    assert h is y
    torch.testing.assert_close(y, x.detach() * 2 + res)
    torch.testing.assert_close(out, F.layer_norm(x.detach() * 2 + res, (8,)))
    (out.sum() + h.sum()).backward()  # the sum's own gradient joins the norm's
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0), atol=1e-5, rtol=0)
    z = x.exp()  # exp keeps its output for its backward
    z_out, _ = ops.AddNorm.apply(z, None, res, norm.weight, norm.bias, 0.0, 1e-5, kernels)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z_out.sum().backward()


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_dense_dropout_norm_torch_form_equals_kernel_form(monkeypatch, p):
    """The fallback (no kernels: linear, dropout, add, LayerNorm in torch) computes the same
    function; with dropout, a mask of the same rate."""
    dense, norm = torch.nn.Linear(11, 37), torch.nn.LayerNorm(37)
    x, res = torch.randn(4, 50, 11), torch.randn(4, 50, 37)
    torch.manual_seed(0)
    a = ops.dense_dropout_norm(x, dense, res, norm, p, training=True)
    monkeypatch.setattr(layer_norm, "add_norm_kernels", lambda: None)
    torch.manual_seed(0)
    b = ops.dense_dropout_norm(x, dense, res, norm, p, training=True)
    assert a.shape == b.shape == res.shape
    if p == 0:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    eval_mode = ops.dense_dropout_norm(x, dense, res, norm, p, training=False)
    torch.testing.assert_close(eval_mode, norm(dense(x) + res), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="dropout probability"):
        ops.dense_dropout_norm(x, dense, res, norm, 1.0, training=True)


def attention_inputs(B: int, nh: int, T: int, hs: int, seed: int):
    """A (B, T, 3H) qkv as the model makes it (q, k, v side by side, heads inside each), a
    padding mask with one full sequence, and a (B, T, 3, nh, hs) view of the same numbers."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 3 * nh * hs, generator=g).requires_grad_()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
    return qkv, mask


def split_heads(qkv: torch.Tensor, nh: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, H3 = qkv.shape
    return qkv.view(B, T, 3, nh, H3 // 3 // nh).permute(2, 0, 3, 1, 4).unbind(0)


@needs_kernels
@pytest.mark.parametrize(("B", "nh", "T", "hs"), [(2, 3, 1, 4), (2, 3, 19, 8), (3, 2, 130, 16)])
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_equals_float64(B, nh, T, hs, p, masked):
    qkv, mask = attention_inputs(B, nh, T, hs, seed=T)
    mask = mask if masked else None
    torch.manual_seed(9)
    y = ops.attention(qkv, nh, mask, p, training=True)
    assert y.shape == (B, T, nh * hs)
    grad = torch.randn(T, B, nh * hs).transpose(0, 1)  # non-contiguous incoming gradient
    y.backward(grad)

    # the kernel's mask: probabilities of equal scores, dropped, divided by the undropped ones
    forward = softmax_dropout_kernels()[0]
    flat = torch.zeros(B, nh, T, T)
    dropped = forward(flat, None, 1.0, next_seed(9), p)
    keep = torch.ones(B, nh, T, T) if dropped is None else dropped / flat
    exact_qkv = qkv.detach().double().requires_grad_()
    q64, k64, v64 = split_heads(exact_qkv, nh)
    scores = q64 @ k64.transpose(-2, -1) / math.sqrt(hs)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    exact = ((scores.softmax(-1) * keep.double()) @ v64).transpose(1, 2).reshape(B, T, -1)
    exact.backward(grad.double())
    torch.testing.assert_close(y.double(), exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(qkv.grad.double(), exact_qkv.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("form", "p"),
    [
        pytest.param("kernel", 0.0, marks=needs_kernels),
        pytest.param("kernel", 0.25, marks=needs_kernels),
        ("torch", 0.0),  # the torch form draws its own dropout mask: checked without drops
    ],
)
@pytest.mark.parametrize(("B", "nh", "R", "T", "hs"), [(2, 3, 1, 1, 4), (3, 2, 5, 19, 8)])
def test_query_attention_equals_float64(monkeypatch, form, B, nh, R, T, hs, p):
    """Queries apart from keys and values (the last layer of sparse prediction): value and the
    gradients of q and of k, v against float64, padded keys, dropout's mask read back from the
    kernel as in the test above."""
    if form == "torch":
        monkeypatch.setattr(softmax, "softmax_dropout_kernels", lambda: None)
    kv, mask = attention_inputs(B, nh, T, hs, seed=R + T)
    kv = kv.detach()[..., : 2 * nh * hs].contiguous().requires_grad_()  # (B, T, 2H)
    q = torch.randn(B, R, nh * hs, generator=torch.Generator().manual_seed(5)).requires_grad_()
    torch.manual_seed(9)
    y = ops.query_attention(q, kv, nh, mask, p, training=True)
    assert y.shape == (B, R, nh * hs)
    grad = torch.randn(R, B, nh * hs).transpose(0, 1)  # non-contiguous incoming gradient
    y.backward(grad)

    keep = torch.ones(B, nh, R, T)
    if p > 0:
        flat = torch.zeros(B, nh, R, T)
        keep = softmax_dropout_kernels()[0](flat, None, 1.0, next_seed(9), p) / flat
    q64, kv64 = (t.detach().double().requires_grad_() for t in (q, kv))
    qh = q64.view(B, R, nh, hs).transpose(1, 2)
    k64, v64 = kv64.view(B, T, 2, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)
    scores = (qh @ k64.transpose(-2, -1) / math.sqrt(hs)).masked_fill(~mask, float("-inf"))
    exact = ((scores.softmax(-1) * keep.double()) @ v64).transpose(1, 2).reshape(B, R, -1)
    exact.backward(grad.double())
    torch.testing.assert_close(y.double(), exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q.grad.double(), q64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(kv.grad.double(), kv64.grad, atol=1e-5, rtol=1e-4)


def sdpa(qkv: torch.Tensor, nh: int, mask: torch.Tensor | None) -> torch.Tensor:
    q, k, v = split_heads(qkv, nh)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(qkv.shape[0], qkv.shape[1], -1)


@needs_kernels
def test_attention_with_every_key_padded_is_uniform_as_in_torch():
    """A sequence of padding only: torch's masked softmax over equal scores is uniform."""
    qkv, _ = attention_inputs(2, 2, 6, 4, seed=1)
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., :3] = True
    y = ops.attention(qkv.detach(), 2, mask, 0.0, training=True)
    q, k, v = split_heads(qkv.detach(), 2)
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~mask, torch.finfo(torch.float32).min)
    expected = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, -1)
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=1e-5)


def test_attention_torch_form_equals_kernel_form_without_drops(monkeypatch):
    qkv, mask = attention_inputs(3, 2, 17, 8, seed=2)
    qkv = qkv.detach()
    a = ops.attention(qkv, 2, mask, 0.0, training=True)
    monkeypatch.setattr(softmax, "softmax_dropout_kernels", lambda: None)
    b = ops.attention(qkv, 2, mask, 0.0, training=True)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(a, sdpa(qkv, 2, mask), atol=1e-6, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize(("n", "H", "inter"), [(1, 3, 1), (7, 5, 37), (64, 32, 128)])
def test_bias_gelu_equals_float64(n, H, inter):
    g = torch.Generator().manual_seed(inter)
    dense = torch.nn.Linear(H, inter)
    with torch.no_grad():
        dense.bias.copy_(torch.randn(inter, generator=g))
    x = (3 * torch.randn(2, H, n, generator=g)).transpose(1, 2).requires_grad_()  # (2, n, H)
    out = ops.dense_activation(x, dense, "gelu")
    assert out.shape == (2, n, inter)
    grad = torch.randn(2, n, inter, generator=g)
    out.backward(grad)
    x64 = x.detach().double().requires_grad_()
    w64 = dense.weight.detach().double().requires_grad_()
    b64 = dense.bias.detach().double().requires_grad_()
    exact = F.gelu(F.linear(x64, w64, b64))
    exact.backward(grad.double())
    torch.testing.assert_close(out.double(), exact, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(dense.weight.grad.double(), w64.grad, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(dense.bias.grad.double(), b64.grad, atol=2e-5, rtol=1e-4)


@needs_kernels
def test_gelu_kernel_over_its_whole_range():
    """Forward and derivative on a fine grid over [-12, 12] (tails: 0 and the identity), within
    the accuracy of torch's own fp32 GELU."""
    forward, backward = bias_gelu_kernels()
    u = torch.linspace(-12, 12, 48_003).view(3, -1)  # rows of 16,001: vector tails
    zero = torch.zeros(u.shape[1])
    exact_u = u.double().requires_grad_()
    exact = F.gelu(exact_u)
    exact.backward(torch.ones_like(exact))
    torch.testing.assert_close(forward(u, zero).double(), exact, atol=6e-7, rtol=1e-6)
    grad_x, grad_bias = backward(torch.ones_like(u), u, zero)
    torch.testing.assert_close(grad_x.double(), exact_u.grad, atol=6e-7, rtol=1e-6)
    torch.testing.assert_close(grad_bias, grad_x.sum(0), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
def test_other_activations_take_the_torch_form(act):
    dense = torch.nn.Linear(6, 10)
    x = torch.randn(4, 6, requires_grad=True)
    out = ops.dense_activation(x, dense, act)
    assert out.grad_fn is not None and "BiasGelu" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, ops.activation(act, dense(x)))


def plain_geglu(h: torch.Tensor) -> torch.Tensor:
    a, g = h.chunk(2, dim=-1)
    return F.gelu(a) * g


def saved_bytes(fn, h: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of ``fn(h)``."""
    kept: dict[int, int] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(h)
    return sum(kept.values())


@needs_kernels
@pytest.mark.parametrize(("n", "inner"), [(1, 1), (7, 37), (64, 128)])
def test_geglu_equals_the_torch_form(n, inner):
    """ModernBERT's GeGLU (gelu(first half) x second half) through :class:`ops.GeGLU`: values
    and the input gradient within 1e-6 of torch's fp32 form, on LayerNorm-scale rows (a row of
    3 x 2I, not contiguous: a transposed (2, n, 2I) batch), row tails shorter than a vector."""
    g = torch.Generator().manual_seed(inner)
    h = torch.randn(2, 2 * inner, n, generator=g).transpose(1, 2).requires_grad_()  # (2, n, 2I)
    out = ops.gated_activation(h, "gelu")
    assert out.shape == (2, n, inner)
    assert type(out.grad_fn.next_functions[0][0]).__name__ == "GeGLUBackward"
    grad = torch.randn(2, n, inner, generator=g)
    out.backward(grad)
    plain_h = h.detach().clone().requires_grad_()
    plain = plain_geglu(plain_h)
    plain.backward(grad)
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h.grad, plain_h.grad, atol=1e-6, rtol=1e-6)


@needs_kernels
def test_geglu_over_its_whole_range_keeping_only_its_input():
    """The gated half on a fine grid over [-12, 12] against float64, within torch's own fp32
    GELU accuracy, forward and both halves of the gradient; and autograd keeps the (n, 2I)
    input only (torch's form keeps gelu(a) as well: half as much again)."""
    a = torch.linspace(-12, 12, 48_003).view(3, -1)  # rows of 16,001: vector tails
    gate = torch.randn(a.shape, generator=torch.Generator().manual_seed(0))
    h = torch.cat([a, gate], dim=1).requires_grad_()  # (3, 2I)
    out = ops.gated_activation(h, "gelu")
    out.backward(torch.ones_like(out))
    h64 = h.detach().double().requires_grad_()
    exact = plain_geglu(h64)
    exact.backward(torch.ones_like(exact))
    torch.testing.assert_close(out.double(), exact, atol=6e-7 * 4, rtol=1e-6)  # |g| up to ~4
    torch.testing.assert_close(h.grad.double(), h64.grad, atol=6e-7 * 4, rtol=1e-6)
    assert saved_bytes(lambda x: ops.gated_activation(x, "gelu"), h) == h.numel() * 4
    assert saved_bytes(plain_geglu, h) == h.numel() * 4 * 3 // 2


@pytest.mark.parametrize("case", ["gelu_new", "relu", "bf16 autocast"])
def test_other_gated_activations_take_the_torch_form(case):
    h = torch.randn(4, 10, requires_grad=True)
    act = "gelu" if case == "bf16 autocast" else case
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "bf16 autocast"):
        x = h.to(torch.bfloat16) if case == "bf16 autocast" else h
        out = ops.gated_activation(x, act)
    assert "GeGLU" not in type(out.grad_fn).__name__
    assert "GeGLU" not in type(out.grad_fn.next_functions[0][0] or out.grad_fn).__name__
    a, g = x.chunk(2, dim=-1)
    torch.testing.assert_close(out, ops.activation(act, a) * g)


@needs_kernels
def test_pretraining_gradients_match_finite_differences_with_dropout(tiny_config):
    """The whole model in training mode (every fused kernel on the path, dropout 0.1 in all of
    them): the gradient along a random direction equals the central difference of the loss, with
    the same dropout masks on both evaluations (the seeds follow torch's generator)."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, tiny_config.vocab_size, (3, 12), generator=g)
    labels = torch.where(torch.rand(3, 12, generator=g) < 0.3, ids, -100)
    labels[:, 2] = ids[:, 2]
    batch = {"input_ids": ids, "labels": labels, "next_sentence_label": torch.tensor([0, 1, 0])}
    params = [p for p in model.parameters() if p.requires_grad]
    direction = [torch.randn(p.shape, generator=g) for p in params]

    def loss_at(t: float) -> float:
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.add_(d, alpha=t)
        torch.manual_seed(42)
        value = model(**batch).loss.double().item()  # with autograd: the same kernels
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.sub_(d, alpha=t)
        return value

    torch.manual_seed(42)
    model(**batch).loss.backward()
    analytic = sum((p.grad * d).sum() for p, d in zip(params, direction, strict=True)).item()
    eps = 1e-3
    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    assert abs(numeric - analytic) < 0.02 * abs(analytic) + 1e-3, (numeric, analytic)


def test_scratch_buffers_are_reused_only_when_nobody_holds_them():
    first = ops.scratch("test.buffer", (10, 5), torch.float32, "cpu")
    held = ops.scratch("test.buffer", (10, 5), torch.float32, "cpu")
    assert held.data_ptr() != first.data_ptr()  # `first` still holds its memory
    pooled = {first.data_ptr(), held.data_ptr()}
    del first, held
    # both free again: the next two (one smaller) get the same two buffers, nothing new
    again = ops.scratch("test.buffer", (9, 5), torch.float32, "cpu")
    other = ops.scratch("test.buffer", (10, 5), torch.float32, "cpu")
    assert {again.data_ptr(), other.data_ptr()} == pooled
    view = again.t()
    del again
    third = ops.scratch("test.buffer", (9, 5), torch.float32, "cpu")  # the view holds its buffer
    assert third.data_ptr() not in pooled
    del view, other, third
    # a free buffer too small is replaced; the pool never grows past the most held at once
    big = ops.scratch("test.buffer", (100, 5), torch.float32, "cpu")
    assert big.data_ptr() not in pooled
    assert len(buffers._SCRATCH[("test.buffer", torch.float32)]) == 3
    del big
    mine = ops.scratch("test.buffer", (9, 5), torch.float32, "cpu")
    assert ops.scratch("test.buffer", (9, 5), torch.float32, "cpu").data_ptr() != mine.data_ptr()
    # the MLM logits returned to a caller who keeps them are never overwritten by the next step
    x, w, b = torch.randn(4, 3), torch.randn(7, 3), torch.randn(7)
    kept = ops.DecoderLinear.apply(x, w, b)
    expected = kept.clone()
    ops.DecoderLinear.apply(2 * x, w, b)
    assert torch.equal(kept, expected)


def test_decoder_rows_are_padded_to_64_bytes_and_equal_linear():
    """The tied decoder writes its (n, V) logits into rows padded to 16 floats (BLAS is ~1.7x
    faster there than into 30522-float rows); values and gradients equal ``F.linear``'s."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 8, generator=g, requires_grad=True)
    w = torch.randn(37, 8, generator=g, requires_grad=True)
    b = torch.randn(37, generator=g, requires_grad=True)
    logits = ops.DecoderLinear.apply(x, w, b)
    assert logits.shape == (6, 37) and logits.stride() == (48, 1)
    grad = torch.randn(6, 37, generator=g)
    logits.backward(grad)
    fast = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    plain = torch.nn.functional.linear(x, w, b)
    plain.backward(grad)
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=1e-6)
    for got, t in zip(fast, (x, w, b), strict=True):
        torch.testing.assert_close(got, t.grad, atol=1e-6, rtol=1e-6)
    assert fast[1].is_contiguous()  # the tied embedding's gradient is summed into it in place


@pytest.mark.parametrize("library", ["blas", "onednn"])
def test_gemm_in_either_library_equals_float64(use_gemm_library, library):
    """``ops.gemm`` (a @ b.T + bias) in BLAS or oneDNN (``BERTFORGE_GEMM``), on the layouts the
    training step passes: contiguous rows, a transposed weight view (the input gradient), a
    bias; fp32 rounding of the float64 product."""
    from bertforge.modeling import kernels

    use_gemm_library(library)
    usable = torch.backends.mkldnn.is_available()
    assert kernels.gemm_library() == (library if usable else "blas")
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(37, 24, generator=g), torch.randn(40, 24, generator=g)
    bias, grad = torch.randn(40, generator=g), torch.randn(37, 40, generator=g)
    out = torch.empty(37, 40)
    for got, want in [
        (ops.gemm(a, w), a.double() @ w.double().t()),
        (ops.gemm(a, w, bias, out), a.double() @ w.double().t() + bias.double()),
        (ops.gemm(grad, w.t()), grad.double() @ w.double()),  # the input gradient
    ]:
        assert got.dtype == torch.float32 and got.is_contiguous()
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)


def test_gemm_library_setting_is_checked(use_gemm_library):
    from bertforge.modeling import kernels

    use_gemm_library("cublas")
    with pytest.warns(UserWarning, match="BERTFORGE_GEMM='cublas' is not one of"):
        assert kernels.gemm_library() in ("blas", "onednn")


@needs_kernels
@pytest.mark.parametrize("case", ["plain", "scaled", "logits used", "twice"])
def test_decoder_cross_entropy_equals_float64(case):
    """The tied decoder + loss in one (the gradient and the bias's written in the forward's pass
    over the logits): loss and every gradient as float64 autograd's, with the loss scaled (as
    under accumulation), with the logits also used by another loss, and run backward twice."""
    g = torch.Generator().manual_seed(4)
    n, H, V = 9, 16, 1003  # V not a multiple of the vector width: tails; rows padded
    h = torch.randn(n, H, generator=g, requires_grad=True)
    w = torch.randn(V, H, generator=g, requires_grad=True)
    b = torch.randn(V, generator=g, requires_grad=True)
    target = torch.randint(0, V, (n,), generator=g)
    extra = torch.randn(n, V, generator=g)

    def objective(loss, logits):
        total = loss * (0.5 if case == "scaled" else 1.0)
        return total + (logits * extra).mean() if case == "logits used" else total

    loss, logits = ops.decoder_cross_entropy(h, w, b, target)
    objective(loss, logits).backward(retain_graph=case == "twice")
    if case == "twice":
        for t in (h, w, b):
            t.grad = None
        objective(loss, logits).backward()
    ours = [t.grad.clone() for t in (h, w, b)]

    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, w, b))
    logits64 = h64 @ w64.t() + b64
    loss64 = F.cross_entropy(logits64, target)
    objective(loss64, logits64).backward()
    torch.testing.assert_close(loss.double(), loss64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits.double(), logits64.detach(), atol=1e-4, rtol=1e-5)
    for got, want in zip(ours, (h64.grad, w64.grad, b64.grad), strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-4)
    assert type(loss.grad_fn).__name__ == "DecoderCrossEntropyBackward"
