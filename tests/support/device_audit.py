"""A stand-in accelerator for tests without one: tensors that say they live on another device
(``meta``) while their numbers sit in CPU memory, and a dispatch mode that audits every operation
run on them.

The model and the training step see ``x.device.type == "meta"``, so they take the paths they
take on a GPU (no C kernels, no CPU buffer pools); the numbers are still computed (on the CPU,
under the mode), so data-dependent code (``nonzero``, ``.item()``) runs as it would on a GPU.
:class:`DeviceAudit` records

* ``mixed``: operations that met a tensor of the stand-in device and a CPU tensor of one or more
  dimensions (what raises "Expected all tensors to be on the same device" on a GPU; a 0-dim CPU
  tensor is a scalar there, as in torch), each also raised as :class:`DeviceMixing`;
* ``created_on_cpu``: operations that produced a CPU tensor of one or more dimensions (a buffer
  that should have followed its inputs to the device);
* ``syncs``: operations that make the host wait for the device (``.item()``, ``bool()``,
  ``nonzero``, a copy to the CPU).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("meta")
"""The device the stand-in tensors report."""

_SYNCING = {
    torch.ops.aten._local_scalar_dense.default: ".item() / bool() / float()",
    torch.ops.aten.nonzero.default: "nonzero (a data-dependent shape)",
    torch.ops.aten.masked_select.default: "masked_select (a data-dependent shape)",
}


class DeviceMixing(RuntimeError):
    """An operation met tensors of two devices (as CUDA's "Expected all tensors to be on the
    same device")."""


class OnDevice(torch.Tensor):
    """A tensor reporting :data:`DEVICE` whose data is the CPU tensor ``inner``; operate on it
    only inside :class:`DeviceAudit`."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> OnDevice:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=DEVICE,
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # type: ignore[override]
        return f"OnDevice({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        raise RuntimeError(f"{func} on an OnDevice tensor outside DeviceAudit")


def _unwrap(x: Any) -> Any:
    return x.inner if isinstance(x, OnDevice) else x


def _is_fake(device: Any) -> bool:
    return device is not None and torch.device(device) == DEVICE


class DeviceAudit(TorchDispatchMode):
    """Runs operations on :class:`OnDevice` tensors and records what a GPU would object to."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []
        self.created_on_cpu: list[str] = []
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        fake = [t for t in flat if isinstance(t, OnDevice)]
        cpu = [
            t
            for t in flat
            if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice) and t.dim() > 0
        ]
        if fake and cpu:  # a GPU refuses this: so does the stand-in
            shapes = ", ".join(str(tuple(t.shape)) for t in cpu)
            self.mixed.append(f"{func}: CPU tensor(s) {shapes} beside {DEVICE} ones")
            raise DeviceMixing(f"Expected all tensors to be on the same device: {self.mixed[-1]}")
        if fake and func in _SYNCING:
            self.syncs.append(_SYNCING[func])
        inner_args, inner_kwargs = tree_map(_unwrap, args), tree_map(_unwrap, kwargs)
        on_fake = bool(fake)
        if _is_fake(kwargs.get("device")):  # a factory (or a copy) asked for the device
            inner_kwargs["device"] = torch.device("cpu")
            on_fake = True
        elif kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu":
            if fake:
                self.syncs.append(f"{func} to the CPU")
            on_fake = False
        out = func(*inner_args, **inner_kwargs)
        same = {id(t.inner): t for t in fake}  # in-place and out= results: the same objects

        def wrap(o: Any) -> Any:
            if not isinstance(o, torch.Tensor):
                return o
            if id(o) in same:
                return same[id(o)]
            if on_fake:
                return OnDevice(o)
            if o.dim() > 0 and o.device.type == "cpu":
                self.created_on_cpu.append(f"{func} -> CPU {tuple(o.shape)}")
            return o

        return tree_map(wrap, out)

    def reset(self) -> None:
        """Forget what was recorded (e.g. the set-up's own copies)."""
        self.mixed.clear()
        self.created_on_cpu.clear()
        self.syncs.clear()

    def report(self) -> str:
        lines = [f"mixed: {m}" for m in self.mixed]
        lines += [f"created on the CPU: {c}" for c in self.created_on_cpu]
        return "\n".join(lines)


def to_fake_device(model: nn.Module) -> nn.Module:
    """Move ``model``'s parameters and buffers onto the stand-in device (in place; tied weights
    stay tied). Call inside :class:`DeviceAudit`."""
    moved: dict[int, Any] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or isinstance(param, OnDevice):
                continue
            if id(param) not in moved:
                moved[id(param)] = nn.Parameter(
                    OnDevice(param.detach().clone()), requires_grad=param.requires_grad
                )
            module._parameters[name] = moved[id(param)]
        for name, buf in list(module._buffers.items()):
            if buf is not None and not isinstance(buf, OnDevice):
                module._buffers[name] = OnDevice(buf.clone())
    return model


def to_cpu(x: torch.Tensor) -> torch.Tensor:
    """The CPU data of a stand-in tensor (no audit needed), or ``x`` itself."""
    return x.inner if isinstance(x, OnDevice) else x
