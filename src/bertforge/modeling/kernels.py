"""Small C kernels for the CPU, built on first use with the system C compiler.

Much of a CPU training step outside the GEMMs is passes over memory that torch cannot merge:

* dropout: torch draws the mask through one Mersenne-Twister stream, then compares, casts and
  multiplies, each a pass. ``csrc/dropout.c`` draws it from a counter-based generator and scales
  in the same pass; since the mask is a pure function of (seed, position), the backward pass
  recomputes it instead of storing it.
* the MLM cross-entropy over n x 30,522 logits: torch writes the fp32 log-probabilities and
  rereads them in the backward (plus a cast for bf16 logits). ``csrc/cross_entropy.c`` keeps
  one log-sum-exp per row and writes the gradient in one pass.
* the end of each post-LN block, LayerNorm(dropout(y + bias) + residual), and its backward with
  every gradient (``csrc/layer_norm.c``); attention's scaling, key mask, softmax and dropout and
  their backward (``csrc/softmax.c``); the feed-forward's bias + exact GELU and its backward with
  the bias gradient, and ModernBERT's GeGLU, gelu(a) x g, with both halves' gradients
  (``csrc/gelu.c``): one pass each way instead of two to six. fp32 only (bf16
  autocast keeps torch's ops there).

The sources in ``csrc/`` are compiled once per source, compiler and CPU into ``$BERTFORGE_CACHE``
(default ``~/.cache/bertforge``), atomically, and loaded with ``ctypes``: no torch headers, no
build step at install time, about a second of compiling. Without a working compiler, or with
``BERTFORGE_KERNELS=0``, the getters below return None and callers use torch ops.

The vectors are one register wide for the instruction set the compiler targets (``csrc/common.h``):
16 floats with AVX-512, 8 with AVX/AVX2, 4 with SSE2 or NEON. ``-march=native`` picks the widest
this CPU runs; ``BERTFORGE_KERNEL_FLAGS`` replaces the flags (e.g. ``"-O3 -mavx2 -mfma -fopenmp"``
to build the AVX2 code on an AVX-512 machine, as the tests do), and :func:`vector_width` reports
the width the loaded library was built with.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from bertforge.runtime import cpu_flags, cpu_model, cpu_vendor

CSRC = Path(__file__).with_name("csrc")
SOURCES = sorted(CSRC.glob("*.c"))
#: flag sets tried in order: the first that compiles wins (clang on macOS lacks -fopenmp)
FLAG_SETS = (
    ["-O3", "-march=native", "-fopenmp"],
    ["-O3", "-fopenmp"],
    ["-O3"],
)
_P, _I64, _U64, _U32, _F, _INT = (
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_uint64,
    ctypes.c_uint32,
    ctypes.c_float,
    ctypes.c_int,
)
_DROPOUT = [_P, _P, _I64, _U64, _U32, _F, _INT]  # x, out, n, seed, threshold, scale, threads
_SIGNATURES = {
    "bertforge_dropout_f32": _DROPOUT,
    "bertforge_dropout_bf16": _DROPOUT,
    # x, target, lse, row_loss, n, V, ld (row stride), threads
    "bertforge_ce_forward_f32": [_P, _P, _P, _P, _I64, _I64, _I64, _INT],
    # x, target, lse, row_loss, work, n, V, ld, threads
    "bertforge_ce_forward_bf16": [_P, _P, _P, _P, _P, _I64, _I64, _I64, _INT],
    # x, target, lse, grad, n, V, ld, scale, threads
    "bertforge_ce_backward_f32": [_P, _P, _P, _P, _I64, _I64, _I64, _F, _INT],
    "bertforge_ce_backward_bf16": [_P, _P, _P, _P, _I64, _I64, _I64, _F, _INT],
    # x, target, lse, row_loss, grad, colsum, work, n, V, ld, scale, threads
    "bertforge_ce_forward_backward_f32": [_P] * 7 + [_I64, _I64, _I64, _F, _INT],
    # y (overwritten: h), bias, residual, gamma, beta, out, mean, rstd, n, H, seed, threshold,
    # scale, eps, threads
    "bertforge_add_norm_forward_f32": [_P] * 8 + [_I64, _I64, _U64, _U32, _F, _F, _INT],
    # grad_out, h, mean, rstd, gamma, grad_extra, grad_h, grad_y, grad_gamma, grad_beta,
    # grad_bias, work, n, H, seed, threshold, scale, threads
    "bertforge_add_norm_backward_f32": [_P] * 12 + [_I64, _I64, _U64, _U32, _F, _INT],
    # scores (overwritten: probs), dropped, mask, rows, T, rows_per_batch, scale, seed,
    # threshold, keep_scale, threads
    "bertforge_softmax_dropout_forward_f32": [_P] * 3 + [_I64] * 3 + [_F, _U64, _U32, _F, _INT],
    # x, bias, out, n, I, threads
    "bertforge_bias_gelu_forward_f32": [_P] * 3 + [_I64, _I64, _INT],
    # grad, x, bias, grad_x, grad_bias, work, n, I, threads
    "bertforge_bias_gelu_backward_f32": [_P] * 6 + [_I64, _I64, _INT],
    # h, out, n, I, threads
    "bertforge_geglu_forward_f32": [_P] * 2 + [_I64, _I64, _INT],
    # grad, h, grad_h, n, I, threads
    "bertforge_geglu_backward_f32": [_P] * 3 + [_I64, _I64, _INT],
    # grad (overwritten), probs, dropped, rows, T, scale, threads
    "bertforge_softmax_dropout_backward_f32": [_P] * 3 + [_I64, _I64, _F, _INT],
    "bertforge_vector_width": [],
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def cache_dir() -> Path:
    """Where built kernels go: ``$BERTFORGE_CACHE``, else ``$XDG_CACHE_HOME/bertforge``."""
    if os.environ.get("BERTFORGE_CACHE"):
        return Path(os.environ["BERTFORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bertforge"


def cpu_signature(cpuinfo: str | None = None) -> str:
    """What a build with ``-march=native`` depends on: the CPU's model name and its flags. The
    name alone is not enough: virtual machines show ``AMD EPYC`` for an AVX2-only Zen 3 and an
    AVX-512 Zen 4 alike, and a library built on one would crash on the other from a shared
    cache (a home directory on a cluster's shared disk)."""
    return f"{cpu_model(cpuinfo)}\n{' '.join(sorted(cpu_flags(cpuinfo)))}"


def flags_override() -> list[str]:
    """The flags ``BERTFORGE_KERNEL_FLAGS`` asks for (split on spaces); empty when it is unset."""
    return os.environ.get("BERTFORGE_KERNEL_FLAGS", "").split()


def flag_sets() -> list[list[str]]:
    """The compiler flag sets to try, in order: :func:`flags_override` alone when it is set, else
    :data:`FLAG_SETS`."""
    chosen = flags_override()
    return [chosen] if chosen else [list(flags) for flags in FLAG_SETS]


def _build(compiler: str) -> Path | None:
    """Compile ``SOURCES`` into the cache (once per sources, compiler, flags and CPU); None on
    failure."""
    files = sorted(CSRC.glob("*.[ch]"))  # the sources and the header they share
    tried = flag_sets()
    parts = [p.read_bytes() for p in files] + [compiler.encode(), cpu_signature().encode()]
    parts += [" ".join(flags).encode() for flags in tried]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = cache_dir() / f"kernels-{platform.machine()}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for flags in tried:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-kernels-", suffix=".so")
        os.close(fd)
        cmd = [compiler, *flags, "-shared", "-fPIC", *map(str, SOURCES), "-o", tmp, "-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=120)
            if done.returncode == 0:
                os.replace(tmp, target)  # atomic: concurrent builders (DDP ranks) race harmlessly
                return target
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return None


def _load(path: Path) -> ctypes.CDLL | None:
    """The library at ``path`` with its signatures set, or None if it is not a loadable one."""
    try:
        lib = ctypes.CDLL(str(path))  # after torch: its OpenMP runtime (libgomp.so.1) is reused
        for symbol, argtypes in _SIGNATURES.items():
            getattr(lib, symbol).argtypes = argtypes
    except (OSError, AttributeError):
        return None
    return lib


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("BERTFORGE_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    lib = None
    for _attempt in range(2):  # a damaged file in the cache is removed and built again, once
        try:
            path = _build(compiler) if compiler else None
        except OSError:
            path = None
        lib = _load(path) if path is not None else None
        if lib is not None or path is None:
            break
        path.unlink(missing_ok=True)
    if lib is None:
        flags = " ".join(flags_override())
        cause = (
            f"the compiler refused BERTFORGE_KERNEL_FLAGS={flags!r}; unset it or fix the flags"
            if flags
            else "no working C compiler; install gcc or clang"
        )
        warnings.warn(
            f"bertforge: could not build its C kernels ({cause}); training uses slower torch "
            "forms. BERTFORGE_KERNELS=0 turns them off without this warning.",
            stacklevel=3,
        )
    return lib


def vector_width() -> int | None:
    """Floats per vector in the loaded C kernels (16: AVX-512, 8: AVX/AVX2, 4: SSE2 or NEON), or
    None when they are not in use."""
    lib = _library()
    return None if lib is None else int(lib.bertforge_vector_width())


def _function(name: str, dtype: torch.dtype) -> Callable | None:
    lib = _library() if dtype in _SUFFIX else None
    return None if lib is None else getattr(lib, f"bertforge_{name}_{_SUFFIX[dtype]}")


@functools.cache
def dropout_kernel(dtype: torch.dtype) -> Callable[[Tensor, Tensor, int, float], None] | None:
    """``f(x, out, seed, p)`` writing dropout of contiguous CPU ``x`` into ``out`` (same shape and
    dtype; may be ``x`` itself), or None when no kernel serves ``dtype`` here. Element i is kept
    when the i-th 16-bit uniform of ``seed``'s stream is >= round(p * 2^16), and scaled by
    1 / (1 - p); the same seed gives the same mask at any thread count."""
    fn = _function("dropout", dtype)
    if fn is None:
        return None

    def run(x: Tensor, out: Tensor, seed: int, p: float) -> None:
        threshold = round(p * 2**16)
        scale = 1.0 / (1.0 - p)
        fn(x.data_ptr(), out.data_ptr(), x.numel(), seed, threshold, scale, _threads())

    return run


@functools.cache
def cross_entropy_kernels(
    dtype: torch.dtype,
) -> tuple[Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], Callable[..., Tensor]] | None:
    """``(forward, backward)`` for CPU (n, V) logits of ``dtype`` whose rows are contiguous
    (``stride(1) == 1``; rows may lie further apart than V, as the decoder's padded rows do) and
    (n,) int64 targets, or None when no kernel serves ``dtype`` here.

    ``forward(logits, target)`` -> ``(lse, row_loss)``, both (n,) fp32: each row's log-sum-exp
    and ``lse - logits[i, target[i]]``. ``backward(logits, target, lse, scale, out=None)`` -> the
    (n, V) gradient ``(softmax - onehot(target)) * scale`` in the logits' dtype and row layout,
    written into ``out`` when given (``out`` must have the logits' strides).
    """
    fwd, bwd = _function("ce_forward", dtype), _function("ce_backward", dtype)
    if fwd is None or bwd is None:
        return None

    def forward(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        n, V = logits.shape
        lse = torch.empty(n, dtype=torch.float32)
        row_loss = torch.empty(n, dtype=torch.float32)
        args = [logits.data_ptr(), target.data_ptr(), lse.data_ptr(), row_loss.data_ptr()]
        if dtype == torch.bfloat16:  # one fp32 row per thread to widen bf16 rows into
            work = torch.empty(_threads(), V, dtype=torch.float32)
            args.append(work.data_ptr())
        fwd(*args, n, V, _row_stride(logits), _threads())
        return lse, row_loss

    def backward(
        logits: Tensor, target: Tensor, lse: Tensor, scale: float, out: Tensor | None = None
    ) -> Tensor:
        n, V = logits.shape
        if out is None:
            out = torch.empty_strided(logits.shape, logits.stride(), dtype=logits.dtype)
        _check_strides(out, logits)
        ptrs = (logits.data_ptr(), target.data_ptr(), lse.data_ptr(), out.data_ptr())
        bwd(*ptrs, n, V, _row_stride(logits), scale, _threads())
        return out

    return forward, backward


@functools.cache
def cross_entropy_with_gradient_kernel() -> Callable[..., tuple[Tensor, Tensor, Tensor]] | None:
    """``f(logits, target, scale, out)`` for CPU fp32 (n, V) logits with contiguous rows (rows
    may lie further apart than V) and (n,) int64 targets -> ``(row_loss, grad, colsum)``: each
    row's ``lse - logits[i, target[i]]``, the gradient ``(softmax - onehot(target)) * scale``
    written into ``out`` (the logits' strides) and its (V,) column sums, in one pass over the
    logits; or None when not built here."""
    fn = _function("ce_forward_backward", torch.float32)
    if fn is None:
        return None

    def run(
        logits: Tensor, target: Tensor, scale: float, out: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, V = logits.shape
        _check_strides(out, logits)
        lse, row_loss = torch.empty(n), torch.empty(n)
        colsum, work = torch.empty(V), torch.empty(_threads(), V)
        ptrs = (logits, target, lse, row_loss, out, colsum, work)
        fn(*(t.data_ptr() for t in ptrs), n, V, _row_stride(logits), scale, _threads())
        return row_loss, out, colsum

    return run


def _check_strides(out: Tensor, logits: Tensor) -> None:
    """The loss kernels write a gradient in the logits' row layout."""
    if out.stride() != logits.stride():
        raise ValueError(f"out strides {out.stride()} differ from the logits' {logits.stride()}")


def _row_stride(logits: Tensor) -> int:
    """Elements from one row of (n, V) logits to the next (V when contiguous)."""
    if logits.stride(1) != 1 and logits.shape[1] > 1:
        raise ValueError(f"logits rows must be contiguous, got strides {logits.stride()}")
    return logits.stride(0) if logits.shape[0] > 1 else logits.shape[1]


@functools.cache
def add_norm_kernels() -> tuple[Callable[..., tuple], Callable[..., tuple]] | None:
    """``(forward, backward)`` of LayerNorm(dropout(y + bias) + residual) over contiguous fp32
    (n, H) CPU rows, or None when the kernels are not built here.

    ``forward(y, bias, residual, gamma, beta, eps, seed, p)`` -> ``(out, mean, rstd)``; ``y`` is
    overwritten with the pre-norm sum h; ``bias`` and ``residual`` may be None.
    ``backward(grad_out, h, mean, rstd, gamma, seed, p, grad_extra=None, with_bias=False)`` ->
    ``(grad_h, grad_y, grad_gamma, grad_beta, grad_bias)``: ``grad_extra`` (a gradient of h from
    elsewhere) is added into ``grad_h``, ``grad_y`` is ``grad_h`` itself when nothing is dropped
    (``p < 2^-17``), ``grad_bias`` (the column sums of ``grad_y``) None unless ``with_bias``.
    The dropout mask is the row-wise one of ``csrc/common.h``.
    """
    fwd = _function("add_norm_forward", torch.float32)
    bwd = _function("add_norm_backward", torch.float32)
    if fwd is None or bwd is None:
        return None

    def forward(
        y: Tensor,
        bias: Tensor | None,
        residual: Tensor | None,
        gamma: Tensor,
        beta: Tensor,
        eps: float,
        seed: int,
        p: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, H = y.shape
        out = torch.empty_like(y)
        mean, rstd = torch.empty(n), torch.empty(n)
        ptrs = [y.data_ptr(), _ptr(bias), _ptr(residual), gamma.data_ptr(), beta.data_ptr()]
        ptrs += [out.data_ptr(), mean.data_ptr(), rstd.data_ptr()]
        fwd(*ptrs, n, H, seed, *_drop(p), eps, _threads())
        return out, mean, rstd

    def backward(
        grad_out: Tensor,
        h: Tensor,
        mean: Tensor,
        rstd: Tensor,
        gamma: Tensor,
        seed: int,
        p: float,
        grad_extra: Tensor | None = None,
        with_bias: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        n, H = h.shape
        grad_h = torch.empty_like(h)
        drops = _drop(p)[0] > 0
        grad_y = torch.empty_like(h) if drops else grad_h
        grad_gamma, grad_beta = torch.empty(H), torch.empty(H)
        grad_bias = torch.empty(H) if with_bias else None
        work = torch.empty(_threads(), 3, H)
        ptrs = [t.data_ptr() for t in (grad_out, h, mean, rstd, gamma)]
        ptrs += [_ptr(grad_extra), grad_h.data_ptr(), grad_y.data_ptr() if drops else None]
        ptrs += [grad_gamma.data_ptr(), grad_beta.data_ptr(), _ptr(grad_bias), work.data_ptr()]
        bwd(*ptrs, n, H, seed, *_drop(p), _threads())
        return grad_h, grad_y, grad_gamma, grad_beta, grad_bias

    return forward, backward


def _ptr(t: Tensor | None) -> int | None:
    """The address of ``t``'s data, or None (NULL) for no tensor."""
    return None if t is None else t.data_ptr()


@functools.cache
def softmax_dropout_kernels() -> tuple[Callable[..., Tensor | None], Callable[..., None]] | None:
    """``(forward, backward)`` of dropout(softmax(scores * scale)) over contiguous fp32 CPU
    attention scores (B, nh, Tq, T), padded keys left out, or None when not built here.

    ``forward(scores, mask, scale, seed, p, out=None)`` overwrites ``scores`` with the
    probabilities and returns the dropped-out probabilities, written into ``out`` when given
    (None when nothing is dropped, ``p < 2^-17``);
    ``mask`` is (B, T) uint8, 1 at real keys, or None. ``backward(grad, probs, dropped, scale)`` overwrites ``grad`` (the
    gradient of the dropped probabilities) with the gradient of the scores.
    """
    fwd, bwd = (
        _function("softmax_dropout_forward", torch.float32),
        _function("softmax_dropout_backward", torch.float32),
    )
    if fwd is None or bwd is None:
        return None

    def forward(
        scores: Tensor,
        mask: Tensor | None,
        scale: float,
        seed: int,
        p: float,
        out: Tensor | None = None,
    ) -> Tensor | None:
        T = scores.shape[-1]
        rows = scores.numel() // T
        dropped = None
        if _drop(p)[0] > 0:
            dropped = torch.empty_like(scores) if out is None else out
        per_batch = rows // scores.shape[0]
        ptrs = (
            scores.data_ptr(),
            None if dropped is None else dropped.data_ptr(),
            None if mask is None else mask.data_ptr(),
        )
        fwd(*ptrs, rows, T, per_batch, scale, seed, *_drop(p), _threads())
        return dropped

    def backward(grad: Tensor, probs: Tensor, dropped: Tensor, scale: float) -> None:
        T = grad.shape[-1]
        bwd(
            grad.data_ptr(),
            probs.data_ptr(),
            dropped.data_ptr(),
            grad.numel() // T,
            T,
            scale,
            _threads(),
        )

    return forward, backward


@functools.cache
def bias_gelu_kernels() -> tuple[Callable[[Tensor, Tensor], Tensor], Callable[..., tuple]] | None:
    """``(forward, backward)`` of the exact GELU of ``x + bias`` over contiguous fp32 (n, I) CPU
    rows, or None when not built here. ``forward(x, bias, out=None)`` -> ``out`` (written into
    ``out`` when given); ``backward(grad, x, bias, into=None)`` -> ``(grad_x, grad_bias)``,
    ``grad_x`` written into ``into`` when given (which may be ``x`` itself)."""
    fwd, bwd = (_function(f"bias_gelu_{part}", torch.float32) for part in ("forward", "backward"))
    if fwd is None or bwd is None:
        return None

    def forward(x: Tensor, bias: Tensor, out: Tensor | None = None) -> Tensor:
        out = torch.empty_like(x) if out is None else out
        fwd(x.data_ptr(), bias.data_ptr(), out.data_ptr(), *x.shape, _threads())
        return out

    def backward(
        grad: Tensor, x: Tensor, bias: Tensor, into: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        grad_x = torch.empty_like(x) if into is None else into
        grad_bias = torch.empty(x.shape[1])
        work = torch.empty(_threads(), x.shape[1])
        ptrs = (grad, x, bias, grad_x, grad_bias, work)
        bwd(*(t.data_ptr() for t in ptrs), *x.shape, _threads())
        return grad_x, grad_bias

    return forward, backward


@functools.cache
def geglu_kernels() -> tuple[Callable[..., Tensor], Callable[..., Tensor]] | None:
    """``(forward, backward)`` of the exact-GELU GeGLU of contiguous fp32 (n, 2I) CPU rows
    ``h = [a | g]``, or None when not built here. ``forward(h)`` -> ``gelu(a) * g``, (n, I);
    ``backward(grad, h)`` -> the (n, 2I) gradient of ``h`` (gelu(a) recomputed from ``h``)."""
    fwd, bwd = (_function(f"geglu_{part}", torch.float32) for part in ("forward", "backward"))
    if fwd is None or bwd is None:
        return None

    def forward(h: Tensor) -> Tensor:
        n, inner = h.shape[0], h.shape[1] // 2
        out = torch.empty(n, inner, dtype=h.dtype, device=h.device)
        fwd(h.data_ptr(), out.data_ptr(), n, inner, _threads())
        return out

    def backward(grad: Tensor, h: Tensor) -> Tensor:
        grad_h = torch.empty_like(h)
        bwd(
            grad.data_ptr(),
            h.data_ptr(),
            grad_h.data_ptr(),
            h.shape[0],
            h.shape[1] // 2,
            _threads(),
        )
        return grad_h

    return forward, backward


GEMM_LIBRARIES = ("auto", "blas", "onednn")


@functools.cache
def gemm_library() -> str:
    """The library the fp32 products of the layers run in: ``"onednn"`` (torch's bundled
    oneDNN, through ``torch.ops.mkldnn._linear_pointwise``) or ``"blas"`` (``torch.mm``: MKL in
    torch's x86 wheels). ``BERTFORGE_GEMM`` = ``auto`` (default), ``blas`` or ``onednn``.
    In training, oneDNN runs the forward and input-gradient products
    (:func:`bertforge.modeling.ops.gemm`); in inference on CPUs with AVX-512, the layers'
    products with their bias and GELU or residual sum (:func:`onednn_for_inference`).

    ``auto`` picks oneDNN on AMD CPUs, where MKL runs its generic code path (the
    ``mkl_blas_def_*`` kernels) and oneDNN's JIT kernels are 15-50% faster on the step's shapes
    (fp32 on an AMD EPYC Zen 4: 4096 x 256 x 1024 at 205-211 GFLOP/s against 139-163), and BLAS
    elsewhere. The choice depends on the CPU only, never on a timing, so that a resumed run
    computes with the same library as the run it continues."""
    choice = os.environ.get("BERTFORGE_GEMM", "auto").strip().lower() or "auto"
    if choice not in GEMM_LIBRARIES:
        warnings.warn(
            f"BERTFORGE_GEMM={choice!r} is not one of {', '.join(GEMM_LIBRARIES)}; using auto",
            stacklevel=2,
        )
        choice = "auto"
    usable = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    if choice == "auto":
        choice = "onednn" if cpu_vendor() == "AuthenticAMD" else "blas"
    return "onednn" if choice == "onednn" and usable else "blas"


def onednn_for_inference() -> bool:
    """Whether inference runs the layers' fp32 products in oneDNN (with their bias and GELU or
    residual sum in the same call, :func:`bertforge.modeling.ops.onednn_linear`): where
    :func:`gemm_library` picks oneDNN and the CPU has AVX-512. Same-process A/B on an AMD EPYC
    Zen 4 (``benchmarks/ab_step.py --case encode``: MiniLM, full windows, fp32): 1.047-1.050x
    natively; 0.915-0.973x with oneDNN and MKL held to AVX2 (an AVX2-only EPYC's code), so
    there MKL keeps them."""
    return gemm_library() == "onednn" and _has_avx512()


@functools.cache
def _has_avx512() -> bool:
    return "avx512f" in cpu_flags()


def _drop(p: float) -> tuple[int, float]:
    """(threshold, scale) of dropout with probability ``p`` in [0, 1): keep a 16-bit uniform
    when it is >= threshold, and scale the kept values."""
    return round(p * 2**16), 1.0 / (1.0 - p)


def _threads() -> int:
    return torch.get_num_threads()


__all__ = [
    "add_norm_kernels",
    "bias_gelu_kernels",
    "geglu_kernels",
    "cache_dir",
    "cross_entropy_kernels",
    "cross_entropy_with_gradient_kernel",
    "dropout_kernel",
    "flag_sets",
    "gemm_library",
    "onednn_for_inference",
    "softmax_dropout_kernels",
    "vector_width",
]
