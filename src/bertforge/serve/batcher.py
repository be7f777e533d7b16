"""Dynamic batching: requests that arrive while the model is busy wait in one queue, and the
next forward pass takes every waiting request for the same model and route whose tokens fit
in the budget (``--max_batch_tokens``). Inference runs on worker threads, never on the event
loop, so the server keeps accepting, validating and refusing requests meanwhile.

One worker (the default) gives a lone request every core torch has. Under many concurrent
clients on a small CPU, a pass over a few short texts leaves threads waiting; ``--workers 2``
with ``--num_threads 1`` runs two passes side by side instead (measured in docs/serving.md).
``max_wait`` holds a batch open for requests on their way (Triton's queue delay).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

RunBatch = Callable[[list[Any]], Sequence[Any]]
"""Runs one forward pass over a batch's items (every job's items, in order) and returns one
result per item."""


@dataclass
class Job:
    key: Hashable
    """Jobs with equal keys (same model, route and options) may share a forward pass."""
    items: list[Any]
    tokens: int
    """Tokens of all items, counted against the batch budget."""
    run: RunBatch
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)
    counted: bool = True
    """Reported to ``on_batch`` (the metrics); the warm-up's passes are not."""


@dataclass
class BatchStats:
    """What the worker reports after each forward pass (for /metrics)."""

    requests: int
    items: int
    tokens: int
    wait_seconds: float
    """How long the batch's oldest request waited in the queue."""
    run_seconds: float


def take_batch(queue: collections.deque[Job], max_tokens: int) -> list[Job]:
    """Remove and return the next batch: the oldest job, then every later job with its key
    while the tokens fit in ``max_tokens`` (the oldest job alone may exceed it)."""
    first = queue.popleft()
    batch, total = [first], first.tokens
    kept: list[Job] = []
    while queue:
        job = queue.popleft()
        if job.key == first.key and total + job.tokens <= max_tokens:
            batch.append(job)
            total += job.tokens
        else:
            kept.append(job)
    queue.extend(kept)
    return batch


class Batcher:
    """``workers`` inference threads fed by one queue of :class:`Job`."""

    def __init__(
        self,
        max_batch_tokens: int,
        on_batch: Callable[[BatchStats], None] | None = None,
        max_wait: float = 0.0,
        workers: int = 1,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait
        self._on_batch = on_batch
        self._queue: collections.deque[Job] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"bertforge-inference-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def submit(self, key: Hashable, items: list[Any], tokens: int, run: RunBatch) -> Future:
        """Queue ``items``; the future resolves to their results (a list, in order)."""
        job = Job(key, items, tokens, run)
        with self._ready:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(job)
            self._ready.notify()
        return job.future

    def on_every_worker(self, fn: Callable[[], Any]) -> list[Any]:
        """Run ``fn`` once on each worker thread, side by side, and return what each returned
        (the warm-up: each thread allocates from a heap of its own). Call it while nothing
        else is queued: each worker then takes exactly one of these jobs, since a worker
        holding one waits for the others to hold theirs before it runs ``fn``."""
        barrier = threading.Barrier(len(self._threads))

        def run(items: list[Any]) -> list[Any]:
            barrier.wait(timeout=60)
            return [fn()]

        futures = []
        for _ in self._threads:  # each job its own key: never merged into one pass
            job = Job(object(), [None], 0, run, counted=False)
            with self._ready:
                if self._closed:
                    raise RuntimeError("the batcher is closed")
                self._queue.append(job)
                self._ready.notify()
            futures.append(job.future)
        return [result for future in futures for result in future.result()]

    def close(self) -> None:
        """Stop the worker after the batch in progress; queued jobs are cancelled."""
        with self._ready:
            self._closed = True
            for job in self._queue:
                job.future.cancel()
            self._queue.clear()
            self._ready.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                self._linger()
                if not self._queue:  # another worker took it while this one lingered
                    continue
                batch = take_batch(self._queue, self.max_batch_tokens)
            # a request whose client gave up (timeout) was cancelled: skip its work
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if batch:
                self._run(batch)

    def _linger(self) -> None:
        """Hold the next batch open for up to ``max_wait`` seconds while its tokens are under
        the budget, so requests on their way join it (called holding the lock)."""
        if self.max_wait <= 0:
            return
        deadline = time.perf_counter() + self.max_wait
        while not self._closed and self._queue:
            first = self._queue[0].key
            queued = sum(job.tokens for job in self._queue if job.key == first)
            left = deadline - time.perf_counter()
            if queued >= self.max_batch_tokens or left <= 0:
                return
            self._ready.wait(left)

    def _run(self, batch: list[Job]) -> None:
        start = time.perf_counter()
        items = [item for job in batch for item in job.items]
        try:
            results = list(batch[0].run(items))
            if len(results) != len(items):
                raise RuntimeError(f"a batch of {len(items)} items gave {len(results)} results")
        except BaseException as err:  # noqa: BLE001 - delivered to the waiting requests
            if len(batch) == 1:
                batch[0].future.set_exception(err)
            else:  # one bad request must not fail its neighbours: run each alone
                for job in batch:
                    self._run_alone(job)
            return
        if (
            self._on_batch is not None and batch[0].counted
        ):  # before the answers: a client then sees its batch
            self._on_batch(
                BatchStats(
                    requests=len(batch),
                    items=len(items),
                    tokens=sum(job.tokens for job in batch),
                    wait_seconds=start - batch[0].enqueued,
                    run_seconds=time.perf_counter() - start,
                )
            )
        offset = 0
        for job in batch:
            job.future.set_result(results[offset : offset + len(job.items)])
            offset += len(job.items)

    def _run_alone(self, job: Job) -> None:
        try:
            job.future.set_result(list(job.run(job.items)))
        except BaseException as err:  # noqa: BLE001
            job.future.set_exception(err)


__all__ = ["BatchStats", "Batcher", "Job", "take_batch"]
