"""Batches for pretraining: a rank-aware resumable sampler, a masking collator, a loader.

Typical use in a training loop (one process per rank)::

    ds = PretrainingDataset(data_dir, "train", tokenizer)
    sampler = PretrainingSampler(len(ds), global_batch_size=256, rank=rank, world_size=world,
                                 seed=seed, lengths=ds.lengths, bucket_window=50)
    collator = PretrainingCollator(tokenizer, mlm_probability=0.15, seed=seed)
    loader = PretrainingLoader(ds, sampler, collator)
    loader.load_state_dict(state["data"])          # on resume: jumps straight to the position
    batches = iter(loader)                          # endless: epochs follow each other
    batch = next(batches)                           # this rank's share of one global step
    state["data"] = loader.state_dict()

- :class:`PretrainingSampler` yields, per global step, this rank's slice
  ``global_batch[rank::world_size]`` of the global batch's example indices. Each epoch is a
  fresh permutation drawn from (seed, epoch); optional length bucketing sorts by length within a
  window of global batches and shuffles the batches of the window (deterministic, the same on
  every rank). Its state is (epoch, step_in_epoch): resume restores the position directly.
- :class:`PretrainingCollator` pads to the longest sequence of the batch and masks with random
  numbers derived from (seed, epoch, example index, position) (see
  :func:`~bertforge.data.masking.counter_uniforms`), so masks are independent of batching,
  rank and padding. With ``split_pairs`` (objective mlm_contrastive) each masked sentence pair
  then becomes two single-segment rows, linked by ``partner`` (:func:`split_pairs`).
- :func:`steps` yields each optimizer step's micro-batches with the sampler position after
  them; on a GPU the loops draw them through :func:`prefetch` (a thread one step ahead) and
  :func:`pinned` memory, so that the host's collating overlaps the device's step.
- :func:`validation_batches` iterates a validation set in order with the fixed epoch
  :data:`VALIDATION_EPOCH`: its masks are fixed once, comparable across evaluations and runs.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from bertforge.data.masking import IGNORE_LABEL, counter_uniforms_np, mask_tokens
from bertforge.errors import BertforgeError

T = TypeVar("T")

VALIDATION_EPOCH = -1
"""Epoch number used for validation masks (never a training epoch)."""


class PretrainingSampler:
    """Global-batch sampler for one rank; endless over epochs; resumable by (epoch, step)."""

    def __init__(
        self,
        num_examples: int,
        global_batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        lengths: Sequence[int] | np.ndarray | None = None,
        bucket_window: int = 0,
    ) -> None:
        if global_batch_size % world_size:
            raise BertforgeError(
                f"global batch size {global_batch_size} is not divisible by world size "
                f"{world_size}; choose a multiple of {world_size}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if num_examples < (global_batch_size if drop_last else 1):
            raise BertforgeError(
                f"the data set has {num_examples} examples, fewer than one global batch of "
                f"{global_batch_size}; lower the batch size or prepare more data"
            )
        if bucket_window and lengths is None:
            raise ValueError("length bucketing (bucket_window > 0) needs lengths")
        self.num_examples, self.global_batch_size = num_examples, global_batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.bucket_window = bucket_window
        self._epoch, self._step = 0, 0
        self._cached: tuple[int, np.ndarray] | None = None

    @property
    def steps_per_epoch(self) -> int:
        n, b = self.num_examples, self.global_batch_size
        return n // b if self.drop_last else -(-n // b)

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._epoch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "step_in_epoch": self._step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._epoch, self._step = int(state["epoch"]), int(state["step_in_epoch"])

    def epoch_order(self, epoch: int) -> np.ndarray:
        """All global batches of an epoch as a (steps, global_batch_size) array (last may be -1 padded)."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, epoch])
        n, b = self.num_examples, self.global_batch_size
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        steps = self.steps_per_epoch
        order = (
            order[: steps * b]
            if self.drop_last
            else np.pad(order, (0, steps * b - n), constant_values=-1)
        )
        batches = order.reshape(steps, b)
        if self.bucket_window and self.lengths is not None:
            batches = self._bucket(batches, rng)
        self._cached = (epoch, batches)
        return batches

    def _bucket(self, batches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = []
        for start in range(0, len(batches), self.bucket_window):
            window = batches[start : start + self.bucket_window].reshape(-1)
            real = window[window >= 0]
            real = real[np.argsort(self.lengths[real], kind="stable")]
            window = np.concatenate([real, window[window < 0]]).reshape(-1, self.global_batch_size)
            out.append(window[rng.permutation(len(window))])
        return np.concatenate(out)

    def batch_indices(self, epoch: int, step: int) -> list[int]:
        """This rank's example indices at (epoch, step)."""
        global_batch = self.epoch_order(epoch)[step]
        return [int(i) for i in global_batch[self.rank :: self.world_size] if i >= 0]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            if self._step >= self.steps_per_epoch:
                self._epoch, self._step = self._epoch + 1, 0
            indices = self.batch_indices(self._epoch, self._step)
            self._step += 1  # the state now points at the next batch
            yield indices


class PretrainingCollator:
    """Pads examples to the longest in the batch and masks them; see the module docstring.

    ``tokenizer`` is a :class:`~bertforge.tokenizer.Tokenizer` (or anything with ``vocab_size``,
    ``pad_id``, ``mask_id``, ``special_ids`` and, for whole-word masking, ``is_continuation``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        mlm_probability: float = 0.15,
        replace_probs: tuple[float, float, float] = (0.8, 0.1, 0.1),
        whole_word: bool = False,
        max_predictions: int | None = None,
        seed: int = 0,
        split_pairs: bool = False,
    ) -> None:
        self.vocab_size = int(tokenizer.vocab_size)
        self.pad_id, self.mask_id = int(tokenizer.pad_id), int(tokenizer.mask_id)
        special = sorted({int(i) for i in tokenizer.special_ids} | {self.pad_id, self.mask_id})
        is_special = np.zeros(self.vocab_size, dtype=bool)
        is_special[special] = True
        self.is_special = is_special
        self.candidate_ids = np.flatnonzero(~is_special)
        self.is_continuation = (
            np.asarray(tokenizer.is_continuation, dtype=bool) if whole_word else None
        )
        self.mlm_probability, self.replace_probs = mlm_probability, tuple(replace_probs)
        self.max_predictions, self.seed = max_predictions, seed
        self.split_pairs = split_pairs

    def pad(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack examples padded to the longest; no masking."""
        lengths = np.array([len(e["input_ids"]) for e in examples])
        B, T = len(examples), int(lengths.max())
        real = np.arange(T)[None, :] < lengths[:, None]  # (B, T), row-major like the concatenation
        ids = np.full((B, T), self.pad_id, dtype=np.int64)
        types = np.zeros((B, T), dtype=np.int64)
        ids[real] = np.concatenate([e["input_ids"] for e in examples])
        types[real] = np.concatenate([e["token_type_ids"] for e in examples])
        nsp = np.array([int(e.get("next_sentence_label", -1)) for e in examples], dtype=np.int64)
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "token_type_ids": torch.from_numpy(types),
            "next_sentence_label": torch.from_numpy(nsp),
        }

    def __call__(
        self, examples: Sequence[dict[str, Any]], indices: Sequence[int], epoch: int
    ) -> dict[str, torch.Tensor]:
        """Collate and mask; ``indices`` are the examples' data-set indices (they seed the masks)."""
        batch = self.pad(examples)
        ids = batch["input_ids"].numpy()
        special = self.is_special[ids] | (batch["attention_mask"].numpy() == 0)
        word_starts = None if self.is_continuation is None else ~self.is_continuation[ids]
        masked, labels = mask_tokens(
            batch["input_ids"],
            special,
            rate=self.mlm_probability,
            mask_token_id=self.mask_id,
            vocab_size=self.vocab_size,
            replace_probs=self.replace_probs,
            uniforms=counter_uniforms_np(self.seed, epoch, indices, ids.shape[1]),
            word_starts=word_starts,
            max_predictions=self.max_predictions,
            candidate_ids=self.candidate_ids,
        )
        batch["input_ids"], batch["labels"] = masked, labels
        return split_pairs(batch, self.pad_id) if self.split_pairs else batch


