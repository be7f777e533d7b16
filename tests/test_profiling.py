"""``--train.profile``: the device-busy arithmetic, and a real pretraining run that traces its
own loop (plain and lagged) and writes a summary that adds up and a trace that loads."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from test_pretrain import _lagged, tiny_cfg

from bertforge.errors import BertforgeError
from bertforge.training.config import TrainConfig
from bertforge.training.pretrain import pretrain
from bertforge.training.profiling import (
    SKIP_STEPS,
    SUMMARY_FILE,
    TRACE_FILE,
    Span,
    busy_time,
    summarize,
)


def test_busy_time_is_the_union_of_spans_inside_the_window():
    window = Span(10.0, 110.0)
    assert busy_time([], window) == 0.0
    # overlapping kernels on two streams count once; a gap counts nothing
    assert busy_time([Span(20, 40), Span(30, 50), Span(60, 70)], window) == 40.0
    # spans cut at the window's edges, spans outside it ignored
    assert busy_time([Span(0, 15), Span(100, 130), Span(200, 300)], window) == 15.0
    # one span inside another
    assert busy_time([Span(20, 80), Span(30, 40)], window) == 60.0


def _event(
    name: str, start: float, end: float, device: bool = False, annotation: bool = False
) -> SimpleNamespace:
    kind = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
    return SimpleNamespace(
        name=name,
        device_type=kind,
        is_user_annotation=annotation,
        time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start),
    )


def test_summarize_divides_by_the_traced_steps():
    events = [
        _event("ProfilerStep*", 0, 10_000),
        _event("ProfilerStep*", 10_000, 20_000),
        _event("bertforge: data", 0, 1_000),
        _event("bertforge: data", 10_000, 13_000),
        _event("bertforge: launch", 1_000, 9_000),
        _event("gemm", 2_000, 8_000, device=True),
        _event("gemm", 12_000, 18_000, device=True),
        _event("memcpy", 19_000, 25_000, device=True),  # past the window: cut at 20 ms
        # a GPU trace repeats the named ranges on the device: annotations, not kernels or steps
        _event("ProfilerStep*", 0, 10_000, device=True, annotation=True),
        _event("bertforge: launch", 1_000, 9_000, device=True, annotation=True),
    ]
    summary = summarize(events)
    assert summary.steps == 2
    assert summary.step_ms == pytest.approx(10.0)
    assert summary.phase_ms == pytest.approx({"data": 2.0, "launch": 4.0})
    assert summary.device_busy_ms == pytest.approx((6 + 6 + 1) / 2)
    text = "\n".join(summary.lines(torch.device("cuda")))
    assert "device busy 6.50 ms a step (65%)" in text
    # no device kernels (a CPU run): no device line
    cpu = summarize(events[:5])
    assert cpu.device_busy_ms is None
    assert "device busy" not in "\n".join(cpu.lines(torch.device("cpu")))


def _read_summary(run) -> tuple[float, dict[str, float], str]:
    text = (run / SUMMARY_FILE).read_text()
    head = re.search(r"profiled (\d+) steps on cpu: ([\d.]+) ms a step", text)
    assert head, text[:400]
    phases = dict(
        (m[1], float(m[2])) for m in re.finditer(r"^  (\w+)\s+([\d.]+) ms", text, flags=re.M)
    )
    return float(head[2]), phases, text


@pytest.mark.parametrize("lagged", [False, True])
def test_pretrain_traces_its_own_loop(pretraining_corpus, tmp_path, monkeypatch, capfd, lagged):
    if lagged:  # the CUDA loop (read one step late, the optimizer step on its own), on the CPU
        _lagged(monkeypatch)
    traced = 3
    run = tmp_path / "run"
    result = pretrain(
        tiny_cfg(pretraining_corpus["nsp"], run, max_steps=SKIP_STEPS + traced + 3, profile=traced)
    )
    assert result["step"] == SKIP_STEPS + traced + 3  # profiling changes nothing of the run
    step_ms, phases, text = _read_summary(run)
    assert f"profiled {traced} steps" in text
    expected = {"data", "launch", "host"} | ({"optimizer"} if lagged else set())
    assert set(phases) == expected, text[:600]
    # the phases are parts of the step: together no longer than it, and the step's work is there
    assert sum(phases.values()) <= step_ms * 1.01
    assert phases["launch"] > 0.0
    assert "device busy" not in text  # a CPU run has no device kernels
    assert "aten::" in text  # the operator table follows
    trace = json.loads((run / TRACE_FILE).read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"bertforge: data", "bertforge: launch"} <= names
    assert "profiled 3 steps on cpu" in capfd.readouterr().err


def test_a_run_shorter_than_the_trace_says_so(pretraining_corpus, tmp_path, capfd):
    run = tmp_path / "run"
    pretrain(tiny_cfg(pretraining_corpus["nsp"], run, max_steps=3, profile=2))
    assert not (run / SUMMARY_FILE).exists()
    assert "the run ended before its traced steps" in capfd.readouterr().err


def test_profile_without_it_writes_nothing(pretraining_corpus, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_cfg(pretraining_corpus["nsp"], run, max_steps=SKIP_STEPS + 4))
    assert not (run / SUMMARY_FILE).exists() and not (run / TRACE_FILE).exists()


def test_a_negative_profile_is_refused():
    with pytest.raises(BertforgeError, match="--train.profile -1 must be at least 0"):
        TrainConfig(profile=-1)
