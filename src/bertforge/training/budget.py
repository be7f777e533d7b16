"""A resident-memory budget for a training run (``--max_memory``, ``train.max_memory``): the
micro-batch and evaluation batch that keep the estimated peak under it, or a one-line refusal
saying what would fit.

The estimate (docs/memory.md) is measured on the run's own model at start:

* **held**, what the process holds whatever the batch: its resident memory once the data and the
  model are loaded, plus the gradients and AdamW's two moments (12 bytes a trainable parameter
  in fp32), :data:`SLACK_BYTES`, and on a CPU in bf16 the kernels oneDNN keeps
  (:data:`KERNEL_CACHE_BYTES`);
* **per sequence**, what each sequence of a micro-batch adds at the step's peak: the tensors
  autograd keeps for the backward pass, counted (``saved_tensors_hooks``) in one forward pass
  of two and of four of the run's longest sequences, in its precision, times
  :data:`STEP_PEAK_FACTOR` for what the backward pass holds beside them (the gradients of the
  activations), plus the fp32 logits (the MLM head's 30k-wide rows at each masked token);
* an evaluation sequence, without gradients, adds a fraction of that (:data:`EVAL_SHARE`), or
  twice its fp32 logits where those are larger (the MLM head's 30k-wide rows, and their
  softmax, at each masked token), on top of the training step's peak (malloc keeps that
  memory; :meth:`MemoryUse.eval_peak`).

The pure parts (:func:`plan_batches`) are tested on numbers; :func:`saved_bytes` on a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertforge.errors import BertforgeError
from bertforge.modeling.ops import clear_scratch
from bertforge.runtime import format_bytes, release_free_memory

OPTIMIZER_BYTES_PER_PARAMETER = 12
"""A trainable fp32 parameter's gradient (4 bytes) and AdamW's two moments (8)."""

KERNEL_CACHE_BYTES = 400 * 2**20
"""What oneDNN's bounded kernel caches hold in bf16 on a CPU once full: a MiniLM adaptation
peaked 0.37 GB higher with 64 kernels kept per cache than with 4 (docs/memory.md); pretraining
keeps 32 now, and the margin stays. They fill over a run (the evaluations' shapes beside the
training steps'), not in its first steps: a 6-step run held only ~0.02 GB of them."""

STEP_PEAK_FACTOR = 2.0
"""The step's peak over the tensors saved for the backward pass (plus the logits, counted
apart): fitted on BERT-Tiny (fp32, V = 30,522: 11.3 MB a sequence of 128 tokens measured
between micro-batches 4 and 16, 4.4 MB saved); on the MiniLM adaptation (bf16: 23.8 MB
measured between micro-batches 8 and 16, 14.2 MB saved) the estimate is 29% high."""

SLACK_BYTES = 96 * 2**20
"""What a run adds to its start-up memory besides the batch: the math libraries' buffers,
malloc's slack, matplotlib for the curves at the end (BERT-Tiny: 472 MB held against 394 MB
resident at start plus its optimizer)."""

EVAL_SHARE = 0.25
"""An evaluation sequence's share of a training sequence's memory (no saved activations: one
layer's temporaries and the logits at a time)."""


@dataclass(frozen=True)
class MemoryUse:
    """The measured parts of a training process's peak."""

    held: int
    """Bytes held whatever the batch size (libraries, data, model, optimizer, kernels)."""
    per_sequence: int
    """Bytes each sequence of a micro-batch adds at a training step's peak."""
    per_eval_sequence: int
    """Bytes each sequence of an evaluation batch adds."""

    def peak(self, micro: int) -> int:
        """The estimated peak with ``micro`` sequences per forward/backward pass."""
        return self.held + micro * self.per_sequence

    def eval_peak(self, batch: int, micro: int) -> int:
        """The estimated peak while evaluating ``batch`` sequences at once in a run that trains
        ``micro`` sequences per pass: the two add up. malloc's heap keeps what the training
        steps freed (``keep_freed_memory``), while an evaluation's large tensors (above glibc's
        32 MB ``mmap`` threshold) come from fresh pages beside it: a tiny ModernBERT fine-tuned
        at 1,024 tokens peaked at 730 MB with micro-batch 8 and evaluation batch 1, 1.20-1.25 GB
        with evaluation batch 55 (docs/modernbert.md, "Long inputs")."""
        return self.peak(micro) + batch * self.per_eval_sequence


@dataclass(frozen=True)
class BatchPlan:
    """What ``--max_memory`` chose."""

    micro: int
    """Sequences per forward/backward pass (the rest of the batch is gradient accumulation)."""
    eval_batch: int
    """Sequences per evaluation batch."""
    peak: int
    """The estimated peak: an evaluation batch beside what the training steps left."""

    def describe(self, budget: int, use: MemoryUse, batch: int, option: str) -> str:
        """The start line's account of the choice."""
        return (
            f"{option} {format_bytes(budget)}: micro-batch {self.micro} "
            f"({batch // self.micro} x {self.micro} per step), evaluation batch "
            f"{self.eval_batch}; estimated peak {format_bytes(self.peak)} = "
            f"{format_bytes(use.held)} held (libraries, data, model, optimizer, kernels) + "
            f"{use.per_sequence / 2**20:.1f} MB a sequence + "
            f"{use.per_eval_sequence / 2**20:.1f} MB an evaluation sequence"
        )


def plan_batches(
    budget: int, use: MemoryUse, batch: int, micro: int, eval_batch: int, option: str
) -> BatchPlan:
    """The largest micro-batch that divides ``batch`` (the per-process batch), at most
    ``micro``, and the largest evaluation batch, at most ``eval_batch``, whose estimated peaks
    stay within ``budget`` bytes; raise, naming ``option`` and what would fit, when a single
    sequence does not."""
    fits = [d for d in range(min(micro, batch), 0, -1) if batch % d == 0]
    chosen = next((d for d in fits if use.eval_peak(1, d) <= budget), None)
    if chosen is None:
        need = use.eval_peak(1, 1)
        raise BertforgeError(
            f"{option} {format_bytes(budget)} is below this run's estimated need of "
            f"{format_bytes(need)} at micro-batch 1 ({format_bytes(use.held)} held + "
            f"{format_bytes(use.per_sequence)} a sequence, and an evaluation sequence beside "
            f"it); raise it to {format_bytes(need)} or more, or train shorter sequences or a "
            "smaller model"
        )
    # evaluation batch 1 fits beside the chosen micro-batch (chosen so)
    evals = next(b for b in range(eval_batch, 0, -1) if use.eval_peak(b, chosen) <= budget)
    return BatchPlan(chosen, evals, use.eval_peak(evals, chosen))


def over_budget(peak: int, budget: int, option: str) -> str | None:
    """What a run that finished over its budget says at the end (None within it): the estimate
    at start is a measurement of a few forward passes, and a run can go past it (the allocator's
    slack over many steps, shapes the start did not try); the user learns by how much."""
    if peak <= budget:
        return None
    over = peak - budget
    return (
        f"warning: peak memory {format_bytes(peak)} went over {option} {format_bytes(budget)} by "
        f"{format_bytes(over)} ({over / budget:.0%}), which the estimate at start missed; lower "
        f"{option} by as much to stay under {format_bytes(budget)}"
    )


def saved_bytes(forward: Callable[[], torch.Tensor], parameters: list[torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``forward()`` runs,
    parameters left out (they are held anyway), each storage counted once, as far as the saved
    tensors reach into it: a pooled scratch buffer (``ops.scratch``) kept larger by an earlier,
    bigger batch counts only what this batch uses of it. No backward runs; the graph is freed
    on return."""
    own = {p.untyped_storage().data_ptr() for p in parameters}
    seen: dict[int, int] = {}

    held: list[torch.Tensor] = []  # alive while the forward runs, as autograd would keep them

    def pack(t: torch.Tensor) -> int:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own and t.device.type != "meta":
            reach = (t.storage_offset() + t.numel()) * t.element_size()
            used = min(storage.nbytes(), max(reach, seen.get(storage.data_ptr(), 0)))
            seen[storage.data_ptr()] = used
        held.append(t)
        # an index, not ``t``: a graph node holding its own output (the attention
        # probabilities) through the hook is a reference cycle that outlived this function,
        # and the passes' activations stayed resident through the whole run (a QA run with
        # --max_memory 1GB peaked at 1.29 GB against its 1014 MB estimate)
        return len(held) - 1

    def unpack(_: int) -> torch.Tensor:
        raise RuntimeError("saved_bytes runs no backward pass")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = forward()
    del out
    held.clear()
    return sum(seen.values())


def longest_rows(encoded: Sequence[tuple[np.ndarray, int]]) -> list[int]:
    """The 4 longest of the ``(ids, label)`` training rows, longest first (ties: the later row
    first): what :func:`measure_use`'s passes of 2 and 4 sequences run on."""
    lengths = np.array([len(ids) for ids, _ in encoded])
    return np.argsort(lengths, kind="stable")[-4:][::-1].tolist()


def measure_use(
    forward: Callable[[int], torch.Tensor],
    model: torch.nn.Module,
    resident: int,
    bf16_cpu: bool,
    logits_per_sequence: int = 0,
) -> MemoryUse:
    """The :class:`MemoryUse` of training ``model``: ``forward(k)`` runs the training forward
    pass (loss) on ``k`` of the longest sequences; ``resident`` is the process's memory now;
    ``logits_per_sequence`` the output values an evaluation computes per sequence (masked
    tokens x vocabulary for MLM). The random number generators are left as they were (dropout
    draws inside)."""
    params = list(model.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    with torch.random.fork_rng(devices=[]):
        two, four = (saved_bytes(lambda k=k: forward(k), params) for k in (2, 4))
    # the passes of 2 and 4 sequences left the model's pooled buffers (ops.scratch) at 4
    # sequences' size, and what they freed in malloc's kept heap (keep_freed_memory): a QA run
    # with --max_memory 1GB (4 windows of 384 tokens measured, micro-batch 1 chosen) held them
    # through training and peaked at 1.29 GB against its 1014 MB estimate. Dropped and handed
    # back, the run holds the ``resident`` taken before the passes again.
    clear_scratch()
    release_free_memory()
    per_saved = max(four - two, 0) / 2
    per_sequence = int(per_saved * STEP_PEAK_FACTOR) + 4 * logits_per_sequence
    fixed = int(max(two - 2 * per_saved, 0))  # per forward pass whatever its size (autocast's
    # bf16 copies of the weights)
    held = resident + trainable * OPTIMIZER_BYTES_PER_PARAMETER + fixed + SLACK_BYTES
    per_eval = max(int(per_sequence * EVAL_SHARE), 2 * 4 * logits_per_sequence)
    return MemoryUse(held + (KERNEL_CACHE_BYTES if bf16_cpu else 0), per_sequence, per_eval)


__all__ = [
    "BatchPlan",
    "MemoryUse",
    "longest_rows",
    "measure_use",
    "plan_batches",
    "saved_bytes",
]