def split_pairs(batch: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """A masked batch of sentence pairs ``[CLS] A [SEP] B [SEP]`` as single segments: each pair
    becomes the rows ``[CLS] A [SEP]`` and ``[CLS] B [SEP]`` (segment 0, B's [CLS] unlabelled),
    masks and labels kept. ``partner`` (rows,) is the other row of an IsNext pair (two chunks of
    one document) and -1 for the halves of a random-next pair and for rows without a second
    segment (packed sequences stay as they are). Replaces ``next_sentence_label``."""
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    real = batch["attention_mask"].numpy().astype(bool)
    second = (batch["token_type_ids"].numpy() == 1) & real
    is_next = batch["next_sentence_label"].numpy() == 0
    rows_ids: list[np.ndarray] = []
    rows_labels: list[np.ndarray] = []
    partner: list[int] = []
    for r in range(ids.shape[0]):
        first = real[r] & ~second[r]
        if not second[r].any():
            rows_ids.append(ids[r, first])
            rows_labels.append(labels[r, first])
            partner.append(-1)
            continue
        n = len(rows_ids)
        rows_ids += [ids[r, first], np.concatenate([ids[r, :1], ids[r, second[r]]])]
        rows_labels += [
            labels[r, first],
            np.concatenate([np.array([IGNORE_LABEL]), labels[r, second[r]]]),
        ]
        partner += [n + 1, n] if is_next[r] else [-1, -1]
    lengths = np.array([len(x) for x in rows_ids])
    B, T = len(rows_ids), int(lengths.max())
    keep = np.arange(T)[None, :] < lengths[:, None]
    new_ids = np.full((B, T), pad_id, dtype=np.int64)
    new_labels = np.full((B, T), IGNORE_LABEL, dtype=np.int64)
    new_ids[keep] = np.concatenate(rows_ids)
    new_labels[keep] = np.concatenate(rows_labels)
    return {
        "input_ids": torch.from_numpy(new_ids),
        "attention_mask": torch.from_numpy(keep.astype(np.int64)),
        "token_type_ids": torch.zeros(B, T, dtype=torch.int64),
        "labels": torch.from_numpy(new_labels),
        "partner": torch.tensor(partner, dtype=torch.int64),
    }


def fetch(dataset: Any, indices: Sequence[int]) -> list[Any]:
    """The examples at ``indices``: the dataset's batched ``__getitems__`` where it has one."""
    many = getattr(dataset, "__getitems__", None)
    return many(indices) if many is not None else [dataset[i] for i in indices]


class PretrainingLoader:
    """Dataset + sampler + collator: ``iter(loader)`` yields collated batches, endlessly.

    ``state_dict()`` / ``load_state_dict()`` save and restore the sampler's position; since the
    masks are a function of (seed, epoch, index), nothing else is needed for an exact resume.
    """

    def __init__(self, dataset: Any, sampler: PretrainingSampler, collator: PretrainingCollator):
        self.dataset, self.sampler, self.collator = dataset, sampler, collator

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for indices in self.sampler:
            epoch = self.sampler.epoch  # the batch just drawn belongs to this epoch
            yield self.collator(fetch(self.dataset, indices), indices, epoch)

    def micro_batches(self, micro: int) -> Iterator[list[dict[str, torch.Tensor]]]:
        """One optimizer step per item, endlessly: this process's share of the global batch as
        consecutive micro-batches of at most ``micro`` sequences, each collated on its own (padded
        to its longest sequence; the masks are the same as in one batch). ``epoch`` is the epoch
        of the step just drawn."""
        for indices in self.sampler:
            epoch = self.sampler.epoch
            parts = [indices[i : i + micro] for i in range(0, len(indices), micro)]
            yield [self.collator(fetch(self.dataset, rows), rows, epoch) for rows in parts]


@dataclass
class Step:
    """One optimizer step's data: this process's micro-batches, and where the sampler stands
    after them (what a checkpoint saves, carried with the batches so that a loader working
    ahead of the loop, :func:`prefetch`, saves the right position)."""

    batches: list[dict[str, torch.Tensor]]
    position: dict[str, int]
    """The sampler's ``state_dict()`` after this step: resuming from it draws the next step."""
    epoch: int
    """The epoch this step's batches belong to."""


def steps(loader: PretrainingLoader, micro: int) -> Iterator[Step]:
    """:meth:`PretrainingLoader.micro_batches` with each step's position and epoch."""
    for parts in loader.micro_batches(micro):
        yield Step(parts, loader.state_dict(), loader.epoch)


def pinned(step: Step) -> Step:
    """``step`` with its tensors in page-locked memory, which a GPU copies from asynchronously
    (``.to(device, non_blocking=True)``); ``step`` itself where no GPU is present."""
    if not torch.cuda.is_available():
        return step
    batches = [{k: v.pin_memory() for k, v in b.items()} for b in step.batches]
    return Step(batches, step.position, step.epoch)


def with_masked_rows(step: Step, static_rate: float | None = None) -> Step:
    """``step`` with each micro-batch's ``masked_rows`` (:func:`rows_for`), found on the host
    ahead of the step."""
    batches = [b | {"masked_rows": rows_for(b["labels"], static_rate)} for b in step.batches]
    return Step(batches, step.position, step.epoch)


def rows_for(labels: torch.Tensor, static_rate: float | None = None) -> torch.Tensor:
    """The rows the sparse MLM head scores: :func:`masked_rows`, or with ``static_rate`` (the
    masking rate, for a compiled model) a count that stays put (:func:`static_masked_rows`)."""
    return masked_rows(labels) if static_rate is None else static_masked_rows(labels, static_rate)


def masked_rows(labels: torch.Tensor) -> torch.Tensor:
    """The positions of ``labels`` (flattened) that are not ignored: the rows the sparse MLM head
    scores, in row-major order (``labels.flatten() != -100``'s ``nonzero``)."""
    return (labels.flatten() != IGNORE_LABEL).nonzero().squeeze(1)


STATIC_ROWS_MULTIPLE = 64
"""What :func:`static_masked_rows` rounds its count up to (whole tensor-core tiles)."""


def static_masked_rows(labels: torch.Tensor, rate: float) -> torch.Tensor:
    """:func:`masked_rows` of a (B, T) batch masked at ``rate``, followed by unlabelled positions
    (label -100: [CLS], [SEP], words left as they are) up to a count that is the same for every
    batch of this shape: ``B * ceil(rate * T)`` (each row's masking budget is ``rate`` times its
    maskable tokens, at most T) rounded up to :data:`STATIC_ROWS_MULTIPLE`. A compiled model
    then sees one shape (one graph, no recompiling), and its loss ignores the added rows
    (``masked_lm``). A batch with more (whole words can overshoot a row's budget) gets its own
    count, rounded up alike."""
    flat = labels.flatten()
    rows = masked_rows(labels)
    B, T = labels.shape
    bound = max(B * math.ceil(rate * T), rows.numel())
    extra = -(-bound // STATIC_ROWS_MULTIPLE) * STATIC_ROWS_MULTIPLE - rows.numel()
    free = (flat == IGNORE_LABEL).nonzero().squeeze(1)
    if extra == 0 or free.numel() == 0:  # (every position labelled: no row to add)
        return rows
    return torch.cat([rows, free.repeat(-(-extra // free.numel()))[:extra]])


def prefetch(
    items: Iterator[T], prepare: Callable[[T], T] | None = None, depth: int = 2
) -> Iterator[T]:
    """``items`` drawn (and ``prepare``d) by a background thread up to ``depth`` ahead, so that
    collating and masking the next step overlaps the device's work on this one. For a GPU;
    on the CPU the loops draw inline (the thread would take a core from the step). An error in
    the thread is raised here, at the item it stopped at."""
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def fill() -> None:
        try:
            for item in items:
                item = prepare(item) if prepare is not None else item
                while not stop.is_set():
                    try:
                        out.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            out.put((done, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            out.put((done, err))

    worker = threading.Thread(target=fill, name="bertforge-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, err = out.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()


def validation_batches(
    dataset: Any,
    collator: PretrainingCollator,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    max_examples: int | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's validation batches in order (examples ``rank::world_size``), fixed masks."""
    n = len(dataset) if max_examples is None else min(len(dataset), max_examples)
    mine = list(range(rank, n, world_size))
    for start in range(0, len(mine), batch_size):
        indices = mine[start : start + batch_size]
        yield collator(fetch(dataset, indices), indices, VALIDATION_EPOCH)
