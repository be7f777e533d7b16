"""Counters and histograms in the Prometheus text format (version 0.0.4), kept by hand: the
server needs a dozen series, not a client library."""

from __future__ import annotations

import bisect
import threading
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

    def render(self, queue_length: int, in_flight: int) -> str:
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
            f"# HELP {p}queue_length Requests waiting for the inference thread.",
            f"# TYPE {p}queue_length gauge",
            f"{p}queue_length {queue_length}",
            f"# HELP {p}requests_in_flight Inference requests being answered.",
            f"# TYPE {p}requests_in_flight gauge",
            f"{p}requests_in_flight {in_flight}",
        ]
        return "\n".join(lines) + "\n"


__all__ = ["Histogram", "Metrics"]
