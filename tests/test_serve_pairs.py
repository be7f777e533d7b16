"""``/predict`` of text pairs against a real ``bertforge serve`` on localhost: a classifier
fine-tuned on pairs (``bertforge finetune --text_pair_column``) answers ``{"inputs": [[a, b],
...]}`` as ``classify(model, tokenizer, texts, pairs)`` does in Python, and a request of the
wrong shape for the model (texts for a pair model, pairs for a single-text one) gets a 422 in
the API's own words."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from conftest import TaskFiles  # noqa: E402
from support.serve import Client, finetune, pair_model, request, serve, tiny_models  # noqa: E402

import bertforge  # noqa: E402
from bertforge.data.encoding import encode_examples  # noqa: E402
from bertforge.inference.explain import attention_maps, integrated_gradients  # noqa: E402
from bertforge.modeling.model import BertForSequenceClassification  # noqa: E402
from bertforge.tokenizer import Tokenizer  # noqa: E402

PAIRS = [
    ["the movie was a film with some actors", "and a plot about people"],
    ["good", "bad"],
    ["a story about town", "one night in town the music was good ."],
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """``nli``: fine-tuned (3 steps) on premise + hypothesis pairs; ``sst``: fine-tuned on single
    texts; ``clf``: a classifier saved without fine-tuning settings (nothing says which it takes)."""
    root = tmp_path_factory.mktemp("serve-pairs")
    made = tiny_models(root)
    nli = pair_model(root, made["mlm"])
    TaskFiles.write_sentiment(root / "sentiment.csv", 48, seed=1)
    sst = finetune(made["mlm"], root / "sentiment.csv", root / "sst")
    short = finetune(
        made["mlm"],
        root / "sentiment.csv",
        root / "short",
        "--max_length",
        "12",
        "--truncation",
        "head_tail",
    )
    return {"nli": nli, "sst": sst, "clf": made["clf"], "short": short}


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
        # /attribute explains one text, or one pair
        ({"inputs": "good", "model": "nli", "steps": 4}, 422, '["<premise>", "<hypothesis>"]'),
        ({"inputs": ["a", "b"], "model": "sst", "steps": 4}, 422, 'not pairs: send "inputs": "'),
        ({"inputs": ["a", "b"], "model": "nli", "steps": 4, "max_tokens": 3}, 422, "4 and"),
        ({"inputs": ["a", "b", "c"], "model": "nli", "steps": 4}, 422, "inputs"),
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


# ---- explaining a pair: /attribute and /attention -------------------------------------------------
def _pair_ids(directory: Path, pair: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(T,) ids of ``[CLS] a [SEP] b [SEP]`` and (T,) token types, as fine-tuning encodes them."""
    ((ids, len_a),) = encode_examples(
        Tokenizer.from_file(directory), [pair[0]], [pair[1]], max_length=64
    )
    types = torch.zeros(len(ids), dtype=torch.long)
    types[len_a:] = 1
    return torch.tensor(ids, dtype=torch.long), types


def test_integrated_gradients_of_one_text_are_unchanged_by_token_types(models):
    # the pair path adds token_type_ids; a single text (None, or all 0) is computed as before
    model = BertForSequenceClassification.from_pretrained(models["clf"]).eval()
    tok = Tokenizer.from_file(models["clf"])
    ids = torch.tensor(tok.encode("a good film about people")["input_ids"])
    baseline = torch.where(torch.isin(ids, torch.tensor(tok.special_ids)), ids, tok.pad_id)
    plain = integrated_gradients(model, ids, baseline, 1, steps=8, chunk=3)
    none = integrated_gradients(model, ids, baseline, 1, steps=8, chunk=3, token_type_ids=None)
    zeros = torch.zeros_like(ids)
    typed = integrated_gradients(model, ids, baseline, 1, steps=8, chunk=3, token_type_ids=zeros)
    assert torch.equal(plain.attributions, none.attributions) and plain.delta == none.delta
    torch.testing.assert_close(typed.attributions, plain.attributions, atol=1e-6, rtol=1e-5)
    assert typed.output == pytest.approx(plain.output, abs=1e-6)
    encoder = model.bert
    torch.testing.assert_close(attention_maps(encoder, ids, zeros), attention_maps(encoder, ids))


