"""Load test of ``bertforge serve``: 1,000 /fill-mask and 1,000 /embed requests (one real
WikiText-2 sentence each) from 32 concurrent local clients, against the offline ceiling: the
same texts through ``bertforge.embed`` (what ``bertforge embed`` runs) in one call, batch 32,
in this process while the server idles.

Models: the real all-MiniLM-L6-v2 for /embed (mean pooling, normalized, as sentence-transformers
use it) and, for /fill-mask, MiniLM's encoder under a freshly initialised MLM head (the package
ships no MLM head; the cost is the same). Every answer is checked against the offline answer
for the same text (same top token, scores and vectors within 1e-4). Prints throughput, p50/p95/
p99 latency and served/offline ratios.

    flock /tmp/bertforge-heavy.lock python benchmarks/bench_serve.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from _common import ROOT, SHARED_DATA, cpu_model, log, markdown_table, minilm_dir

sys.path.insert(0, str(ROOT / "tests"))
from support.serve import Client, serve  # noqa: E402

from bertforge.inference.predict import embed, fill_mask  # noqa: E402
from bertforge.modeling.model import BertForMaskedLM, BertModel  # noqa: E402
from bertforge.tokenizer import Tokenizer  # noqa: E402


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` WikiText-2 validation lines of 8-60 words, one masked word each for fill-mask."""
    lines = (SHARED_DATA / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    # WikiText lines are paragraphs: cut them into sentences (" . ") to have enough of 8-60 words
    rows = [
        sentence.strip() + " ."
        for line in lines.splitlines()
        if line.strip() and not line.strip().startswith("=")
        for sentence in line.split(" . ")
        if 8 <= len(sentence.split()) <= 60
    ]
    rng = random.Random(seed)
    return rng.sample(rows, n)


def masked(texts: list[str], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for text in texts:
        words = text.split()
        words[rng.randrange(len(words))] = "[MASK]"
        out.append(" ".join(words))
    return out


def load(port: int, path: str, bodies: list[dict], clients: int) -> tuple[float, list, list]:
    """Send every body from ``clients`` threads; (wall seconds, latencies, answers in order)."""
    local = threading.local()
    answers: list = [None] * len(bodies)
    latencies: list = [0.0] * len(bodies)

    def one(i: int) -> None:
        if not hasattr(local, "client"):
            local.client = Client(port)
        t0 = time.perf_counter()
        status, answer = local.client.request("POST", path, bodies[i])
        latencies[i] = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"{path} answered {status}: {answer}")
        answers[i] = answer

    with ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        list(pool.map(one, range(len(bodies))))
        wall = time.perf_counter() - start
    return wall, latencies, answers


def percentiles(latencies: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(latencies, n=100)
    return q[49] * 1e3, q[94] * 1e3, q[98] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max_batch_tokens", type=int, default=16384)
    parser.add_argument(
        "--num_threads", type=int, help="the server's torch threads (default: its own default)"
    )
    parser.add_argument("--workers", type=int, help="the server's inference threads")
    parser.add_argument("--batch_wait_ms", type=float, help="the server's batch wait")
    args = parser.parse_args()
    torch.set_num_threads(2)
    texts = sentences(args.requests)
    masked_texts = masked(texts)
    minilm = minilm_dir()
    tok = Tokenizer.from_file(minilm)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        mlm = BertForMaskedLM.from_pretrained(minilm)  # MLM head freshly initialised
        mlm.save_pretrained(Path(tmp) / "mlm", tokenizer=tok)
        mlm.eval()
        encoder = BertModel.from_pretrained(minilm).eval()

        # offline: the answers to check against, and the ceiling (best of 3 runs)
        expected_masks = fill_mask(mlm, tok, masked_texts, top_k=5, batch_size=32)
        expected_vectors = embed(encoder, tok, texts, "mean", normalize=True, batch_size=32)
        offline = {}
        for name, call in (
            ("fill-mask", lambda: fill_mask(mlm, tok, masked_texts, top_k=5, batch_size=32)),
            ("embed", lambda: embed(encoder, tok, texts, "mean", normalize=True, batch_size=32)),
        ):
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                call()
                runs.append(time.perf_counter() - t0)
            offline[name] = len(texts) / min(runs)
            log(f"offline {name}: {offline[name]:.1f} texts/s")

        served = {"minilm": minilm, "mlm": Path(tmp) / "mlm"}
        options = ("--max_batch_tokens", str(args.max_batch_tokens))
        for name in ("num_threads", "workers", "batch_wait_ms"):
            if getattr(args, name) is not None:
                options += (f"--{name}", str(getattr(args, name)))
        with serve(served, *options, log=Path(tmp) / "server.log") as (port, _):
            fill_bodies = [{"inputs": t, "model": "mlm", "top_k": 5} for t in masked_texts]
            embed_bodies = [
                {"inputs": t, "model": "minilm", "pooling": "mean", "normalize": True}
                for t in texts
            ]
            load(port, "/embed", embed_bodies[:64], args.clients)  # warm-up
            load(port, "/fill-mask", fill_bodies[:64], args.clients)
            warm = Client(port).request("GET", "/metrics")[1]
            results = {}
            for path, bodies in (("/fill-mask", fill_bodies), ("/embed", embed_bodies)):
                results[path] = load(port, path, bodies, args.clients)
                log(f"served {path}: {len(bodies) / results[path][0]:.1f} requests/s")
            metrics = Client(port).request("GET", "/metrics")[1]

    # every answer correct
    _, _, fill_answers = results["/fill-mask"]
    for got, want in zip(fill_answers, expected_masks, strict=True):
        got = got[0]
        assert got["filled"] == want["filled"], (got["filled"], want["filled"])
        assert [c["id"] for c in got["masks"][0]] == [c["id"] for c in want["masks"][0]]
        assert np.allclose(
            [c["score"] for c in got["masks"][0]], [c["score"] for c in want["masks"][0]], atol=1e-4
        )
    _, _, embed_answers = results["/embed"]
    vectors = np.array([a[0] for a in embed_answers], dtype=np.float32)
    assert np.allclose(vectors, expected_vectors, atol=1e-4), np.abs(
        vectors - expected_vectors
    ).max()

    def series(text: str, name: str) -> float:
        return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])

    passes = series(metrics, "bertforge_batch_requests_count") - series(
        warm, "bertforge_batch_requests_count"
    )
    merged = series(metrics, "bertforge_batch_requests_sum") - series(
        warm, "bertforge_batch_requests_sum"
    )
    mean_batch = merged / passes
    rows = []
    for path, key in (("/fill-mask", "fill-mask"), ("/embed", "embed")):
        wall, latencies, _ = results[path]
        rate = len(latencies) / wall
        p50, p95, p99 = percentiles(latencies)
        rows.append(
            [
                path,
                f"{len(latencies)}/{len(latencies)}",
                f"{rate:.1f}",
                f"{offline[key]:.1f}",
                f"{rate / offline[key]:.2f}",
                f"{p50:.0f}",
                f"{p95:.0f}",
                f"{p99:.0f}",
            ]
        )
    print(
        f"bertforge serve, {args.clients} concurrent local clients, {args.requests} requests per "
        f"route, one text each; {cpu_model()}, fp32; offline at {torch.get_num_threads()} "
        f"torch threads; server: {' '.join(options)}; "
        f"mean {mean_batch:.1f} requests per forward pass\n"
    )
    print(
        markdown_table(
            [
                "route",
                "answered & correct",
                "served texts/s",
                "offline texts/s (batch 32)",
                "served/offline",
                "p50 ms",
                "p95 ms",
                "p99 ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
