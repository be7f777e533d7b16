"""``bertforge distill --report true`` end to end on tiny models (hidden 32): OUTPUT/report.json
and report.md hold a row per model -- the teacher (4 layers), the distilled student (2 of its
layers), a ``--report_compare`` model (the student's start fine-tuned alone), the random twin
and the constant baseline -- whose numbers are the models' real ones (parameters counted,
file sizes read, the majority share counted here), measured throughput, and the ratio row; the
same command on the finished run writes the report alone; a student is saved no wider than
its teacher's stored weights; the constant baselines against hand-computed values."""

from __future__ import annotations

import csv
import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUICK_FINETUNE, TINY_MODEL, TaskFiles
from support.cli import one_line_error
from test_tagging import FAST, tagged_sentences, write_conll

from bertforge import cli
from bertforge.modeling.checkpoint import stored_float_dtype
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.modeling.pooling import write_pooling_declaration
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.distill_report import (
    Timed,
    constant_classification,
    constant_embedding,
    constant_regression,
    constant_span,
    interleaved_rates,
)

QUICK = ["--batch_size", "16", "--num_threads", "1", "--precision", "fp32", "--progress", "false"]
QUICK += ["--dropout", "0", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    """A 4-layer teacher fine-tuned on the keyword rule, a 2-layer start fine-tuned alone (the
    comparison), and the labelled files."""
    root = tmp_path_factory.mktemp("distill_report")
    start2 = TaskFiles.tiny_start_model(root, kind="mlm")
    tokenizer = Tokenizer.from_file(start2)
    torch.manual_seed(2)
    config = BertConfig(vocab_size=tokenizer.vocab_size, **{**TINY_MODEL, "num_hidden_layers": 4})
    start4 = root / "start4"
    BertForMaskedLM(config).save_pretrained(start4, tokenizer=tokenizer)
    paths = {"root": root, "train": root / "train.csv", "validation": root / "val.csv"}
    TaskFiles.write_sentiment(paths["train"], 160, seed=1)
    TaskFiles.write_sentiment(paths["validation"], 48, seed=2)
    fast = [*QUICK_FINETUNE, "--max_length", "24", "--batch_size", "16", "--lr", "3e-3"]
    for name, start, steps in (("teacher", start4, "40"), ("alone", start2, "12")):
        argv = ["finetune", "--model", str(start), "--train", str(paths["train"])]
        argv += ["--validation", str(paths["validation"]), "--output", str(root / name)]
        assert cli.main([*argv, *fast, "--max_steps", steps]) == 0
        paths[name] = root / name
    return paths


def distill_argv(work: dict[str, Path], out: Path, *options: str) -> list[str]:
    argv = ["distill", "--teacher", str(work["teacher"]), "--student_layers", "0", "3"]
    argv += ["--train", str(work["train"]), "--validation", str(work["validation"])]
    return [*argv, "--output", str(out), "--max_steps", "12", *options, *QUICK]


@pytest.fixture(scope="module")
def reported(work) -> Path:
    out = work["root"] / "student"
    argv = distill_argv(work, out, "--report", "true", "--report_compare", str(work["alone"]))
    argv += ["--report_alone", "true"]
    assert cli.main([*argv, "--report_texts", "40", "--report_rounds", "1"]) == 0
    return out


def labels_of(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as f:
        return [row["label"] for row in csv.DictReader(f)]


def report_rows(out: Path, *names: str) -> dict[str, dict]:
    """``out/report.json``'s rows by name, checked to be ``names`` in that order."""
    rows = {r["name"]: r for r in json.loads((out / "report.json").read_text())["rows"]}
    assert list(rows) == list(names)
    return rows


def assert_measured(row: dict, model: torch.nn.Module) -> None:
    """A report row holds ``model``'s real parameter count and a measured speed."""
    assert row["parameters"] == sum(p.numel() for p in model.parameters())
    assert all(v > 0 for v in row["texts_per_second"].values())


def test_report_has_every_row_with_the_models_real_numbers(work, reported):
    report = json.loads((reported / "report.json").read_text())
    train, val = labels_of(work["train"]), labels_of(work["validation"])
    majority = max(sorted(set(train)), key=train.count)
    constant = f"constant: always {majority}"
    names = ["teacher", "distilled student", "student alone", "random twin alone"]
    rows = report_rows(reported, *names, "compare: alone", "random twin (untrained)", constant)
    assert report["validation_rows"] == len(val)
    # the constant baseline's accuracy: the majority training class's share of the validation rows
    assert rows[constant]["scores"]["accuracy"] == pytest.approx(val.count(majority) / len(val))
    assert rows[constant]["parameters"] == 0 and rows[constant]["bytes"] == 0
    for name, directory in (
        ("teacher", work["teacher"]),
        ("distilled student", reported),
        ("compare: alone", work["alone"]),
    ):
        row = rows[name]
        model = BertForSequenceClassification.from_pretrained(directory)
        assert row["parameters"] == sum(p.numel() for p in model.parameters())
        assert row["bytes"] == (directory / "model.safetensors").stat().st_size
        assert row["megabytes"] == pytest.approx(row["bytes"] / 1e6)
        assert row["onnx_int8_megabytes"] > 0
        assert set(row["texts_per_second"]) == {"eager_b1", "eager_b32", "onnx_int8_b1",
                                                "onnx_int8_b32"}  # fmt: skip
        assert all(v > 0 for v in row["texts_per_second"].values()), row
        assert {"accuracy", "macro_f1", "mcc", "agreement"} <= set(
            row["scores"]
        ) or name == "teacher"
    for name in ("random twin (untrained)", "student alone", "random twin alone"):
        twin = rows[name]  # the student's network: its parameters, bytes and speed
        assert twin["parameters"] == rows["distilled student"]["parameters"]
        assert twin["bytes"] == rows["distilled student"]["bytes"]
        assert twin["speed_of"] == "distilled student"
        assert all(v is None for v in twin["texts_per_second"].values())
    # trained alone: the gold labels only, for the distillation's 12 steps, from the student's
    # start (the teacher's layers 0 and 3) and from the twin's fresh weights
    for name, folder in (("student alone", "alone"), ("random twin alone", "twin")):
        saved = json.loads((reported / "report" / folder / "distill_config.json").read_text())
        assert saved["alpha"] == 0.0 and saved["max_steps"] == 12 and not saved["unlabelled"]
        alone = json.loads((reported / "report" / folder / "eval_results.json").read_text())
        assert rows[name]["scores"]["accuracy"] == alone["validation"]["accuracy"]
    twin_start = BertForSequenceClassification.from_pretrained(reported / "report" / "twin-start")
    student = BertForSequenceClassification.from_pretrained(reported)
    assert twin_start.config.num_hidden_layers == student.config.num_hidden_layers == 2
    assert not torch.equal(
        twin_start.bert.embeddings.word_embeddings.weight,
        student.bert.embeddings.word_embeddings.weight,
    )
    # the student's scores are its eval_results.json's (the same rows, the same model)
    results = json.loads((reported / "eval_results.json").read_text())
    assert rows["distilled student"]["scores"]["accuracy"] == results["validation"]["accuracy"]
    assert rows["teacher"]["scores"]["accuracy"] == results["teacher"]["accuracy"]
    assert rows["teacher"]["scores"]["accuracy"] > rows[constant]["scores"]["accuracy"]
    assert rows["teacher"]["scores"]["agreement"] == 1.0
    ratio = report["ratio"]
    assert ratio["parameters"] == pytest.approx(
        rows["distilled student"]["parameters"] / rows["teacher"]["parameters"], abs=1e-4
    )
    assert 0 < ratio["parameters"] < 1 and 0 < ratio["megabytes"] < 1
    assert all(v > 0 for v in ratio["texts_per_second"].values())
    assert report["throughput"]["threads"] == 1 and report["throughput"]["texts"] == 40
    assert not (reported / "teacher_outputs.npy").exists()  # read by the report, then dropped
    assert not list(reported.glob(".report-*"))  # its exports and the untrained twin


def test_report_markdown_and_the_model_card_show_the_table(reported):
    md = (reported / "report.md").read_text()
    report = json.loads((reported / "report.json").read_text())
    header = "| model | accuracy | macro_f1 | mcc | agreement | loss | parameters | MB on disk |"
    assert header in md
    for row in report["rows"]:
        assert f"| {row['name']} |" in md
    assert "| *student / teacher* |" in md and "1 thread(s)" in md
    card = (reported / "README.md").read_text()
    assert header in card and "| random twin (untrained) |" in card


def test_report_alone_on_a_finished_run(work, reported, tmp_path, capsys):
    """The same command with --report true on a finished run (its report deleted) writes the
    report again, without training: the same scores and sizes."""
    out = tmp_path / "again"
    shutil.copytree(reported, out)
    (out / "report.json").unlink()
    (out / "report.md").unlink()
    before = (out / "model.safetensors").read_bytes()
    argv = distill_argv(work, out, "--report", "true", "--report_texts", "8")
    assert cli.main([*argv, "--report_rounds", "1"]) == 0
    assert "finished run of these settings; its report follows" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before
    old = json.loads((reported / "report.json").read_text())["rows"]
    new = json.loads((out / "report.json").read_text())["rows"]
    kept = [r["name"] for r in old if not r["name"].startswith("compare")]
    assert [r["name"] for r in new] == [r for r in kept if "alone" not in r]
    for a in new:
        b = next(r for r in old if r["name"] == a["name"])
        assert a["scores"] == pytest.approx(b["scores"]) and a["bytes"] == b["bytes"]
    assert not (out / "teacher_outputs.npy").exists()


def test_student_is_saved_no_wider_than_its_teacher(work, tmp_path):
    """A teacher stored in bf16 gives a student stored in bf16 (half the bytes of fp32);
    --save_dtype fp32 asks for fp32."""
    teacher = tmp_path / "teacher-bf16"
    model = BertForSequenceClassification.from_pretrained(work["teacher"])
    model.save_pretrained(
        teacher, tokenizer=Tokenizer.from_file(work["teacher"]), dtype=torch.bfloat16
    )
    shutil.copy2(work["teacher"] / "finetune_config.json", teacher)
    assert stored_float_dtype(teacher) == torch.bfloat16
    sizes = {}
    for dtype in ("auto", "fp32"):
        out = tmp_path / dtype
        argv = distill_argv(work, out, "--max_steps", "2", "--save_dtype", dtype)
        argv[argv.index("--teacher") + 1] = str(teacher)
        assert cli.main(argv) == 0
        sizes[dtype] = (out / "model.safetensors").stat().st_size
        BertForSequenceClassification.from_pretrained(out)  # loads
    assert stored_float_dtype(tmp_path / "auto") == torch.bfloat16
    assert stored_float_dtype(tmp_path / "fp32") == torch.float32
    assert sizes["auto"] < 0.6 * sizes["fp32"]
    assert stored_float_dtype(work["teacher"]) == torch.float32  # fp32 teachers stay fp32


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--report_compare", "x"], "--report_compare is for the report: add --report true"),
        (["--report", "true", "--report_texts", "0"], "--report_texts 0 must be at least 1"),
    ],
)
def test_report_bad_input(work, tmp_path, capsys, options, expected):
    out = tmp_path / "out"
    assert expected in one_line_error(distill_argv(work, out, *options), capsys)
    assert not out.exists()


