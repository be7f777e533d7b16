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
length one pass holds. The time it costs is printed at start (``warmed ... in N s``).

What a first pass builds is the shape's, not the model's: oneDNN's and MKL's kernels are chosen
per shape and dtype, our C kernels compiled per signature, and a thread's arena grows to the
largest tensors it holds, all process-wide. A second model of the same sizes (two MiniLM-size
models: an encoder and a fine-tuned tagger) meets every shape already built, so its grid is not
run again: it runs each route once per length at batch 1 (its head's own small products), which
halved the warm-up of two MiniLM-size models (:func:`warm_plan`). The server says before it
starts how many passes and tokens the warm-up holds, and after each model how long it took and
about how long the rest will take.
"""

from __future__ import annotations

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


def pass_tokens(passes: Sequence[tuple[str, Any]]) -> int:
    """Tokens of a warm-up's passes (their batch x length), for the estimate said at start."""
    return sum(getattr(run, "tokens", 0) for _, run in passes)


def warm_passes(
    served: ServedModel, longest: int, limits: WarmLimits, shapes_warmed: bool = False
) -> list[tuple[str, Callable[[], Any]]]:
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

    passes: list[tuple[str, Callable[[], Any]]] = []
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
                    _call(predict_fill_mask, served.model, served.tokenizer, masked, 5, **opts),
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
                ("/tag", _call(predict_tag, served.model, served.tokenizer, texts, **opts))
            )
        if "/answer" in served.routes:  # [CLS] question ? [SEP] context [SEP]
            questions = [words(2) + " ?"] * batch
            contexts = [words(length - 6)] * batch
            passes.append(
                (
                    "/answer",
                    _call(
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
            passes.append(("/attention", _call(attention_maps, served.encoder, ids)))
        if "/attribute" in served.routes:
            chunk = max(1, limits.max_batch_tokens // length)  # as the route cuts its steps
            passes.append(
                (
                    "/attribute",
                    _call(
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
class _Pass:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    tokens: int
    """Batch x length of the texts it runs (for the estimate said at start)."""

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    texts = next((a for a in args if isinstance(a, list) and a and isinstance(a[0], str)), None)
    if texts is not None:  # a batched route: texts of about equal length
        tokens = len(texts) * (len(texts[0].split()) + 2)
    else:  # /attention, /attribute: one text of ids (x steps for /attribute)
        ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
        steps = next((a for a in args if isinstance(a, int) and not isinstance(a, bool)), 1)
        tokens = (0 if ids is None else ids.numel()) * max(1, steps)
    return _Pass(fn, args, kwargs, tokens)


def warm(served: ServedModel, longest: int, limits: WarmLimits, shapes_warmed: bool = False) -> int:
    """Run every pass of ``served``'s warm-up on this thread; returns how many ran."""
    passes = warm_passes(served, longest, limits, shapes_warmed)
    for _, run in passes:
        run()
    return len(passes)


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """``(fn(), seconds it took)``."""
    start = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - start


__all__ = [
    "LARGEST_PASS",
    "WarmLimits",
    "filler_word",
    "pass_tokens",
    "shape_signature",
    "warm_plan",
    "timed",
    "warm",
    "warm_batch_sizes",
    "warm_lengths",
    "warm_passes",
    "warm_shapes",
]
