"""A real ``bertforge serve`` process on a free localhost port, tiny models for it, and a
small HTTP client (imported by the serve tests and benchmarks/bench_serve.py)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from conftest import FILLER, TaskFiles  # the task_files fixture's class (used outside a test)

ROOT = Path(__file__).resolve().parents[2]


def tiny_models(root: Path) -> dict[str, Path]:
    """A tiny masked LM (tokenizer trained on the task fixtures' words), a 2-label classifier
    and a regressor on its encoder, saved as model directories."""
    from bertforge.modeling.model import BertForSequenceClassification
    from bertforge.tokenizer import Tokenizer

    mlm = TaskFiles.tiny_start_model(root, kind="mlm")
    tokenizer = Tokenizer.from_file(mlm)
    torch.manual_seed(1)
    clf = BertForSequenceClassification.from_pretrained(
        mlm, num_labels=2, id2label={0: "neg", 1: "pos"}
    )
    clf.save_pretrained(root / "clf", tokenizer=tokenizer)
    torch.manual_seed(2)
    reg = BertForSequenceClassification.from_pretrained(mlm, num_labels=1)
    reg.save_pretrained(root / "reg", tokenizer=tokenizer)
    return {"mlm": mlm, "clf": root / "clf", "reg": root / "reg"}


def finetune(start: Path, train: Path, out: Path, *options: str) -> Path:
    """``bertforge finetune`` for 3 steps from ``start`` on ``train`` into ``out``."""
    import contextlib
    import io

    from bertforge import cli

    argv = ["finetune", "--model", str(start), "--train", str(train), "--output", str(out)]
    argv += ["--batch_size", "8", "--max_steps", "3", "--max_length", "64", "--precision", "fp32"]
    argv += ["--validation_fraction", "0.25", *options]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return out


def pair_model(root: Path, start: Path) -> Path:
    """``root/nli``: a classifier fine-tuned (3 steps) from ``start`` on premise + hypothesis
    pairs labelled entailment or contradiction, as ``--text_pair_column`` writes one."""
    rng = random.Random(0)
    rows = [
        {
            "premise": " ".join(rng.choice(FILLER) for _ in range(8)),
            "hypothesis": " ".join(rng.choice(FILLER) for _ in range(6)),
            "label": rng.choice(["entailment", "contradiction"]),
        }
        for _ in range(48)
    ]
    TaskFiles.write_rows(root / "pairs.csv", rows)
    options = ("--text_column", "premise", "--text_pair_column", "hypothesis")
    return finetune(start, root / "pairs.csv", root / "nli", *options)


TAG_NAMES = [(["anna"], "PER"), (["tom"], "PER"), (["paris"], "LOC"), (["new", "york"], "LOC")]


def tagger_model(root: Path, start: Path, steps: int = 40, *extra: str) -> Path:
    """``root/ner``: a token classifier fine-tuned (``steps`` steps) from ``start`` on filler
    sentences where "anna"/"tom" are PER and "paris"/"new york" LOC, as ``bertforge finetune
    --task token_classification`` writes one (``extra``: more finetune options)."""
    rng = random.Random(3)
    blocks = []
    for _ in range(256):
        units = [([rng.choice(FILLER)], ["O"]) for _ in range(rng.randint(3, 8))]
        for _ in range(rng.randint(1, 2)):
            name, kind = rng.choice(TAG_NAMES)
            tags = [f"B-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
            units.insert(rng.randint(0, len(units)), (name, tags))
        words = [(w, t) for u in units for w, t in zip(*u, strict=True)]
        blocks.append("\n".join(f"{w}\t{t}" for w, t in words))
    (root / "ner.conll").write_text("\n\n".join(blocks) + "\n")
    options = ["--task", "token_classification", "--lr", "3e-3", "--dropout", "0"]
    options += ["--batch_size", "16", "--max_length", "32", "--max_steps", str(steps)]
    return finetune(start, root / "ner.conll", root / "ner", *options, *extra)


def qa_model(root: Path, start: Path, steps: int = 40, *extra: str) -> Path:
    """``root/qa``: a question-answering model fine-tuned (``steps`` steps) from ``start`` on
    "where is good ?" about filler text holding "good" once, as ``bertforge finetune --task
    question_answering`` writes one (``extra``: more finetune options)."""
    rng = random.Random(4)
    rows = []
    for i in range(256):
        before = " ".join(rng.choice(FILLER) for _ in range(rng.randint(0, 10)))
        after = " ".join(rng.choice(FILLER) for _ in range(rng.randint(3, 10)))
        context = f"{before} good {after}".strip()
        start_char = context.index("good")
        answers = {"text": ["good"], "answer_start": [start_char]}
        rows.append({"id": f"q{i}", "question": "where is good ?", "context": context,
                     "answers": answers})  # fmt: skip
    train = root / "qa.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = ["--task", "question_answering", "--lr", "3e-3", "--dropout", "0"]
    options += ["--batch_size", "16", "--max_length", "48", "--doc_stride", "16"]
    options += ["--max_steps", str(steps)]
    return finetune(start, train, root / "qa", *options, *extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """JSON over one keep-alive HTTP/1.1 connection to 127.0.0.1 (reconnects when closed);
    HTTPS when given an SSL ``context``, ``headers`` sent with every request (a key)."""

    def __init__(
        self,
        port: int,
        timeout: float = 60.0,
        *,
        context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.port, self.timeout, self.context = port, timeout, context
        self.headers = headers or {}
        self.conn: http.client.HTTPConnection | None = None
        self.last_headers: dict[str, str] = {}
        """The headers of the last answer, names in lower case."""

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text). ``body`` is sent as JSON, ``raw`` as it is."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent_headers = {"Content-Type": "application/json", **self.headers, **(headers or {})}
        for attempt in range(2):
            if self.conn is None:
                if self.context is None:
                    self.conn = http.client.HTTPConnection(
                        "127.0.0.1", self.port, timeout=self.timeout
                    )
                else:
                    self.conn = http.client.HTTPSConnection(
                        "127.0.0.1", self.port, timeout=self.timeout, context=self.context
                    )
            try:
                self.conn.request(method, path, body=data, headers=sent_headers)
                response = self.conn.getresponse()
                payload = response.read()
                if response.getheader("connection", "").lower() == "close":
                    self.close()
                break
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.close()  # the server closed an idle keep-alive connection: once more
                if attempt:
                    raise
        self.last_headers = {k.lower(): v for k, v in response.getheaders()}
        kind = response.getheader("content-type", "")
        if kind.startswith("application/json"):
            return response.status, json.loads(payload)
        return response.status, payload.decode("utf-8", "replace")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    context: ssl.SSLContext | None = None,
    **kw: Any,
) -> tuple[int, Any]:
    """One request on a fresh connection."""
    client = Client(port, context=context)
    try:
        return client.request(method, path, body, **kw)
    finally:
        client.close()


@contextlib.contextmanager
def serve(
    models: dict[str, Path],
    *options: str,
    log: Path | None = None,
    startup: float = 120.0,
    env: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    meanwhile: Callable[[], Any] | None = None,
) -> Iterator[tuple[int, subprocess.Popen]]:
    """Run ``bertforge serve`` with ``models`` (NAME -> DIR) and ``options`` on a free port
    (``env`` added to the environment; ``context`` to reach it over HTTPS); yields (port,
    process) once /health answers 200, stops the process after. ``meanwhile`` runs once the
    process has started, while it loads (a test's own reference work, on the other core)."""
    port = free_port()
    argv = [sys.executable, "-m", "bertforge.cli", "serve", "--port", str(port)]
    for name, directory in models.items():
        argv += ["--model", f"{name}={directory}"]
    argv += ["--precision", "fp32", "--device", "cpu", *options]
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **(env or {})}
    sink = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        if meanwhile is not None:
            meanwhile()
        deadline = time.monotonic() + startup
        while True:
            if process.poll() is not None:
                text = log.read_text() if log else ""
                raise RuntimeError(f"bertforge serve exited with {process.returncode}: {text}")
            try:
                if request(port, "GET", "/health", context=context)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"bertforge serve did not answer within {startup} s")
            time.sleep(0.1)
        yield port, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log:
            sink.close()


