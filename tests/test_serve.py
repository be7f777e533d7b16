"""``bertforge serve`` against a real server process on a free localhost port: every route
answers what the inference functions answer in this process, every limit answers 4xx naming
the limit, malformed input gets one clear message, and concurrent clients get the answers
sequential ones get."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from conftest import TaskFiles  # noqa: E402
from support.serve import ROOT, Client, request, serve, tiny_models  # noqa: E402

import bertforge  # noqa: E402
from bertforge.inference.explain import (  # noqa: E402
    attention_maps,
    attribute,
    integrated_gradients,
    padded_baseline,
)
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification, BertModel  # noqa: E402
from bertforge.serve.batcher import Batcher, Job, take_batch  # noqa: E402
from bertforge.tokenizer import Tokenizer  # noqa: E402

TEXTS = ["the [MASK] was a film .", "a [MASK] story about [MASK] town .", "good [MASK]"]
PLAIN = ["the movie was a film .", "good", "a bad story about people who went to town ."]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    made = tiny_models(tmp_path_factory.mktemp("serve"))
    # the masked LM again, declaring mean pooling and normalisation as sentence-transformers does
    st = made["mlm"].parent / "st"
    shutil.copytree(made["mlm"], st)
    TaskFiles.declare_mean_pooling(st, dim=32)
    # the encoder alone (no head): embeddings only
    enc = made["mlm"].parent / "enc"
    BertModel.from_pretrained(made["mlm"]).save_pretrained(
        enc, tokenizer=Tokenizer.from_file(made["mlm"])
    )
    return {**made, "st": st, "enc": enc}


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    with serve(models, "--max_client_batch_size", "8", "--max_input_length", "48", log=log) as (
        port,
        _,
    ):
        yield port


# ---- pure parts ---------------------------------------------------------------------------------
def test_take_batch_merges_same_key_under_the_token_budget():
    import collections

    def job(key, tokens):
        return Job(key, [key], tokens, run=lambda items: items)

    queue = collections.deque([job("a", 6), job("b", 1), job("a", 4), job("a", 1), job("a", 2)])
    batch = take_batch(queue, max_tokens=11)
    assert [(j.key, j.tokens) for j in batch] == [("a", 6), ("a", 4), ("a", 1)]
    assert [(j.key, j.tokens) for j in queue] == [("b", 1), ("a", 2)]  # order kept
    big = collections.deque([job("a", 50), job("a", 1)])
    assert [j.tokens for j in take_batch(big, max_tokens=10)] == [50]  # alone when too big


def test_attention_maps_equal_transformers_output_attentions(models):
    transformers = pytest.importorskip("transformers")
    ours = BertModel.from_pretrained(models["mlm"]).eval()
    theirs = transformers.BertModel.from_pretrained(models["mlm"], attn_implementation="eager")
    ids = torch.tensor(
        Tokenizer.from_file(models["mlm"]).encode("a good film about town")["input_ids"]
    )
    maps = attention_maps(ours, ids)  # (L, nh, T, T)
    with torch.no_grad():
        ref = theirs.eval()(input_ids=ids[None], output_attentions=True).attentions
    assert maps.shape == (2, 4, len(ids), len(ids))
    torch.testing.assert_close(maps, torch.stack(ref)[:, 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))


def test_integrated_gradients_completeness_and_baseline_tokens(models):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(models["clf"]).eval()
    with torch.no_grad():  # larger weights than BERT's init: a far from linear function
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.3)
    tok = Tokenizer.from_file(models["clf"])
    ids = torch.tensor(tok.encode("a good film about people")["input_ids"])
    baseline = ids.clone()
    baseline[1:-1] = tok.pad_id
    coarse = integrated_gradients(model, ids, baseline, target=1, steps=2)
    fine = integrated_gradients(model, ids, baseline, target=1, steps=128, chunk=50)
    change = fine.output - fine.baseline_output
    assert abs(change) > 1e-2
    # completeness: the attributions add up to the output's change, closer with more steps
    assert abs(fine.delta) < 0.02 * abs(change)
    assert abs(fine.delta) <= abs(coarse.delta) + 1e-6
    assert fine.attributions[0] == 0 and fine.attributions[-1] == 0  # same as the baseline
    assert float(fine.attributions[1:-1].abs().min()) > 0


def test_attribute_explains_the_prediction_that_classify_makes(models):
    model = BertForSequenceClassification.from_pretrained(models["clf"]).eval()
    tok = Tokenizer.from_file(models["clf"])
    text = "a good film about people"
    encoded = tok.encode(text, "in town")
    ids = torch.tensor(encoded["input_ids"])
    types = torch.tensor(encoded["token_type_ids"])
    sep = ids.tolist().index(tok.sep_id)
    baseline = padded_baseline(ids, tok)  # [CLS] [PAD]... [SEP] [PAD]... [SEP]
    assert baseline.tolist() == [tok.cls_id, *[tok.pad_id] * (sep - 1), tok.sep_id] + [
        tok.pad_id
    ] * (len(ids) - sep - 2) + [tok.sep_id]
    (expected,) = bertforge.classify(model, tok, [text], ["in town"])
    explained = attribute(model, tok, ids, types, steps=16)
    assert explained.label == explained.target == expected["label"] and explained.value is None
    assert explained.scores == pytest.approx(expected["scores"], abs=1e-5)
    same = integrated_gradients(model, ids, baseline, 1 if expected["label"] == "pos" else 0, 16)
    torch.testing.assert_close(explained.attribution.attributions, same.attributions)
    other = "neg" if expected["label"] == "pos" else "pos"
    assert attribute(model, tok, ids, types, target=["neg", "pos"].index(other)).target == other
    with pytest.raises(ValueError, match="target=2 is not a label index; give 0 to 1"):
        attribute(model, tok, ids, target=2)
    regressor = BertForSequenceClassification.from_pretrained(models["reg"]).eval()
    (value,) = bertforge.classify(regressor, tok, [text])
    explained = attribute(regressor, tok, torch.tensor(tok.encode(text)["input_ids"]), steps=4)
    assert explained.label is explained.scores is explained.target is None
    assert explained.value == pytest.approx(value["value"], abs=1e-5)


def test_integrated_gradients_leave_other_threads_forward_passes_alone(models):
    """``--workers 2`` runs /attribute beside other passes of the same model: the embedding
    hook of integrated gradients must act on its own thread only (it once fed its path to the
    other thread's pass: wrong answers, or a shape error)."""
    model = BertForSequenceClassification.from_pretrained(models["clf"]).eval()
    tok = Tokenizer.from_file(models["clf"])
    ids = torch.tensor(tok.encode("a good film about people in town")["input_ids"])
    other = torch.tensor([tok.encode("a bad story")["input_ids"]] * 4)  # (4, T')
    with torch.inference_mode():
        expected = model(other).logits
    baseline = ids.clone()
    baseline[1:-1] = tok.pad_id
    stop, seen = threading.Event(), []

    def explain() -> None:
        while not stop.is_set():
            integrated_gradients(model, ids, baseline, target=1, steps=8, chunk=4)

    worker = threading.Thread(target=explain)
    worker.start()
    try:
        for _ in range(200):
            with torch.inference_mode():
                seen.append(model(other).logits)
    finally:
        stop.set()
        worker.join()
    assert all(torch.equal(logits, expected) for logits in seen)


# ---- the server ---------------------------------------------------------------------------------
def test_health_info_docs_and_page(server, models):
    assert request(server, "GET", "/health") == (200, {"status": "ok"})
    status, info = request(server, "GET", "/info")
    assert status == 200
    by_name = {m["name"]: m for m in info["models"]}
    assert {n: m["kind"] for n, m in by_name.items()} == {
        "mlm": "masked-lm",
        "clf": "classifier",
        "reg": "classifier",
        "st": "masked-lm",
        "enc": "encoder",
    }
    clf = BertForSequenceClassification.from_pretrained(models["clf"])
    assert by_name["clf"]["parameters"] == sum(p.numel() for p in clf.parameters())
    assert by_name["clf"]["labels"] == ["neg", "pos"] and by_name["reg"]["regression"]
    assert by_name["mlm"]["config"]["hidden_size"] == 32
    assert info["limits"]["max_client_batch_size"] == 8
    status, page = request(server, "GET", "/docs")
    assert status == 200 and "/docs-assets/swagger-ui-bundle.js" in page
    assert "https://" not in page and "cdn" not in page  # no CDN: the docs work offline
    assert request(server, "GET", "/docs-assets/swagger-ui-bundle.js")[0] == 200
    status, html = request(server, "GET", "/")
    assert status == 200 and "[MASK]" in html and "/static/app.js" in html
    assert "https://" not in html  # nothing from a CDN
    for asset in ("/static/app.js", "/static/style.css"):
        status, text = request(server, "GET", asset)
        assert status == 200 and "https://" not in text
    assert request(server, "GET", "/static/secret.py")[0] == 404
    status, spec = request(server, "GET", "/openapi.json")
    assert {"/fill-mask", "/embed", "/attention", "/attribute", "/similarity"} <= set(spec["paths"])


def test_tokenize_gives_wordpieces_with_offsets(server, models):
    text = "Good films, about TOWN."
    status, (pieces,) = request(server, "POST", "/tokenize", {"inputs": [text]})
    assert status == 200
    tok = Tokenizer.from_file(models["mlm"])
    assert [p["id"] for p in pieces] == tok.encode(text)["input_ids"]
    assert pieces[0]["text"] == "[CLS]" and pieces[-1]["text"] == "[SEP]"
    for p in pieces[1:-1]:  # "," is not in the tiny vocabulary: [UNK] with the comma's span
        span = text[p["start"] : p["stop"]].lower()
        assert p["text"].removeprefix("##") == ("[UNK]" if span == "," else span)


def test_fill_mask_predict_embed_similarity_equal_the_library(server, models):
    mlm = BertForMaskedLM.from_pretrained(models["mlm"])
    tok = Tokenizer.from_file(models["mlm"])
    status, served = request(server, "POST", "/fill-mask", {"inputs": TEXTS, "top_k": 4})
    assert status == 200
    direct = bertforge.fill_mask(mlm, tok, TEXTS, top_k=4)
    assert [r["filled"] for r in served] == [r["filled"] for r in direct]
    for a, b in zip(served, direct, strict=True):
        assert [[c["id"] for c in m] for m in a["masks"]] == [
            [c["id"] for c in m] for m in b["masks"]
        ]
        assert [c["score"] for m in a["masks"] for c in m] == pytest.approx(
            [c["score"] for m in b["masks"] for c in m], abs=1e-6
        )

    clf = BertForSequenceClassification.from_pretrained(models["clf"])
    status, served = request(server, "POST", "/predict", {"inputs": PLAIN, "model": "clf"})
    direct = bertforge.classify(clf, tok, PLAIN)
    assert status == 200 and [r["label"] for r in served] == [r["label"] for r in direct]
    assert served[0]["scores"]["pos"] == pytest.approx(direct[0]["scores"]["pos"], abs=1e-6)
    status, served = request(server, "POST", "/predict", {"inputs": "good", "model": "reg"})
    reg = BertForSequenceClassification.from_pretrained(models["reg"])
    assert served[0]["value"] == pytest.approx(
        bertforge.classify(reg, tok, ["good"])[0]["value"], abs=1e-6
    )

    encoder = BertModel.from_pretrained(models["mlm"])
    for pooling, normalize in (("cls", False), ("mean", True)):
        body = {"inputs": PLAIN, "pooling": pooling, "normalize": normalize}
        status, vectors = request(server, "POST", "/embed", body)
        direct = bertforge.embed(encoder, tok, PLAIN, pooling, normalize=normalize)
        assert status == 200 and np.allclose(vectors, direct, atol=1e-5)
    # unset pooling: what the model declares (st: mean, normalised), else cls without normalising
    status, vectors = request(server, "POST", "/embed", {"inputs": PLAIN, "model": "st"})
    assert status == 200 and np.allclose(vectors, direct, atol=1e-5)  # direct: mean, normalised
    status, vectors = request(server, "POST", "/embed", {"inputs": PLAIN})
    cls = bertforge.embed(encoder, tok, PLAIN, "cls", normalize=False)
    assert status == 200 and np.allclose(vectors, cls, atol=1e-5)
    status, answer = request(server, "POST", "/similarity", {"inputs": PLAIN, "pooling": "mean"})
    unit = bertforge.embed(encoder, tok, PLAIN, "mean", normalize=True)
    assert status == 200 and np.allclose(answer["similarity"], unit @ unit.T, atol=1e-4)


def test_attention_and_attribute(server, models):
    text = "a good film about town"
    status, answer = request(server, "POST", "/attention", {"inputs": text, "model": "clf"})
    assert status == 200 and (answer["layers"], answer["heads"]) == (2, 4)
    encoder = BertForSequenceClassification.from_pretrained(models["clf"]).bert
    ids = torch.tensor(Tokenizer.from_file(models["clf"]).encode(text)["input_ids"])
    assert answer["tokens"][0] == "[CLS]" and len(answer["tokens"]) == len(ids)
    assert np.allclose(answer["attentions"], attention_maps(encoder, ids).numpy(), atol=1e-4)
    status, cut = request(server, "POST", "/attention", {"inputs": text, "max_tokens": 4})
    assert status == 200 and cut["truncated"] and cut["tokens"][-1] == "[SEP]"
    assert np.array(cut["attentions"]).shape == (2, 4, 4, 4)

    body = {"inputs": text, "model": "clf", "steps": 64}
    status, answer = request(server, "POST", "/attribute", body)
    assert status == 200, answer
    _, (prediction,) = request(server, "POST", "/predict", {"inputs": text, "model": "clf"})
    assert answer["label"] == answer["target"] == prediction["label"]
    assert len(answer["attributions"]) == len(answer["tokens"]) == len(ids)
    change = answer["output"] - answer["baseline_output"]
    assert abs(sum(answer["attributions"]) - change) == pytest.approx(
        abs(answer["delta"]), abs=1e-6
    )
    status, other = request(server, "POST", "/attribute", {**body, "target": "pos"})
    assert status == 200 and other["target"] == "pos"
    status, answer = request(server, "POST", "/attribute", {"inputs": text, "model": "reg"})
    assert status == 200 and "value" in answer and len(answer["attributions"]) == len(ids)


LONG = "the movie " * 40  # 82 tokens with [CLS]/[SEP]: over --max_input_length 48


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("POST", "/fill-mask", b'{"inputs": "the [MASK]",', 422, "malformed JSON"),
        ("POST", "/fill-mask", b"\xff\xfe garbage", 422, "JSON"),
        (
            "POST",
            "/embed",
            b'{"inputs": "\xff\xfe bad"}',
            422,
            "the body is not UTF-8 (byte 0xff at position 12); send a UTF-8 JSON object such as "
            '{"inputs": "a text"}',
        ),
        ("POST", "/embed", b"[" * 100_000, 422, "nested too deeply"),
        ("POST", "/embed", b'{"inputs": "a",', 422, "malformed JSON at character 15"),
        ("POST", "/fill-mask", b'{"inputs": "\\ud800 [MASK]"}', 422, "not valid Unicode"),
        ("POST", "/attention", b'{"inputs": "a \\udfff"}', 422, "not valid Unicode"),
        ("POST", "/fill-mask", [1, 2], 422, "dictionary"),
        ("POST", "/fill-mask", {"inputs": "no mask here"}, 422, "no [MASK]"),
        ("POST", "/fill-mask", {"inputs": "the [MASK]", "model": "gpt"}, 404, "not served"),
        (
            "POST",
            "/fill-mask",
            {"inputs": "the [MASK]", "model": "clf"},
            422,
            "model 'clf' is a classifier model: /fill-mask needs a masked-lm model (mlm, st",
        ),
        (
            "POST",
            "/predict",
            {"inputs": "good", "model": "enc"},
            422,
            "model 'enc' is an encoder model: /predict needs a classifier model",
        ),
        ("POST", "/fill-mask", {"inputs": "the [MASK]", "top_k": 0}, 422, "top_k"),
        ("POST", "/fill-mask", {"inputs": "the [MASK]", "top_k": "x"}, 422, "top_k"),
        ("POST", "/fill-mask", {"text": "the [MASK]"}, 422, "inputs: required"),
        ("POST", "/fill-mask", {"inputs": "[MASK]", "bogus": 1}, 422, "bogus: unknown field"),
        ("POST", "/fill-mask", {"inputs": LONG + "[MASK]"}, 413, "--max_input_length=48"),
        ("POST", "/embed", {"inputs": []}, 422, "empty"),
        ("POST", "/embed", {"inputs": ["a"] * 9}, 413, "--max_client_batch_size=8"),
        ("POST", "/embed", {"inputs": LONG}, 413, "truncate"),
        ("POST", "/embed", {"inputs": "a", "pooling": "median"}, 422, "pooling"),
        ("POST", "/predict", {"inputs": "good"}, 422, "is a masked-lm model: /predict needs a"),
        ("POST", "/similarity", {"inputs": ["one"]}, 422, "at least 2"),
        (
            "POST",
            "/attention",
            {"inputs": "word " * 10_000, "model": "reg"},
            413,
            "--max_attention_tokens",
        ),
        ("POST", "/attention", {"inputs": "a", "max_tokens": 1}, 422, "max_tokens"),
        (
            "POST",
            "/attribute",
            {"inputs": "a", "model": "clf", "steps": 10_000},
            422,
            "--max_attribution_steps",
        ),
        ("POST", "/attribute", {"inputs": "a", "model": "clf", "target": "x"}, 422, "not a label"),
        ("POST", "/attribute", {"inputs": "a", "model": "mlm"}, 422, "classifier"),
        ("GET", "/fill-mask", None, 405, "Method Not Allowed"),
        ("GET", "/nowhere", None, 404, "/docs"),
    ],
)
def test_bad_requests_get_a_clear_4xx(server, method, path, body, status, says):
    raw = body if isinstance(body, bytes) else None
    got, answer = request(server, method, path, None if raw else body, raw=raw)
    assert got == status, answer
    assert says in answer["error"] and "\n" not in answer["error"]
    assert request(server, "GET", "/health")[0] == 200


