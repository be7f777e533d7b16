"""Soak test of ``bertforge serve``: N minutes (default 10) of 32 concurrent local clients over a
mix of routes, then a SIGTERM in the middle of that load.

The server listens on 127.0.0.1 only, with an API key (from ``BERTFORGE_API_KEY``) and the JSON
access log; it serves the real all-MiniLM-L6-v2 (/embed, /similarity, /attention, /tokenize)
and the tests' tiny masked LM and classifier (/fill-mask, /predict, /attribute), with two
inference workers of one thread each. Each client sends WikiText-2 sentences in a fixed random
mix of routes, each request with its own ``X-Request-Id``. It checks, per minute:

- no 5xx answer (and nothing but 200 at all);
- the server's RSS grows by less than 5% from the reference to the last minute's median (one
  sample a second). The reference is fixed before any run: the median of the samples of the
  first ``SETTLE_SECONDS`` (30) seconds of load, which start the moment ``/health`` first
  answers 200. The server's warm-up (before it says ready) has run every shape the load
  brings, so this settle holds only what the first requests themselves allocate (32
  connections, their buffers, the request queue); the RSS at ready is printed beside it;
- the p99 latency of every minute is within 20% of the first minute's.

Then, with every client still sending, SIGTERM: every request the server accepted must be
answered (each request id in the server's access log came back to its client, none with a
5xx but /health's 503 "draining", which tells a load balancer to stop sending), new
connections are refused, and the process exits 0.

Bounded: it stops after --minutes or --max_requests, whichever comes first.

    python benchmarks/soak_serve.py [--minutes 10] [--clients 32] [--json soak.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
from _common import ROOT, cpu_kind, log, markdown_table, minilm_dir

sys.path.insert(0, str(ROOT / "tests"))
from bench_serve import masked, sentences  # noqa: E402
from support.serve import Client, serve, tiny_models  # noqa: E402

from bertforge.tokenizer import Tokenizer  # noqa: E402

#: (weight, route) of the mix; the body of each is made by ``body`` below
SETTLE_SECONDS = 30.0
"""The first seconds of load after /health first says ready whose RSS median is the reference
of the growth check (decided before the runs: see the module's docstring)."""

MIX = [
    (30, "/embed"),
    (10, "/similarity"),
    (10, "/tokenize"),
    (15, "/fill-mask"),
    (15, "/predict"),
    (5, "/attention"),
    (5, "/attribute"),
    (5, "/info"),
    (5, "/health"),
]


def body(route: str, rng: random.Random, texts: list[str], masks: list[str]) -> dict | None:
    """A valid request body for ``route`` from the sentence pool (None: a GET)."""
    if route == "/embed":
        return {
            "inputs": rng.sample(texts, rng.randint(1, 4)),
            "model": "minilm",
            "pooling": "mean",
        }
    if route == "/similarity":
        return {"inputs": rng.sample(texts, rng.randint(2, 3)), "model": "minilm"}
    if route == "/tokenize":
        return {"inputs": rng.choice(texts), "model": "minilm"}
    if route == "/fill-mask":
        return {"inputs": rng.choice(masks), "model": "mlm", "top_k": 5}
    if route == "/predict":
        return {"inputs": rng.sample(texts, rng.randint(1, 4)), "model": "clf", "truncate": True}
    if route == "/attention":
        return {"inputs": rng.choice(texts), "model": "minilm", "max_tokens": 32}
    if route == "/attribute":
        return {"inputs": rng.choice(texts), "model": "clf", "steps": 8, "max_tokens": 32}
    return None


class Record:
    """What the clients saw, shared between their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[tuple[float, float, int, str]] = []  # (end time, seconds, status, route)
        self.answered_ids: set[str] = set()
        self.failures: Counter = Counter()  # no answer at all, by exception type
        self.failed_after_stop: Counter = Counter()
        self.statuses_after_stop: Counter = Counter()
        self.outstanding = 0  # requests sent and not yet answered


def client_loop(
    k: int,
    port: int,
    key: str,
    texts: list[str],
    masks: list[str],
    record: Record,
    stop: threading.Event,
    signalled: threading.Event,
    budget: list[int],
) -> None:
    rng = random.Random(k)
    routes, weights = zip(*[(r, w) for w, r in MIX], strict=True)
    client = Client(port, timeout=120, headers={"Authorization": f"Bearer {key}"})
    n = 0
    while not stop.is_set():
        with record.lock:
            if budget[0] <= 0:
                break
            budget[0] -= 1
        route = rng.choices(routes, weights)[0]
        payload = body(route, rng, texts, masks)
        rid = f"soak-{k}-{n}"
        n += 1
        after = signalled.is_set()
        with record.lock:
            record.outstanding += 1
        t0 = time.perf_counter()
        try:
            status, _ = client.request(
                "GET" if payload is None else "POST", route, payload, headers={"X-Request-Id": rid}
            )
        except Exception as err:  # noqa: BLE001 - no answer: counted, and after a SIGTERM the end
            with record.lock:
                record.outstanding -= 1
                (record.failed_after_stop if signalled.is_set() else record.failures)[
                    type(err).__name__
                ] += 1
            if signalled.is_set():
                break
            continue
        end = time.perf_counter()
        with record.lock:
            record.outstanding -= 1
            record.samples.append((end, end - t0, status, route))
            record.answered_ids.add(rid)
            if after or signalled.is_set():
                # /health answers 503 "draining" once the SIGTERM came: what a load balancer
                # needs to hear, not a failure
                draining = route == "/health" and status == 503
                record.statuses_after_stop["draining" if draining else status] += 1
    client.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max_requests", type=int, default=2_000_000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--server_env", action="append", default=[], help="NAME=VALUE for the server process"
    )
    args = parser.parse_args()
    key = secrets.token_urlsafe(24)
    texts = sentences(2000, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = tiny_models(Path(tmp))
        tokenizer = Tokenizer.from_file(tiny["mlm"])  # fill-mask texts within its 64 positions
        masks = [m for m in masked(texts) if len(tokenizer.encode(m)["input_ids"]) <= 64]
        models = {"minilm": minilm_dir(), "mlm": tiny["mlm"], "clf": tiny["clf"]}
        server_log = Path(tmp) / "server.log"
        options = ("--workers", "2", "--num_threads", "1", "--max_input_length", "128")
        options += ("--log_format", "json", "--shutdown_timeout", "30")
        env = {"BERTFORGE_API_KEY": key, **dict(e.split("=", 1) for e in args.server_env)}
        with serve(models, *options, log=server_log, env=env, startup=600) as (port, process):
            server = psutil.Process(process.pid)
            rss_ready = server.memory_info().rss  # /health has just said 200
            record = Record()
            stop, signalled = threading.Event(), threading.Event()
            budget = [args.max_requests]
            load_before = os.getloadavg()
            start = time.perf_counter()
            threads = [
                threading.Thread(
                    target=client_loop,
                    args=(k, port, key, texts, masks, record, stop, signalled, budget),
                    daemon=True,
                )
                for k in range(args.clients)
            ]
            for t in threads:
                t.start()
            # RSS once a second; a minute's figure is the median of its samples, since one
            # sample may fall on the transient memory of a large batch in progress
            rss: list[tuple[int, int]] = []  # (median, max) bytes per minute
            timeline: list[tuple[float, int]] = []  # (seconds since start, bytes)
            minutes = max(1, round(args.minutes))
            minute_seconds = args.minutes * 60 / minutes
            for m in range(1, minutes + 1):
                end = start + m * minute_seconds
                samples = []
                while time.perf_counter() < end and budget[0] > 0:
                    samples.append(server.memory_info().rss)
                    timeline.append((time.perf_counter() - start, samples[-1]))
                    time.sleep(min(1.0, max(0.0, end - time.perf_counter())))
                samples = samples or [server.memory_info().rss]
                rss.append((int(statistics.median(samples)), max(samples)))
                with record.lock:
                    done = len(record.samples)
                log(f"minute {m}: {done:,} answers, RSS median {rss[-1][0] / 2**20:.1f} MiB")
                if budget[0] <= 0:
                    break
            # SIGTERM in the middle of the load: every client is still sending
            load_after = os.getloadavg()
            with record.lock:
                in_flight = record.outstanding  # sent, not yet answered
                answered_before = len(record.samples)
            signalled.set()
            signal_time = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=120)
            drain = time.perf_counter() - signal_time
            stop.set()
            for t in threads:
                t.join(timeout=60)
        logged, warm_lines = {}, []
        for line in server_log.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                logged[entry["request_id"]] = entry
            elif "warmed" in line:
                warm_lines.append(line.strip())
    settle = [b for t, b in timeline if t < SETTLE_SECONDS] or [rss[0][0]]
    reference = (rss_ready, int(statistics.median(settle)))
    report(
        args,
        record,
        rss,
        reference,
        warm_lines,
        start,
        signal_time,
        answered_before,
        in_flight,
        logged,
        code,
        drain,
        load_before,
        load_after,
    )


def report(
    args,
    record,
    rss,
    reference,
    warm_lines,
    start,
    signal_time,
    answered_before,
    in_flight,
    logged,
    code,
    drain,
    load_before,
    load_after,
) -> None:  # noqa: ANN001 - a printing routine
    minutes = len(rss)
    minute_seconds = args.minutes * 60 / max(1, round(args.minutes))
    rows, p99s = [], []
    statuses = Counter(s for end, _, s, _ in record.samples if end < signal_time)
    for m in range(minutes):
        lo, hi = start + m * minute_seconds, start + (m + 1) * minute_seconds
        lat = [sec for end, sec, _, _ in record.samples if lo <= end < hi]
        fives = sum(1 for end, _, s, _ in record.samples if lo <= end < hi and s >= 500)
        if not lat:
            continue
        p99 = percentile(lat, 0.99)
        p99s.append(p99)
        rows.append(
            [
                str(m + 1),
                f"{len(lat):,}",
                f"{len(lat) / minute_seconds:.1f}",
                f"{statistics.median(lat) * 1e3:.0f}",
                f"{p99 * 1e3:.0f}",
                f"{p99 / p99s[0]:.2f}",
                f"{rss[m][0] / 2**20:.1f}",
                f"{rss[m][1] / 2**20:.1f}",
                str(fives),
            ]
        )
    ready, base = reference
    last = rss[-1][0]
    growth = (last - base) / base
    from_minute_1 = (last - rss[0][0]) / rss[0][0]
    worst = max(p / p99s[0] for p in p99s)
    best = min(p / p99s[0] for p in p99s)
    lost = sorted(r for r in logged if r.startswith("soak-") and r not in record.answered_ids)
    after_5xx = sum(
        n for s, n in record.statuses_after_stop.items() if s != "draining" and s >= 500
    )
    after_answered = sum(record.statuses_after_stop.values())
    fives = sum(n for s, n in statuses.items() if s >= 500)
    checks = {
        "no 5xx during the soak": fives == 0,
        "only 200 answers": set(statuses) <= {200},
        f"RSS growth from the first {SETTLE_SECONDS:g} s of load to the last minute < 5%": growth
        < 0.05,
        "p99 of every minute <= 1.2 x the first minute's": worst <= 1.2,
        "every request the server accepted was answered": not lost and after_5xx == 0,
        "exit status 0 after SIGTERM": code == 0,
    }
    print(f"bertforge serve soak: {args.minutes:g} min, {args.clients} clients; {cpu_kind()}")
    print(
        f"load average (1/5/15 min) at the start {'/'.join(f'{x:.1f}' for x in load_before)}, "
        f"at the SIGTERM {'/'.join(f'{x:.1f}' for x in load_after)} on {os.cpu_count()} cores\n"
    )
    header = ["minute", "answers", "req/s", "p50 ms", "p99 ms", "p99 / minute 1"]
    header += ["RSS median MiB", "RSS max MiB", "5xx"]
    print(markdown_table(header, rows))
    print(f"\nanswers by status before the SIGTERM: {dict(sorted(statuses.items()))}")
    others = Counter((r, s) for _, _, s, r in record.samples if s != 200)
    if others:
        print(f"answers other than 200, by route: {dict(others)}")
    print(f"requests with no answer before the SIGTERM: {dict(record.failures) or 0}")
    for line in warm_lines:
        print(f"server: {line}")
    print(
        f"RSS: {ready / 2**20:.1f} MiB when /health first said 200, {base / 2**20:.1f} MiB "
        f"(median) in the first {SETTLE_SECONDS:g} s of load, {rss[0][0] / 2**20:.1f} MiB in "
        f"minute 1, {last / 2**20:.1f} MiB in the last ({growth:+.2%} from the first "
        f"{SETTLE_SECONDS:g} s, {from_minute_1:+.2%} from minute 1, "
        f"{(last - ready) / ready:+.2%} from ready); p99 ratio to minute 1 between {best:.2f} "
        f"and {worst:.2f}"
    )
    print(
        f"SIGTERM with {in_flight} requests in flight from {args.clients} clients "
        f"({answered_before:,} answers before it): "
        f"{after_answered} answered after it ({after_5xx} 5xx; "
        f"{record.statuses_after_stop['draining']} /health 503 draining), "
        f"{sum(record.failed_after_stop.values())} later requests refused "
        f"({dict(record.failed_after_stop)}), {len(logged):,} requests in the server's log, "
        f"{len(lost)} of them without an answer at the client; exit status {code} after "
        f"{drain:.2f} s"
    )
    if lost:
        print(f"logged by the server, never answered at the client: {lost[:5]}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_kind(),
                    "minutes": args.minutes,
                    "clients": args.clients,
                    "rows": rows,
                    "statuses": dict(statuses),
                    "rss_ready": ready,
                    "rss_settle": base,
                    "rss_growth": growth,
                    "rss_growth_from_minute_1": from_minute_1,
                    "warm_up": warm_lines,
                    "p99_ratio_max": worst,
                    "p99_ratio_min": best,
                    "answered_after_sigterm": after_answered,
                    "lost": len(lost),
                    "exit_status": code,
                    "drain_seconds": drain,
                    "load_before": load_before,
                    "load_after": load_after,
                    "checks": checks,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
