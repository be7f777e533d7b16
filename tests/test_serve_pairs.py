"""``/predict`` of text pairs against a real ``bertforge serve`` on localhost: a classifier
fine-tuned on pairs (``bertforge finetune --text_pair_column``) answers ``{"inputs": [[a, b],
...]}`` as ``classify(model, tokenizer, texts, pairs)`` does in Python, and a request of the
wrong shape for the model (texts for a pair model, pairs for a single-text one) gets a 422 in
the API's own words."""

from __future__ import annotations

import contextlib
import io
import random
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from conftest import FILLER, TaskFiles  # noqa: E402
from serve_helpers import Client, request, serve, tiny_models  # noqa: E402

import bertforge  # noqa: E402
from bertforge import cli  # noqa: E402
from bertforge.modeling.model import BertForSequenceClassification  # noqa: E402
from bertforge.tokenizer import Tokenizer  # noqa: E402

PAIRS = [
    ["the movie was a film with some actors", "and a plot about people"],
    ["good", "bad"],
    ["a story about town", "one night in town the music was good ."],
]


def _finetune(start: Path, train: Path, out: Path, *options: str) -> Path:
    argv = ["finetune", "--model", str(start), "--train", str(train), "--output", str(out)]
    argv += ["--batch_size", "8", "--max_steps", "3", "--max_length", "64", "--precision", "fp32"]
    argv += ["--validation_fraction", "0.25", *options]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """``nli``: fine-tuned (3 steps) on premise + hypothesis pairs; ``sst``: fine-tuned on single
    texts; ``clf``: a classifier saved without fine-tuning settings (nothing says which it takes)."""
    root = tmp_path_factory.mktemp("serve-pairs")
    made = tiny_models(root)
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
    pair_options = ("--text_column", "premise", "--text_pair_column", "hypothesis")
    nli = _finetune(made["mlm"], root / "pairs.csv", root / "nli", *pair_options)
    TaskFiles.write_sentiment(root / "sentiment.csv", 48, seed=1)
    sst = _finetune(made["mlm"], root / "sentiment.csv", root / "sst")
    return {"nli": nli, "sst": sst, "clf": made["clf"]}


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-pairs-log") / "server.log"
    options = ("--max_client_batch_size", "4", "--max_input_length", "32")
    with serve(models, *options, log=log) as (port, _):
        yield port


def _library(directory: Path, pairs: list[list[str]]) -> list[dict]:
    model = BertForSequenceClassification.from_pretrained(directory)
    tokenizer = Tokenizer.from_file(directory)
    texts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    return bertforge.classify(model, tokenizer, texts, seconds, max_length=32)


def test_a_pair_model_answers_pairs_as_the_python_api_does(server, models):
    status, info = request(server, "GET", "/info")
    by_name = {m["name"]: m for m in info["models"]}
    assert by_name["nli"]["inputs"] == "pairs"
    assert by_name["nli"]["pair_columns"] == ["premise", "hypothesis"]
    assert by_name["sst"]["inputs"] == "texts" and by_name["clf"]["inputs"] == "texts or pairs"

    status, served = request(server, "POST", "/predict", {"inputs": PAIRS, "model": "nli"})
    assert status == 200, served
    direct = _library(models["nli"], PAIRS)
    assert [r["label"] for r in served] == [r["label"] for r in direct]
    for a, b in zip(served, direct, strict=True):
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-6)
    # the second text is read: swapping the segments changes the scores
    swapped = [[b, a] for a, b in PAIRS]
    status, other = request(server, "POST", "/predict", {"inputs": swapped, "model": "nli"})
    assert status == 200 and other[2]["scores"] != pytest.approx(served[2]["scores"], abs=1e-6)
    # one pair alone is a list of one pair
    status, (one,) = request(server, "POST", "/predict", {"inputs": [PAIRS[0]], "model": "nli"})
    assert status == 200 and one["scores"] == pytest.approx(direct[0]["scores"], abs=1e-6)


def test_a_classifier_without_fine_tuning_settings_takes_texts_and_pairs(server, models):
    status, served = request(server, "POST", "/predict", {"inputs": PAIRS, "model": "clf"})
    assert status == 200, served
    for a, b in zip(served, _library(models["clf"], PAIRS), strict=True):
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-6)
    assert request(server, "POST", "/predict", {"inputs": "good", "model": "clf"})[0] == 200


