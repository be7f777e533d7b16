"""Counters and histograms in the Prometheus text format (version 0.0.4), kept by hand: the
server needs a dozen series, not a client library."""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Sequence

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)


class Histogram:
    """Cumulative-bucket histogram of one label set."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out, running = [], 0
        for bound, count in zip([*self.buckets, "+Inf"], self.counts, strict=True):
            running += count
            le = bound if isinstance(bound, str) else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
        braces = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{braces} {self.sum:.6f}")
        out.append(f"{name}_count{braces} {running}")
        return out


class Metrics:
    """Everything /metrics reports; thread-safe (the inference thread reports batches)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_requests = Histogram(SIZE_BUCKETS)
        self.batch_items = Histogram(SIZE_BUCKETS)
        self.batch_tokens = Histogram(TOKEN_BUCKETS)
        self.queue_wait = Histogram(LATENCY_BUCKETS)
        self.inference = Histogram(LATENCY_BUCKETS)
        self.in_flight = 0
        """Inference requests being answered (counted by ``bertforge.serve.limits.Limits``)."""

    def request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[route, status] = self.requests.get((route, status), 0) + 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, requests: int, items: int, tokens: int, wait: float, run: float) -> None:
        with self._lock:
            self.batch_requests.observe(requests)
            self.batch_items.observe(items)
            self.batch_tokens.observe(tokens)
            self.queue_wait.observe(wait)
            self.inference.observe(run)

    def render(self, queue_length: int, in_flight: int, ready: bool = True) -> str:
        """The exposition text."""
        p = "bertforge_"
        with self._lock:
            lines = [
                f"# HELP {p}requests_total HTTP requests answered, by route and status code.",
                f"# TYPE {p}requests_total counter",
            ]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'{p}requests_total{{route="{route}",status="{status}"}} {n}')
            lines += [
                f"# HELP {p}request_duration_seconds Time from request to answer, by route.",
                f"# TYPE {p}request_duration_seconds histogram",
            ]
            for route, hist in sorted(self.latency.items()):
                lines += hist.lines(f"{p}request_duration_seconds", f'route="{route}"')
            for name, hist, text in (
                ("batch_requests", self.batch_requests, "Requests merged into one forward pass."),
                ("batch_texts", self.batch_items, "Texts in one forward pass."),
                ("batch_tokens", self.batch_tokens, "Tokens in one forward pass."),
                ("queue_wait_seconds", self.queue_wait, "Time a batch's oldest request waited."),
                ("inference_seconds", self.inference, "Time of one forward pass."),
            ):
                lines += [f"# HELP {p}{name} {text}", f"# TYPE {p}{name} histogram"]
                lines += hist.lines(p + name, "")
        lines += [
            f"# HELP {p}queued_requests Requests waiting for an inference thread.",
            f"# TYPE {p}queued_requests gauge",
            f"{p}queued_requests {queue_length}",
            f"# HELP {p}requests_in_flight Inference requests being answered.",
            f"# TYPE {p}requests_in_flight gauge",
            f"{p}requests_in_flight {in_flight}",
            f"# HELP {p}ready 1 once every model is loaded and warmed (/health answers 200).",
            f"# TYPE {p}ready gauge",
            f"{p}ready {int(ready)}",
            *process_lines(),
        ]
        return "\n".join(lines) + "\n"


_STARTED = time.time()


def process_lines() -> list[str]:
    """The standard ``process_*`` series client libraries export (CPU time, resident memory,
    start time), so the usual dashboards work on this server too."""
    times = os.times()
    lines = [
        "# HELP process_cpu_seconds_total User and system CPU time of the server process.",
        "# TYPE process_cpu_seconds_total counter",
        f"process_cpu_seconds_total {times.user + times.system:.2f}",
        "# HELP process_start_time_seconds Start time of the process, in seconds since the epoch.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {_STARTED:.3f}",
    ]
    rss = resident_bytes()
    if rss is not None:
        lines += [
            "# HELP process_resident_memory_bytes Resident memory of the server process.",
            "# TYPE process_resident_memory_bytes gauge",
            f"process_resident_memory_bytes {rss}",
        ]
    return lines


def resident_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process from ``/proc`` (None where there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


__all__ = ["Histogram", "Metrics", "process_lines", "resident_bytes"]
