"""The warm-up a server runs before ``/health`` says ready: each served model's inference
functions, one per route it answers, over the shapes traffic will bring, on every inference
worker thread.

Why every shape and every thread: the first pass of a new ``(batch, length)`` shape builds what
later passes of that shape reuse (kernel choices and oneDNN/MKL buffers, torch's per-shape
state), and each worker thread allocates from a glibc heap (an arena) of its own, which grows to
the largest batch that thread has run. Warmed on one short text only, a server took a minute of
traffic to build all that: its RSS grew 8% while it already said ready
(``benchmarks/soak_serve.py``, docs/reliability.md). The batcher merges requests of one route
into passes of up to ``--max_batch_tokens`` tokens, padded to their longest text (no length
buckets), so a pass may take any ``(batch, length)``: the warm-up runs lengths doubling from 8
to the longest a request may have, each at batch sizes doubling from 1 to the most texts of that
length one pass holds. The time it took is printed at the end (``warmed ... in N s``).

What a first pass builds is the shape's, not the model's: oneDNN's and MKL's kernels are chosen
per shape and dtype, our C kernels compiled per signature, and a thread's arena grows to the
largest tensors it holds, all process-wide. A second model of the same sizes (two MiniLM-size
models: an encoder and a fine-tuned tagger) meets every shape already built, so its grid is not
run again: it runs each route once per length at batch 1 (its head's own small products), which
halved the warm-up of two MiniLM-size models (:func:`warm_plan`).

In which order (:func:`warm_schedule`): first the passes a user's first requests take, one text
of up to :data:`FIRST_LENGTH` tokens on every route of every model, shortest first; then every
other pass from the smallest (batch x length) to the largest, the big merged passes of a server
under load last. ``/health`` still says ready only when every pass has run on every thread: the
order decides what is warm first, never what is left cold, so it does not bring the 200 sooner;
it makes the shapes of a user's first requests the first ones known to be warm, said in the log
and on ``/health``. The server says before it starts how many passes and tokens the warm-up
holds, once the first requests' shapes are warm and again at half the passes how long the rest
will take (:func:`time_left`), and ``/health`` answers its progress meanwhile
(:class:`WarmProgress`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bertforge.inference.explain import attention_maps
from bertforge.inference.explain import attribute as explain_attribute
from bertforge.inference.predict import classify as predict_classify
from bertforge.inference.predict import embed as predict_embed
from bertforge.inference.predict import fill_mask as predict_fill_mask
from bertforge.inference.qa import answer as predict_answer
from bertforge.inference.tagging import tag as predict_tag
from bertforge.serve.models import ServedModel

SHORTEST = 8
"""The shortest length (tokens, with [CLS] and [SEP]) the warm-up runs."""
LARGEST_PASS = 2048
"""The most tokens of one warm-up pass (``--max_batch_tokens`` when smaller). Under 32
concurrent clients of ``benchmarks/soak_serve.py`` the merged passes held up to ~2,000 tokens;
warming every length up to the full budget (16,384) took 211 s on the 2 shared cores and
2.3 times the memory the server then used under that load. A pass larger than this still
runs, and pays its first-pass costs the first time."""
ATTRIBUTION_STEPS = 32
"""Steps of the warm-up's /attribute passes: the route's default."""
FIRST_LENGTH = 64
"""The longest text (tokens, with [CLS] and [SEP]) of the requests a user sends first, whose
shapes the warm-up runs before all others: one sentence or two, one text per request."""


@dataclass(frozen=True)
class WarmLimits:
    """The server's limits that bound the shapes of a forward pass."""

    max_batch_tokens: int
    """Tokens of the largest warm-up pass: ``--max_batch_tokens``, at most
    :data:`LARGEST_PASS`."""
    max_items: int
    """Texts one merged pass may hold: requests in flight x texts per request."""
    max_attention_tokens: int
    """Longest text of /attention and /attribute (``--max_attention_tokens``)."""


def warm_lengths(longest: int, shortest: int = SHORTEST) -> list[int]:
    """Lengths doubling from ``shortest`` up to ``longest``, ``longest`` itself last
    (``[8, 16, 32, 40]`` for 40); ``[longest]`` when it is shorter than ``shortest``."""
    lengths, n = [], shortest
    while n < longest:
        lengths.append(n)
        n *= 2
    return [*lengths, longest]