# ---- a fuzzer: random garbage for every route -----------------------------------------------------
ROUTES = [
    "/tokenize",
    "/fill-mask",
    "/predict",
    "/embed",
    "/similarity",
    "/attention",
    "/attribute",
    "/tag",
    "/answer",
]
GETS = ["/health", "/info", "/metrics", "/", "/docs", "/openapi.json", "/static/app.js"]
WEIRD = [
    "",
    "🙂",
    "Ünïcødé",
    "日本語のテキスト",
    "مرحبا بالعالم",
    "\x00",
    "\u202e",
    "[MASK]",
    "[CLS]",
    "##",
]


def random_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return " ".join(
            rng.choice(WEIRD + ["the", "movie", "good", "[MASK]"])
            for _ in range(rng.randint(0, 30))
        )
    if kind < 0.6:
        return "".join(chr(rng.randint(0, 0x2FFFF)) for _ in range(rng.randint(0, 200))).replace(
            "\ud800", ""
        )
    if kind < 0.8:
        return "word " * rng.randint(0, 400) + "[MASK]"
    return rng.choice(WEIRD) * rng.randint(0, 100)


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randint(0, 9 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**80), 10**30, 7])
    if kind == 3:
        return rng.choice([0.5, -1e308, 1e308, 3.0])
    if kind in (4, 5):
        return random_text(rng)
    if kind in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    keys = [
        "inputs",
        "model",
        "top_k",
        "pooling",
        "normalize",
        "truncate",
        "steps",
        "target",
        "max_tokens",
        "x",
    ]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randint(0, 6))}


