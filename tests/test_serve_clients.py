"""The clients people already point at an embedding server, unchanged, against one real
``bertforge serve`` process on loopback (with an API key): the ``openai`` package
(``embeddings.create`` as floats, base64 and token ids, a batch, ``dimensions`` on a model
fine-tuned with ``--matryoshka_dims``, and its exceptions for a wrong key, an input over the
limit, a cut the model was not trained for), LangChain's ``OpenAIEmbeddings``, and
``huggingface_hub.InferenceClient`` on the TEI routes (``feature_extraction``,
``text_classification``, ``get_endpoint_info``); ``/rerank`` in TEI's body, a cross-encoder's
scores against sentence-transformers' ``CrossEncoder`` and an embedding model's against the
cosines of sentence-transformers' vectors. The vectors equal ``bertforge embed``'s and
sentence-transformers' within 1e-5."""

from __future__ import annotations

import base64
import io
import math
import random
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
hub = pytest.importorskip("huggingface_hub")
langchain_openai = pytest.importorskip("langchain_openai")
st = pytest.importorskip("sentence_transformers")

from conftest import FILLER, TaskFiles  # noqa: E402
from support.serve import Client, finetune, serve, tiny_models  # noqa: E402

from bertforge import cli  # noqa: E402
from bertforge.inference.predict import (  # noqa: E402
    classify,
    cut_dimensions,
    trained_dimensions,
)
from bertforge.modeling.model import BertForSequenceClassification  # noqa: E402
from bertforge.serve.limits import error_answer, openai_error  # noqa: E402
from bertforge.serve.routes.tei import cosines, label_scores, ranked  # noqa: E402
from bertforge.tokenizer import Tokenizer  # noqa: E402

