"""Extractive question answering: the SQuAD/JSONL reader and its edge cases, doc_stride windows
and their answer positions, n-best span decoding against a reference decoder written here,
SQuAD v1.1 EM/F1 against a re-implementation of the official script on the real shared files,
logits equal to transformers' ``BertForQuestionAnswering``, ``finetune --task
question_answering`` end to end, ``bertforge answer``, ``evaluate`` and the ONNX export."""

from __future__ import annotations

import collections
import gzip
import json
import random
import re
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import cli
from bertforge.data.qa import (
    QAExample,
    decode_spans,
    encode_windows,
    read_qa,
    window_spans,
)
from bertforge.errors import BertforgeError
from bertforge.evaluation.qa import exact_match, f1_score, normalize_answer, squad_metrics
from bertforge.inference.qa import answer
from bertforge.modeling.model import BertForQuestionAnswering
from bertforge.tokenizer.wordpiece import Tokenizer

WORDS = ["the", "movie", "was", "a", "film", "with", "some", "actors", "and", "plot", "about"]


def _squad(rows: list[dict]) -> dict:
    """A SQuAD v1.1 document of ``rows`` (one paragraph per row)."""
    paragraphs = [
        {
            "context": r["context"],
            "qas": [
                {
                    "id": r["id"],
                    "question": r["question"],
                    "answers": [
                        {"text": t, "answer_start": s}
                        for t, s in zip(
                            r["answers"]["text"], r["answers"]["answer_start"], strict=True
                        )
                    ],
                }
            ],
        }
        for r in rows
    ]
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def _rows(n: int, seed: int, words: tuple[int, int] = (5, 12)) -> list[dict]:
    """``n`` learnable questions: "where is good ?" about filler text holding "good" once."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        before = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, words[1])))
        after = " ".join(rng.choice(WORDS) for _ in range(rng.randint(words[0], words[1])))
        context = (before + " good " + after).strip()
        start = context.index("good")
        rows.append(
            {
                "id": f"q{seed}-{i}",
                "question": "where is good ?",
                "context": context,
                "answers": {"text": ["good"], "answer_start": [start]},
            }
        )
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(task_files, tmp_path_factory) -> Path:
    """A tiny random MLM model with its real (trained) tokenizer."""
    return task_files.tiny_start_model(tmp_path_factory.mktemp("qa"), kind="mlm")


# ---- reading ------------------------------------------------------------------------------------


def test_squad_gz_and_jsonl_read_alike(tmp_path: Path):
    rows = _rows(4, seed=0)
    with gzip.open(tmp_path / "d.json.gz", "wt", encoding="utf-8") as f:
        json.dump(_squad(rows), f)
    from_squad, w1 = read_qa(tmp_path / "d.json.gz")
    from_jsonl, w2 = read_qa(_write_jsonl(tmp_path / "d.jsonl", rows))  # blank lines at the end
    assert from_squad == from_jsonl and not w1 and not w2
    assert [e.id for e in from_jsonl] == [r["id"] for r in rows]


def test_misplaced_answer_moves_to_nearest_occurrence_and_says_which(tmp_path: Path):
    context = "good film , good plot , good actors"
    row = {"id": "m1", "question": "q ?", "context": context,
           "answers": {"text": ["good"], "answer_start": [13]}}  # fmt: skip
    (example,), warnings = read_qa(_write_jsonl(tmp_path / "m.jsonl", [row]))
    assert example.starts == [12]  # the second "good" (12) is nearer than the first (0)
    assert len(warnings) == 1 and "m1" in warnings[0] and "nearest occurrence" in warnings[0]
    row["answers"] = {"text": ["great"], "answer_start": [0]}
    with pytest.raises(BertforgeError, match=r"answer 'great' \(id m1\) does not occur"):
        read_qa(_write_jsonl(tmp_path / "n.jsonl", [row]))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("question"), "m.jsonl:1: no 'question' field"),
        (lambda r: r.pop("id"), "m.jsonl:1: no 'id' field"),
        (lambda r: r.pop("answers"), "m.jsonl:1: no 'answers' field"),
        (lambda r: r.update(answers={"text": ["x"]}), "'answers' must hold 'text' and"),
        (lambda r: r.update(context="  "), "field 'context' is"),
    ],
)
def test_missing_fields_are_one_line_errors(tmp_path: Path, change, message):
    row = _rows(1, seed=0)[0]
    change(row)
    with pytest.raises(BertforgeError, match=re.escape(message)) as err:
        read_qa(_write_jsonl(tmp_path / "m.jsonl", [row]))
    assert "\n" not in str(err.value)


# ---- windows ------------------------------------------------------------------------------------


def test_window_spans_overlap_by_the_stride_and_cover_everything():
    assert window_spans(10, 4, 1) == [(0, 4), (3, 4), (6, 4)]
    assert window_spans(3, 4, 1) == [(0, 3)]
    for n, room, stride in [(100, 30, 10), (31, 30, 29), (7, 3, 0)]:
        spans = window_spans(n, room, stride)
        assert spans[0][0] == 0 and sum(spans[-1]) == n
        for (a, la), (b, _) in zip(spans, spans[1:], strict=False):
            assert b == a + la - stride


def test_long_context_windows_label_the_answer_once_and_cls_elsewhere(tiny: Path):
    tokenizer = Tokenizer.from_file(tiny)
    (row,) = _rows(1, seed=3, words=(60, 60))
    example = QAExample(row["id"], row["question"], row["context"], ["good"],
                        row["answers"]["answer_start"])  # fmt: skip
    windows = encode_windows(tokenizer, [example], max_length=32, doc_stride=8, labels=True)
    assert len(windows) >= 4  # a context of several windows
    labelled = [w for w in range(len(windows)) if windows.targets[w, 0] != 0]
    assert labelled  # the answer is inside at least one window (overlaps may hold it twice)
    for w in range(len(windows)):
        ids, question_end = windows.encoded[w]
        assert len(ids) <= 32 and ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
        s, e = windows.targets[w]
        if s == 0:
            assert e == 0
            continue
        token = windows.first[w] + np.array([s, e]) - question_end
        a, b = windows.offsets[0][token[0], 0], windows.offsets[0][token[1], 1]
        assert example.context[a:b] == "good"


def test_a_stride_that_cannot_fit_the_question_is_an_error(tiny: Path):
    tokenizer = Tokenizer.from_file(tiny)
    example = QAExample("long-q", "the movie was a film with some actors", "good plot")
    with pytest.raises(BertforgeError, match="question long-q: --max_length 16 .* --doc_stride 8"):
        encode_windows(tokenizer, [example], max_length=16, doc_stride=8)


# ---- decoding against a reference decoder -------------------------------------------------------


def reference_decode(windows, examples, starts, ends, n_best=20, max_answer_length=30):
    """run_qa's post-processing, written out: per window an offset mapping with None outside
    the context, the n_best start and end logits paired, the best score over all windows."""
    best: dict[int, tuple[float, str]] = {}
    for w, (ids, question_end) in enumerate(windows.encoded):
        i = int(windows.example[w])
        offsets = [None] * len(ids)
        for p in range(question_end, question_end + int(windows.length[w])):
            offsets[p] = tuple(windows.offsets[i][windows.first[w] + p - question_end])
        for s in np.argsort(starts[w])[-1 : -n_best - 1 : -1]:
            for e in np.argsort(ends[w])[-1 : -n_best - 1 : -1]:
                if offsets[s] is None or offsets[e] is None or e < s:
                    continue
                if e - s + 1 > max_answer_length:
                    continue
                score = starts[w][s] + ends[w][e]
                if i not in best or score > best[i][0]:
                    best[i] = (score, examples[i].context[offsets[s][0] : offsets[e][1]])
    return [best.get(i, (None, ""))[1] for i in range(len(examples))]


def test_decoded_spans_equal_the_reference_decoder(tiny: Path):
    tokenizer = Tokenizer.from_file(tiny)
    rows = _rows(6, seed=5, words=(20, 40))
    examples = [QAExample(r["id"], r["question"], r["context"]) for r in rows]
    windows = encode_windows(tokenizer, examples, max_length=24, doc_stride=6)
    rng = np.random.default_rng(0)
    starts = [rng.normal(size=len(ids)).astype(np.float32) for ids, _ in windows.encoded]
    ends = [rng.normal(size=len(ids)).astype(np.float32) for ids, _ in windows.encoded]
    for n_best, longest in [(20, 30), (3, 2), (5, 1)]:
        ours = decode_spans(windows, examples, starts, ends, n_best=n_best,
                            max_answer_length=longest)  # fmt: skip
        assert [s.text for s in ours] == reference_decode(
            windows, examples, starts, ends, n_best, longest
        )
        for e, s in zip(examples, ours, strict=True):
            assert e.context[s.start : s.end] == s.text


# ---- SQuAD v1.1 EM/F1 against the official script's logic ----------------------------------------


def official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_f1(prediction, ground_truth):
    prediction_tokens = official_normalize(prediction).split()
    ground_truth_tokens = official_normalize(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def official_evaluate(dataset, predictions):
    f1 = exact = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                truths = [a["text"] for a in qa["answers"]]
                p = predictions[qa["id"]]
                exact += max(official_normalize(p) == official_normalize(t) for t in truths)
                f1 += max(official_f1(p, t) for t in truths)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


@pytest.mark.parametrize("name", ["xquad_en_test.json.gz", "squad_dev_train.json.gz"])
def test_em_f1_equal_the_official_script_on_real_files(shared_data: Path, name: str):
    path = shared_data / "qa" / name
    with gzip.open(path) as f:
        dataset = json.load(f)["data"]
    examples, _ = read_qa(path)
    examples = examples[:1500]  # enough variety, a second or two
    keep = {e.id for e in examples}
    dataset = [
        {"paragraphs": [{"qas": [q for q in p["qas"] if q["id"] in keep]} for p in a["paragraphs"]]}
        for a in dataset
    ]
    rng = random.Random(0)
    predictions = {}
    for e in examples:  # right, partly right, wrong, empty, a missing question
        words, gold = e.context.split(), rng.choice(e.answers)
        kind = rng.randrange(6)
        if kind == 5:
            continue
        predictions[e.id] = [
            gold,
            "The " + gold.upper() + " !",
            " ".join(gold.split()[: max(1, len(gold.split()) // 2)]) + " of a",
            " ".join(words[rng.randrange(len(words)) :][:3]),
            "",
        ][kind]
    expected = official_evaluate(dataset, predictions)
    ours = squad_metrics(predictions, {e.id: e.answers for e in examples})
    assert ours["exact_match"] * 100 == pytest.approx(expected["exact_match"], abs=1e-9)
    assert ours["f1"] * 100 == pytest.approx(expected["f1"], abs=1e-9)
    assert 0 < ours["exact_match"] < ours["f1"] < 1
    for e in examples[:300]:
        p = predictions.get(e.id, "")
        assert normalize_answer(p) == official_normalize(p)
        assert f1_score(p, e.answers) == pytest.approx(max(official_f1(p, t) for t in e.answers))
        assert exact_match(p, e.answers) == max(
            official_normalize(p) == official_normalize(t) for t in e.answers
        )


# ---- the model against transformers ---------------------------------------------------------------


def test_logits_and_spans_equal_transformers(minilm_dir: Path, tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = BertForQuestionAnswering.from_pretrained(minilm_dir)
    assert {"qa_outputs.weight", "qa_outputs.bias"} == set(ours.loading_info["missing"])
    with torch.no_grad():  # a head far from zero, so the spans mean something
        ours.qa_outputs.weight.normal_(0, 0.5)
    tokenizer = Tokenizer.from_file(minilm_dir)
    ours.save_pretrained(tmp_path / "qa", tokenizer=tokenizer)
    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa").eval()
    assert type(theirs).__name__ == "BertForQuestionAnswering"
    examples = [
        QAExample("a", "Who won Super Bowl 50?", "The Denver Broncos defeated the Carolina "
                  "Panthers 24-10 to earn their third Super Bowl title."),
        QAExample("b", "Where?", "It was played at Levi's Stadium in Santa Clara, California, "
                  "on February 7, 2016, " * 6),
    ]  # fmt: skip
    windows = encode_windows(tokenizer, examples, max_length=48, doc_stride=16)
    assert len(windows) > 2
    starts, ends = [], []
    for ids, question_end in windows.encoded:
        input_ids = torch.as_tensor(ids, dtype=torch.long)[None]
        types = torch.zeros_like(input_ids)
        types[:, question_end:] = 1
        with torch.no_grad():
            a = ours(input_ids, torch.ones_like(input_ids), types)
            b = theirs(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                       token_type_ids=types)  # fmt: skip
        torch.testing.assert_close(a.start_logits, b.start_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.end_logits, b.end_logits, atol=1e-5, rtol=1e-5)
        starts.append(b.start_logits[0].numpy())
        ends.append(b.end_logits[0].numpy())
    reference = reference_decode(windows, examples, starts, ends)
    spans = answer(ours, tokenizer, examples, max_length=48, doc_stride=16, batch_size=2)
    assert [s.text for s in spans] == reference and all(reference)


# ---- fine-tuning, answer, evaluate, export -------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qa-run")
    train = _write_jsonl(root / "train.jsonl", _rows(128, seed=1))
    val = _write_jsonl(root / "val.jsonl", _rows(32, seed=2))
    out = root / "out"
    argv = ["finetune", "--model", str(tiny), "--task", "question_answering",
            "--train", str(train), "--validation", str(val), "--output", str(out),
            "--max_length", "48", "--doc_stride", "16", "--batch_size", "16", "--epochs", "2", "--log_every", "2",
            "--lr", "3e-3", "--precision", "fp32", "--progress", "false", "--dropout", "0"]  # fmt: skip
    assert cli.main(argv) == 0
    return {"out": out, "val": val, "root": root}


def test_finetune_learns_the_task_and_reports_em_f1(trained, capsys):
    results = json.loads((trained["out"] / "eval_results.json").read_text())
    assert results["metric"] == "f1"
    val = results["validation"]
    assert val["f1"] > 0.9 and val["exact_match"] > 0.9
    assert results["baseline"]["f1"] < 0.5
    losses = [json.loads(line) for line in (trained["out"] / "metrics.jsonl").open()]
    train = [r["loss"] for r in losses if r.get("split") == "train"]
    assert train[-1] < 0.7 * train[0]
    config = json.loads((trained["out"] / "config.json").read_text())
    assert config["architectures"] == ["BertForQuestionAnswering"]


def test_answer_command_and_evaluate(trained, capsys):
    out, val = trained["out"], trained["val"]
    context = "the movie was good and the plot was a film"
    argv = ["answer", "--model", str(out), "--question", "where is good ?", "--context", context]
    assert cli.main([*argv, "--precision", "fp32"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["answer"] == "good" and context[result["start"] : result["end"]] == "good"
    predictions = trained["root"] / "pred.json"
    argv = ["answer", "--model", str(out), "--input", str(val), "--output", str(predictions)]
    assert cli.main([*argv, "--precision", "fp32"]) == 0
    answers = json.loads(predictions.read_text())
    details = [json.loads(line) for line in predictions.with_suffix(".jsonl").open()]
    assert list(answers) == [d["id"] for d in details] and len(answers) == 32
    assert {"score", "probability", "start", "end"} <= set(details[0])
    assert "exact_match" in capsys.readouterr().err
    report = trained["root"] / "eval.json"
    argv = ["evaluate", "--model", str(out), "--data", str(val), "--output", str(report)]
    assert cli.main([*argv, "--precision", "fp32"]) == 0
    printed = capsys.readouterr().out
    assert "exact_match" in printed and "baseline" in printed
    scores = json.loads(report.read_text())
    gold = {e.id: e.answers for e in read_qa(val)[0]}
    expected = squad_metrics(answers, gold)
    assert scores["f1"] == pytest.approx(expected["f1"])


def test_onnx_export_matches_eager(trained, tmp_path: Path):
    pytest.importorskip("onnxruntime")
    out = trained["out"]
    assert cli.main(["export", "--model", str(out), "--format", "onnx",
                     "--output", str(tmp_path / "onnx")]) == 0  # fmt: skip
    from bertforge.inference.onnx import load_onnx

    exported = load_onnx(tmp_path / "onnx")
    model = BertForQuestionAnswering.from_pretrained(out)
    ids = torch.randint(5, model.config.vocab_size, (3, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    types = torch.zeros_like(ids)
    types[:, 7:] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    start, end = exported.span_logits({k: v.numpy() for k, v in batch.items()})
    with torch.no_grad():
        eager = model(**batch)
    real = mask.bool().numpy()
    assert np.abs(start - eager.start_logits.numpy())[real].max() < 1e-4
    assert np.abs(end - eager.end_logits.numpy())[real].max() < 1e-4
    tokenizer = Tokenizer.from_file(out)
    examples = [QAExample(r["id"], r["question"], r["context"]) for r in _rows(8, seed=9)]
    assert [s.text for s in answer(exported, tokenizer, examples)] == [
        s.text for s in answer(model, tokenizer, examples)
    ]


# ---- bad input through the commands -------------------------------------------------------------


def test_bad_input_is_one_line(tiny: Path, tmp_path: Path, capsys):
    good = _write_jsonl(tmp_path / "good.jsonl", _rows(8, seed=0))
    missing = _rows(1, seed=0)
    del missing[0]["context"]
    missing = _write_jsonl(tmp_path / "missing.jsonl", missing)
    base = ["finetune", "--model", str(tiny), "--task", "question_answering", "--output",
            str(tmp_path / "out"), "--max_steps", "1", "--progress", "false"]  # fmt: skip
    cases = [
        ([*base, "--train", str(good), "--max_length", "48", "--doc_stride", "48"],
         "--doc_stride 48 must be below --max_length 48"),
        ([*base, "--train", str(good), "--max_length", "12", "--doc_stride", "6"],
         "question q0-0: --max_length 12 with a question of 8 tokens leaves 1 context token"),
        ([*base, "--train", str(missing)], "missing.jsonl:1: no 'context' field"),
        (["answer", "--model", str(tiny), "--question", "q"], "give --question Q --context C"),
        (["answer", "--model", str(tiny), "--question", "q", "--context", "c"],
         "no question-answering head"),
    ]  # fmt: skip
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err, err


@pytest.mark.parametrize("value", ["0", "-3"])
def test_answer_and_finetune_refuse_the_same_max_answer_length(tiny: Path, tmp_path, capsys, value):
    good = _write_jsonl(tmp_path / "good.jsonl", _rows(8, seed=0))
    expected = f"--max_answer_length {value} must be at least 1"
    for argv in (
        ["answer", "--model", str(tiny), "--question", "q", "--context", "c"],
        ["finetune", "--model", str(tiny), "--task", "question_answering", "--train", str(good),
         "--output", str(tmp_path / "out")],
    ):  # fmt: skip
        assert cli.main([*argv, "--max_answer_length", value]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and expected in err and "\n" not in err, err
    with pytest.raises(BertforgeError, match="max_answer_length"):
        answer(None, None, ["q"], ["c"], max_answer_length=int(value))


def _strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_answer_prints_valid_json_without_any_candidate(trained, monkeypatch, capsys):
    from bertforge.cli import answer as answer_cli
    from bertforge.data.qa import Span

    # no span fits (e.g. every top start logit lies in the question): an empty answer, no score
    monkeypatch.setattr(answer_cli, "answer", lambda *a, **k: [Span("", 0, 0, float("-inf"))])
    argv = ["answer", "--model", str(trained["out"]), "--question", "q", "--context", "the film"]
    assert cli.main(argv) == 0
    result = _strict_json(capsys.readouterr().out)
    assert result["answer"] == "" and result["score"] is None


def test_answer_top_k_lists_alternatives(trained, capsys):
    context = "the movie was good and the plot was a film"
    argv = ["answer", "--model", str(trained["out"]), "--question", "where is good ?",
            "--context", context, "--top_k", "3", "--precision", "fp32"]  # fmt: skip
    assert cli.main(argv) == 0
    result = _strict_json(capsys.readouterr().out)
    assert result["answer"] == "good" and len(result["alternatives"]) == 2
    for other in result["alternatives"]:
        assert context[other["start"] : other["end"]] == other["answer"] != "good"
