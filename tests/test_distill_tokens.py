"""``bertforge distill`` of token-classification and question-answering teachers on tiny
models: the teacher's cached outputs are its logits at each word's first piece (float16, a row
per word), a layer subset learns the entities, the student loads in transformers with the same
logits and tags through the CLI, a student with another vocabulary learns word by word, a run
resumes exactly; a QA teacher's start/end distributions reach a fresh student that answers and
loads in transformers, and a QA student of another vocabulary learns the teacher's
distributions carried to its tokens by character."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL
from support.cli import one_line_error
from support.micro import assert_same_step, step_gradients
from test_tagging import FAST, NAMES, tagged_sentences, write_conll

from bertforge import cli
from bertforge.data.qa import QAExample, encode_windows
from bertforge.data.tagging import IGNORE, encode_tagged
from bertforge.inference.tagging import token_logits
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForTokenClassification,
)
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import list_checkpoints
from bertforge.training.distill_qa import FLOOR, carry_logits, teacher_windows
from bertforge.training.distill_tokens import _targets
from bertforge.training.teacher import load_teacher, token_teacher_outputs, word_offsets

QUICK = ["--batch_size", "16", "--num_threads", "1", "--precision", "fp32", "--progress", "false"]
QUICK += ["--dropout", "0", "--eval_batch_size", "32"]


@pytest.fixture(scope="module")
def work(task_files, tmp_path_factory) -> dict[str, Path]:
    """A tiny NER teacher fine-tuned on the names rule, its data, untagged sentences, and a
    tiny start model whose tokenizer was trained on other text."""
    root = tmp_path_factory.mktemp("distill-tokens")
    train, dev = tagged_sentences(256, seed=1), tagged_sentences(64, seed=2)
    paths = {
        "root": root,
        "start": task_files.tiny_start_model(root),
        "train": write_conll(root / "train.conll", train),
        "dev": root / "dev.jsonl",
    }
    rows = "".join(json.dumps({"tokens": w, "tags": t}) + "\n" for w, t in dev)
    paths["dev"].write_text(rows)
    untagged = [" ".join(w) for w, _ in tagged_sentences(200, seed=5)]
    paths["unlabelled"] = root / "unlabelled.txt"
    paths["unlabelled"].write_text("\n".join(untagged) + "\n")
    teacher = root / "teacher"
    argv = ["finetune", "--task", "token_classification", "--model", str(paths["start"])]
    argv += ["--train", str(paths["train"]), "--validation", str(paths["dev"])]
    assert cli.main([*argv, "--output", str(teacher), "--epochs", "3", *FAST]) == 0
    paths["teacher"] = teacher
    # another vocabulary: names and filler words spelt backwards beside them, so the same
    # words become other pieces
    rng = random.Random(7)
    lines = []
    for words, _ in tagged_sentences(300, seed=9):
        lines.append(" ".join(words) + " " + " ".join(w[::-1] for w in rng.sample(words, 2)))
    corpus = root / "other.txt"
    corpus.write_text("\n".join(lines) + "\n")
    tokenizer = Tokenizer.train(corpus, vocab_size=90, min_frequency=1)
    config = BertConfig(vocab_size=tokenizer.vocab_size, **{**TINY_MODEL, "num_hidden_layers": 1})
    torch.manual_seed(1)
    BertForMaskedLM(config).save_pretrained(root / "other", tokenizer=tokenizer)
    paths["other"] = root / "other"
    return paths


def distill_argv(work: dict[str, Path], out: Path, *options: str) -> list[str]:
    argv = ["distill", "--teacher", str(work["teacher"]), "--output", str(out)]
    return [*argv, "--validation", str(work["dev"]), *options, *QUICK]


def test_teacher_outputs_are_its_first_piece_logits_a_row_per_word(work, tmp_path):
    teacher = load_teacher(str(work["teacher"]))
    words = [w for w, _ in tagged_sentences(5, seed=3)] + [["\x07"]]  # a word without pieces
    cached = token_teacher_outputs(teacher, words, tmp_path / "t.npy", batch_size=4)
    assert cached.dtype == np.float16 and cached.shape == (sum(map(len, words)), 4)
    windows = encode_tagged(teacher.tokenizer, words, None, max_length=teacher.max_length)
    logits = token_logits(teacher.model.eval(), windows.encoded, teacher.tokenizer.pad_id)
    offsets = word_offsets(words)
    for w, values in enumerate(logits):
        first = np.flatnonzero(windows.word[w] >= 0)
        rows = offsets[windows.sentence[w]] + windows.word[w][first]
        np.testing.assert_allclose(cached[rows], values[first], atol=2e-3, rtol=1e-3)
    assert np.isnan(cached[-1]).all()  # no target for it
    again = token_teacher_outputs(teacher, words, tmp_path / "t.npy", batch_size=4)
    assert isinstance(again, np.memmap)


def test_with_the_teachers_tokenizer_the_targets_are_the_labelled_positions(work):
    """Word alignment on first pieces: with one tokenizer it is finetune's labelling exactly."""
    tokenizer = Tokenizer.from_file(work["teacher"])
    sentences = tagged_sentences(8, seed=4)
    words = [w for w, _ in sentences]
    ids = [np.arange(len(w)) % 4 for w in words]
    windows = encode_tagged(tokenizer, words, ids, max_length=12)  # some split into windows
    assert len(windows) > len(words)
    for target, labels in zip(_targets(windows, word_offsets(words)), windows.labels, strict=True):
        assert np.array_equal(target >= 0, labels != IGNORE)