def test_attribute_explains_a_pair_over_both_texts(server, models):
    pair = PAIRS[2]
    body = {"inputs": pair, "model": "nli", "steps": 64}
    status, answer = request(server, "POST", "/attribute", body)
    assert status == 200, answer
    ids, types = _pair_ids(models["nli"], pair)
    tok = Tokenizer.from_file(models["nli"])
    assert answer["tokens"] == [tok.id_to_token(int(i)) for i in ids]
    assert answer["token_type_ids"] == types.tolist() and not answer["truncated"]
    # [CLS] a [SEP] b [SEP]: the [SEP] between the texts closes the first segment
    first = types.tolist().index(1)
    assert answer["tokens"][first - 1] == answer["tokens"][-1] == "[SEP]"
    assert answer["tokens"].count("[SEP]") == 2 and answer["tokens"][0] == "[CLS]"
    # the label is /predict's for the same pair, the attributions a direct call's
    _, (predicted,) = request(server, "POST", "/predict", {"inputs": [pair], "model": "nli"})
    assert answer["label"] == answer["target"] == predicted["label"]
    assert answer["scores"] == pytest.approx(predicted["scores"], abs=1e-5)
    model = BertForSequenceClassification.from_pretrained(models["nli"]).eval()
    baseline = torch.where(torch.isin(ids, torch.tensor(tok.special_ids)), ids, tok.pad_id)
    target = model.config.label2id[answer["target"]]
    direct = integrated_gradients(model, ids, baseline, target, steps=64, token_type_ids=types)
    attributions = np.array(answer["attributions"])
    scale = np.abs(attributions).max()  # a model fine-tuned for 3 steps: all of them are small
    assert scale > 0
    np.testing.assert_allclose(attributions, direct.attributions.numpy(), atol=1e-4 * scale)
    assert answer["output"] == pytest.approx(direct.output, abs=1e-5)
    # both texts are explained: every WordPiece of each has an attribution of its own
    special = np.isin(ids.numpy(), tok.special_ids)
    for segment in (0, 1):
        words = (types.numpy() == segment) & ~special
        assert words.any() and (np.abs(attributions[words]) > 0).all()
    # the token types matter: the same tokens read as one text are explained otherwise
    flat = integrated_gradients(model, ids, baseline, target, steps=64)
    assert np.abs(flat.attributions.numpy() - attributions).max() > 0.05 * scale
    assert "[SEP] [PAD]... [SEP]" in answer["baseline"]


def test_attention_and_attribute_cut_a_long_pair(server, models):
    body = {"inputs": [LONG, "good"], "model": "nli", "steps": 4, "max_tokens": 10}
    status, answer = request(server, "POST", "/attribute", body)
    assert status == 200, answer
    # the longer text is cut first: [CLS] + 6 of LONG + [SEP] + good + [SEP]
    assert answer["truncated"] and len(answer["tokens"]) == len(answer["attributions"]) == 10
    assert answer["tokens"][-3:] == ["[SEP]", "good", "[SEP]"]
    assert answer["token_type_ids"] == [0] * 8 + [1] * 2
    status, attention = request(server, "POST", "/attention", {"inputs": PAIRS[0], "model": "nli"})
    assert status == 200, attention
    ids, types = _pair_ids(models["nli"], PAIRS[0])
    assert attention["token_type_ids"] == types.tolist()
    encoder = BertForSequenceClassification.from_pretrained(models["nli"]).bert
    maps = attention_maps(encoder, ids, types).numpy()
    assert np.allclose(attention["attentions"], maps, atol=1e-4)
    assert not np.allclose(attention_maps(encoder, ids).numpy(), maps, atol=1e-4)


def test_predict_cuts_texts_as_fine_tuning_did(server, models):
    """A model fine-tuned with --max_length 12 --truncation head_tail: /predict scores a longer
    text (within --max_input_length) as `bertforge classify` and classify() do, cut to 12 tokens
    head and tail, not whole (it scored up to the server's limit before)."""
    text = "the movie was a good film about people in town and the music was good at night ."
    status, (served,) = request(server, "POST", "/predict", {"inputs": text, "model": "short"})
    assert status == 200, served
    model = BertForSequenceClassification.from_pretrained(models["short"])
    tokenizer = Tokenizer.from_file(models["short"])
    assert 12 < len(tokenizer.encode(text)["input_ids"]) <= 32
    (direct,) = bertforge.classify(model, tokenizer, [text])
    assert served["scores"] == direct["scores"]  # the same computation, bit for bit
    (whole,) = bertforge.classify(model, tokenizer, [text], max_length=32)
    assert whole["scores"] != direct["scores"]  # what the server answered before
