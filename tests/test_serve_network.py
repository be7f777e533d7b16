"""``bertforge serve`` beyond localhost, against real server processes: the API key on every
route (401 without it or with a wrong one), a non-loopback ``--host`` without a key refused
before anything loads, HTTPS with a self-signed certificate made here, a SIGTERM under 32
concurrent requests that loses none of them and exits 0, ``/health`` 503 while the models
load, and the access log, request ids and metric names an operator relies on."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from support.serve import ROOT, Client, free_port, request, serve, tiny_models  # noqa: E402

from bertforge.serve.access import access_line, bearer_matches, request_id  # noqa: E402
from bertforge.serve.config import ServeConfig, is_loopback  # noqa: E402

KEY = "s3cret-key-for-the-test"

# every route, each with a body it answers 200 to (/health, the page and the docs are public)
ROUTES = [
    ("GET", "/info", None),
    ("GET", "/metrics", None),
    ("POST", "/tokenize", {"inputs": "a good film"}),
    ("POST", "/fill-mask", {"inputs": "a [MASK] film", "model": "mlm"}),
    ("POST", "/predict", {"inputs": "a good film", "model": "clf"}),
    ("POST", "/embed", {"inputs": ["a good film", "bad"]}),
    ("POST", "/similarity", {"inputs": ["a good film", "bad"]}),
    ("POST", "/attention", {"inputs": "a good film"}),
    ("POST", "/attribute", {"inputs": "a good film", "model": "clf", "steps": 4}),
]
PUBLIC = ["/health", "/", "/static/app.js", "/static/style.css", "/docs", "/openapi.json"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return tiny_models(tmp_path_factory.mktemp("network"))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made now with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def trusting(certificate) -> ssl.SSLContext:
    """A client context that trusts the test's certificate only (hostname checked)."""
    return ssl.create_default_context(cafile=str(certificate[0]))


@pytest.fixture(scope="module")
def secured(models, certificate, trusting, tmp_path_factory):
    """A server with a key (from BERTFORGE_API_KEY), over HTTPS, logging JSON lines."""
    log = tmp_path_factory.mktemp("secured") / "server.log"
    cert, key = certificate
    options = ("--ssl_certfile", str(cert), "--ssl_keyfile", str(key), "--log_format", "json")
    options += ("--num_threads", "1")
    served = {"mlm": models["mlm"], "clf": models["clf"]}
    env = {"BERTFORGE_API_KEY": KEY}
    with serve(served, *options, log=log, env=env, context=trusting) as (port, _):
        yield port, log


# ---- pure parts ---------------------------------------------------------------------------------
def test_bearer_matches_the_key_only():
    assert bearer_matches(b"Bearer " + KEY.encode(), KEY)
    assert bearer_matches(b"bearer  " + KEY.encode() + b" ", KEY)  # scheme is case-insensitive
    for wrong in (
        None,
        b"",
        KEY.encode(),
        b"Basic " + KEY.encode(),
        b"Bearer " + KEY[:-1].encode(),
    ):
        assert not bearer_matches(wrong, KEY), wrong
    assert not bearer_matches(b"Bearer " + KEY.encode() + b"x", KEY)


def test_request_ids_are_echoed_when_sane_else_made():
    assert request_id([(b"x-request-id", b"abc-123")]) == "abc-123"
    made = {request_id([]) for _ in range(3)}
    assert len(made) == 3 and all(re.fullmatch(r"[0-9a-f]{32}", m) for m in made)
    for forged in (b"a b", b"x" * 129, b"line\nbreak", b'"quoted"'):  # cannot forge a log line
        assert request_id([(b"x-request-id", forged)]) != forged.decode()
    line = access_line("json", "POST", "/embed", 200, 12.345, "abc")
    assert json.loads(line) | {"time": 0} == {
        "time": 0,
        "method": "POST",
        "route": "/embed",
        "status": 200,
        "ms": 12.35,
        "request_id": "abc",
    }
    assert access_line("text", "GET", "/info", 401, 0.5, "abc").endswith(
        " GET /info 401 0.5ms id=abc"
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("box.example.org", False),
    ],
)
def test_a_host_other_than_loopback_needs_a_key(host, loopback, monkeypatch):
    monkeypatch.delenv("BERTFORGE_API_KEY", raising=False)
    assert is_loopback(host) == loopback
    if loopback:
        ServeConfig(model=["/tmp/m"], host=host)
    else:
        with pytest.raises(Exception, match="BERTFORGE_API_KEY") as err:
            ServeConfig(model=["/tmp/m"], host=host)
        assert "--allow_unauthenticated" in str(err.value)
    ServeConfig(model=["/tmp/m"], host=host, api_key="k")
    ServeConfig(model=["/tmp/m"], host=host, allow_unauthenticated=True)
    monkeypatch.setenv("BERTFORGE_API_KEY", "from-env")
    config = ServeConfig(model=["/tmp/m"], host=host)
    assert config.api_key == "from-env" and "from-env" not in repr(config)
    assert "from-env" not in json.dumps(config.limits())