def test_truncate_cuts_instead_of_refusing(server):
    status, vectors = request(server, "POST", "/embed", {"inputs": LONG, "truncate": True})
    assert status == 200 and len(vectors) == 1 and len(vectors[0]) == 32


def test_workers_run_batches_side_by_side():
    def meeting(timeout: float):
        both = threading.Barrier(2, timeout=timeout)

        def meet(items):  # returns only once the other batch is running too
            both.wait()
            return items

        return meet

    batcher = Batcher(max_batch_tokens=1, workers=2)  # every job its own batch
    try:
        meet = meeting(timeout=10)
        futures = [batcher.submit(key, [key], 1, meet) for key in ("a", "b")]
        assert [f.result(timeout=10) for f in futures] == [["a"], ["b"]]
    finally:
        batcher.close()
    lone = Batcher(max_batch_tokens=1, workers=1)  # one worker: the second batch waits
    try:
        meet = meeting(timeout=0.5)
        futures = [lone.submit(key, [key], 1, meet) for key in ("a", "b")]
        with pytest.raises(threading.BrokenBarrierError):
            futures[0].result(timeout=10)
    finally:
        lone.close()


def test_batch_wait_lets_later_requests_join_the_pass():
    calls: list[list[str]] = []

    def record(items):
        calls.append(list(items))
        return items

    batcher = Batcher(max_batch_tokens=100, max_wait=0.5)
    try:
        first = batcher.submit("k", ["a"], 1, record)
        time.sleep(0.05)  # well inside the wait: joins the same forward pass
        second = batcher.submit("k", ["b"], 1, record)
        assert first.result(timeout=5) == ["a"] and second.result(timeout=5) == ["b"]
    finally:
        batcher.close()
    assert calls == [["a", "b"]]


