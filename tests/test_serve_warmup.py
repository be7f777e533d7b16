"""The server's warm-up (bertforge.serve.warmup): the shapes it runs, that each pass really has
its shape, and that it runs on every inference worker thread without counting in /metrics."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from support.serve import tiny_models  # noqa: E402

from bertforge.serve.batcher import Batcher  # noqa: E402
from bertforge.serve.models import load_served_model  # noqa: E402
from bertforge.serve.warmup import (  # noqa: E402
    WarmLimits,
    warm_batch_sizes,
    warm_lengths,
    warm_passes,
    warm_shapes,
)


def test_warm_shapes_double_up_to_the_longest_text_and_the_token_budget():
    assert warm_lengths(40) == [8, 16, 32, 40]
    assert warm_lengths(64) == [8, 16, 32, 64]
    assert warm_lengths(5) == [5]
    assert warm_batch_sizes(32, max_batch_tokens=1000, max_items=10_000) == [1, 2, 4, 8, 16, 31]
    assert warm_batch_sizes(8, max_batch_tokens=1000, max_items=20) == [1, 2, 4, 8, 16, 20]
    assert warm_batch_sizes(600, max_batch_tokens=512, max_items=64) == [1]  # one text alone
    shapes = warm_shapes(128, max_batch_tokens=16384, max_items=128 * 64)
    assert max(b * t for b, t in shapes) == 16384  # a pass as large as the batcher makes
    assert {t for _, t in shapes} == {8, 16, 32, 64, 128}
    assert (128, 128) in shapes and (1, 128) in shapes and (2048, 8) in shapes
    assert all(b * t <= 16384 for b, t in shapes)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    return tiny_models(tmp_path_factory.mktemp("warm"))


def test_every_route_is_warmed_at_every_shape(tiny):
    limits = WarmLimits(max_batch_tokens=256, max_items=64, max_attention_tokens=16)
    for name, kind, routes in (
        ("mlm", "masked-lm", {"/embed", "/fill-mask", "/attention"}),
        ("clf", "classifier", {"/embed", "/predict", "/attention", "/attribute"}),
    ):
        served = load_served_model(name, str(tiny[name]), "cpu", "fp32")
        assert served.kind == kind
        seen: list[tuple[str, tuple[int, ...]]] = []
        route = [""]

        def record(module, args, kwargs, seen=seen, route=route):
            ids = args[0] if args else kwargs["input_ids"]
            seen.append((route[0], tuple(ids.shape)))

        hook = served.encoder.register_forward_pre_hook(record, with_kwargs=True)
        try:
            for route[0], run in warm_passes(served, 40, limits):
                run()
        finally:
            hook.remove()
        assert {r for r, _ in seen} == routes
        batched = set(warm_shapes(40, 256, 64))
        for r in routes - {"/attention", "/attribute"}:  # exactly the shapes, padded to none
            assert {s for q, s in seen if q == r} == batched, r
        explained = {s for q, s in seen if q == "/attention"}
        assert explained == {(1, t) for t in warm_lengths(16)}  # one text, its own length


def test_on_every_worker_runs_once_on_each_thread_and_is_not_a_batch():
    batches = []
    batcher = Batcher(max_batch_tokens=10, on_batch=batches.append, workers=3)
    try:
        names = batcher.on_every_worker(lambda: threading.current_thread().name)
        assert sorted(names) == [f"bertforge-inference-{i}" for i in range(3)]
        assert batches == []  # the warm-up is not reported to /metrics
        assert batcher.submit("k", ["x"], 1, lambda items: items).result(timeout=10) == ["x"]
        assert len(batches) == 1
    finally:
        batcher.close()


def test_a_model_of_shapes_already_warmed_runs_each_route_once_per_length(tiny):
    # two MiniLM-size models warmed the same grid twice (44 s to /health on 2 busy cores); the
    # kernels and arenas a first pass builds belong to the shape, not to the model
    from bertforge.serve.warmup import pass_tokens, shape_signature, warm_plan

    limits = WarmLimits(max_batch_tokens=256, max_items=64, max_attention_tokens=16)
    mlm = load_served_model("mlm", str(tiny["mlm"]), "cpu", "fp32")
    clf = load_served_model("clf", str(tiny["clf"]), "cpu", "fp32")
    assert shape_signature(mlm, 32) == shape_signature(clf, 32) != shape_signature(clf, 16)
    plan = warm_plan([mlm, clf], lambda m: 32)
    assert [(m.name, done) for m, _, done in plan] == [("mlm", False), ("clf", True)]
    assert [
        done for *_, done in warm_plan([mlm, clf], lambda m: {"mlm": 16, "clf": 32}[m.name])
    ] == [
        False,
        False,  # a longer text than the first warmed: shapes of its own
    ]
    full, light = warm_passes(clf, 32, limits), warm_passes(clf, 32, limits, shapes_warmed=True)
    batched = [r for r, _ in light if r in ("/embed", "/predict")]
    assert len(batched) == 2 * len(warm_lengths(32))  # each route once per length
    assert len(light) < len(full) and pass_tokens(light) < pass_tokens(full) / 4
    assert {r for r, _ in light} == {r for r, _ in full}  # every route still runs
