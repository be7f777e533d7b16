"""The state behind the routes: the served models, the batcher, the limits' checks and the
readiness. Every request is checked here on the event loop (model, route, sizes) before it
reaches the inference thread, so a bad one costs microseconds and an answer that names what is
wrong; the inference itself goes through the :class:`~bertforge.serve.batcher.Batcher`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from bertforge.data.encoding import encode_examples
from bertforge.errors import BertforgeError
from bertforge.io import pause_point
from bertforge.runtime import release_free_memory
from bertforge.serve.batcher import Batcher, BatchStats, RunBatch
from bertforge.serve.config import ServeConfig
from bertforge.serve.limits import ApiError
from bertforge.serve.metrics import Metrics
from bertforge.serve.models import ServedModel
from bertforge.serve.schemas import Pair, Texts
from bertforge.serve.warmup import (
    LARGEST_PASS,
    WarmLimits,
    WarmProgress,
    pass_tokens,
    timed,
    warm_plan,
    warm_schedule,
)

TRIM_SECONDS = 1.0
"""How often the server hands free memory back to the kernel (:func:`release_free_memory`): a
trim costs 0.2-2.5 ms of one core, and at 10 s the server held about 80 MiB more in a
10-minute soak (docs/reliability.md)."""

LoadModels = Callable[[], dict[str, ServedModel]]
"""Loads the served models (name -> model), called once on a thread of its own."""


class Server:
    """The state behind the routes: models, limits, batcher, metrics, readiness."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.models: dict[str, ServedModel] = {}
        self.default = ""
        self.metrics = Metrics()
        self.batcher: Batcher | None = None
        self.ready = False
        """Every model is loaded and warmed up: /health answers 200."""
        self.warming: WarmProgress | None = None
        """The warm-up's progress, once it has begun (/health says it while it answers 503)."""
        self.load_error: BaseException | None = None
        self.draining = False
        """Shutting down: /health answers 503 while the requests in flight are answered."""
        self._stopped = threading.Event()

    def load(self, load: LoadModels, on_failure: Callable[[BaseException], None] | None) -> None:
        """Load the models, warm them up (so requests pay no first-pass costs, :meth:`warm`),
        then serve them; a failure goes to ``on_failure`` and the server stays unready."""
        try:
            models = load()
            if not models:
                raise BertforgeError("bertforge serve: give at least one --model DIR")
            pause_point("serve-loaded")  # lets a test stop the server as the models load
            if self.stopping():  # a signal came while the models loaded: no warm-up
                print("stopped while loading the models: not serving", file=sys.stderr, flush=True)
                return
            if not self.warm(models):  # a signal stopped the server during its warm-up
                return
            pause_point("serve-ready")  # lets a test see /health while loading
            self.models, self.default = models, next(iter(models))
            self.ready = True
        except BaseException as err:  # noqa: BLE001 - reported; the command then exits
            if self.stopping() and not isinstance(err, BertforgeError):
                return  # the stop closed what the warm-up ran on: a stop, not a failure
            self.load_error = err
            if on_failure is not None:
                on_failure(err)

    def stopping(self) -> bool:
        """A signal asked the server to stop, or it has stopped."""
        return self.draining or self._stopped.is_set()

    def warm(self, models: dict[str, ServedModel]) -> bool:
        """Run every model's warm-up (:mod:`~bertforge.serve.warmup`) on every inference
        worker, the first requests' shapes first, before /health says ready; say on stderr
        what it holds, how long the rest will take and how long it took, and on /health how
        far it is (:attr:`warming`). A stop asked meanwhile (SIGTERM while loading) ends it
        after the pass in progress, so the process exits at once instead of warming a model
        it will not serve: False then."""
        assert self.batcher is not None
        config = self.config
        limits = WarmLimits(
            max_batch_tokens=min(config.max_batch_tokens, LARGEST_PASS),
            max_items=config.max_concurrent_requests * config.max_client_batch_size,
            max_attention_tokens=config.max_attention_tokens,
        )
        plan = warm_plan(list(models.values()), lambda m: self.length_limit(m)[0])
        schedule = warm_schedule(plan, limits)
        workers = config.workers
        progress = self.warming = WarmProgress(schedule, workers)
        first = [p for _, p in schedule if p.first]
        threads = f"{workers} inference thread{'s' if workers > 1 else ''}"
        models_said = f"{len(models)} model{'s' if len(models) > 1 else ''}"
        print(
            f"warming up {models_said} before /health says ready: {len(schedule)} passes, "
            f"{pass_tokens(schedule):,} tokens of the shapes requests may take, on each of "
            f"{threads}; the first requests' shapes first (one text of up to "
            f"{max((p.length for p in first), default=0)} tokens on every route: {len(first)} "
            "passes)"
            + (
                f" ({sum(done for _, _, done in plan)} of the same sizes as one before: its "
                "shapes are built, each route runs once per length)"
                if any(done for _, _, done in plan)
                else ""
            ),
            file=sys.stderr,
            flush=True,
        )

        def each() -> int:
            passes = warm_schedule(plan, limits)  # this thread's own
            for k, (_, run) in enumerate(passes):
                if self.stopping():
                    return k
                took = time.perf_counter()
                run()
                pause_point("serve-warm-pass")  # lets a test stop the server mid-warm-up
                event = progress.done(run, time.perf_counter() - took)
                if event is None:
                    continue
                spent = time.perf_counter() - progress.start
                what = "the first requests' shapes" if event == "first" else "half the passes"
                print(
                    f"warmed {what} in {spent:.1f} s; about {progress.seconds_left() or 0:.0f} s "
                    "left",
                    file=sys.stderr,
                    flush=True,
                )
            return len(passes)

        passes, seconds = timed(lambda: self.batcher.on_every_worker(each)[0])
        if self.stopping():
            print(
                f"stopped during the warm-up ({passes} of {len(schedule)} passes done in "
                f"{seconds:.1f} s): not serving",
                file=sys.stderr,
                flush=True,
            )
            return False
        print(
            f"warmed {models_said} in {seconds:.1f} s ({passes} passes of the shapes requests "
            f"may take, on each of {threads})",
            file=sys.stderr,
            flush=True,
        )
        return True

    def begin_draining(self) -> None:
        """A signal asked the server to stop: /health answers 503 from now on."""
        self.draining = True

    def start(self) -> None:
        self.batcher = Batcher(
            self.config.max_batch_tokens,
            self._on_batch,
            self.config.batch_wait_ms / 1000,
            self.config.workers,
        )
        self._stopped.clear()
        threading.Thread(target=self._trim, name="bertforge-trim", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self.batcher is not None:
            self.batcher.close()

    def _trim(self) -> None:
        # found by benchmarks/soak_serve.py: under 32 clients for 10 minutes the server's RSS
        # grew by 65% without it, by 12% with it every 10 s (docs/reliability.md)
        while not self._stopped.wait(TRIM_SECONDS):
            release_free_memory()

    def _on_batch(self, s: BatchStats) -> None:
        self.metrics.batch(s.requests, s.items, s.tokens, s.wait_seconds, s.run_seconds)

    # ---- checks ----
    def model(self, name: str | None, route: str, wrong_kind: int = 422) -> ServedModel:
        """The served model a request names (the default when it names none), refused with a
        404 when it is not served and with ``wrong_kind`` (422 on our routes; TEI's routes
        answer 424, its status for a model of another type) when ``route`` is not one of its."""
        name = name or self.default
        served = self.models.get(name)
        if served is None:
            raise ApiError(
                404, f"model {name!r} is not served; served: {', '.join(self.models)}", "model"
            )
        if route not in served.routes:
            need = {"/fill-mask": "masked-lm", "/predict": "classifier", "/attribute": "classifier"}
            needed = need.get(route, "PyTorch")  # /attention of an ONNX Runtime model
            raise ApiError(
                wrong_kind,
                f"model {name!r} is {_a(served.kind)} model: {route} needs {_a(needed)} model"
                f" ({', '.join(n for n, m in self.models.items() if route in m.routes) or 'none'}"
                " served)",
                "model" if wrong_kind == 422 else "backend",
            )
        return served

    def top_k(self, requested: int | None, default: int) -> int:
        """The request's ``top_k``, checked against --max_top_k; left out, the route's
        ``default`` capped at that limit (a client never sent a value to refuse)."""
        limit = self.config.max_top_k
        top_k = min(default, limit) if requested is None else requested
        if not 1 <= top_k <= limit:
            raise ApiError(422, f"top_k={top_k} must be between 1 and --max_top_k={limit}")
        return top_k

    def texts(self, inputs: Texts | list[Pair]) -> list[Any]:
        """The request's texts (or ``(text, text_pair)`` pairs) as a list, checked: not empty,
        valid Unicode, at most --max_client_batch_size of them."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if not texts:
            raise ApiError(422, "inputs is empty; send a text or a list of texts")
        noun = "pair" if isinstance(texts[0], tuple) else "text"
        for i, item in enumerate(texts):
            for text in item if isinstance(item, tuple) else (item,):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as err:  # JSON may escape a lone surrogate: "\ud800"
                    raise ApiError(
                        422,
                        f"{noun} {i + 1} is not valid Unicode ({err.reason} at character "
                        f"{err.start}); send UTF-8 text",
                    ) from err
        self.check_batch_size(len(texts), noun)
        return texts

    def check_batch_size(self, count: int, noun: str = "text") -> None:
        """At most --max_client_batch_size texts (or pairs, or token-id lists) per request."""
        limit = self.config.max_client_batch_size
        if count > limit:
            raise ApiError(
                413,
                f"{count} {noun}s in one request exceed --max_client_batch_size={limit}; "
                "split the request",
                "max-client-batch-size",
            )

    def check_pairing(self, served: ServedModel, paired: bool, route: str) -> None:
        """A model fine-tuned on text pairs takes pairs only, one fine-tuned on single texts
        takes texts only (one ``bertforge finetune`` did not write takes either)."""
        columns = served.pair_columns
        if columns and not paired:
            a, b = columns
            fix = (
                f'send "inputs": [["<{a}>", "<{b}>"], ...] (a list of two texts is two texts, '
                "not one pair)"
                if route == "/predict"
                else f'{route} explains one pair: send "inputs": ["<{a}>", "<{b}>"]'
            )
            raise ApiError(
                422, f"model {served.name!r} was fine-tuned on text pairs ({a!r} + {b!r}): {fix}"
            )
        if paired and served.inputs == "texts":
            column = served.finetuned.get("text_column") or "text"
            one = '"<text>"' if route == "/attribute" else '"<text>" or ["<text>", ...]'
            raise ApiError(
                422,
                f"model {served.name!r} was fine-tuned on single texts ({column!r}), not pairs: "
                f'send "inputs": {one}',
            )

    def length_limit(self, served: ServedModel) -> tuple[int, str]:
        if served.max_length < self.config.max_input_length:
            return served.max_length, f"model {served.name!r}'s max_position_embeddings"
        return self.config.max_input_length, "--max_input_length"

    def lengths(
        self,
        served: ServedModel,
        texts: Sequence[Any],
        truncate: bool,
        *,
        field: str | None = None,
    ) -> list[int]:
        """Token counts (with [CLS] and [SEP], for a ``(text, text_pair)`` pair of both and
        three specials); a text or pair over the limit is a 413 naming it (and, for a body
        without ``truncate`` such as OpenAI's, the ``field`` it came in)."""
        limit, name = self.length_limit(served)
        paired = bool(texts) and isinstance(texts[0], tuple)
        lengths = _token_counts(served, texts)
        for i, n in enumerate(lengths):
            if n > limit and not truncate:
                hint = "" if name.startswith("model") or field else " or send truncate: true"
                raise ApiError(
                    413,
                    f"{'pair' if paired else 'text'} {i + 1} is {n} tokens long, more than "
                    f"{name}={limit}; shorten it{hint}",
                    "max-input-length",
                    param=field,
                )
        return [min(n, limit) for n in lengths]

    def explained_ids(
        self, served: ServedModel, inputs: str | Pair, max_tokens: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """Ids, token types (None for one text) and whether cut, of what /attention and
        /attribute explain."""
        paired = not isinstance(inputs, str)
        self.texts([inputs] if paired else inputs)  # valid Unicode
        limit = min(self.config.max_attention_tokens, served.max_length)
        least = 4 if paired else 2  # [CLS] a [SEP] b [SEP] keeps a token of a text
        if max_tokens is not None and not least <= max_tokens <= limit:
            raise ApiError(
                422,
                f"max_tokens={max_tokens} must be between {least} and {limit}"
                + (" for a pair" if paired else ""),
            )
        ids, types, n = _cut_ids(served, inputs, max_tokens or limit)
        if max_tokens is None and n > limit:
            raise ApiError(
                413,
                f"the {'pair' if paired else 'text'} is {n} tokens long, more than "
                f"--max_attention_tokens={limit} (attention grows with the square of the "
                "length); shorten it or send max_tokens",
                "max-attention-tokens",
            )
        return ids, types, n > len(ids)

    # ---- inference ----
    async def run(self, key: Hashable, items: list[Any], tokens: int, fn: RunBatch) -> list[Any]:
        assert self.batcher is not None
        future = self.batcher.submit(key, items, tokens, fn)
        try:
            return await asyncio.wrap_future(future)
        except BertforgeError as err:
            raise ApiError(422, str(err)) from err


def _token_counts(served: ServedModel, items: Sequence[Any]) -> list[int]:
    """Tokens each text takes with [CLS] and [SEP], or each ``(text, text_pair)`` pair with
    both texts and its three specials, uncut."""
    backend = served.tokenizer.backend
    if items and isinstance(items[0], tuple):
        firsts = backend.encode_batch([a for a, _ in items])
        seconds = backend.encode_batch([b for _, b in items])
        return [len(a.ids) + len(b.ids) + 3 for a, b in zip(firsts, seconds, strict=True)]
    return [len(e.ids) + 2 for e in backend.encode_batch(list(items))]


def _cut_ids(
    served: ServedModel, inputs: str | Pair, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(T,) ids of ``[CLS] text [SEP]`` cut to ``max_tokens``, None for token types, and the
    tokens the whole text takes; for a pair ``[CLS] a [SEP] b [SEP]`` (the longer text cut
    first, as fine-tuning cuts a pair, each text keeping its first tokens) and its (T,) token
    types, 1 from ``b`` on."""
    tok = served.tokenizer
    if isinstance(inputs, str):
        ids = tok.backend.encode(inputs).ids
        full = len(ids) + 2
        ids = [tok.cls_id, *ids[: max_tokens - 2], tok.sep_id]
        return torch.tensor(ids, dtype=torch.long), None, full
    a, b = inputs
    ((pair_ids, len_a),) = encode_examples(tok, [a], [b], max_length=max_tokens)
    ids = torch.tensor(pair_ids, dtype=torch.long)
    types = (torch.arange(len(ids)) >= len_a).long()  # (T,) 0 on [CLS] a [SEP], 1 on b [SEP]
    return ids, types, _token_counts(served, [(a, b)])[0]


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a classifier", "an encoder"."""
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


__all__ = ["LoadModels", "Server", "TRIM_SECONDS"]