KEY = "key-of-the-client-tests"
TEXTS = [
    "A man is playing a guitar.",
    "The new movie is awesome.",
    "A cat sits on the mat.",
    "bertforge serves sentence embeddings",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("clients")
    made = tiny_models(root)
    rng = random.Random(5)
    rows = [
        {"q": " ".join(rng.choice(FILLER) for _ in range(5)), "d": " ".join(rng.sample(FILLER, 6))}
        for _ in range(32)
    ]
    TaskFiles.write_rows(root / "pairs.jsonl", rows, "jsonl")
    options = ["--task", "embedding", "--text_column", "q", "--text_pair_column", "d"]
    options += ["--matryoshka_dims", "32", "16", "--max_length", "24", "--max_steps", "1"]
    mat = finetune(made["mlm"], root / "pairs.jsonl", root / "mat", *options)
    return {"minilm": minilm_dir, "clf": made["clf"], "reg": made["reg"], "mat": mat}


def embed_reference(minilm: Path, root: Path) -> np.ndarray:
    """``bertforge embed``'s vectors of TEXTS with all-MiniLM-L6-v2, checked against
    sentence-transformers' within 1e-5."""
    (root / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    argv = ["embed", "--model", str(minilm), "--input", str(root / "texts.txt")]
    argv += ["--output", str(root / "out.npy"), "--device", "cpu", "--precision", "fp32"]
    with redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
    ours = np.load(root / "out.npy")
    theirs = st.SentenceTransformer(str(minilm), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    return ours


@pytest.fixture(scope="module")
def served(models, tmp_path_factory) -> tuple[str, np.ndarray]:
    """(the server's URL, the reference vectors), made while the server loads."""
    root = tmp_path_factory.mktemp("clients-log")
    options = ("--max_client_batch_size", "8", "--max_input_length", "48", "--num_threads", "1")
    # a small warm-up (shapes up to 128 tokens, 4 requests in flight): the texts here are short
    options += ("--max_batch_tokens", "128", "--max_concurrent_requests", "4")
    found: dict[str, np.ndarray] = {}

    def meanwhile() -> None:
        found["reference"] = embed_reference(models["minilm"], root)

    env = {"BERTFORGE_API_KEY": KEY}
    with serve(models, *options, log=root / "server.log", env=env, meanwhile=meanwhile) as (
        port,
        _,
    ):
        yield f"http://127.0.0.1:{port}", found["reference"]


@pytest.fixture(scope="module")
def server(served) -> str:
    return served[0]


@pytest.fixture(scope="module")
def reference(served) -> np.ndarray:
    return served[1]


# ---- pure parts ---------------------------------------------------------------------------------
def test_matryoshka_sizes_and_cuts_by_hand():
    assert trained_dimensions({}, 384) == [384]
    assert trained_dimensions({"matryoshka_dims": [256, 64, 999]}, 384) == [384, 256, 64]
    vectors = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(cut_dimensions(vectors, 2, False), [[3, 4], [1, 0]])
    np.testing.assert_allclose(cut_dimensions(vectors, 2, True), [[0.6, 0.8], [1, 0]], atol=1e-7)


def test_tei_scores_and_ranks_by_hand():
    logits = np.array([[0.0, math.log(3.0)], [2.0, 2.0]])
    np.testing.assert_allclose(label_scores(logits, "softmax"), [[0.25, 0.75], [0.5, 0.5]])
    np.testing.assert_allclose(label_scores(logits, "sigmoid")[0], [0.5, 0.75])
    np.testing.assert_array_equal(label_scores(logits, "none"), logits)
    np.testing.assert_allclose(cosines(np.array([1.0, 0.0]), np.array([[2.0, 0.0], [1, 1]])),
                               [1.0, math.sqrt(0.5)])  # fmt: skip
    scores = np.array([0.2, 0.9, 0.2, 0.5])
    assert [r["index"] for r in ranked(scores, None)] == [1, 3, 0, 2]  # ties: input order
    assert ranked(scores[:1], ["t"]) == [{"index": 0, "score": 0.2, "text": "t"}]


def test_openai_error_shapes_and_statuses():
    assert error_answer("/embed", 413, "too long", "max-input-length") == (
        413,
        {"error": "too long", "error_type": "max-input-length"},
    )
    status, body = error_answer("/v1/embeddings", 413, "too long", "max-input-length", "input")
    assert status == 400 and body == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
    assert openai_error(422, "m", "validation") == (
        400,
        {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}},
    )
    assert openai_error(401, "m", "unauthorized")[1]["error"]["code"] == "invalid_api_key"
    assert openai_error(404, "m", "model")[1]["error"]["code"] == "model_not_found"
    assert openai_error(429, "m", "max-concurrent-requests")[1]["error"]["type"] == (
        "rate_limit_error"
    )
    assert openai_error(503, "m", "loading") == (
        503,
        {"error": {"message": "m", "type": "server_error", "param": None, "code": "loading"}},
    )


# ---- the clients, against one server ------------------------------------------------------------
def _openai(server: str, key: str = KEY):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0)


def test_openai_embeddings_equal_bertforge_embed(server, models, reference):
    client = _openai(server)
    batch = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2, 3] and batch.model == "minilm"
    got = np.array([d.embedding for d in batch.data], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    tok = Tokenizer.from_file(models["minilm"])
    tokens = sum(len(tok.backend.encode(t).ids) + 2 for t in TEXTS)
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == tokens
    packed = client.embeddings.create(model="minilm", input=TEXTS[1], encoding_format="base64")
    vector = np.frombuffer(base64.b64decode(packed.data[0].embedding), dtype="<f4")
    np.testing.assert_allclose(vector, reference[1], atol=1e-5, rtol=0)
    # no format given: the client asks for base64 and decodes it itself
    plain = client.embeddings.create(model="minilm", input=TEXTS[2])
    np.testing.assert_allclose(plain.data[0].embedding, reference[2], atol=1e-5, rtol=0)
    ids = tok.backend.encode(TEXTS[3]).ids  # WordPieces without [CLS]/[SEP]
    by_ids = client.embeddings.create(model="minilm", input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, reference[3], atol=1e-5, rtol=0)
    assert [m.id for m in client.models.list()] == ["minilm", "clf", "reg", "mat"]
    assert client.models.retrieve("mat").owned_by == "bertforge"


def test_openai_dimensions_and_errors(server, models):
    client = _openai(server)
    full = client.embeddings.create(model="mat", input=TEXTS, encoding_format="float")
    cut = client.embeddings.create(model="mat", input=TEXTS, dimensions=16)
    full_v = np.array([d.embedding for d in full.data])
    cut_v = np.array([d.embedding for d in cut.data])
    assert cut_v.shape == (4, 16)
    np.testing.assert_allclose(cut_v, full_v[:, :16], atol=1e-6, rtol=0)  # not normalised
    theirs = st.SentenceTransformer(str(models["mat"]), device="cpu", truncate_dim=16)
    np.testing.assert_allclose(cut_v, theirs.encode(TEXTS), atol=1e-5, rtol=0)
    refused = [
        (dict(model="mat", input="a", dimensions=12), openai.BadRequestError, "32, 16"),
        (dict(model="mat", input="a", dimensions=64), openai.BadRequestError, "width, 32"),
        (dict(model="minilm", input="a", dimensions=128), openai.BadRequestError, "not trained"),
        (dict(model="minilm", input="word " * 60), openai.BadRequestError, "max_input_length"),
        (dict(model="minilm", input=["a"] * 9), openai.BadRequestError, "batch_size=8"),
        (dict(model="minilm", input=[[10**9]]), openai.BadRequestError, "vocabulary"),
        (dict(model="nope", input="a"), openai.NotFoundError, "not served"),
    ]
    for kwargs, error, said in refused:
        with pytest.raises(error) as caught:
            client.embeddings.create(**kwargs)
        assert said in caught.value.message, (kwargs, caught.value.message)
        assert set(caught.value.body) == {"message", "type", "param", "code"}
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as caught:
        _openai(server, "not-the-key").embeddings.create(model="minilm", input="a")
    assert caught.value.body["code"] == "invalid_api_key"


def test_langchain_openai_embeddings(server, reference):
    embeddings = langchain_openai.OpenAIEmbeddings(
        model="minilm", base_url=f"{server}/v1", api_key=KEY, check_embedding_ctx_length=False
    )
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[0]), reference[0], atol=1e-5, rtol=0)