def test_concurrent_clients_get_the_sequential_answers_in_shared_batches(server):
    check_concurrent_answers(server)


@pytest.fixture(scope="module")
def pooled_server(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-pooled") / "server.log"
    options = ("--workers", "2", "--num_threads", "1", "--batch_wait_ms", "3")
    with serve(models, *options, "--max_client_batch_size", "8", log=log) as (port, _):
        yield port


def test_two_workers_and_batch_wait_give_the_sequential_answers(pooled_server):
    check_concurrent_answers(pooled_server)


def check_concurrent_answers(server: int) -> None:
    """96 requests from 16 threads answer what the same requests sent one by one answer, and
    some of them share forward passes."""
    bodies = []
    for i in range(96):
        text = f"{PLAIN[i % 3]} " * (1 + i % 4)
        if i % 2:
            bodies.append(("/fill-mask", {"inputs": [text + " [MASK] .", "[MASK] " + text]}))
        else:
            bodies.append(("/embed", {"inputs": text, "pooling": "mean"}))
    client = Client(server)
    sequential = [client.request("POST", path, body) for path, body in bodies]
    client.close()
    _, before = request(server, "GET", "/metrics")
    concurrent: list = [None] * len(bodies)

    def worker(k: int) -> None:
        c = Client(server)
        for i in range(k, len(bodies), 16):
            concurrent[i] = c.request("POST", *bodies[i])
        c.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (path, _), (s1, a), (s2, b) in zip(bodies, sequential, concurrent, strict=True):
        assert s1 == s2 == 200
        if path == "/embed":
            assert np.allclose(a, b, atol=1e-5)
        else:
            assert [r["filled"] for r in a] == [r["filled"] for r in b]
            ids = [[[c["id"] for c in m] for m in r["masks"]] for r in a]
            assert ids == [[[c["id"] for c in m] for m in r["masks"]] for r in b]
    _, after = request(server, "GET", "/metrics")

    def count(text: str, name: str) -> float:
        return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])

    passes = count(after, "bertforge_batch_requests_count") - count(
        before, "bertforge_batch_requests_count"
    )
    merged = count(after, "bertforge_batch_requests_sum") - count(
        before, "bertforge_batch_requests_sum"
    )
    assert merged == len(bodies)  # every request went through the batcher once
    assert passes < len(bodies)  # and some shared a forward pass
    assert 'bertforge_requests_total{route="/embed",status="200"}' in after
    assert "bertforge_queued_requests 0" in after


