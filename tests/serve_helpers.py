"""A real ``bertforge serve`` process on a free localhost port, tiny models for it, and a
small HTTP client (imported by the serve tests and benchmarks/bench_serve.py)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def tiny_models(root: Path) -> dict[str, Path]:
    """A tiny masked LM (tokenizer trained on the task fixtures' words), a 2-label classifier
    and a regressor on its encoder, saved as model directories."""
    sys.path.insert(0, str(Path(__file__).parent))
    from task_fixtures import tiny_start_model

    from bertforge.modeling.model import BertForSequenceClassification
    from bertforge.tokenizer import Tokenizer

    mlm = tiny_start_model(root, kind="mlm")
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """JSON over one keep-alive HTTP/1.1 connection to 127.0.0.1 (reconnects when closed)."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.port, self.timeout = port, timeout
        self.conn: http.client.HTTPConnection | None = None

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
        sent_headers = {"Content-Type": "application/json", **(headers or {})}
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
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
        kind = response.getheader("content-type", "")
        if kind.startswith("application/json"):
            return response.status, json.loads(payload)
        return response.status, payload.decode("utf-8", "replace")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def request(port: int, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    """One request on a fresh connection."""
    client = Client(port)
    try:
        return client.request(method, path, body, **kw)
    finally:
        client.close()


@contextlib.contextmanager
def serve(
    models: dict[str, Path], *options: str, log: Path | None = None, startup: float = 120.0
) -> Iterator[tuple[int, subprocess.Popen]]:
    """Run ``bertforge serve`` with ``models`` (NAME -> DIR) and ``options`` on a free port;
    yields (port, process) once /health answers, stops the process after."""
    port = free_port()
    argv = [sys.executable, "-m", "bertforge.cli", "serve", "--port", str(port)]
    for name, directory in models.items():
        argv += ["--model", f"{name}={directory}"]
    argv += ["--precision", "fp32", "--device", "cpu", *options]
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    sink = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + startup
        while True:
            if process.poll() is not None:
                text = log.read_text() if log else ""
                raise RuntimeError(f"bertforge serve exited with {process.returncode}: {text}")
            try:
                if request(port, "GET", "/health")[0] == 200:
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
