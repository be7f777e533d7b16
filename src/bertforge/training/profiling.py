"""``--train.profile N``: where a pretraining step's time goes, from inside the real loop.

A step benchmarked alone (``benchmarks/bench_gpu.py``) and the same step inside ``bertforge
pretrain`` differ by whatever the loop adds: drawing and copying the data, the step's
bookkeeping, the reads that wait for the device. :class:`StepProfiler` runs ``torch.profiler``
over N loop iterations after the first few (compiling and the allocator's warm-up), with the
loop's phases named (:data:`PHASES`), and writes to the run's folder:

* ``profile.txt``: the host's milliseconds per step in each phase, the device's busy share of
  the step (on a GPU: the union of its kernels' intervals over the traced window; the rest is
  the device waiting for the host) and the top operators;
* ``profile-trace.json``: the whole trace, for https://ui.perfetto.dev or chrome://tracing.

Off (``N = 0``, the default), it costs nothing: :meth:`StepProfiler.phase` is a null context.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from bertforge.io import atomic_write_text

T = TypeVar("T")

SKIP_STEPS = 5
"""Loop iterations left out before the traced ones: the first compiles (on CUDA by default) and
the next few fill the allocator's caches."""

PHASES = {
    "data": "the next step's batches (from the prefetch thread on CUDA)",
    "launch": "forward, backward and clipping queued (run, on a CPU)",
    "optimizer": "the optimizer step queued (CUDA; elsewhere it is in host)",
    "host": "a step's numbers read (a wait for the device), its log, evaluation, checkpoint",
}
"""The loop's phases as the profile names them (``bertforge: <name>``), with what each holds."""

TRACE_FILE = "profile-trace.json"
SUMMARY_FILE = "profile.txt"


@dataclass
class Span:
    """One interval of a trace, in microseconds."""

    start: float
    end: float


def busy_time(spans: Iterable[Span], window: Span) -> float:
    """Microseconds of ``window`` covered by at least one of ``spans`` (their union, clipped to
    the window): a device's busy time, whatever its kernels' overlap across streams."""
    clipped = sorted(
        (max(s.start, window.start), min(s.end, window.end))
        for s in spans
        if s.end > window.start and s.start < window.end
    )
    total, reach = 0.0, window.start
    for start, end in clipped:
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


@dataclass
class Summary:
    """What ``profile.txt`` says above its operator table."""

    steps: int
    step_ms: float
    """Wall milliseconds per traced iteration, on the host's clock."""
    phase_ms: dict[str, float]
    """Host milliseconds per iteration in each of :data:`PHASES` that occurred."""
    device_busy_ms: float | None
    """Milliseconds per iteration with a device kernel running (None without a device trace)."""

    def lines(self, device: torch.device) -> list[str]:
        out = [
            f"profiled {self.steps} steps on {device}: {self.step_ms:.2f} ms a step "
            f"(the host's clock, the profiler's own cost included)",
            "host time in the loop's phases, per step:",
        ]
        width = max(len(name) for name in PHASES)
        for name, what in PHASES.items():
            if name in self.phase_ms:
                out.append(f"  {name:<{width}}  {self.phase_ms[name]:8.2f} ms   {what}")
        if self.device_busy_ms is not None:
            share = self.device_busy_ms / self.step_ms if self.step_ms else 0.0
            out.append(
                f"device busy {self.device_busy_ms:.2f} ms a step ({share:.0%}); idle "
                f"{max(self.step_ms - self.device_busy_ms, 0.0):.2f} ms, waiting for the host"
            )
        return out


def summarize(events: Sequence[Any]) -> Summary:
    """A :class:`Summary` of a trace's events (``torch.profiler``'s ``FunctionEvent``s):
    iterations are the profiler's ``ProfilerStep`` ranges, phases the loop's named ranges (both
    on the host: a GPU trace repeats them as device-side annotations, which are not kernels),
    device time the CUDA (or other accelerator) kernels' union inside the iterations."""
    cpu = torch.autograd.DeviceType.CPU
    host = [e for e in events if e.device_type == cpu]
    iterations = [e for e in host if e.name.startswith("ProfilerStep")]
    n = max(len(iterations), 1)
    if iterations:
        window = Span(
            min(e.time_range.start for e in iterations), max(e.time_range.end for e in iterations)
        )
    else:
        window = Span(0.0, 0.0)
    phase_us: dict[str, float] = {}
    for e in host:
        if e.name.startswith("bertforge: "):
            name = e.name.removeprefix("bertforge: ")
            phase_us[name] = phase_us.get(name, 0.0) + e.time_range.elapsed_us()
    kernels = [
        Span(e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type != cpu and not getattr(e, "is_user_annotation", False)
    ]
    busy = busy_time(kernels, window) / n / 1000 if kernels else None
    return Summary(
        steps=len(iterations),
        step_ms=(window.end - window.start) / n / 1000,
        phase_ms={k: v / n / 1000 for k, v in phase_us.items()},
        device_busy_ms=busy,
    )


class StepProfiler:
    """``torch.profiler`` over ``steps`` loop iterations after :data:`SKIP_STEPS`; call
    :meth:`step` once per iteration and wrap the loop's parts in :meth:`phase`. ``steps = 0``:
    off. Writes ``profile.txt`` and ``profile-trace.json`` into ``out`` when the traced
    iterations end (or the loop does, first)."""

    def __init__(self, steps: int, out: Path, device: torch.device) -> None:
        self.steps, self.out, self.device = steps, out, device
        self.written = False
        self._prof: Any = None

    def __enter__(self) -> StepProfiler:
        if self.steps <= 0:
            return self
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(skip_first=SKIP_STEPS, wait=0, warmup=1, active=self.steps, repeat=1),
            on_trace_ready=self._write,
        )
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)
            if not self.written:
                print(
                    f"--train.profile {self.steps}: the run ended before its traced steps "
                    f"(it needs {SKIP_STEPS + 1 + self.steps}); nothing written",
                    file=sys.stderr,
                    flush=True,
                )

    def phase(self, name: str) -> AbstractContextManager[Any]:
        """The loop's part ``name`` (one of :data:`PHASES`) as a named range of the trace."""
        if self._prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"bertforge: {name}")

    def phased(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """A decorator: each call of the function inside :meth:`phase` ``name``."""

        def wrap(fn: Callable[..., T]) -> Callable[..., T]:
            @functools.wraps(fn)
            def phased_call(*args: Any, **kwargs: Any) -> T:
                with self.phase(name):
                    return fn(*args, **kwargs)

            return phased_call

        return wrap

    def step(self) -> None:
        """One loop iteration ended."""
        if self._prof is not None:
            self._prof.step()

    def _write(self, prof: Any) -> None:
        if self.written:  # a trace cut short by the loop's end, after the full one
            return
        self.written = True
        self.out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out / TRACE_FILE))
        summary = summarize(prof.events())
        on_device = self.device.type == "cuda"
        table = prof.key_averages().table(
            sort_by="self_device_time_total" if on_device else "self_cpu_time_total", row_limit=30
        )
        lines = summary.lines(self.device)
        atomic_write_text(self.out / SUMMARY_FILE, "\n".join([*lines, "", table]) + "\n")
        print("\n".join(lines), file=sys.stderr, flush=True)
        print(
            f"profile: {self.out / SUMMARY_FILE} and {self.out / TRACE_FILE} "
            "(open it in https://ui.perfetto.dev)",
            file=sys.stderr,
            flush=True,
        )


__all__ = ["PHASES", "SKIP_STEPS", "Span", "StepProfiler", "Summary", "busy_time", "summarize"]
