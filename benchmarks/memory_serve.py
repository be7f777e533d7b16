"""Resident memory of ``bertforge serve`` idle and under load: starts the server on
all-MiniLM-L6-v2, reads its ``VmRSS`` once it answers ``/health`` (idle), sends ``--requests``
``/embed`` requests of one IMDB review each (its first 1,000 characters) from ``--clients`` threads, then reads its ``VmHWM``
(the peak under load) and ``VmRSS`` (after). transformers' side of the same work:
``memory_reference.py --job embed``.

    python benchmarks/memory_serve.py --requests 512 --clients 16
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import ROOT, minilm_dir
from memory_reference import imdb_texts


def status_mb(pid: int, field: str) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in text.splitlines() if x.startswith(field)).split()[1]) / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--num_threads", type=int, default=1)
    args = p.parse_args()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    argv = [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(minilm_dir())]
    argv += ["--port", str(port), "--num_threads", str(args.num_threads)]
    # a pipe left unread would fill up and stop the server: its log goes to a file
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"{url}/health", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.5)
            time.sleep(2.0)
            idle = status_mb(server.pid, "VmRSS")
            texts = [t[:1000] for t in imdb_texts(args.requests)[0]]  # ~230 tokens at most

            def embed(text: str) -> None:
                body = json.dumps({"inputs": [text]}).encode()
                req = urllib.request.Request(
                    f"{url}/embed", body, {"Content-Type": "application/json"}
                )
                urllib.request.urlopen(req, timeout=600).read()

            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(embed, texts))
            seconds = time.perf_counter() - t0
            peak, after = status_mb(server.pid, "VmHWM"), status_mb(server.pid, "VmRSS")
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.seek(0)
            said = [line for line in log.read().splitlines() if "bf16" in line or "fp32" in line]
            print(said[0] if said else "(the server named no precision)")
    print(
        f"bertforge serve (all-MiniLM-L6-v2, {args.requests} /embed requests of one IMDB review "
        f"from {args.clients} clients, {seconds:.0f} s): idle {idle:,.0f} MB, peak under load "
        f"{peak:,.0f} MB, after {after:,.0f} MB resident"
    )


if __name__ == "__main__":
    main()
