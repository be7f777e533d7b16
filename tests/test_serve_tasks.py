"""``/tag`` and ``/answer`` of a real ``bertforge serve`` process: a tiny token classifier and a
tiny question-answering model fine-tuned here (a few dozen steps), served on localhost beside a
sequence classifier; the routes answer what ``tag()`` and ``answer()`` give in Python, refuse
bad bodies and wrong-kind models with a 422 saying what fits, and ``/info`` names each model's
task (told apart by ``config.json``'s ``architectures``, not the weights' names). Their ONNX
exports (``bertforge export --format onnx``) are served too, by ONNX Runtime, and answer
``/tag`` and ``/answer`` as the PyTorch models do."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("fastapi")

from support.serve import qa_model, request, serve, tagger_model, tiny_models  # noqa: E402

from bertforge import cli  # noqa: E402
from bertforge.inference.qa import answer  # noqa: E402
from bertforge.inference.tagging import tag  # noqa: E402
from bertforge.modeling.model import (  # noqa: E402
    BertForQuestionAnswering,
    BertForTokenClassification,
)
from bertforge.serve.models import weights_kind  # noqa: E402
from bertforge.tokenizer import Tokenizer  # noqa: E402

TEXTS = [
    "the movie with anna and tom was about new york .",
    "people went to paris to see a film",
    "a plot about some actors",
]
QUESTIONS = [
    ("where is good ?", "the film was good and the plot about people"),
    ("where is good ?", "some actors went to see it and it was good"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    tiny = tiny_models(root)
    made = {"ner": tagger_model(root, tiny["mlm"]), "qa": qa_model(root, tiny["mlm"]), **tiny}
    if importlib.util.find_spec("onnxruntime") is not None:
        for name in ("ner", "qa"):
            out = root / f"{name}-onnx"
            argv = ["export", "--model", str(made[name]), "--format", "onnx", "--output", str(out)]
            assert cli.main(argv) == 0
            made[f"{name}-onnx"] = out
    return made


@pytest.fixture(scope="module")
def port(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("tasks-log") / "server.log"
    served = {"ner": models["ner"], "qa": models["qa"], "clf": models["clf"]}
    served.update({n: models[n] for n in ("ner-onnx", "qa-onnx") if n in models})
    with serve(served, "--max_input_length", "48", "--max_top_k", "5", log=log) as (port, _):
        yield port


def test_kinds_come_from_config_architectures(models):
    # a token classifier's head is "classifier." as a sequence classifier's is: the config tells
    assert weights_kind(models["ner"]) == "token-classifier"
    assert weights_kind(models["qa"]) == "question-answering"
    assert weights_kind(models["clf"]) == "classifier"
    config = json.loads((models["ner"] / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]


def test_info_names_each_models_task(port):
    status, info = request(port, "GET", "/info")
    assert status == 200
    by_name = {m["name"]: m for m in info["models"] if not m["name"].endswith("-onnx")}
    assert {n: m["task"] for n, m in by_name.items()} == {
        "ner": "token-classification",
        "qa": "question-answering",
        "clf": "sequence-classification",
    }
    assert "/tag" in by_name["ner"]["routes"] and "/predict" not in by_name["ner"]["routes"]
    assert "/answer" in by_name["qa"]["routes"]
    assert set(by_name["ner"]["labels"]) == {"O", "B-PER", "B-LOC", "I-LOC"}


@pytest.mark.parametrize("aggregation", ["first", "simple"])
def test_tag_equals_tag_in_python(port, models, aggregation):
    model = BertForTokenClassification.from_pretrained(models["ner"]).eval()
    tokenizer = Tokenizer.from_file(models["ner"])
    expected = tag(model, tokenizer, TEXTS, aggregation=aggregation)
    body = {"inputs": TEXTS, "model": "ner", "aggregation": aggregation}
    status, got = request(port, "POST", "/tag", body)
    assert status == 200
    assert [[(e["entity"], e["start"], e["end"], e["word"]) for e in t] for t in got] == [
        [(e["entity"], e["start"], e["end"], e["word"]) for e in t] for t in expected
    ]
    scores = [e["score"] for t in got for e in t]
    assert scores == pytest.approx([e["score"] for t in expected for e in t], abs=1e-5)
    assert any(got)  # the model found entities: the comparison is not of empty lists
    for text, found in zip(TEXTS, got, strict=True):
        assert all(text[e["start"] : e["end"]] == e["word"] for e in found)
    # one text alone is a list of one, as /predict answers
    one = {"inputs": TEXTS[0], "model": "ner", "aggregation": aggregation}
    assert request(port, "POST", "/tag", one) == (200, got[:1])


def test_answer_equals_answer_in_python_with_next_best_spans(port, models):
    model = BertForQuestionAnswering.from_pretrained(models["qa"]).eval()
    tokenizer = Tokenizer.from_file(models["qa"])
    questions, contexts = zip(*QUESTIONS, strict=True)
    expected = answer(model, tokenizer, list(questions), list(contexts), top_k=3)
    body = {"inputs": [{"question": q, "context": c} for q, c in QUESTIONS], "model": "qa"}
    status, got = request(port, "POST", "/answer", {**body, "top_k": 3})
    assert status == 200 and len(got) == 2
    for span, result, (_, context) in zip(expected, got, QUESTIONS, strict=True):
        ranked = [span, *span.alternatives]
        answers = [result, *result["alternatives"]]
        assert len(answers) == 3
        assert [(a["answer"], a["start"], a["end"]) for a in answers] == [
            (s.text, s.start, s.end) for s in ranked
        ]
        assert [a["score"] for a in answers] == pytest.approx([s.score for s in ranked], abs=1e-4)
        assert [a["probability"] for a in answers] == pytest.approx(
            [s.probability for s in ranked], abs=1e-4
        )
        assert all(context[a["start"] : a["end"]] == a["answer"] for a in answers)
        assert len({(a["start"], a["end"]) for a in answers}) == 3  # distinct spans
    assert got[0]["answer"] == "good"  # it learned the task
    # one {question, context} object, the default top_k
    status, one = request(port, "POST", "/answer", {"inputs": body["inputs"][0], "model": "qa"})
    assert status == 200 and one[0]["answer"] == got[0]["answer"]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/tag", {"model": "ner"}, "inputs: required field missing"),
        ("/tag", {"inputs": "a", "model": "ner", "aggregation": "max"}, "aggregation"),
        ("/tag", {"inputs": [], "model": "ner"}, "inputs is empty"),
        ("/answer", {"inputs": [{"question": "q"}], "model": "qa"}, "context: required field"),
        ("/answer", {"inputs": "where?", "model": "qa"}, "inputs"),
        ("/answer", {"inputs": {"question": " ", "context": "x"}, "model": "qa"}, "question is empty"),
        ("/answer", {"inputs": {"question": "q", "context": "c"}, "model": "qa", "top_k": 9}, "--max_top_k=5"),
        ("/tag", {"inputs": "anna", "model": "clf"}, "/tag needs a token-classifier model (ner"),
        ("/answer", {"inputs": {"question": "q", "context": "c"}, "model": "ner"}, "/answer needs a question-answering model (qa"),
        ("/predict", {"inputs": "a film", "model": "ner"}, "/predict needs a classifier model (clf served)"),
    ],
)  # fmt: skip
def test_bad_bodies_and_wrong_kinds_are_422_saying_what_fits(port, path, body, message):
    status, error = request(port, "POST", path, body)
    assert status == 422, error
    assert message in error["error"], error


def test_a_long_input_is_413_naming_the_limit(port):
    long = " ".join(["film"] * 60)
    status, error = request(port, "POST", "/tag", {"inputs": ["anna", long], "model": "ner"})
    assert status == 413 and "text 2 is 62 tokens long" in error["error"]
    body = {"inputs": {"question": "where is good ?", "context": long}, "model": "qa"}
    status, error = request(port, "POST", "/answer", body)
    assert status == 413 and "--max_input_length=48" in error["error"]


def test_onnx_exports_of_a_tagger_and_a_qa_model_answer_as_pytorch_does(port, models):
    pytest.importorskip("onnxruntime")
    status, info = request(port, "GET", "/info")
    by_name = {m["name"]: m for m in info["models"]}
    ner, qa = by_name["ner-onnx"], by_name["qa-onnx"]
    assert (ner["backend"], ner["kind"], qa["backend"], qa["kind"]) == (
        "onnx",
        "token-classifier",
        "onnx",
        "question-answering",
    )
    assert ner["routes"] == ["/tag", "/tokenize", "/embed", "/similarity"]
    assert qa["routes"] == ["/answer", "/tokenize", "/embed", "/similarity"]
    assert ner["labels"] == by_name["ner"]["labels"]
    for aggregation in ("first", "simple"):
        body = {"inputs": TEXTS, "aggregation": aggregation}
        _, eager = request(port, "POST", "/tag", {**body, "model": "ner"})
        status, exported = request(port, "POST", "/tag", {**body, "model": "ner-onnx"})
        assert status == 200 and any(exported)
        assert [[(e["entity"], e["start"], e["end"]) for e in t] for t in exported] == [
            [(e["entity"], e["start"], e["end"]) for e in t] for t in eager
        ]
        got = [e["score"] for t in exported for e in t]
        assert got == pytest.approx([e["score"] for t in eager for e in t], abs=1e-4)
    body = {"inputs": [{"question": q, "context": c} for q, c in QUESTIONS], "top_k": 3}
    _, eager = request(port, "POST", "/answer", {**body, "model": "qa"})
    status, exported = request(port, "POST", "/answer", {**body, "model": "qa-onnx"})
    assert status == 200 and exported[0]["answer"] == "good"
    for a, b in zip(exported, eager, strict=True):
        spans = [a, *a["alternatives"]]
        assert [(s["start"], s["end"]) for s in spans] == [
            (s["start"], s["end"]) for s in [b, *b["alternatives"]]
        ]
        assert a["score"] == pytest.approx(b["score"], abs=1e-4)
    # no attention maps from ONNX Runtime: said in one line
    status, error = request(port, "POST", "/attention", {"inputs": "anna", "model": "ner-onnx"})
    assert status == 422 and "ner-onnx" in error["error"]