def test_non_loopback_host_without_key_is_refused_before_loading_or_binding(models):
    """One line, exit 2, before the models load and before the port is bound: the port given
    is taken, and the answer is about the key, not the port."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(models["mlm"])]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        env.pop("BERTFORGE_API_KEY", None)
        done = subprocess.run(
            [*argv, "--host", "0.0.0.0", "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "--host 0.0.0.0 answers other machines" in line
    assert "BERTFORGE_API_KEY=KEY" in line and "--allow_unauthenticated" in line
    assert "masked-lm" not in done.stderr  # no model was loaded


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ssl_certfile", "cert.pem"], "TLS needs both --ssl_certfile and --ssl_keyfile"),
        (["--ssl_certfile", "/nonexistent.pem", "--ssl_keyfile", "k"], "no such file"),
        (["--api_key", " "], "--api_key (or BERTFORGE_API_KEY) is empty"),
        (["--log_format", "xml"], "--log_format"),
        (["--shutdown_timeout", "-1"], "--shutdown_timeout"),
    ],
)
def test_network_option_errors_are_one_line(argv, says, capsys):
    from bertforge.cli import main

    assert main(["serve", "--model", "/tmp/m", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


def test_a_key_that_is_not_the_certificates_is_one_line(models, certificate, tmp_path, capsys):
    from bertforge.cli import main

    cert, _ = certificate
    other = tmp_path / "other.pem"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(other), "2048"], check=True, capture_output=True
    )
    argv = ["serve", "--model", str(models["mlm"]), "--ssl_certfile", str(cert)]
    assert main([*argv, "--ssl_keyfile", str(other), "--port", str(free_port())]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot use them" in line and "give a PEM certificate and its private key" in line


# ---- a server with a key, over HTTPS --------------------------------------------------------------
def test_every_route_needs_the_key_and_answers_with_it(secured, trusting):
    port, log = secured
    keyed = Client(port, context=trusting, headers={"Authorization": f"Bearer {KEY}"})
    wrong = Client(port, context=trusting, headers={"Authorization": "Bearer not-the-key"})
    bare = Client(port, context=trusting)
    for method, path, body in ROUTES:
        for client, said in ((bare, "no key"), (wrong, "a wrong key")):
            status, answer = client.request(method, path, body)
            assert status == 401, (path, status, answer)
            assert answer["error_type"] == "unauthorized" and said in answer["error"]
            assert "Authorization: Bearer KEY" in answer["error"]
            assert client.last_headers["www-authenticate"] == "Bearer"
        status, answer = keyed.request(method, path, body)
        assert status == 200, (path, answer)
    for path in PUBLIC:  # no model and no answer in these: a browser must open them bare
        assert bare.request("GET", path)[0] == 200, path
    _, spec = bare.request("GET", "/openapi.json")  # /docs' "Authorize" sends the key
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    _, info = keyed.request("GET", "/info")
    assert info["limits"]["authenticated"] is True and info["limits"]["tls"] is True
    for client in (keyed, wrong, bare):
        client.close()
    text = log.read_text()
    assert KEY not in text and "not-the-key" not in text  # never logged
    assert KEY not in json.dumps(info)


def test_plain_http_to_the_tls_port_gets_no_answer(secured):
    port, _ = secured
    try:
        status = request(port, "GET", "/health")[0]
    except (OSError, http.client.HTTPException):
        status = None
    assert status is None
    untrusting = ssl.create_default_context()  # the system's CAs: a self-signed cert fails
    with pytest.raises(ssl.SSLCertVerificationError):
        request(port, "GET", "/health", context=untrusting)


def test_request_ids_access_log_and_metrics_names(secured, trusting):
    port, log = secured
    client = Client(port, context=trusting, headers={"Authorization": f"Bearer {KEY}"})
    status, _ = client.request(
        "POST", "/embed", {"inputs": "good"}, headers={"X-Request-Id": "r-42"}
    )
    assert status == 200 and client.last_headers["x-request-id"] == "r-42"
    client.request("GET", "/info")
    made = client.last_headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    status, text = client.request("GET", "/metrics")
    client.close()
    time.sleep(0.2)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    by_id = {r["request_id"]: r for r in records}
    assert by_id["r-42"]["method"] == "POST" and by_id["r-42"]["route"] == "/embed"
    assert by_id["r-42"]["status"] == 200 and by_id["r-42"]["ms"] > 0
    assert by_id[made]["route"] == "/info"
    assert {r["status"] for r in records} >= {200, 401}
    check_prometheus_conventions(text)


def check_prometheus_conventions(text: str) -> None:
    """Names, suffixes and histogram series as the Prometheus naming conventions and text
    format say: counters end in _total, a duration is in seconds, histograms have cumulative
    buckets ending at +Inf that equal their _count, every series has a TYPE."""
    types: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            name, _, labels = head.partition("{")
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            samples.append((name, pairs, float(value)))
    for name, kind in types.items():
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), name
        assert name.startswith(("bertforge_", "process_")), name
        assert (kind == "counter") == name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith(("_seconds", "_requests", "_texts", "_tokens")), name
        assert "milliseconds" not in name and not name.endswith("_ms"), name
    for name, _, _ in samples:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or types.get(base) == "histogram", f"{name} has no TYPE"
    for name, kind in types.items():
        if kind != "histogram":
            continue
        series: dict[tuple, list[tuple[float, float]]] = {}
        counts = {}
        for sample, labels, value in samples:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            if sample == name + "_bucket":
                series.setdefault(key, []).append((float(labels["le"]), value))
            elif sample == name + "_count":
                counts[key] = value
        for key, buckets in series.items():
            bounds = [b for b, _ in buckets]
            assert bounds == sorted(bounds) and bounds[-1] == float("inf"), name
            values = [v for _, v in buckets]
            assert values == sorted(values) and values[-1] == counts[key], name
    assert types["bertforge_request_duration_seconds"] == "histogram"
    assert types["bertforge_batch_requests"] == "histogram"
    assert types["process_resident_memory_bytes"] == "gauge"
    ready = [v for n, _, v in samples if n == "bertforge_ready"]
    assert ready == [1.0]


# ---- graceful shutdown and readiness ------------------------------------------------------------
def _in_flight(port: int) -> int:
    _, text = request(port, "GET", "/metrics")
    return int(re.search(r"^bertforge_requests_in_flight (\d+)$", text, re.M).group(1))


def _send_all(port: int, n: int, body: dict) -> list[http.client.HTTPConnection]:
    """``n`` connections, then one /attention request on each, sent within milliseconds."""
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(n)]
    for conn in conns:
        conn.connect()
    payload = json.dumps(body).encode()
    for conn in conns:
        conn.request("POST", "/attention", payload, {"Content-Type": "application/json"})
    deadline = time.monotonic() + 30
    while _in_flight(port) < n:  # every request accepted and being answered
        assert time.monotonic() < deadline, f"the {n} requests never were in flight at once"
        time.sleep(0.02)
    return conns


def _answer(conn: http.client.HTTPConnection) -> tuple[int, object]:
    try:
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    except (OSError, http.client.HTTPException) as err:
        return 0, repr(err)
    finally:
        conn.close()


def test_sigterm_under_32_concurrent_requests_answers_all_and_exits_0(models, tmp_path):
    """32 clients each with a request in flight (every /attention pass, never batched, waits
    100 ms for company, so they queue); SIGTERM; every one is answered 200, a new connection is
    refused, and the process exits 0."""
    log = tmp_path / "server.log"
    options = ("--batch_wait_ms", "100", "--shutdown_timeout", "60", "--num_threads", "1")
    with serve({"clf": models["clf"]}, *options, log=log) as (port, process):
        conns = _send_all(port, 32, {"inputs": "a good film about people"})
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(OSError):  # no longer accepting
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        answers: list = [None] * 32

        def read(i: int) -> None:
            answers[i] = _answer(conns[i])

        threads = [threading.Thread(target=read, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        code = process.wait(timeout=60)
        took = time.monotonic() - stopped
    assert code == 0, log.read_text()[-2000:]
    failed = [a for a in answers if a is None or a[0] != 200]
    assert failed == [], failed[:3]
    assert all(a[1]["tokens"][0] == "[CLS]" for a in answers)
    assert took < 60
    lines = [line for line in log.read_text().splitlines() if " POST /attention " in line]
    assert len(lines) == 32 and all(" 200 " in line for line in lines)


def test_shutdown_timeout_bounds_the_drain(models, tmp_path):
    """Requests that would take longer than --shutdown_timeout are cut off with a JSON 503; the
    process still exits 0, long before the queued work would have been done."""
    options = ("--batch_wait_ms", "2000", "--shutdown_timeout", "1", "--num_threads", "1")
    with serve({"clf": models["clf"]}, *options, log=tmp_path / "server.log") as (port, process):
        conns = _send_all(port, 16, {"inputs": "a good film"})  # 16 x 2 s of waiting
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        took = time.monotonic() - start
        answers = [_answer(conn) for conn in conns]
    assert code == 0 and took < 16, (code, took)  # the queue held 32 s of work
    statuses = [status for status, _ in answers]
    assert 503 in statuses and set(statuses) <= {200, 503}, statuses
    cut = next(answer for status, answer in answers if status == 503)
    assert cut["error_type"] == "shutting-down" and "--shutdown_timeout=1 s" in cut["error"]


def _held_server(
    stage: str, models: dict[str, Path], tmp_path: Path, *options: str
) -> tuple[subprocess.Popen, int, Path, Path]:
    """A ``bertforge serve`` of the tiny classifier started and waited for until it holds at
    pause point ``stage`` (``bertforge.io.pause_point``, e.g. ``serve-ready:1``): the process,
    its port, its log and the marker to delete to let it go on."""
    marker = tmp_path / "paused"
    port = free_port()
    argv = [sys.executable, "-m", "bertforge.cli", "serve", "--port", str(port)]
    argv += ["--model", f"clf={models['clf']}", "--precision", "fp32", "--device", "cpu"]
    argv += list(options)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "BERTFORGE_TEST_PAUSE": f"{stage}:{marker}",
    }
    log = tmp_path / "server.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(log.read_text())
        time.sleep(0.05)
    return process, port, log, marker


def test_health_is_503_until_the_models_are_loaded_and_warmed(models, tmp_path):
    # loaded and warmed, held before it says ready
    process, port, _, marker = _held_server("serve-ready:1", models, tmp_path)
    try:
        deadline = time.monotonic() + 120
        status, health = request(port, "GET", "/health")
        assert status == 503 and health["status"] == "loading"
        warm_up = health["warm_up"]  # warmed, not yet ready: its progress is complete
        assert warm_up["tokens_done"] == warm_up["tokens"] > 0 and warm_up["first_requests_warm"]
        assert warm_up["seconds_left"] == 0
        status, answer = request(port, "POST", "/predict", {"inputs": "good"})
        assert status == 503 and answer["error_type"] == "loading"
        assert "/health" in answer["error"]
        _, text = request(port, "GET", "/metrics")
        assert "bertforge_ready 0" in text
        assert request(port, "GET", "/")[0] == 200  # the page loads meanwhile
        marker.unlink()
        while request(port, "GET", "/health")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert request(port, "GET", "/health") == (200, {"status": "ok"})
        assert request(port, "POST", "/predict", {"inputs": "good"})[0] == 200
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0


def _sigterm_at(stage: str, models: dict[str, Path], tmp_path: Path) -> tuple[int, str]:
    """A server held at pause point ``stage``, sent SIGTERM there and let go: its exit status
    and log."""
    process, _, log, marker = _held_server(stage, models, tmp_path, "--num_threads", "1")
    try:
        process.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the handler runs on the main thread; the server is still held
        marker.unlink()
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    return code, log.read_text()


def test_sigterm_during_the_warm_up_stops_it_and_exits_0(models, tmp_path):
    """SIGTERM while the models warm up (``docker stop`` of a server still starting): the
    warm-up ends after the pass in progress instead of running the rest (it once ran on for
    up to the batcher's 30 s join and then aborted, status 134, with a worker still inside
    torch), the log says so, and the process exits 0 without ever saying ready."""
    code, text = _sigterm_at("serve-warm-pass:2", models, tmp_path)  # after its 2nd pass
    assert code == 0, text[-2000:]
    said = re.search(r"stopped during the warm-up \((\d+) of (\d+) passes done", text)
    assert said, text[-2000:]
    assert int(said[1]) == 2 < int(said[2])  # the rest never ran
    assert "warmed 1 model in" not in text


def test_sigterm_while_the_models_load_waits_for_them_and_exits_0(models, tmp_path):
    """SIGTERM before the models are loaded: the server waits for the loading thread (exiting
    under a thread inside torch aborted the process, status 134), starts no warm-up, and exits
    0 saying why it never served."""
    code, text = _sigterm_at("serve-loaded:1", models, tmp_path)
    assert code == 0, text[-2000:]
    assert "stopped while loading the models: not serving" in text, text[-2000:]
    assert "warming up" not in text


def test_a_model_that_fails_to_load_is_one_line_and_exit_2(models, tmp_path):
    """The port is bound before the models load now: a model whose files were altered still
    ends the process with the loader's one line and exit status 2."""
    altered = tmp_path / "clf"
    shutil.copytree(models["clf"], altered)
    config = json.loads((altered / "config.json").read_text())
    (altered / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.3}))
    argv = [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(altered)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [*argv, "--port", str(free_port()), "--num_threads", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "config.json" in last and "manifest" in last
