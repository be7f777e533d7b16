"""``bertforge prepare --workers N``: tokenising chunks of documents in N worker processes.

:func:`~bertforge.data.instances.tokenize_chunk` is the pure step (the sentences of a chunk of
documents -> token ids, long sentences cut into pieces). :class:`ChunkPool` runs it in
``workers`` processes while the main process keeps reading the corpus and building instances. Results are consumed in the order the chunks were submitted, so
everything downstream (the NSP random draws, the shard files, even the order of the skip reasons
in ``meta.json``) is the same as with one worker: the output is byte-identical.

Memory stays bounded: a worker holds one chunk (``chunk_chars`` characters and its ids) at a time
and at most ``2 * workers`` chunks are in flight; the main process waits for the oldest before
submitting more. Each worker tokenises single-threaded (``TOKENIZERS_PARALLELISM=false``): the
processes are the parallelism, N workers for N cores.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from bertforge.data.instances import TokenizedChunk, tokenize_chunk

# ---- worker processes -------------------------------------------------------------------------
_worker_backend: Any = None


def _init_worker(tokenizer_json: str) -> None:
    global _worker_backend
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: processes scale
    from tokenizers import Tokenizer as Backend

    _worker_backend = Backend.from_str(tokenizer_json)


def _tokenize_in_worker(documents: list[list[str]], limit: int) -> TokenizedChunk:
    return tokenize_chunk(_worker_backend, documents, limit)


class ChunkPool:
    """``workers`` processes tokenising chunks; results handed back in submission order.

    ``submit(documents, limit, done)`` queues a chunk; ``done(chunk)`` is called in the main
    process, strictly in submission order across all callers, when the chunk's turn comes (during
    a later ``submit`` once ``2 * workers`` chunks are in flight, or in :meth:`drain`).
    """

    def __init__(self, tokenizer_json: str, workers: int) -> None:
        # fork starts workers without re-importing torch; spawn where fork does not exist
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.workers = workers
        self._executor = ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer_json,)
        )
        self.waited = 0.0
        """Seconds the main process spent waiting for a worker's result (idle)."""
        self._pending: deque[tuple[Future, Callable[[TokenizedChunk], None]]] = deque()

    def submit(
        self, documents: list[list[str]], limit: int, done: Callable[[TokenizedChunk], None]
    ) -> None:
        while len(self._pending) >= 2 * self.workers:
            self._finish_oldest()
        self._pending.append((self._executor.submit(_tokenize_in_worker, documents, limit), done))

    def _finish_oldest(self) -> None:
        future, done = self._pending.popleft()
        start = time.perf_counter()
        chunk = future.result()
        self.waited += time.perf_counter() - start
        done(chunk)

    def drain(self) -> None:
        """Hand back every chunk still in flight, in order."""
        while self._pending:
            self._finish_oldest()

    def close(self) -> None:
        """Stop the workers (chunks still in flight are dropped: call :meth:`drain` first)."""
        for future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ChunkPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ChunkPool"]