# ---- limits that need their own server -----------------------------------------------------------
@pytest.fixture(scope="module")
def strict_server(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-strict") / "server.log"
    options = ("--max_concurrent_requests", "2", "--max_payload_bytes", "2000")
    with serve(models, *options, "--request_timeout", "1.5", log=log) as (port, process):
        yield port, process


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_payload_limit_declared_and_streamed(strict_server):
    port, _ = strict_server
    status, answer = request(port, "POST", "/embed", {"inputs": "x" * 3000})
    assert status == 413 and "--max_payload_bytes=2000" in answer["error"]
    # a chunked body declares no length: counted while it arrives
    sock = _connect(port)
    head = b"POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b'{"inputs": "' + b"y" * 1500
    sock.sendall(
        head + b"%x\r\n%s\r\n" % (len(chunk), chunk) + b"%x\r\n%s\r\n" % (len(chunk), chunk)
    )
    reply = _read_all(sock)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413") and b"--max_payload_bytes=2000" in reply


def test_slow_clients_time_out_and_concurrency_limit_answers_429(strict_server):
    port, _ = strict_server
    start = time.monotonic()
    # two clients that send headers and part of a body, then stall: both slots taken
    stalled = []
    for _ in range(2):
        sock = _connect(port)
        sock.sendall(b'POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"inp')
        stalled.append(sock)
    time.sleep(0.3)
    status, answer = request(port, "POST", "/embed", {"inputs": "good"})
    assert status == 429 and "--max_concurrent_requests=2" in answer["error"]
    assert request(port, "GET", "/health")[0] == 200  # GETs are not counted
    for sock in stalled:  # each stalled client is answered 408 at the deadline and let go
        reply = _read_all(sock)
        sock.close()
        assert reply.startswith(b"HTTP/1.1 408") and b"--request_timeout=1.5" in reply
    assert time.monotonic() - start < 6
    assert request(port, "POST", "/embed", {"inputs": "good"})[0] == 200  # slots are free again
    # a client that connects and never finishes its headers is disconnected
    sock = _connect(port)
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    assert _read_all(sock) == b""
    assert time.monotonic() - t0 < 4
    sock.close()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model", "m=/nonexistent/model"], "no such model directory"),
        (["--model", "bad name=/tmp"], "letters, digits"),
        (["--model", "/tmp/a", "--max_input_length", "0"], "--max_input_length"),
        (["--port", "80"], "--model"),
        (["--model", "/tmp/a", "--workers", "0"], "--workers 0 must be at least 1"),
        (["--model", "/tmp/a", "--batch_wait_ms", "-1"], "--batch_wait_ms"),
    ],
)
def test_serve_command_errors_are_one_line(argv, says, capsys):
    from bertforge.cli import main

    assert main(["serve", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


def test_a_training_run_given_to_serve_names_its_model(tmp_path, capsys):
    from bertforge.cli import main

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    assert main(["serve", "--model", f"m={run}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --model m={run}: a training run, not a model directory; its model is "
        f"{run / 'model'} (give that directory)\n"
    )


def test_a_port_in_use_is_one_line_and_exit_2_before_serving(tmp_path):
    """Another process listening on the port: refused before the models load and before
    "serving on" is printed (uvicorn itself would log a traceback-like error and exit 3)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(tmp_path)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run(
            [*argv, "--port", str(port)], capture_output=True, text=True, env=env, timeout=120
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use; pass another --port"
    ]
    assert "serving on" not in done.stderr + done.stdout