def test_report_compare_of_another_task_is_refused(work, tmp_path, capsys):
    regressor = tmp_path / "regressor"
    config = BertConfig.load(work["alone"] / "config.json")
    shutil.copytree(work["alone"], regressor)
    config.num_labels, config.problem_type, config.id2label = 1, "regression", None
    config.save(regressor)
    out = tmp_path / "out"
    argv = distill_argv(work, out, "--report", "true", "--report_compare", str(regressor))
    argv += ["--max_steps", "1"]
    err = one_line_error(argv, capsys)
    assert "a regression model, the teacher is for classification" in err


def test_report_of_an_embedding_student(work, tmp_path):
    """An embedding teacher (the 4-layer start with a mean-pooling declaration) on unlabelled
    text alone: the constant row is one vector, nothing is trained alone (no gold labels)."""
    teacher = tmp_path / "embedder"
    model = BertModel.from_pretrained(work["root"] / "start4")
    model.save_pretrained(teacher, tokenizer=Tokenizer.from_file(work["root"] / "start4"))
    write_pooling_declaration(teacher, "mean", True, model.config.hidden_size, 24)
    rng = random.Random(5)
    lines = [TaskFiles.sentence(rng, rng.choice(["good", "bad"])) for _ in range(120)]
    (tmp_path / "sentences.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["distill", "--teacher", str(teacher), "--student_layers", "0", "3", "--unlabelled"]
    argv += [str(tmp_path / "sentences.txt"), "--output", str(out), "--max_steps", "6", *QUICK]
    argv += ["--report", "true", "--report_alone", "true", "--report_texts", "8"]
    assert cli.main([*argv, "--report_rounds", "1"]) == 0
    names = ["teacher", "distilled student", "random twin (untrained)", "constant: one vector"]
    rows = report_rows(out, *names)
    assert rows["teacher"]["scores"] == {"cosine": 1.0, "mse": 0.0}
    assert 0 < rows["constant: one vector"]["scores"]["cosine"] < 1
    student, twin = rows["distilled student"], rows["random twin (untrained)"]
    assert student["scores"]["cosine"] > twin["scores"]["cosine"]
    assert_measured(student, BertModel.from_pretrained(out))


def test_report_of_a_token_classifier(work, tmp_path):
    """A named-entity teacher: the constant tags every word O (entity F1 0, its token
    accuracy the share of O words, counted here)."""
    train, dev = tagged_sentences(96, seed=1), tagged_sentences(24, seed=2)
    write_conll(tmp_path / "train.conll", train)
    write_conll(tmp_path / "dev.conll", dev)
    teacher = tmp_path / "tagger"
    argv = ["finetune", "--task", "token_classification", "--model", str(work["root"] / "start4")]
    argv += ["--train", str(tmp_path / "train.conll"), "--output", str(teacher)]
    assert cli.main([*argv, "--max_steps", "20", *FAST]) == 0
    out = tmp_path / "out"
    argv = ["distill", "--teacher", str(teacher), "--student_layers", "0", "3", "--train"]
    argv += [str(tmp_path / "train.conll"), "--validation", str(tmp_path / "dev.conll")]
    argv += ["--output", str(out), "--max_steps", "4", *QUICK, "--report", "true"]
    argv += ["--report_texts", "8", "--report_rounds", "1"]
    assert cli.main(argv) == 0
    names = ["teacher", "distilled student", "random twin (untrained)", "constant: always O"]
    rows = report_rows(out, *names)
    report = json.loads((out / "report.json").read_text())
    assert report["metric"] == "entity_f1" and report["validation_rows"] == len(dev)
    tags = [t for _, sentence in dev for t in sentence]
    constant = rows["constant: always O"]["scores"]
    assert constant["entity_f1"] == 0.0
    assert constant["token_accuracy"] == pytest.approx(tags.count("O") / len(tags))
    assert "entities" not in constant  # a count, not a score
    assert_measured(rows["distilled student"], BertForTokenClassification.from_pretrained(out))


# ---- the pure parts ----------------------------------------------------------------------------


def test_constant_baselines_against_hand_computed_values():
    # classes 0,1,1,2,1 -> 1 is the majority; validation 1,0,1,1 -> accuracy 3/4
    majority, scores = constant_classification(
        np.array([0, 1, 1, 2, 1]), np.array([1, 0, 1, 1]), 3, np.array([1, 1, 0, 2])
    )
    assert majority == 1 and scores["accuracy"] == pytest.approx(0.75)
    assert scores["agreement"] == pytest.approx(0.5) and scores["mcc"] == pytest.approx(0.0)
    # a tie goes to the lowest class id
    assert constant_classification(np.array([2, 0, 2, 0]), np.array([0]), 3)[0] == 0
    mean, scores = constant_regression(np.array([1.0, 2.0, 6.0]), np.array([2.0, 4.0]))
    assert mean == pytest.approx(3.0)
    assert scores["mse"] == pytest.approx(1.0) and scores["mae"] == pytest.approx(1.0)
    assert scores["spearman"] == 0.0 and scores["pearson"] == 0.0  # bertforge's for a constant
    # embedding: the mean training target (1, 1) / sqrt 2 against (1, 0) and (0, 1)
    train = np.array([[1.0, 0.0], [0.0, 1.0]])
    got = constant_embedding(train, np.array([[1.0, 0.0], [0.0, 1.0]]), normalize=True)
    assert got["cosine"] == pytest.approx(1 / math.sqrt(2))
    assert got["mse"] == pytest.approx(((1 - 1 / math.sqrt(2)) ** 2 + 0.5) / 2)


def test_constant_span_answers_with_the_contexts_first_words():
    # gold training answers of 1, 2, 2 and 5 words: the median is 2 words
    words, scores = constant_span(
        ["Paris", "New York", "the cat", "a b c d e"],
        ["New York is big", "Paris, France is old", "x"],
        [["New York"], ["Paris"], ["y"]],
    )
    assert words == 2
    # "New York" exact; "Paris, France" against "Paris": EM 0, F1 2/3 (precision 1/2,
    # recall 1); "x" against "y": 0
    assert scores["exact_match"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx((1 + 2 / 3) / 3)
    assert constant_span([], ["a b"], [["a"]])[0] == 1  # no gold answers: one word


def test_interleaved_rates_take_turns_and_keep_the_best_round():
    calls: list[str] = []
    ticks = iter(range(1000))
    timed = [
        Timed(name, "eager", lambda b, name=name: calls.append(name), {1: [{}, {}], 32: [{}]})
        for name in ("a", "b")
    ]
    rates = interleaved_rates(timed, texts=2, rounds=2, clock=lambda: float(next(ticks)))
    # warm-up: one batch of each size each, then rounds of a (b1, b32) then b (b1, b32)
    assert calls[:4] == ["a", "a", "b", "b"]
    assert calls[4:10] == ["a", "a", "a", "b", "b", "b"]
    assert len(calls) == 4 + 2 * 6
    assert rates[("a", "eager", 1)] == pytest.approx(2.0)  # 2 texts in one tick