def warm_batch_sizes(length: int, max_batch_tokens: int, max_items: int) -> list[int]:
    """Batch sizes doubling from 1 up to the most texts of ``length`` tokens one pass holds
    (``max_batch_tokens // length``, at most ``max_items``), that most itself last."""
    most = max(1, min(max_items, max_batch_tokens // length))
    sizes, n = [], 1
    while n < most:
        sizes.append(n)
        n *= 2
    return [*sizes, most]


def warm_shapes(longest: int, max_batch_tokens: int, max_items: int) -> list[tuple[int, int]]:
    """``(batch size, length)`` of every pass the warm-up runs for one batched route."""
    return [
        (batch, length)
        for length in warm_lengths(longest)
        for batch in warm_batch_sizes(length, max_batch_tokens, max_items)
    ]


def filler_word(served: ServedModel) -> str:
    """A word the tokenizer reads as one WordPiece, to build texts of an exact length."""
    backend = served.tokenizer.backend
    candidates = ["the", "a", *sorted(backend.get_vocab())]
    for word in candidates:
        if word.isalpha() and len(backend.encode(word).ids) == 1:
            return word
    return "[UNK]"  # no word piece at all: a special token is one token too


def shape_signature(served: ServedModel, longest: int) -> tuple[Any, ...]:
    """What the shapes of ``served``'s passes depend on: its encoder's sizes, precision,
    backend and device, and the longest text it takes. Two models with one signature run the
    same products at the same shapes."""
    c = served.model.config
    sizes = (c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_hidden_layers)
    device = served.describe()["device"]
    return (*sizes, served.options.get("precision"), served.backend, device, longest)


def warm_plan(
    models: Sequence[ServedModel], longest: Callable[[ServedModel], int]
) -> list[tuple[ServedModel, int, bool]]:
    """``(model, longest text, shapes already warmed)`` per model, in order: the first model of
    each :func:`shape_signature` runs the whole grid, a later one of the same signature only
    each route once per length (see the module docstring)."""
    seen: set[tuple[Any, ...]] = set()
    plan = []
    for served in models:
        n = longest(served)
        signature = shape_signature(served, n)
        plan.append((served, n, signature in seen))
        seen.add(signature)
    return plan


def warm_passes(
    served: ServedModel, longest: int, limits: WarmLimits, shapes_warmed: bool = False
) -> list[tuple[str, WarmPass]]:
    """``(route, pass)`` for every forward pass of ``served``'s warm-up: the inference
    function behind each of its routes, as the route calls it, at each shape
    (:func:`warm_shapes`; /attention and /attribute one text at a time, as they run). With
    ``shapes_warmed`` (a model of the same shapes ran the grid) the batched routes run once per
    length, at batch 1."""
    word = filler_word(served)
    options = served.options

    def text(length: int) -> str:  # ``length`` tokens with [CLS] and [SEP]
        return " ".join([word] * max(1, length - 2))

    def words(n: int) -> str:
        return " ".join([word] * max(1, n))

    passes: list[tuple[str, WarmPass]] = []
    shapes = (
        [(1, length) for length in warm_lengths(longest)]
        if shapes_warmed
        else warm_shapes(longest, limits.max_batch_tokens, limits.max_items)
    )
    pooling = served.declared_pooling[0] or "cls"
    for batch, length in shapes:
        opts = {**options, "batch_size": batch}
        texts = [text(length)] * batch
        if "/embed" in served.routes:
            passes.append(
                (
                    "/embed",
                    _call(
                        (batch, length),
                        predict_embed,
                        served.encoder,
                        served.tokenizer,
                        texts,
                        pooling,
                        max_length=longest,
                        **opts,
                    ),
                )
            )
        if "/fill-mask" in served.routes:
            masked = ["[MASK] " + text(length - 1)] * batch
            passes.append(
                (
                    "/fill-mask",
                    _call(
                        (batch, length),
                        predict_fill_mask,
                        served.model,
                        served.tokenizer,
                        masked,
                        5,
                        **opts,
                    ),
                )
            )
        if "/predict" in served.routes:
            half = (length - 3) // 2  # a pair: [CLS] a [SEP] b [SEP]
            firsts, pairs = (
                ([words(half)] * batch, [words(length - 3 - half)] * batch)
                if served.inputs == "pairs"
                else (texts, None)
            )
            passes.append(
                (
                    "/predict",
                    _call(
                        (batch, length),
                        predict_classify,
                        served.model,
                        served.tokenizer,
                        firsts,
                        pairs,
                        max_length=longest,
                        **opts,
                    ),
                )
            )
        if "/tag" in served.routes:
            passes.append(
                (
                    "/tag",
                    _call(
                        (batch, length), predict_tag, served.model, served.tokenizer, texts, **opts
                    ),
                )
            )
        if "/answer" in served.routes:  # [CLS] question ? [SEP] context [SEP]
            questions = [words(2) + " ?"] * batch
            contexts = [words(length - 6)] * batch
            passes.append(
                (
                    "/answer",
                    _call(
                        (batch, length),
                        predict_answer,
                        served.model,
                        served.tokenizer,
                        questions,
                        contexts,
                        top_k=3,
                        **opts,
                    ),
                )
            )
    explained = min(limits.max_attention_tokens, longest)
    for length in warm_lengths(explained):
        ids = served.tokenizer.backend.encode(text(length)).ids
        ids = torch.tensor([served.tokenizer.cls_id, *ids, served.tokenizer.sep_id])
        if served.backend == "torch":
            ids = ids.to(next(iter(served.model.parameters())).device)
        if "/attention" in served.routes:
            passes.append(("/attention", _call((1, length), attention_maps, served.encoder, ids)))
        if "/attribute" in served.routes:
            chunk = max(1, limits.max_batch_tokens // length)  # as the route cuts its steps
            passes.append(
                (
                    "/attribute",
                    _call(
                        (1, length),
                        explain_attribute,
                        served.model,
                        served.tokenizer,
                        ids,
                        None,
                        None,
                        ATTRIBUTION_STEPS,
                        chunk,
                    ),
                )
            )
    return passes


@dataclass(frozen=True)
class WarmPass:
    """One forward pass of the warm-up: an inference function and its arguments, as a route
    calls it."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batch: int
    """Texts of the pass (1 for /attention and /attribute: one text, as they run)."""
    length: int
    """Tokens of each text, with [CLS] and [SEP]."""
    tokens: int
    """Batch x length of the texts it runs (x steps for /attribute), for the estimates."""

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    @property
    def first(self) -> bool:
        """A pass of the requests a user sends first (:func:`first_request`)."""
        return first_request(self.batch, self.length)


def _call(shape: tuple[int, int], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> WarmPass:
    texts = next((a for a in args if isinstance(a, list) and a and isinstance(a[0], str)), None)
    if texts is not None:  # a batched route: texts of about equal length
        tokens = len(texts) * (len(texts[0].split()) + 2)
    else:  # /attention, /attribute: one text of ids (x steps for /attribute)
        ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
        steps = next((a for a in args if isinstance(a, int) and not isinstance(a, bool)), 1)
        tokens = (0 if ids is None else ids.numel()) * max(1, steps)
    batch, length = shape
    return WarmPass(fn, args, kwargs, batch, length, tokens)


def first_request(batch: int, length: int, first_length: int = FIRST_LENGTH) -> bool:
    """Whether a pass of ``batch`` texts of ``length`` tokens is one a user's first requests
    take: one text of at most ``first_length`` tokens."""
    return batch == 1 and length <= first_length


def warm_rank(batch: int, length: int, first_length: int = FIRST_LENGTH) -> tuple[int, int, int]:
    """Where a pass of ``batch`` texts of ``length`` tokens comes in the warm-up, lowest first:
    the first requests' passes (:func:`first_request`) shortest first, then every other pass
    from the smallest (batch x length) to the largest, the shorter texts first at one size."""
    if first_request(batch, length, first_length):
        return (0, length, 0)
    return (1, batch * length, length)


def warm_schedule(
    plan: Sequence[tuple[ServedModel, int, bool]], limits: WarmLimits
) -> list[tuple[str, WarmPass]]:
    """``(route, pass)`` of every model's warm-up (:func:`warm_plan`, :func:`warm_passes`), in
    the order they run: by :func:`warm_rank`, so every route of every model runs one short text
    before any model's large passes; at one rank, models and routes keep their order. The
    passes are those of each model's own list, every one of them: only the order changes."""
    passes = [p for served, n, done in plan for p in warm_passes(served, n, limits, done)]
    return sorted(passes, key=lambda p: warm_rank(p[1].batch, p[1].length))


def pass_tokens(passes: Sequence[tuple[str, WarmPass]]) -> int:
    """Tokens of a warm-up's passes (their batch x length), for the estimates."""
    return sum(run.tokens for _, run in passes)


def pass_cost(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(seconds a pass, seconds a token)`` fitted by least squares to ``(tokens, seconds)`` of
    the passes run so far, neither below zero. A pass pays its shape's first-pass costs and
    Python's overhead whatever its size, and its products by the token: a rate by the token
    alone, measured on the first requests' short passes, foretold 251 s for the last 4 s of
    the tiny test model's warm-up (2 busy cores), one by the pass alone would miss that a MiniLM pass of 2,048 tokens costs more
    than one of 8."""
    if not samples:
        return 0.0, 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_s = sum(s for _, s in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (s - mean_s) for t, s in samples)
    per_token = cov / var if var > 0 else 0.0
    per_pass = mean_s - per_token * mean_t
    if per_token <= 0:  # no cost by the token seen (sizes alike, or noise): by the pass
        return mean_s, 0.0
    if per_pass < 0:  # through zero: by the token
        return 0.0, sum(t * s for t, s in samples) / sum(t * t for t, _ in samples)
    return per_pass, per_token


def time_left(
    samples: Sequence[tuple[int, float]], passes_left: int, tokens_left: int
) -> float | None:
    """Seconds ``passes_left`` passes of ``tokens_left`` tokens take at :func:`pass_cost` of
    ``samples`` (None before a pass has run). Made early, on short passes only, it is rough:
    the server says it again when half the passes have run, and ``/health`` at every call."""
    if not samples:
        return None
    per_pass, per_token = pass_cost(samples)
    return per_pass * passes_left + per_token * tokens_left


class WarmProgress:
    """How far the warm-up is, summed over the inference threads that each run the whole
    schedule side by side: updated after every pass, read by ``/health`` while it answers
    503."""

    def __init__(self, schedule: Sequence[tuple[str, WarmPass]], threads: int) -> None:
        self.threads = threads
        self.passes = len(schedule) * threads
        self.tokens = pass_tokens(schedule) * threads
        self.first_passes = sum(p.first for _, p in schedule) * threads
        self.passes_done = 0
        self.tokens_done = 0
        self.first_done = 0
        self.samples: list[tuple[int, float]] = []
        """``(tokens, seconds)`` of every pass run, on any thread."""
        self.start = time.perf_counter()
        self._lock = threading.Lock()

    def done(self, run: WarmPass, seconds: float) -> str | None:
        """Count ``run`` as done in ``seconds``; ``"first"`` once, for the pass that finishes
        the first requests' shapes on every thread, ``"half"`` once, for the pass that makes
        half of all passes done, else None."""
        with self._lock:
            self.passes_done += 1
            self.tokens_done += run.tokens
            self.samples.append((run.tokens, seconds))
            if run.first:
                self.first_done += 1
                if self.first_done == self.first_passes:
                    return "first"
            return "half" if self.passes_done == self.passes // 2 else None

    @property
    def first_warm(self) -> bool:
        """Every thread ran the first requests' passes."""
        return self.first_done >= self.first_passes

    def seconds_left(self) -> float | None:
        """About how long the rest takes: each thread runs its share beside the others."""
        with self._lock:
            left = time_left(
                self.samples, self.passes - self.passes_done, self.tokens - self.tokens_done
            )
        return None if left is None else left / self.threads

    def describe(self) -> dict[str, Any]:
        """What ``/health`` says while the warm-up runs."""
        left = self.seconds_left()
        return {
            "passes": self.passes,
            "passes_done": self.passes_done,
            "tokens": self.tokens,
            "tokens_done": self.tokens_done,
            "first_requests_warm": self.first_warm,
            "seconds_left": None if left is None else round(left, 1),
        }


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """``(fn(), seconds it took)``."""
    start = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - start


__all__ = [
    "FIRST_LENGTH",
    "LARGEST_PASS",
    "WarmLimits",
    "WarmPass",
    "WarmProgress",
    "filler_word",
    "first_request",
    "pass_cost",
    "pass_tokens",
    "shape_signature",
    "time_left",
    "timed",
    "warm_batch_sizes",
    "warm_lengths",
    "warm_passes",
    "warm_plan",
    "warm_rank",
    "warm_schedule",
    "warm_shapes",
]
