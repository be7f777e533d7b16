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
    WarmPass,
    WarmProgress,
    pass_cost,
    time_left,
    warm_batch_sizes,
    warm_lengths,
    warm_passes,
    warm_plan,
    warm_rank,
    warm_schedule,
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


def first_requests_first(passes) -> bool:
    """Every pass of one text of up to 64 tokens (shortest first) before any other pass."""
    firsts = [p.first for _, p in passes]
    cut = firsts.index(False) if False in firsts else len(firsts)
    lengths = [p.length for _, p in passes[:cut]]
    return not any(firsts[cut:]) and lengths == sorted(lengths)


def test_the_first_requests_shapes_rank_before_every_larger_pass():
    shapes = warm_shapes(128, max_batch_tokens=2048, max_items=64)
    ranked = sorted(shapes, key=lambda s: warm_rank(*s))
    assert ranked[:4] == [(1, 8), (1, 16), (1, 32), (1, 64)]  # one sentence or two, shortest first
    sizes = [b * t for b, t in ranked[4:]]
    assert sizes == sorted(sizes) and ranked[-1][0] * ranked[-1][1] == 2048  # largest last
    assert (1, 128) in ranked[4:]  # a long text is not a first request
    # the order before: every batch size of 8 tokens, then of 16, ...: (64, 8) before (1, 16)
    assert shapes.index((64, 8)) < shapes.index((1, 16))
    assert sorted(ranked) == sorted(shapes)  # only the order changes


def test_the_warm_up_runs_every_models_first_requests_before_any_large_pass(tiny):
    # issue 53: two models warmed one after the other, the first one's largest passes before
    # the second one's first text; now one short text on every route of every model comes first
    limits = WarmLimits(max_batch_tokens=256, max_items=64, max_attention_tokens=16)
    mlm = load_served_model("mlm", str(tiny["mlm"]), "cpu", "fp32")
    clf = load_served_model("clf", str(tiny["clf"]), "cpu", "fp32")
    plan = warm_plan([mlm, clf], lambda m: 64)
    before = [p for served, n, done in plan for p in warm_passes(served, n, limits, done)]
    schedule = warm_schedule(plan, limits)
    assert not first_requests_first(before)
    assert first_requests_first(schedule)

    def key(route, p):
        return route, p.fn, id(p.args[0]), p.batch, p.length, p.tokens

    assert sorted(map(str, (key(*p) for p in schedule))) == sorted(
        map(str, (key(*p) for p in before))
    )  # every pass of before, none left out: /health still waits for all of them
    models = {id(mlm.model), id(mlm.encoder), id(clf.model), id(clf.encoder)}
    every_route = {(r, id(p.args[0])) for r, p in before}
    assert {id(p.args[0]) for _, p in before} <= models
    cut = [p.first for _, p in schedule].index(False)
    assert {(r, id(p.args[0])) for r, p in schedule[:cut]} == every_route
    assert schedule[0][1].length == 8 and schedule[-1][1].batch * schedule[-1][1].length == 256


def test_the_time_left_is_fitted_by_the_pass_and_by_the_token():
    # a rate by the token alone, taken on the first requests' short passes, said "about 251 s
    # left" for the tiny model's last 4 s; passes of a fixed cost and a cost by the token
    assert time_left([], 10, 1000) is None
    line = [(t, 0.01 + 0.001 * t) for t in (8, 16, 32, 64)]
    per_pass, per_token = pass_cost(line)
    assert per_pass == pytest.approx(0.01) and per_token == pytest.approx(0.001)
    assert time_left(line, 2, 4096) == pytest.approx(2 * 0.01 + 4.096)
    flat = [(8, 0.05), (16, 0.04), (32, 0.05), (64, 0.04)]  # overhead only: by the pass
    assert pass_cost(flat) == (pytest.approx(0.045), 0.0)
    steep = [(8, 0.0), (64, 0.1)]  # the line crosses below zero: through zero, by the token
    per_pass, per_token = pass_cost(steep)
    assert per_pass == 0.0 and per_token == pytest.approx(6.4 / (64 + 4096))
    assert pass_cost([(8, 0.2)]) == (0.2, 0.0)


def test_warm_progress_counts_every_thread_and_says_the_time_left():
    def fake(batch: int, length: int) -> tuple[str, WarmPass]:
        return "/embed", WarmPass(lambda: None, (), {}, batch, length, batch * length)

    schedule = [fake(1, 8), fake(1, 16), fake(4, 8), fake(8, 16)]
    progress = WarmProgress(schedule, threads=2)
    assert progress.tokens == 2 * (8 + 16 + 32 + 128) and progress.passes == 8
    assert progress.describe()["seconds_left"] is None and not progress.first_warm
    said = [progress.done(run, 0.01) for _ in range(2) for _, run in schedule[:2]]
    assert said == [None, None, None, "first"]  # once, when the last thread has them warm
    assert progress.first_warm
    assert progress.seconds_left() == pytest.approx(4 * 0.01 / 2)  # 4 passes, 2 threads
    assert [progress.done(run, 0.02) for _, run in schedule[2:]] == [None, None]
    state = progress.describe()
    assert state["tokens_done"] == 2 * 8 + 2 * 16 + 32 + 128 < state["tokens"]
    assert state["passes_done"] == 6 and state["first_requests_warm"]
    assert state["seconds_left"] >= 0