@pytest.fixture(scope="module")
def distilled(work) -> Path:
    out = work["root"] / "student"
    argv = distill_argv(work, out, "--student_layers", "1", "--train", str(work["train"]))
    argv += ["--unlabelled", str(work["unlabelled"]), "--max_steps", "40", "--lr", "3e-3"]
    assert cli.main([*argv, "--eval_every", "20"]) == 0
    return out


def test_the_first_line_counts_sentences_windows_and_the_gold_ones(work, tmp_path, capsys):
    """The run's first line says how many sentences it trains on, how many windows they make
    under the student's tokenizer and how many of those carry gold tags (the labelled
    sentences', not the untagged ones')."""
    argv = distill_argv(work, tmp_path / "s", "--student_layers", "1", "--max_steps", "1")
    capsys.readouterr()
    assert (
        cli.main([*argv, "--train", str(work["train"]), "--unlabelled", str(work["unlabelled"])])
        == 0
    )
    log = "".join(capsys.readouterr())
    found = re.search(r"on (\d+) sentences \((\d+) windows, (\d+) with gold tags\)", log)
    assert found, log
    assert [int(n) for n in found.groups()] == [256 + 200, 256 + 200, 256]  # short sentences


def test_a_layer_subset_learns_the_entities_and_tags(distilled, tmp_path, capsys):
    results = json.loads((distilled / "eval_results.json").read_text())
    assert results["task"] == "token_classification" and results["metric"] == "entity_f1"
    assert results["teacher"]["entity_f1"] >= 0.9
    assert results["validation"]["entity_f1"] >= 0.75  # all-O scores 0
    assert results["validation"]["agreement"] >= 0.9
    assert results["parameters"] < results["teacher_parameters"]
    config = json.loads((distilled / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    assert config["num_hidden_layers"] == 1
    settings = json.loads((distilled / "finetune_config.json").read_text())
    assert settings["task"] == "token_classification"
    texts = tmp_path / "texts.txt"
    texts.write_text("we met anna in paris today\n")
    capsys.readouterr()
    assert cli.main(["tag", "--model", str(distilled), "--input", str(texts)]) == 0
    found = capsys.readouterr().out
    assert "anna" in found and "paris" in found


def test_the_student_loads_in_transformers_with_the_same_logits(distilled):
    transformers = pytest.importorskip("transformers")
    ours = BertForTokenClassification.from_pretrained(distilled).eval()
    theirs = transformers.BertForTokenClassification.from_pretrained(distilled).eval()
    assert theirs.config.id2label[3] == "B-PER"
    tok = transformers.BertTokenizerFast.from_pretrained(distilled)
    batch = tok(["anna went to new york", "tom"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = theirs(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    real = batch["attention_mask"].bool()  # padding positions are nobody's output
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_a_student_with_another_vocabulary_learns_word_by_word(work):
    out = work["root"] / "other-vocab"
    argv = distill_argv(work, out, "--student", str(work["other"]), "--train", str(work["train"]))
    assert cli.main([*argv, "--max_steps", "60", "--lr", "1e-2", "--alpha", "0.8"]) == 0
    student, teacher = Tokenizer.from_file(out), Tokenizer.from_file(work["teacher"])
    name = " ".join(NAMES[3][0])
    assert student.encode(name)["input_ids"] != teacher.encode(name)["input_ids"]
    results = json.loads((out / "eval_results.json").read_text())
    assert results["validation"]["token_accuracy"] >= 0.9
    assert results["validation"]["entity_f1"] >= 0.5


def hidden_losses(out: Path) -> list[float]:
    return [r["hidden_loss"] for r in read_metrics(out) if r["split"] == "train"]


def test_intermediate_losses_with_a_token_teacher(work, tmp_path, capsys):
    """A tagger's student learns the teacher's hidden states (through the projection) and its
    relations beside the per-word soft targets; a student of another vocabulary is refused
    (the losses compare positions)."""
    out = work["root"] / "token-layers"
    argv = distill_argv(work, out, "--student_preset", "tiny", "--train", str(work["train"]))
    argv += ["--hidden_weight", "1", "--relation_weight", "1", "--relation_heads", "2"]
    assert cli.main([*argv, "--max_steps", "40", "--log_every", "1", "--lr", "3e-3"]) == 0
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert {"hidden_loss", "relation_loss", "soft_loss", "hard_loss"} <= set(train[0])
    losses = hidden_losses(out)  # batches differ by more than a step learns: 8-step means
    assert len(losses) == 40 and 0 < np.mean(losses[-8:]) < 0.9 * np.mean(losses[:8]), losses
    argv = distill_argv(work, tmp_path / "x", "--student", str(work["other"]))
    capsys.readouterr()
    message = one_line_error([*argv, "--train", str(work["train"]), "--hidden_weight", "1"], capsys)
    assert "need the teacher's tokenizer" in message
    assert not (tmp_path / "x").exists()


# ---- question answering: the start/end distributions, the same vocabulary -----------------------


@pytest.fixture(scope="module")
def qa(task_files, tmp_path_factory) -> dict[str, Path]:
    """A tiny QA teacher fine-tuned on test_qa's "where is good ?" rule, and its data."""
    from test_qa import _rows, _write_jsonl

    root = tmp_path_factory.mktemp("distill-qa")
    paths = {
        "start": task_files.tiny_start_model(root, kind="mlm"),
        "train": _write_jsonl(root / "train.jsonl", _rows(128, seed=1)),
        "val": _write_jsonl(root / "val.jsonl", _rows(32, seed=2)),
        "root": root,
    }
    argv = ["finetune", "--model", str(paths["start"]), "--task", "question_answering"]
    argv += ["--train", str(paths["train"]), "--validation", str(paths["val"])]
    argv += ["--output", str(root / "teacher"), "--max_length", "48", "--doc_stride", "16"]
    argv += ["--epochs", "2", *FAST[2:]]
    assert cli.main(argv) == 0
    paths["teacher"] = root / "teacher"
    return paths


def fresh_qa_student_argv(qa: dict[str, Path], out: Path) -> list[str]:
    """``distill`` of the QA teacher into a fresh BERT-Tiny shape, validated on its own set."""
    argv = ["distill", "--teacher", str(qa["teacher"]), "--output", str(out), *QUICK]
    return [*argv, "--student_preset", "tiny", "--train", str(qa["train"]), "--validation",
            str(qa["val"])]  # fmt: skip


def test_a_qa_teacher_distils_into_a_fresh_student_that_answers(qa, capsys):
    out = qa["root"] / "student"
    argv = fresh_qa_student_argv(qa, out)
    assert cli.main([*argv, "--max_steps", "32", "--lr", "3e-3"]) == 0  # fresh weights
    log = "".join(capsys.readouterr())
    assert re.search(r"on \d+ questions \(\d+ windows\), validating on \d+;", log), log
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "question_answering" and results["metric"] == "f1"
    assert results["teacher"]["f1"] >= 0.9 and results["validation"]["f1"] >= 0.8
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForQuestionAnswering"]
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForQuestionAnswering.from_pretrained(out).eval()
    ours = BertForQuestionAnswering.from_pretrained(out).eval()
    batch = transformers.BertTokenizerFast.from_pretrained(out)(
        ["where is good ?"], ["the movie was good"], return_tensors="pt"
    )
    with torch.no_grad():
        expected, got = theirs(**batch), ours(**batch)
    torch.testing.assert_close(got.start_logits, expected.start_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.end_logits, expected.end_logits, atol=1e-5, rtol=1e-5)
    capsys.readouterr()
    argv = ["answer", "--model", str(out), "--question", "where is good ?"]
    assert cli.main([*argv, "--context", "the movie was good and some plot"]) == 0
    assert "good" in capsys.readouterr().out


def test_the_report_of_a_qa_teacher(qa):
    """--report on a QA teacher: the teacher, the distilled student, the student's start and its
    random twin trained on the gold spans alone for the same steps, the untrained twin and the
    constant (the context's first words, as many as the median gold answer: here 1, so it is
    right where "good" opens the context); each network timed on question/context pairs."""
    out = qa["root"] / "reported"
    argv = ["distill", "--teacher", str(qa["teacher"]), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--train", str(qa["train"]), "--validation", str(qa["val"])]
    argv += ["--max_steps", "8", "--report", "true", "--report_alone", "true"]
    assert cli.main([*argv, "--report_texts", "8", "--report_rounds", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    constant = "constant: the context's first 1 words"
    names = ["teacher", "distilled student", "student alone", "random twin alone"]
    assert list(rows) == [*names, "random twin (untrained)", constant]
    assert report["task"] == "question_answering" and report["metric"] == "f1"
    val = [json.loads(line) for line in qa["val"].read_text().splitlines() if line.strip()]
    opens = np.mean([r["context"].split()[0] == "good" for r in val])
    assert rows[constant]["scores"]["exact_match"] == pytest.approx(opens)
    assert rows["teacher"]["scores"]["f1"] >= 0.9
    assert (
        rows["distilled student"]["scores"]["f1"] > rows["random twin (untrained)"]["scores"]["f1"]
    )
    for name in names:
        assert set(rows[name]["scores"]) >= {"exact_match", "f1"}
        assert "windows" not in rows[name]["scores"] and "examples" not in rows[name]["scores"]
    student = BertForQuestionAnswering.from_pretrained(out)
    assert rows["distilled student"]["parameters"] == sum(p.numel() for p in student.parameters())
    assert rows["distilled student"]["texts_per_second"]["eager_b1"] > 0
    for folder in ("alone", "twin"):  # trained on the gold spans alone, for the same 8 steps
        saved = json.loads((out / "report" / folder / "distill_config.json").read_text())
        assert saved["alpha"] == 0.0 and saved["max_steps"] == 8
    assert "| constant: the context's first 1 words |" in (out / "report.md").read_text()


# ---- question answering across vocabularies: distributions carried by character ---------------


def test_carried_logits_move_each_positions_mass_and_renormalise():
    """Teacher positions 0..3 with probabilities 0.1, 0.2, 0.3, 0.4: position 1 is left out
    (a question token), 2 and 3 land on student position 1, nothing on position 2."""
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4])) + 5.0  # a shift changes nothing
    got = carry_logits(logits, np.array([0, -1, 1, 1]), 3)
    np.testing.assert_allclose(np.exp(got[:2]), [0.125, 0.875], rtol=1e-6)
    assert got[2] == FLOOR and got.dtype == np.float32
    assert np.all(carry_logits(np.zeros(2), np.array([-1, -1]), 2) == FLOOR)  # nothing kept


def qa_examples(rows: list[dict]) -> list[QAExample]:
    return [
        QAExample(r["id"], r["question"], r["context"], r["answers"]["text"],
                  r["answers"]["answer_start"])
        for r in rows
    ]  # fmt: skip


def test_teacher_windows_of_the_same_tokenizer_are_the_students_own(qa):
    """With one tokenizer on both sides the teacher's windows are the student's windows, and
    every [CLS] and context position maps to itself (the question's and [SEP]s to none)."""
    from test_qa import _rows

    tokenizer = Tokenizer.from_file(qa["teacher"])

    examples = qa_examples(_rows(12, seed=3, words=(20, 40)))
    student = encode_windows(tokenizer, examples, max_length=24, doc_stride=6)
    assert len(student) > len(examples)  # long contexts: several windows each
    carried = teacher_windows(tokenizer, examples, student, max_length=24)
    assert carried.cut == 0
    for w, (ids, head) in enumerate(student.encoded):
        theirs, their_head = carried.windows.encoded[w]
        assert np.array_equal(theirs, ids) and their_head == head
        expected = np.full(len(ids), -1)
        expected[0] = 0
        expected[head : len(ids) - 1] = np.arange(head, len(ids) - 1)
        assert np.array_equal(carried.starts[w], expected)
        assert np.array_equal(carried.ends[w], expected)


@pytest.fixture(scope="module")
def qa_other(qa) -> Path:
    """A tiny student whose 70-piece vocabulary, trained on the questions' contexts, has other
    ids for every word and splits the answer, "good", into four pieces (the teacher has it
    whole)."""
    from test_qa import _rows

    root = qa["root"]
    corpus = root / "qa-other.txt"
    corpus.write_text("\n".join(r["context"] for r in _rows(200, seed=11)) + "\n")
    tokenizer = Tokenizer.train(corpus, vocab_size=70, min_frequency=1)
    config = BertConfig(vocab_size=tokenizer.vocab_size, **{**TINY_MODEL, "num_hidden_layers": 2})
    torch.manual_seed(2)
    BertForMaskedLM(config).save_pretrained(root / "qa-other", tokenizer=tokenizer)
    return root / "qa-other"


def test_teacher_windows_of_another_tokenizer_cover_the_students_characters(qa, qa_other):
    """Each teacher window reads the context tokens that start inside its student window's
    characters; each of its context tokens' start (end) mass goes to the student token that
    starts (ends) at the same character, none where no student token does."""
    from test_qa import _rows

    student_tok, teacher_tok = Tokenizer.from_file(qa_other), Tokenizer.from_file(qa["teacher"])
    examples = qa_examples(_rows(10, seed=4, words=(10, 30)))
    student = encode_windows(student_tok, examples, max_length=32, doc_stride=8)
    carried = teacher_windows(teacher_tok, examples, student, max_length=32)
    assert student_tok.encode("movie")["input_ids"] != teacher_tok.encode("movie")["input_ids"]
    for w in range(len(student)):
        i, f, n = student.example[w], student.first[w], student.length[w]
        mine, theirs = student.offsets[i], carried.windows.offsets[i]
        lo, m = carried.windows.first[w], carried.windows.length[w]
        head_s, head_t = student.encoded[w][1], carried.windows.encoded[w][1]
        c0, c1 = mine[f, 0], mine[f + n - 1, 1]
        inside = np.flatnonzero((theirs[:, 0] >= c0) & (theirs[:, 0] < c1))
        assert np.array_equal(np.arange(lo, lo + m), inside)
        for j in range(lo, lo + m):
            to_start, to_end = carried.starts[w][head_t + j - lo], carried.ends[w][head_t + j - lo]
            starts_here = np.flatnonzero(mine[f : f + n, 0] == theirs[j, 0])
            ends_here = np.flatnonzero(mine[f : f + n, 1] == theirs[j, 1])
            assert to_start == (head_s + starts_here[0] if len(starts_here) else -1)
            assert to_end == (head_s + ends_here[0] if len(ends_here) else -1)
            word_start = theirs[j, 0] == 0 or examples[i].context[theirs[j, 0] - 1] == " "
            assert not word_start or to_start >= 0  # every word's start carries over
        assert carried.starts[w][0] == carried.ends[w][0] == 0  # [CLS] to [CLS]
        assert (carried.starts[w][1:head_t] == -1).all()  # the question carries nothing


def test_a_qa_student_of_another_vocabulary_learns_the_carried_distributions(qa, qa_other, capsys):
    out = qa["root"] / "student-other"
    argv = ["distill", "--teacher", str(qa["teacher"]), "--output", str(out), *QUICK]
    argv += [
        "--student",
        str(qa_other),
        "--train",
        str(qa["train"]),
        "--validation",
        str(qa["val"]),
    ]
    # soft targets alone (--alpha 1): what it learns, it learns from the carried distributions
    assert cli.main([*argv, "--max_steps", "120", "--lr", "3e-3", "--alpha", "1"]) == 0
    log = "".join(capsys.readouterr())
    assert "carried to the student's tokens by character" in log, log
    results = json.loads((out / "eval_results.json").read_text())
    assert results["teacher"]["f1"] >= 0.9  # scored on its own windows
    assert results["validation"]["f1"] >= 0.8
    student, teacher = Tokenizer.from_file(out), Tokenizer.from_file(qa["teacher"])
    assert student.backend.encode("good", add_special_tokens=False).tokens == [
        "g",
        "##o",
        "##o",
        "##d",
    ]
    assert len(teacher.backend.encode("good", add_special_tokens=False).tokens) == 1
    capsys.readouterr()
    argv = ["answer", "--model", str(out), "--question", "where is good ?"]
    assert cli.main([*argv, "--context", "the movie was good and some plot"]) == 0
    assert "good" in capsys.readouterr().out


def test_intermediate_losses_with_a_qa_teacher(qa):
    """A fresh QA student learns the teacher's hidden states and relations beside the start/end
    distributions (the attention KL, which needs the teacher's head count, runs in the
    micro-batch test below)."""
    out = qa["root"] / "qa-layers"
    argv = fresh_qa_student_argv(qa, out)
    argv += ["--hidden_weight", "1", "--relation_weight", "1", "--relation_heads", "2"]
    assert cli.main([*argv, "--max_steps", "40", "--log_every", "1", "--lr", "3e-3"]) == 0
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert {"hidden_loss", "relation_loss", "soft_loss", "hard_loss"} <= set(train[0])
    losses = hidden_losses(out)
    assert len(losses) == 40 and 0 < np.mean(losses[-8:]) < 0.9 * np.mean(losses[:8]), losses
    results = json.loads((out / "eval_results.json").read_text())
    assert results["validation"]["f1"] >= 0.8


@pytest.mark.parametrize(
    "options, message",
    [
        (["--student_layers", "0", "--train", "TRAIN", "--unlabelled", "TRAIN"],
         "reads question/context pairs; drop --unlabelled"),
        (["--student_layers", "0", "--unlabelled", "TRAIN", "--validation", "TRAIN"],
         "--unlabelled gives texts without questions"),
        (["--student", "QA_OTHER", "--train", "TRAIN", "--hidden_weight", "1"],
         "need the teacher's tokenizer"),
    ],
)  # fmt: skip
def test_a_qa_teacher_refuses_what_it_cannot_do(qa, qa_other, tmp_path, capsys, options, message):
    files = {"QA_OTHER": str(qa_other), "TRAIN": str(qa["train"])}
    argv = ["distill", "--teacher", str(qa["teacher"]), "--output", str(tmp_path / "x"), *QUICK]
    err = one_line_error([*argv, *(files.get(o, o) for o in options)], capsys)
    assert message in err
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_a_token_run_resumes_exactly(work):
    """Killed after step 6 of 12 (its checkpoint and the cached per-word outputs copied), the
    run continues to the same weights and losses."""
    options = ["--student_layers", "1", "--train", str(work["train"]), "--max_steps", "12"]
    options += ["--eval_every", "6", "--log_every", "3", "--keep_checkpoints", "0"]
    options += ["--keep_final_checkpoint", "--dropout", "0.1"]
    full, resumed = work["root"] / "full", work["root"] / "resumed"
    assert cli.main(distill_argv(work, full, *options)) == 0
    first, last = list_checkpoints(full)
    shutil.copytree(first, resumed / first.name)
    for f in full.iterdir():
        if f.is_file() and f.name not in ("eval_results.json", "finetune_config.json"):
            shutil.copy(f, resumed / f.name)
    assert cli.main(distill_argv(work, resumed, *options)) == 0
    a = BertForTokenClassification.from_pretrained(last).state_dict()
    b = BertForTokenClassification.from_pretrained(list_checkpoints(resumed)[-1]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [
        [r["loss"] for r in read_metrics(d) if r["split"] == "train" and r["step"] > 6]
        for d in (full, resumed)
    ]
    assert losses[0] == losses[1] and losses[0]


@pytest.mark.parametrize("teacher", ["tokens", "qa", "tokens-layers", "qa-layers"])
def test_micro_batches_give_the_whole_batchs_step(work, qa, tmp_path, teacher):
    """A tagger's step (its terms are means over the words that learn and the gold words:
    untagged sentences beside tagged ones) and a QA step (over windows), each also with the
    intermediate losses (means over real tokens), whole and in micro-batches of 8, 4 and 1:
    the same gradients and logged terms."""
    out = tmp_path / "out"
    if teacher.startswith("tokens"):
        argv = distill_argv(work, out, "--student_layers", "1", "--train", str(work["train"]))
        argv += ["--unlabelled", str(work["unlabelled"]), "--alpha", "0.3"]
    else:
        argv = ["distill", "--teacher", str(qa["teacher"]), "--output", str(out), *QUICK]
        argv += ["--student_layers", "1", "--train", str(qa["train"])]
        argv += ["--validation", str(qa["val"])]
    if teacher.endswith("layers"):
        argv += ["--hidden_weight", "1", "--attention_weight", "0.5", "--relation_weight", "1"]
    labelled = step_gradients(argv, np.array([0]), [1])[0]["run"].data.labelled
    gold, transfer = np.flatnonzero(labelled), np.flatnonzero(~labelled)
    tokens = teacher.startswith("tokens")
    rows = np.concatenate([gold[:5], transfer[:11]]) if tokens else gold[:16]
    assert_same_step(step_gradients(argv, rows, [16, 8, 4, 1]))
