"""Checks the fused operators share: which tensors the CPU-tuned torch forms and the fp32 C
kernels take, a kernel's dropout seed, and whether activations may be overwritten in place
(inference); C side: ``csrc/common.h``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _seed() -> int:
    """A kernel's dropout seed, drawn from torch's generator (``torch.manual_seed`` reproduces it)."""
    return int(torch.randint(0, 2**62, (1,)).item())


def cpu_tuned(*tensors: Tensor) -> bool:
    """Whether the torch forms tuned for the CPU's memory take these tensors: the :func:`scratch`
    pools, the decoder's padded rows (:class:`DecoderLinear`), the summed embedding gradient
    (:class:`WordEmbedding`). True on the CPU only; each of them is also correct on any device
    (``tests/test_devices.py`` forces them onto another one), but a GPU gains nothing from
    them. The C kernels ask :func:`_fp32_cpu`, which tests the memory itself."""
    return all(t.device.type == "cpu" for t in tensors)


def _fp32_cpu(*tensors: Tensor) -> bool:
    """Whether the fp32 CPU kernels may take these tensors (and no graph is being compiled)."""
    if torch.compiler.is_compiling():
        return False
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def autograd_free(*tensors: Tensor) -> bool:
    """True when no gradient is being recorded (inference) and ``tensors`` share one dtype (no
    autocast mixing): intermediate buffers may then be reused in place."""
    return not torch.is_grad_enabled() and len({t.dtype for t in tensors}) == 1


__all__ = ["cpu_tuned", "autograd_free"]
