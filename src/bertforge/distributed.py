"""Data-parallel training through ``torchrun``: process-group setup from the environment it
sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), gloo on CPU and nccl on CUDA (with gloo
for the CPU-side counters the loops reduce), and the few
collectives the loops need. Without torchrun everything here degrades to a single process.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from bertforge.errors import BertforgeError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    """Global rank of this process (0 writes files and prints)."""
    world_size: int = 1
    """Number of processes."""
    local_rank: int = 0
    """Rank on this machine; selects the GPU."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError as err:
        raise BertforgeError(f"environment variable {name}={value!r} must be an integer") from err


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group torchrun describes; a no-op when WORLD_SIZE is unset or 1."""
    info = DistInfo(_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0))
    if not info.enabled or (dist.is_available() and dist.is_initialized()):
        return info
    if not dist.is_available():
        raise BertforgeError("WORLD_SIZE>1 but this torch build has no torch.distributed")
    if device.type == "cuda":
        torch.cuda.set_device(info.local_rank)
        backend = "cpu:gloo,cuda:nccl"  # loss sums and counts are float64 CPU tensors
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size)
    return info


def local_device(device: torch.device, info: DistInfo) -> torch.device:
    """One GPU per local rank; CPU/MPS unchanged."""
    if device.type == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank)
    return device


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum of ``value`` over ranks (a new tensor; the input is left alone)."""
    out = value.detach().clone()
    if _active():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def gather_object(value: object) -> list[object]:
    """Every rank's ``value``, in rank order (``[value]`` in a single process)."""
    if not _active():
        return [value]
    values: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def barrier() -> None:
    if _active():
        dist.barrier()


def wrap_ddp(model: nn.Module, device: torch.device, info: DistInfo) -> nn.Module:
    """DistributedDataParallel around ``model`` when running under torchrun, else ``model``.

    Keep a handle to the plain module: that is what gets saved and evaluated.
    """
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


_ENDED = False
"""Whether :func:`cleanup` has left a process group in this process (see :func:`ended_group`)."""


def cleanup() -> None:
    """Leave the process group: collect what still holds it first (DDP's reducer keeps a
    reference to the group, and a wrapper in a reference cycle would otherwise be freed during
    interpreter teardown, gloo's threads with it), then wait for every rank and destroy it."""
    global _ENDED
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
        _ENDED = True


def ended_group() -> bool:
    """Whether this process was a torchrun worker that has left its group. The command line ends
    such a process with ``os._exit`` once its output is flushed: interpreter teardown after a
    gloo group has aborted a worker (SIGABRT, "terminate called without an active exception")
    after its work was done and written, which torchrun reports as the run failing."""
    return _ENDED


__all__ = [
    "DistInfo",
    "all_reduce_sum",
    "barrier",
    "cleanup",
    "ended_group",
    "gather_object",
    "init_distributed",
    "local_device",
    "wrap_ddp",
]