def test_pairs_and_texts_share_no_forward_pass_but_each_gets_its_answer(server):
    bodies = [{"inputs": PAIRS, "model": "clf"}, {"inputs": [a for a, _ in PAIRS], "model": "clf"}]
    expected = [request(server, "POST", "/predict", b)[1] for b in bodies]
    answers: list = [None] * 16

    def send(i: int) -> None:
        client = Client(server)
        answers[i] = client.request("POST", "/predict", bodies[i % 2])
        client.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, answer) in enumerate(answers):
        assert status == 200
        for a, b in zip(answer, expected[i % 2], strict=True):
            assert a["scores"] == pytest.approx(b["scores"], abs=1e-5)


LONG = "the movie " * 10  # 20 tokens: a pair of two is 43 with [CLS] and two [SEP], over 32


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        # a pair model given texts: say what to send, in the API's words
        ({"inputs": "good", "model": "nli"}, 422, "fine-tuned on text pairs ('premise' + "),
        ({"inputs": "good", "model": "nli"}, 422, '"inputs": [["<premise>", "<hypothesis>"]'),
        ({"inputs": ["good", "bad"], "model": "nli"}, 422, "two texts, not one pair"),
        ({"inputs": "good", "model": "nli", "steps": 4}, 422, "/attribute explains one text"),
        # a single-text model given pairs
        ({"inputs": PAIRS, "model": "sst"}, 422, "fine-tuned on single texts ('text'), not pairs"),
        # shapes that are none of text, texts, pairs
        ({"inputs": [["a", "b", "c"]], "model": "nli"}, 422, "item 1 is not a pair of two texts"),
        ({"inputs": [["a"]], "model": "nli"}, 422, "item 1 is not a pair"),
        ({"inputs": [["a", 1]], "model": "nli"}, 422, "item 1 is not a pair"),
        ({"inputs": ["a", ["b", "c"]], "model": "nli"}, 422, "texts and pairs are mixed"),
        ({"inputs": [None], "model": "nli"}, 422, "item 1 is NoneType, not a text"),
        ({"inputs": {"a": "b"}, "model": "nli"}, 422, "not dict"),
        ({"inputs": [], "model": "nli"}, 422, "empty"),
        # the limits count pairs, and both texts of a pair
        ({"inputs": [PAIRS[0]] * 5, "model": "nli"}, 413, "5 pairs in one request exceed"),
        ({"inputs": [[LONG, LONG]], "model": "nli"}, 413, "pair 1 is 43 tokens long"),
        ({"inputs": [["a \ud800", "b"]], "model": "nli"}, 422, "pair 1 is not valid Unicode"),
    ],
)
def test_wrong_inputs_for_the_model_get_a_clear_4xx(server, body, status, says):
    path = "/attribute" if "steps" in body else "/predict"
    got, answer = request(server, "POST", path, body)
    assert got == status, answer
    assert says in answer["error"] and "\n" not in answer["error"]
    # nothing an HTTP client cannot act on
    assert "pairs=[" not in answer["error"] and "bertforge classify" not in answer["error"]


def test_truncate_cuts_a_long_pair_as_the_python_api_does(server, models):
    body = {"inputs": [[LONG, LONG + "good"]], "model": "nli", "truncate": True}
    status, (served,) = request(server, "POST", "/predict", body)
    assert status == 200, served
    (direct,) = _library(models["nli"], body["inputs"])
    assert served["scores"] == pytest.approx(direct["scores"], abs=1e-6)


def test_openapi_documents_pairs(server):
    _, spec = request(server, "GET", "/openapi.json")
    schema = spec["components"]["schemas"]["PredictRequest"]
    shapes = schema["properties"]["inputs"]["anyOf"]
    pairs = [s["items"] for s in shapes if s.get("type") == "array" and "items" in s]
    assert {"type": "array", "minItems": 2, "maxItems": 2}.items() <= pairs[-1].items()
    assert "text_pair" in schema["properties"]["inputs"]["description"]
    assert "pairs" in spec["paths"]["/predict"]["post"]["description"]