def random_body(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.15:
        return bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 300)))
    if kind < 0.2:  # deeply nested JSON
        depth = rng.randint(50, 5000)
        return b"[" * depth + b"]" * depth
    if kind < 0.25:  # truncated JSON
        text = json.dumps({"inputs": random_text(rng)})
        return text[: rng.randint(0, len(text))].encode("utf-8", "surrogatepass")
    if kind < 0.3:  # over the payload limit
        return b'{"inputs": "' + b"a" * rng.randint(20_000, 60_000) + b'"}'
    if kind < 0.65:  # plausible fields, hostile values
        body = {
            "inputs": rng.choice(
                [random_text(rng), [random_text(rng) for _ in range(rng.randint(0, 12))]]
            ),
            "model": rng.choice(["mlm", "clf", "reg", "nope", "", 5, None]),
        }
        for key in ("top_k", "pooling", "normalize", "truncate", "steps", "target", "max_tokens"):
            if rng.random() < 0.3:
                body[key] = random_value(rng, 3)
        if rng.random() < 0.1:
            body.pop("model")
        return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    return json.dumps(random_value(rng)).encode("utf-8", "surrogatepass")


def raw_garbage(port: int, rng: random.Random) -> bytes:
    """Non-HTTP bytes on a fresh connection; returns what the server said before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 500))) + b"\r\n\r\n")
        try:
            return sock.recv(200)
        except (ConnectionResetError, TimeoutError):
            return b""


def fuzz(port: int, count: int, seed: int, statuses: Counter, deadline: float) -> int:
    """Send ``count`` garbage requests from 4 threads; returns how many were sent."""
    sent = [0]
    lock = threading.Lock()

    def worker(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        client = Client(port, timeout=30)
        for _ in range(k, count, 4):
            if time.monotonic() > deadline:
                break
            roll = rng.random()
            if roll < 0.03:
                reply = raw_garbage(port, rng)
                status = int(reply[9:12]) if reply[:5] == b"HTTP/" else 0
            else:
                method = rng.choice(["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
                if roll < 0.08:
                    path = "/" + "".join(
                        rng.choice("abc/%.?&=~") for _ in range(rng.randint(0, 2000))
                    )
                elif method == "GET":
                    path = rng.choice(GETS + ROUTES)
                else:
                    path = rng.choice(ROUTES)
                headers = {}
                if rng.random() < 0.2:
                    headers["Content-Type"] = rng.choice(
                        ["text/plain", "application/x-www-form-urlencoded", "garbage/\x7f", ""]
                    )
                status, _ = client.request(method, path, raw=random_body(rng), headers=headers)
            with lock:
                statuses[status] += 1
                sent[0] += 1
        client.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent[0]