def test_huggingface_inference_client_on_the_tei_routes(server, models, reference):
    client = hub.InferenceClient(base_url=server, api_key=KEY)  # POST /: the default model's
    np.testing.assert_allclose(client.feature_extraction(TEXTS), reference, atol=1e-5, rtol=0)
    one = client.feature_extraction(TEXTS[0], normalize=True, truncate=True)
    np.testing.assert_allclose(one, reference[:1], atol=1e-5, rtol=0)
    info = hub.InferenceClient(server, api_key=KEY, provider="hf-inference").get_endpoint_info()
    assert info["model_id"] == "minilm" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_client_batch_size"] == 8 and info["max_input_length"] == 48
    clf = hub.InferenceClient(base_url=f"{server}/tei/predict?model=clf", api_key=KEY)
    labels = clf.text_classification("a good film")
    model = BertForSequenceClassification.from_pretrained(models["clf"])
    ours = classify(model, Tokenizer.from_file(models["clf"]), ["a good film"])[0]["scores"]
    assert [x.label for x in labels] == sorted(ours, key=lambda k: -ours[k])
    for x in labels:
        assert math.isclose(x.score, ours[x.label], abs_tol=1e-6)
    assert len(clf.text_classification("a good film", top_k=1)) == 1


def test_rerank_in_tei_shape_equals_sentence_transformers(server, models, reference):
    client = Client(int(server.rsplit(":", 1)[1]), headers={"Authorization": f"Bearer {KEY}"})
    query, texts = "a cat on a mat", TEXTS
    status, ranks = client.request("POST", "/rerank", {"query": query, "texts": texts,
                                                        "model": "minilm", "return_text": True})  # fmt: skip
    assert status == 200, ranks
    vectors = st.SentenceTransformer(str(models["minilm"]), device="cpu").encode([query, *texts])
    cosines = vectors[1:] @ vectors[0]  # unit vectors
    assert [r["index"] for r in ranks] == list(np.argsort(-cosines, kind="stable"))
    for r in ranks:
        assert math.isclose(r["score"], cosines[r["index"]], abs_tol=1e-5)
        assert r["text"] == texts[r["index"]]
    pairs = [(query, t) for t in texts]
    for name, raw in (("clf", True), ("reg", False)):
        body = {"query": query, "texts": texts, "raw_scores": raw}
        status, ranks = client.request("POST", f"/tei/rerank?model={name}", body)
        assert status == 200, ranks
        logits = st.CrossEncoder(str(models[name]), device="cpu").predict(pairs)
        # two classes: the second's log-odds raw; one output: CrossEncoder's sigmoid, as TEI
        expected = logits[:, 1] - logits[:, 0] if raw else logits
        assert sorted(r["index"] for r in ranks) == [0, 1, 2, 3] and "text" not in ranks[0]
        assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
        for r in ranks:
            assert math.isclose(r["score"], float(expected[r["index"]]), abs_tol=1e-5)
    status, refused = client.request("POST", "/rerank", {"query": "q", "texts": ["a"] * 9})
    assert status == 413 and "max_client_batch_size" in refused["error"]
    # a model of another type: TEI's backend error, 424 (our own /predict answers 422)
    status, refused = client.request("POST", "/tei/predict?model=minilm", {"inputs": "a"})
    assert status == 424 and refused["error_type"] == "backend", refused
    assert "/predict needs a classifier model" in refused["error"]
    assert client.request("POST", "/predict?model=minilm", {"inputs": "a"})[0] == 422
    client.close()


