"""10,000 requests of random garbage against a real ``bertforge serve`` on localhost (the fuzzer
of tests/support/serve.py: random bytes, malformed or deeply nested JSON, wrong types, hostile
text, random methods/paths/headers, over-size bodies, raw non-HTTP bytes), with the server's
RSS after every 2,000: the server must stay up, answer everything with a 4xx (never a 5xx), give
the same answer to a real request before and after, and its memory must level off.

    python benchmarks/fuzz_serve.py [--requests 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
from _common import ROOT, cpu_model, markdown_table

sys.path.insert(0, str(ROOT / "tests"))
from support.serve import fuzz, request, serve, tiny_models  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = tiny_models(Path(tmp))
        options = ("--max_payload_bytes", "20000", "--max_input_length", "64")
        with serve(models, *options, "--request_timeout", "10", log=Path(tmp) / "log") as (
            port,
            process,
        ):
            probe = {"inputs": ["the [MASK] was a film ."], "model": "mlm", "top_k": 3}
            before = request(port, "POST", "/fill-mask", probe)
            server = psutil.Process(process.pid)
            statuses: Counter = Counter()
            rows = [["0", f"{server.memory_info().rss / 2**20:.1f}", "", ""]]
            start = time.monotonic()
            for k in range(0, args.requests, args.step):
                fuzz(port, args.step, seed=k, statuses=statuses, deadline=time.monotonic() + 600)
                fives = sum(n for s, n in statuses.items() if s >= 500)
                rows.append(
                    [
                        f"{k + args.step:,}",
                        f"{server.memory_info().rss / 2**20:.1f}",
                        str(fives),
                        f"{time.monotonic() - start:.0f}",
                    ]
                )
            alive = process.poll() is None and request(port, "GET", "/health")[0] == 200
            same = request(port, "POST", "/fill-mask", probe) == before
    print(f"bertforge serve under random garbage; {cpu_model()}\n")
    print(markdown_table(["requests sent", "server RSS MiB", "5xx answers", "seconds"], rows))
    print(f"\nanswers by status: {dict(sorted(statuses.items()))}")
    print(f"server up after: {alive}; same answer to a real request before and after: {same}")
    if not (alive and same) or any(s >= 500 for s in statuses):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
