"""Per-step buffers: :func:`scratch`, large buffers pooled per name and reused once nobody
holds them (no page faults), :func:`padded_rows` (rows padded to 64 bytes) and ``_laid_out``
(a contiguous copy in a scratch buffer). The pool is this module's state, one per process.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

# Large per-step buffers (the MLM logits and their gradient, each layer's feed-forward and q/k/v
# activations: MBs to tens of MBs each) come back from glibc as fresh pages every step: freed at
# the end of a step, the top of the heap is returned to the kernel, and the next step's first
# touch of each page faults (~7,000 faults, ~25 ms of the mini fp32 step on an AMD EPYC Zen 4;
# keeping the heap, a process-wide malloc setting, made the step ~4% faster). Buffers taken
# from :func:`scratch` are kept and handed out again once no tensor holds them any more: a pool
# per name, as long as the most buffers of that name alive at once (one per layer for an
# activation autograd saves, one for a gradient the layers take turns with).
_SCRATCH: dict[tuple[str, torch.dtype], list[Tensor]] = {}


_SCRATCH_LOCK = threading.Lock()


def scratch(
    name: str,
    shape: tuple[int, ...] | torch.Size,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Tensor:
    """An uninitialised tensor of ``shape``, ``dtype`` on ``device`` (the device of the tensors
    it will meet: no default, so that no caller gets CPU memory by omission) for the per-step
    buffer ``name``. On the CPU: the memory of a buffer of that name that no tensor holds any
    more (checked by the storage's reference count), else a new allocation (1/8 larger, for
    batches that vary) kept for the next calls; a free buffer too small for ``shape`` is
    replaced. Elsewhere a plain ``torch.empty``: a GPU's caching allocator already reuses
    freed blocks without page faults."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    with _SCRATCH_LOCK:
        pool = _SCRATCH.setdefault((name, dtype), [])
        free = [i for i, buf in enumerate(pool) if _unshared(buf)]
        fits = [i for i in free if pool[i].numel() >= numel]
        if fits:
            buf = pool[fits[0]]
        else:
            buf = torch.empty(numel + numel // 8, dtype=dtype)
            if free:
                pool[free[0]] = buf
            else:
                pool.append(buf)
        return buf[:numel].view(shape)


def clear_scratch() -> None:
    """Drop the pooled buffers (those no tensor holds stay allocated only as long as their
    holders): after passes of a size the run will not take again, e.g. the larger batches that
    measure a memory budget, whose buffers would otherwise stay pooled at that size."""
    with _SCRATCH_LOCK:
        _SCRATCH.clear()


def _padded(width: int, multiple: int = 16) -> int:
    """``width`` rounded up to a multiple of ``multiple`` elements (16 floats = 64 bytes)."""
    return -(-width // multiple) * multiple


def padded_rows(
    name: str,
    shape: tuple[int, int] | torch.Size,
    ld: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Tensor:
    """A :func:`scratch` (n, V) view on ``device`` whose rows start ``ld`` >= V elements apart."""
    n, V = shape
    return scratch(name, (n, ld), dtype, device)[:, :V]


def _unshared(buf: Tensor) -> bool:
    """Whether ``buf`` (held by the scratch table) is the only tensor on its storage."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # a torch without it: never reuse
        return False
    return use_count(buf.untyped_storage()._cdata) <= 2  # buf + the temporary storage object


def _laid_out(name: str, x: Tensor) -> Tensor:
    """``x.contiguous()`` in the :func:`scratch` buffer ``name``."""
    return scratch(name, x.shape, x.dtype, x.device).copy_(x)


__all__ = ["clear_scratch", "scratch", "padded_rows"]