def test_tei_truncation_direction_left_keeps_the_end(server, models):
    """``truncate`` with ``truncation_direction: left`` cuts the beginning of a text past
    --max_input_length (48 tokens): /tei/embed's vectors equal sentence-transformers' with its
    tokenizer cutting on the left, and differ from the default cut (right); /tei/predict
    scores what ``classify(..., truncation="tail")`` scores."""
    client = Client(int(server.rsplit(":", 1)[1]), headers={"Authorization": f"Bearer {KEY}"})
    long = " ".join(TEXTS * 6)  # about 100 tokens
    answers = {}
    for direction in ("Left", "right"):
        body = {"inputs": [long], "truncate": True, "truncation_direction": direction}
        status, answers[direction] = client.request("POST", "/tei/embed?model=minilm", body)
        assert status == 200, answers[direction]
    minilm = st.SentenceTransformer(str(models["minilm"]), device="cpu")
    minilm.max_seq_length = 48
    right = minilm.encode([long])
    minilm.tokenizer.truncation_side = "left"
    left = minilm.encode([long])
    np.testing.assert_allclose(answers["right"], right, atol=1e-5, rtol=0)
    np.testing.assert_allclose(answers["Left"], left, atol=1e-5, rtol=0)
    assert np.abs(left - right).max() > 0.05  # the two cuts keep different words
    # the classifier's vocabulary is the fixtures' words (TEXTS are mostly [UNK] to it, and
    # their two cuts score alike): a text whose first and last 48 tokens hold different words
    half = len(FILLER) // 2
    known = " ".join(FILLER[:half] * 6 + FILLER[half:] * 6)
    body = {"inputs": known, "truncate": True, "truncation_direction": "left"}
    status, scores = client.request("POST", "/tei/predict?model=clf", body)
    assert status == 200, scores
    model = BertForSequenceClassification.from_pretrained(models["clf"])
    tok = Tokenizer.from_file(models["clf"])
    probs = {  # the server's length limit, 48 tokens, is below the classifier's own
        cut: classify(model, tok, [known], max_length=48, truncation=cut)[0]["scores"]
        for cut in ("tail", "head")
    }
    assert probs["tail"] != pytest.approx(probs["head"], abs=1e-6)
    assert {x["label"]: x["score"] for x in scores} == pytest.approx(probs["tail"], abs=1e-6)
    client.close()


def test_the_new_routes_are_keyed_documented_and_counted(server):
    bare = Client(int(server.rsplit(":", 1)[1]))
    keyed = Client(bare.port, headers={"Authorization": f"Bearer {KEY}"})
    assert bare.request("GET", "/")[0] == 200  # the page is public; TEI's POST / is not
    for path in ("/", "/tei/embed", "/rerank", "/v1/embeddings", "/v1/models", "/tei/info"):
        method = "GET" if path in ("/v1/models", "/tei/info") else "POST"
        status, body = bare.request(method, path, {"inputs": "a"})
        assert status == 401, (path, body)
    assert bare.request("GET", "/tei/health")[0] == 200  # public, as TEI's /health
    status, spec = bare.request("GET", "/openapi.json")
    for path in ("/v1/embeddings", "/v1/models", "/rerank", "/tei/embed", "/tei/predict", "/"):
        assert path in spec["paths"], path
    status, metrics = keyed.request("GET", "/metrics")
    for route in ("/v1/embeddings", "/rerank", "/tei/predict", "/"):
        assert f'route="{route}",status="200"' in metrics, route
    assert 'route="/v1/embeddings",status="400"' in metrics
    bare.close()
    keyed.close()
