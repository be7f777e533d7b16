"""The C dropout kernel (bertforge.kernels): built for real with the system compiler, its mask a
function of (seed, position) only, independent across positions, and a torch fallback when it
cannot be built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from bertforge.modeling.kernels import dropout_kernel, vector_width
from bertforge.runtime import cpu_flags

pytestmark = pytest.mark.usefixtures("two_threads")  # the kernels' threaded paths
HAVE_COMPILER = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))


@pytest.fixture
def kernel32():
    if not HAVE_COMPILER:
        pytest.skip("no C compiler on this machine")
    kernel = dropout_kernel(torch.float32)
    assert kernel is not None, "a C compiler is present, so the kernel must build"
    return kernel


def run(kernel, x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    out = torch.empty_like(x)
    kernel(x, out, seed, p)
    return out


def test_mask_depends_on_seed_and_position_only(kernel32):
    x = torch.randn(10_000)
    a = run(kernel32, x, 123, 0.25)
    assert torch.equal(a, run(kernel32, x, 123, 0.25))  # same seed, same mask
    assert not torch.equal(a, run(kernel32, x, 124, 0.25))
    # element i's fate does not depend on the length (tails of partial blocks included) ...
    for n in (1, 3, 255, 257, 1000):
        assert torch.equal(run(kernel32, x[:n].clone(), 123, 0.25), a[:n])
    # ... nor on the thread count, and the output may overwrite the input
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(run(kernel32, x, 123, 0.25), a)
    finally:
        torch.set_num_threads(threads)
    y = x.clone()
    kernel32(y, y, 123, 0.25)
    assert torch.equal(y, a)
    kept = a != 0
    torch.testing.assert_close(a[kept], x[kept] / 0.75)


def test_drops_are_independent_across_positions(kernel32):
    """Four uniforms come from one 64-bit word (positions j, j+64, j+128, j+192 of a 256-block):
    pairs of positions, neighbours or word-mates, are dropped together with probability p^2."""
    p, n = 0.5, 1 << 20
    dropped = run(kernel32, torch.ones(n), 7, p) == 0
    for lag in (1, 64, 128, 192, 256):
        both = (dropped[:-lag] & dropped[lag:]).float().mean().item()
        assert abs(both - p * p) < 0.005, (lag, both)  # sd ~ 0.0004 at n = 1e6
    # the 16-bit uniforms are uniform: the drop rate follows p across its range
    for q in (0.01, 0.3, 0.9):
        rate = (run(kernel32, torch.ones(n), 8, q) == 0).float().mean().item()
        assert abs(rate - q) < 0.004, (q, rate)


def test_bf16_kernel_rounds_like_torch_and_keeps_nan():
    if not HAVE_COMPILER:
        pytest.skip("no C compiler on this machine")
    kernel = dropout_kernel(torch.bfloat16)
    assert kernel is not None
    x = torch.randn(5000).to(torch.bfloat16)
    x[17] = float("nan")
    out = run(kernel, x, 99, 0.1)
    kept = out != 0
    expected = (x.float() * (1 / 0.9)).to(torch.bfloat16)  # fp32 product, rounded to nearest
    assert kept[17] and out[17].isnan()
    assert torch.equal(out[kept & ~x.isnan()], expected[kept & ~x.isnan()])
    rate = 1 - kept.float().mean().item()
    assert abs(rate - 0.1) < 0.03


@pytest.mark.slow
def test_built_into_the_cache_once_and_switched_off_by_env(tmp_path):
    """A fresh process builds the library into $BERTFORGE_CACHE; a damaged cached library is
    built again; BERTFORGE_KERNELS=0 and a missing compiler both give the torch fallback (the
    latter with a warning), and dropout still works."""
    if not HAVE_COMPILER:
        pytest.skip("no C compiler on this machine")
    script = textwrap.dedent(
        """
        import warnings, torch
        from bertforge.modeling.kernels import dropout_kernel, vector_width
        from bertforge.modeling.ops import dropout
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kernel = dropout_kernel(torch.float32)
        y = dropout(torch.ones(1000), 0.5, True)
        named = any("BERTFORGE_KERNEL_FLAGS=" in str(w.message) for w in caught)
        print(kernel is not None, len(caught), int((y == 0).sum()) in range(380, 620), named)
        """
    )

    def child(**env: str) -> str:
        full = {**os.environ, "BERTFORGE_CACHE": str(tmp_path / "cache"), **env}
        done = subprocess.run(
            [sys.executable, "-c", script], env=full, capture_output=True, text=True, check=True
        )
        return done.stdout.split("\n")[-2]

    assert child() == "True 0 True False"
    built = list((tmp_path / "cache").glob("kernels-*.so"))
    assert len(built) == 1 and not list((tmp_path / "cache").glob(".tmp-*"))
    stamp = built[0].stat().st_mtime_ns
    assert child() == "True 0 True False"  # loaded, not rebuilt
    assert built[0].stat().st_mtime_ns == stamp
    assert child(BERTFORGE_KERNELS="0") == "False 0 True False"
    built[0].write_bytes(b"\x7fELF damaged by a crash")  # a damaged cache entry: rebuilt, once
    assert child() == "True 0 True False"
    assert built[0].read_bytes()[:4] == b"\x7fELF" and built[0].stat().st_size > 1000
    missing = str(tmp_path / "no-such-compiler")
    shutil.rmtree(tmp_path / "cache")
    assert child(CC=missing) == "False 1 True False"
    # flags the compiler refuses: the torch forms, and a warning that names the variable
    assert child(BERTFORGE_KERNEL_FLAGS="-O3 --no-such-flag") == "False 1 True True"


def test_the_default_build_uses_the_widest_vectors_this_cpu_runs(kernel32):
    if os.environ.get("BERTFORGE_KERNEL_FLAGS") or os.uname().machine != "x86_64":
        pytest.skip("the default flags on x86")
    widths = [width for _, width in _widths_this_cpu_runs()]
    assert vector_width() == max(widths)


def _widths_this_cpu_runs() -> list[tuple[str, int]]:
    """(compiler flags, floats per vector) of every vector width of csrc/common.h this CPU can
    execute: SSE2 (x86-64's baseline) always, AVX2 and AVX-512 when /proc/cpuinfo lists them."""
    flags = cpu_flags()
    if not flags:
        return []
    widths = [("-O3 -fopenmp", 4)]
    if {"avx2", "fma"} <= flags:
        widths.append(("-O3 -mavx2 -mfma -fopenmp", 8))
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"} <= flags:
        widths.append(("-O3 -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -fopenmp", 16))
    return widths


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86 Linux")
@pytest.mark.parametrize("flags,width", _widths_this_cpu_runs())
def test_every_vector_width_this_cpu_runs_passes_the_kernel_tests(tmp_path, flags, width):
    """The kernels are written once for vectors of 4, 8 or 16 floats (SSE2, AVX2, AVX-512) and
    ``-march=native`` picks one, so a CPU tests only its own width. Here each width the CPU can
    execute is built with BERTFORGE_KERNEL_FLAGS and must pass the float64 tests of every kernel:
    an AVX-512 machine checks the AVX2 code that AVX2-only CPUs (most laptops) run."""
    if not HAVE_COMPILER:
        pytest.skip("no C compiler on this machine")
    env = {**os.environ, "BERTFORGE_CACHE": str(tmp_path), "BERTFORGE_KERNEL_FLAGS": flags}
    probe = "from bertforge.modeling.kernels import vector_width; print(vector_width())"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == [str(width)], done.stderr[-2000:]
    here = os.path.dirname(__file__)
    files = [os.path.join(here, name) for name in ("test_fused_kernels.py", "test_kernels.py")]
    cmd = [sys.executable, "-m", "pytest", *files, "-m", "not slow", "-k", "not widest_vectors"]
    cmd += ["-p", "no:cacheprovider"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-500:]
    assert len(list(tmp_path.glob("kernels-*.so"))) == 1  # built with these flags, nothing else
