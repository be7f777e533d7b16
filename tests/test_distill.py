"""``bertforge distill`` end to end on tiny models: a fine-tuned teacher's knowledge reaches a
student (a layer subset, a fresh preset, a model with another vocabulary), the student is a
normal model directory transformers and sentence-transformers load with the same outputs, a
layer subset holds exactly the teacher's layers (transformers on copied weights), resume is
exact, and bad input is a one-line error."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FILLER, QUICK_FINETUNE, TINY_MODEL, TaskFiles
from support.cli import one_line_error
from support.micro import assert_same_step, step_gradients

from bertforge import cli
from bertforge.inference.predict import embed
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import list_checkpoints
from bertforge.training.distill import balanced_rows
from bertforge.training.model_card import read_card_metadata
from bertforge.training.students import layer_subset, resized_preset

QUICK = ["--batch_size", "16", "--num_threads", "1", "--precision", "fp32", "--progress", "false"]
QUICK += ["--dropout", "0"]


def write_lines(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    """A tiny classifier and regressor fine-tuned on the keyword rule (the teachers), their data,
    unlabelled sentences, and a tiny start model with a vocabulary of its own."""
    root = tmp_path_factory.mktemp("distill")
    start = TaskFiles.tiny_start_model(root, kind="mlm")
    paths = {
        "root": root,
        "start": start,
        "train": root / "train.csv",
        "scores": root / "scores.csv",
    }
    TaskFiles.write_sentiment(paths["train"], 240, seed=1)
    TaskFiles.write_scores(paths["scores"], 240, seed=3)
    rng = random.Random(4)
    sentences = [TaskFiles.sentence(rng, rng.choice(["good", "bad"])) for _ in range(200)]
    paths["unlabelled"] = write_lines(root / "unlabelled.txt", sentences)
    fast = [*QUICK_FINETUNE, "--max_length", "24", "--batch_size", "16", "--lr", "3e-3"]
    for name, data, extra in (
        ("teacher", "train", []),
        (
            "regressor",
            "scores",
            ["--task", "regression", "--text_column", "review", "--label_column", "score"],
        ),
    ):
        argv = ["finetune", "--model", str(start), "--train", str(paths[data])]
        argv += ["--output", str(root / name), *extra, *fast, "--max_steps", "60"]
        assert cli.main(argv) == 0
        paths[name] = root / name
    # another vocabulary: a tokenizer trained on other text (the filler words beside words
    # spelt backwards), so the same text becomes other ids
    other = root / "other"
    lines = [
        TaskFiles.sentence(rng, "good")
        + " "
        + " ".join(w[::-1] for w in rng.sample(FILLER, 6))
        + " bad"
        for _ in range(300)
    ]
    tokenizer = Tokenizer.train(
        write_lines(root / "other.txt", lines), vocab_size=200, min_frequency=1
    )
    config = BertConfig(vocab_size=tokenizer.vocab_size, **{**TINY_MODEL, "num_hidden_layers": 1})
    torch.manual_seed(1)
    BertForMaskedLM(config).save_pretrained(other, tokenizer=tokenizer)
    paths["other"] = other
    return paths


def distill_argv(work: dict[str, Path], out: Path, *options: str) -> list[str]:
    return ["distill", "--teacher", str(work["teacher"]), "--output", str(out), *options, *QUICK]


def test_layer_subset_copies_the_right_layers_as_transformers_does(work):
    transformers = pytest.importorskip("transformers")
    ours = layer_subset(BertForSequenceClassification.from_pretrained(work["teacher"]), [1]).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(work["teacher"]).eval()
    theirs.bert.encoder.layer = torch.nn.ModuleList([theirs.bert.encoder.layer[1]])
    theirs.config.num_hidden_layers = 1
    tok = transformers.BertTokenizerFast.from_pretrained(work["teacher"])
    batch = tok(["a good film .", "the plot was bad and long"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = theirs(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    teacher = BertForSequenceClassification.from_pretrained(work["teacher"]).state_dict()
    kept = ours.state_dict()
    assert torch.equal(
        kept["bert.encoder.layer.0.output.dense.weight"],
        teacher["bert.encoder.layer.1.output.dense.weight"],
    )
    assert "bert.encoder.layer.1.output.dense.weight" not in kept


@pytest.fixture(scope="module")
def distilled(work) -> Path:
    out = work["root"] / "student"
    argv = distill_argv(work, out, "--student_layers", "1", "--train", str(work["train"]))
    argv += ["--unlabelled", str(work["unlabelled"]), "--max_steps", "30", "--lr", "3e-3"]
    argv += ["--eval_every", "15"]
    assert cli.main(argv) == 0
    return out


def test_distilled_student_learns_and_reports_beside_the_teacher(distilled):
    results = json.loads((distilled / "eval_results.json").read_text())
    assert results["teacher"]["accuracy"] >= 0.9
    assert results["validation"]["accuracy"] >= 0.85  # chance is 0.5
    assert results["validation"]["agreement"] >= 0.85
    assert results["parameters"] < results["teacher_parameters"]
    train = [r for r in read_metrics(distilled) if r["split"] == "train"]
    assert {"soft_loss", "hard_loss"} <= set(train[0])
    settings = json.loads((distilled / "finetune_config.json").read_text())
    assert settings["task"] == "classification" and settings["max_length"] == 24
    assert not list_checkpoints(distilled) and not (distilled / "teacher_outputs.npy").exists()


def test_distilled_student_has_a_model_card_beside_its_teacher(distilled):
    results = json.loads((distilled / "eval_results.json").read_text())
    meta = read_card_metadata(distilled / "README.md")
    assert meta["pipeline_tag"] == "text-classification" and "distillation" in meta["tags"]
    (index,) = meta["model-index"]
    values = {m["type"]: m["value"] for m in index["results"][0]["metrics"]}
    assert values["accuracy"] == pytest.approx(results["validation"]["accuracy"], abs=1e-4)
    card = (distilled / "README.md").read_text()
    assert "teacher" in card and "bertforge distill" in card
    assert f"{results['teacher']['accuracy']:.4f}"[:4] in card


def test_distilled_student_loads_in_transformers_with_the_same_logits(distilled, work):
    transformers = pytest.importorskip("transformers")
    ours = BertForSequenceClassification.from_pretrained(distilled).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(distilled).eval()
    assert ours.config.num_hidden_layers == 1 and theirs.config.id2label == {0: "neg", 1: "pos"}
    tok = transformers.BertTokenizerFast.from_pretrained(distilled)
    batch = tok(["a good film .", "the plot was bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = theirs(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_student_with_another_vocabulary_tokenises_on_its_own(work):
    """The student reads the text with its own tokenizer (other ids for the same words) and
    still learns the teacher's rule; the saved model carries the student's vocabulary."""
    out = work["root"] / "other-vocab"
    argv = distill_argv(work, out, "--student", str(work["other"]), "--train", str(work["train"]))
    assert cli.main([*argv, "--max_steps", "40", "--lr", "1e-2", "--alpha", "0.8"]) == 0
    saved, teacher = Tokenizer.from_file(out), Tokenizer.from_file(work["teacher"])
    assert saved.vocab_size == Tokenizer.from_file(work["other"]).vocab_size != teacher.vocab_size
    text = "the movie was good ."
    assert saved.encode(text)["input_ids"] != teacher.encode(text)["input_ids"]
    results = json.loads((out / "eval_results.json").read_text())
    assert results["validation"]["accuracy"] >= 0.8


def test_unlabelled_text_alone_with_a_validation_file(work, capsys):
    """No gold label to train on: the teacher labels the transfer text, the student learns its
    rule (alpha plays no part: every batch trains on the soft term alone). The teacher's pass
    says how far it is, a line per chunk, ending at every text."""
    out = work["root"] / "unlabelled-only"
    argv = distill_argv(work, out, "--student_layers", "1", "--unlabelled", str(work["unlabelled"]))
    assert (
        cli.main([*argv, "--validation", str(work["train"]), "--max_steps", "12", "--lr", "3e-3"])
        == 0
    )
    results = json.loads((out / "eval_results.json").read_text())
    assert results["validation"]["examples"] == 240 and results["validation"]["accuracy"] >= 0.85
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert "hard_loss" not in train[0]
    texts = sum(1 for line in work["unlabelled"].read_text().splitlines() if line.strip()) + 240
    passes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("teacher:")]
    assert passes and passes[-1].startswith(f"teacher: {texts:,} of {texts:,} texts, ")


def test_two_students_share_one_teacher_cache(work, tmp_path, capsys):
    """--teacher_cache: the first student's run computes the teacher's outputs into the file,
    the second (another student, the same texts) reads them without a teacher pass; the file
    is the user's and stays."""
    cache = tmp_path / "shared" / "teacher.npy"
    scores = []
    for layer in ("1", "0"):
        out = tmp_path / f"student-{layer}"
        argv = distill_argv(work, out, "--student_layers", layer, "--train", str(work["train"]))
        argv += ["--teacher_cache", str(cache), "--max_steps", "2"]
        assert cli.main(argv) == 0
        passes = [line for line in capsys.readouterr().err.splitlines() if "teacher: " in line]
        scores.append((json.loads((out / "eval_results.json").read_text())["teacher"], passes))
        assert not (out / "teacher_outputs.npy").exists()
    assert scores[0][1] and not scores[1][1]  # the second run never ran the teacher
    assert scores[0][0] == scores[1][0] and cache.is_file()


def test_a_pair_teacher_gives_its_columns_to_the_student(classifier, tmp_path):
    """A teacher fine-tuned on text pairs: the student reads the same two columns (from the
    teacher's finetune_config.json) and keeps them for the inference commands."""
    out = tmp_path / "pairs"
    argv = ["distill", "--teacher", str(classifier), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--train", str(classifier.parent / "train.csv")]
    assert (
        cli.main([*argv, "--max_steps", "2", "--batch_size", "8", "--validation_fraction", "0.25"])
        == 0
    )
    settings = json.loads((out / "finetune_config.json").read_text())
    assert settings["text_pair_column"] == "second" and settings["task"] == "classification"
    assert json.loads((out / "eval_results.json").read_text())["validation"]["examples"] == 10


def test_a_pair_teacher_labels_unlabelled_pairs(classifier, tmp_path, capsys):
    """--unlabelled for a pair teacher: a table in its two columns (no labels) whose rows the
    teacher labels beside --train's; a row with an empty side is skipped, and --max_unlabelled
    counts pairs."""
    pairs = tmp_path / "silver.jsonl"
    rows = [{"text": f"some words {i}", "second": f"good words {i}"} for i in range(30)]
    rows.append({"text": "a lone first side", "second": " "})
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "silver"
    argv = ["distill", "--teacher", str(classifier), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--train", str(classifier.parent / "train.csv")]
    argv += ["--unlabelled", str(pairs), "--max_unlabelled", "24", "--validation_fraction", "0.25"]
    assert cli.main([*argv, "--max_steps", "2", "--batch_size", "8"]) == 0
    passes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("teacher:")]
    assert passes[-1].startswith("teacher: 64 of 64 texts, ")  # 30 + 10 gold, 24 transfer
    no_pair = tmp_path / "one-column.csv"
    no_pair.write_text("text\nonly one side\n", encoding="utf-8")
    argv[argv.index(str(pairs))] = str(no_pair)
    assert "'second'" in one_line_error([*argv, "--output", str(tmp_path / "bad")], capsys)
    argv += ["--transfer_unit", "sentence", "--output", str(tmp_path / "bad2")]
    assert "drop --transfer_unit" in one_line_error(argv, capsys)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad2").exists()


def test_transfer_rows_balanced_to_the_gold_proportions():
    """balanced_rows: the transfer rows kept come in the gold rows' class proportions, as many
    as the scarcest class allows; the gold rows are never among them; a class the gold rows
    lack keeps none."""
    labelled = np.array([True] * 8 + [False] * 100)
    labels = np.array([0, 0, 1, 1, 1, 1, 1, 1] + [0] * 100)  # gold: 1/4 class 0, 3/4 class 1
    classes = np.array([0] * 8 + [0] * 70 + [1] * 24 + [2] * 6)  # the teacher: mostly 0
    keep = balanced_rows(classes, labelled, labels, seed=0)
    assert list(keep) == sorted(set(keep.tolist())) and keep.min() >= 8
    assert np.bincount(classes[keep], minlength=3).tolist() == [8, 24, 0]  # 24 / 0.75 = 32 rows
    assert balanced_rows(classes, labelled, labels, seed=1).tolist() != keep.tolist()


def test_a_pair_teacher_with_balanced_silver_pairs(classifier, tmp_path, capsys):
    """--balance_transfer: the teacher labels the transfer pairs, and the run keeps those of
    each class in --train's proportions, saying how many; refused for a regression teacher."""
    pairs = tmp_path / "silver.jsonl"
    rows = [{"text": f"some words {i}", "second": f"{'good' if i % 4 else 'bad'} words"}
            for i in range(40)]  # fmt: skip
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "balanced"
    argv = ["distill", "--teacher", str(classifier), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--train", str(classifier.parent / "train.csv")]
    argv += ["--unlabelled", str(pairs), "--balance_transfer", "true", "--max_steps", "2"]
    assert cli.main([*argv, "--batch_size", "8", "--validation_fraction", "0.25"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("balance:")]
    assert len(said) == 1 and said[0].startswith("balance: kept ") and " of 40 transfer" in said[0]


def test_regression_student_predicts_in_the_labels_units(work):
    out = work["root"] / "regression-student"
    argv = ["distill", "--teacher", str(work["regressor"]), "--output", str(out), *QUICK]
    argv += ["--student_preset", "tiny", "--train", str(work["scores"]), "--max_steps", "30"]
    assert cli.main([*argv, "--lr", "2e-3"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["teacher"]["spearman"] > 0.8 and results["validation"]["spearman"] > 0.6
    model = BertForSequenceClassification.from_pretrained(out).eval()
    teacher = BertForSequenceClassification.from_pretrained(work["regressor"]).eval()
    assert model.config.is_regression and model.config.hidden_size == 128
    texts = ["good good good film .", "a good good film", "the good plot", "some people went"]
    with torch.no_grad():
        values = [m(**Tokenizer.from_file(out).encode_batch(texts, return_tensors="pt")).logits[:, 0]
                  for m in (model, teacher)]  # fmt: skip
    # in the labels' units (the teacher's mean, not the z-scores' 0), in the teacher's order
    assert abs(float(values[0].mean() - values[1].mean())) < 0.5 < float(values[1].mean())
    assert values[0].argsort().tolist() == values[1].argsort().tolist() == [3, 2, 1, 0]


def test_a_fresh_student_of_its_own_shape(work):
    """--student_num_layers / --student_hidden_size resize a preset: the saved student has the
    asked depth and width, width/64 heads (at least 1) and a 4 x width feed-forward, and the
    run and its model card say so."""
    out = work["root"] / "resized-student"
    argv = distill_argv(work, out, "--student_preset", "tiny", "--train", str(work["train"]))
    argv += ["--student_num_layers", "1", "--student_hidden_size", "192", "--max_steps", "2"]
    assert cli.main(argv) == 0
    config = BertConfig.load(out)
    shape = (config.num_hidden_layers, config.hidden_size, config.num_attention_heads)
    assert shape == (1, 192, 3) and config.intermediate_size == 768
    assert "resized to 1 layer x 192 wide" in (out / "README.md").read_text()
    assert resized_preset(None, 96) == dict(
        hidden_size=96, num_attention_heads=1, intermediate_size=384
    )
    assert resized_preset(3, None) == dict(num_hidden_layers=3)


def test_intermediate_losses_run_the_teacher_beside_the_student(work):
    """Hidden states through the learned projection, attention KL and MiniLM's relations on the
    layer map, logged by name; a fresh student of other width and head count takes the
    relation and hidden-state losses."""
    out = work["root"] / "layers"
    argv = distill_argv(work, out, "--student_layers", "1", "--train", str(work["train"]))
    argv += ["--hidden_weight", "1", "--attention_weight", "1", "--relation_weight", "1"]
    assert cli.main([*argv, "--max_steps", "4", "--log_every", "2"]) == 0
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert {"hidden_loss", "attention_loss", "relation_loss", "soft_loss"} <= set(train[0])
    out = work["root"] / "layers-preset"
    argv = distill_argv(work, out, "--student_preset", "tiny", "--train", str(work["train"]))
    argv += ["--hidden_weight", "1", "--relation_weight", "1", "--relation_heads", "2"]
    assert cli.main([*argv, "--max_steps", "40", "--log_every", "1", "--lr", "3e-3"]) == 0
    losses = [r["hidden_loss"] for r in read_metrics(out) if r["split"] == "train"]
    # the projection and the student learn the teacher's states: batches differ by more than a
    # step learns, so the mean of the last 8 steps against that of the first 8
    assert len(losses) == 40 and 0 < np.mean(losses[-8:]) < 0.9 * np.mean(losses[:8]), losses


@pytest.mark.parametrize("case", ["gold_and_transfer", "transfer_only", "layers", "regression"])
def test_micro_batches_give_the_whole_batchs_step(work, tmp_path, case):
    """One step over 16 texts, whole and in micro-batches of 8, 4 and 1: the same gradients and
    logged terms, with gold rows in some micro-batches only (each term weighs its own units:
    texts, gold texts, real tokens), transfer text alone (the soft term at weight 1), the
    intermediate losses (their projection too) and a regressor."""
    out = tmp_path / "out"
    if case == "regression":
        argv = distill_argv(work, out, "--student_layers", "1", "--train", str(work["scores"]))
        argv[argv.index("--teacher") + 1] = str(work["regressor"])
    else:
        argv = distill_argv(work, out, "--student_layers", "1", "--train", str(work["train"]))
    if case in ("gold_and_transfer", "transfer_only"):
        argv += ["--unlabelled", str(work["unlabelled"]), "--alpha", "0.3"]
    if case == "layers":
        argv += ["--hidden_weight", "1", "--attention_weight", "0.5", "--relation_weight", "1"]
    steps = step_gradients(argv, np.array([0]), [1])  # the run, to read its rows
    labelled = steps[0]["run"].data.labelled
    gold, transfer = np.flatnonzero(labelled), np.flatnonzero(~labelled)
    if case == "gold_and_transfer":  # gold rows in the first micro-batches of 4 only
        rows = np.concatenate([gold[:3], transfer[:13]])
    elif case == "transfer_only":
        rows = transfer[:16]
    else:
        rows = gold[:16]
    assert_same_step(step_gradients(argv, rows, [16, 8, 4, 1]))


def test_max_memory_picks_micro_batches_and_refuses_too_little(work, tmp_path, capsys):
    argv = distill_argv(work, tmp_path / "fits", "--student_layers", "1")
    argv += ["--train", str(work["train"]), "--max_steps", "2", "--max_memory", "4GB"]
    assert cli.main(argv) == 0
    said = capsys.readouterr().err
    assert "--max_memory 4.00 GB: micro-batch 16 (1 x 16 per step)" in said, said
    assert json.loads((tmp_path / "fits" / "eval_results.json").read_text())["peak_memory_bytes"]
    # refused after the teacher's pass (the measurement runs the loss on its outputs), which
    # stays cached in OUTPUT: the same command with a budget that fits starts from it
    argv = distill_argv(work, tmp_path / "tight", "--student_layers", "1")
    argv += ["--train", str(work["train"]), "--max_steps", "2"]
    assert cli.main([*argv, "--max_memory", "20MB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --max_memory 20 MB is below this run's estimated need")
    assert "raise it to" in err[-1]
    assert cli.main([*argv, "--max_memory", "4GB"]) == 0
    assert "teacher: " not in capsys.readouterr().err  # its outputs came from the cache


def test_resume_after_an_interruption_continues_exactly(work):
    options = ["--student_layers", "1", "--train", str(work["train"]), "--max_steps", "12"]
    options += ["--eval_every", "6", "--log_every", "3", "--keep_checkpoints", "0"]
    options += ["--keep_final_checkpoint"]
    options += ["--dropout", "0.1"]  # dropout draws from the restored RNG
    options += ["--hidden_weight", "0.5"]  # its projection resumes with the student
    full, resumed = work["root"] / "full", work["root"] / "resumed"
    assert cli.main(distill_argv(work, full, *options)) == 0
    first, last = list_checkpoints(full)
    shutil.copytree(first, resumed / first.name)  # as if killed after step 6
    for f in full.iterdir():
        if f.is_file() and f.name not in ("eval_results.json", "finetune_config.json"):
            shutil.copy(f, resumed / f.name)
    assert cli.main(distill_argv(work, resumed, *options)) == 0
    a = BertForSequenceClassification.from_pretrained(last).state_dict()
    b = BertForSequenceClassification.from_pretrained(list_checkpoints(resumed)[-1]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [
        [r["loss"] for r in read_metrics(d) if r["split"] == "train" and r["step"] > 6]
        for d in (full, resumed)
    ]
    assert losses[0] == losses[1] and losses[0]


def test_embedding_teacher_from_unlabelled_text_alone(work, minilm_dir):
    """all-MiniLM-L6-v2 into its own first layer, on unlabelled sentences alone: the student's
    vectors move towards the teacher's, and sentence-transformers reads the student as embed
    does."""
    st = pytest.importorskip("sentence_transformers")
    out = work["root"] / "minilm-1"
    argv = ["distill", "--teacher", str(minilm_dir), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--unlabelled", str(work["unlabelled"]), "--max_length", "24"]
    argv += ["--max_unlabelled", "96", "--max_steps", "8", "--lr", "5e-4", "--eval_every", "4"]
    assert cli.main(argv) == 0
    results = json.loads((out / "eval_results.json").read_text())
    val = [r for r in read_metrics(out) if r["split"] == "val"]
    assert results["validation"]["cosine"] >= val[0]["cosine"] > 0.5
    assert json.loads((out / "modules.json").read_text())[-1]["type"].endswith("Normalize")
    texts = ["a good film .", "the plot was bad and long"]
    ours = embed(BertModel.from_pretrained(out), Tokenizer.from_file(out), texts)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_an_embedding_teachers_validation_file_is_what_the_student_is_scored_on(
    work, minilm_dir, tmp_path, capsys
):
    """--validation for an embedding teacher: its texts are the validation set (their count
    in the log, the cosine scored on them), and every transfer text stays in training (none
    held out); an empty file is a one-line error naming it."""
    val = tmp_path / "val.csv"
    rng = random.Random(9)
    val.write_text(
        "text\n" + "".join(TaskFiles.sentence(rng, "good") + "\n" for _ in range(12)),
        encoding="utf-8",
    )
    out = tmp_path / "minilm-val"
    argv = ["distill", "--teacher", str(minilm_dir), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--unlabelled", str(work["unlabelled"]), "--max_length", "24"]
    argv += ["--max_unlabelled", "40", "--max_steps", "2", "--validation", str(val)]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    log = captured.out + captured.err
    assert "on 40 texts" in log and "validating on 12;" in log
    assert 0 < json.loads((out / "eval_results.json").read_text())["validation"]["cosine"] <= 1
    val.write_text("text\n", encoding="utf-8")
    assert "val.csv: the file is empty" in one_line_error(
        [*argv, "--output", str(tmp_path / "e")], capsys
    )


def test_embedding_student_narrower_than_its_teacher_learns_a_pca_projection(work, minilm_dir):
    """A 32-wide student with a vocabulary of its own learns the 384-wide teacher's vectors
    through their PCA projection, the cosine term beside the MSE."""
    out = work["root"] / "minilm-narrow"
    argv = ["distill", "--teacher", str(minilm_dir), "--output", str(out), *QUICK]
    argv += ["--student", str(work["start"]), "--unlabelled", str(work["unlabelled"])]
    argv += ["--max_unlabelled", "64", "--max_length", "24", "--max_steps", "3"]
    assert cli.main([*argv, "--cosine_weight", "1"]) == 0
    assert BertModel.from_pretrained(out).config.hidden_size == 32
    assert Tokenizer.from_file(out).vocab_size != Tokenizer.from_file(minilm_dir).vocab_size
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert {"mse_loss", "cosine_loss"} <= set(train[0])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("not_finetuned", "is not fine-tuned"),
        ("other_head", "head for regression"),
        ("layers_out_of_range", "out of range"),
        ("unreadable_unlabelled", "no corpus reader reads .docx"),
        ("two_students", "exactly one student"),
        ("unlabelled_for_pairs", "the teacher reads pairs"),
        ("attention_heads_differ", "use --relation_weight for differing head counts"),
        ("no_gold_to_validate_on", "needs gold labels to validate on"),
        ("layers_need_the_tokenizer", "need the teacher's tokenizer"),
        ("teacher_cache_not_npy", "teacher.txt: give a .npy file path"),
        ("resized_without_preset", "--student_hidden_size shapes a fresh student"),
        ("heads_do_not_divide", "--student_hidden_size 200: the width is split into"),
        ("balance_a_regressor", "--balance_transfer keeps a classifier's class proportions"),
    ],
)
def test_bad_input_is_one_line(work, classifier, tmp_path, capsys, case, expected):
    out = tmp_path / "out"
    train = ["--train", str(work["train"])]
    argv = {
        "not_finetuned": ["distill", "--teacher", str(work["start"]), "--output", str(out),
                          "--student_preset", "tiny", *train],
        "other_head": distill_argv(work, out, "--student", str(work["regressor"]), *train),
        "layers_out_of_range": distill_argv(work, out, "--student_layers", "0", "2", *train),
        "unreadable_unlabelled": distill_argv(
            work, out, "--student_layers", "0", *train,
            "--unlabelled", str(write_lines(tmp_path / "texts.docx", ["PK"])),
        ),
        "two_students": distill_argv(work, out, "--student_layers", "0", "--student_preset", "tiny", *train),
        "unlabelled_for_pairs": ["distill", "--teacher", str(classifier), "--output", str(out),
                                 "--student_layers", "0", "--unlabelled", str(work["unlabelled"]),
                                 "--train", str(classifier.parent / "train.csv")],
        "no_gold_to_validate_on": distill_argv(work, out, "--student_layers", "0",
                                               "--unlabelled", str(work["unlabelled"])),
        "attention_heads_differ": distill_argv(work, out, "--student_preset", "tiny", *train,
                                               "--attention_weight", "1"),
        "layers_need_the_tokenizer": distill_argv(work, out, "--student", str(work["other"]),
                                                  *train, "--hidden_weight", "1"),
        "teacher_cache_not_npy": distill_argv(work, out, "--student_layers", "0", *train,
                                              "--teacher_cache", str(tmp_path / "teacher.txt")),
        "resized_without_preset": distill_argv(work, out, "--student_layers", "0", *train,
                                               "--student_hidden_size", "256"),
        "heads_do_not_divide": distill_argv(work, out, "--student_preset", "tiny", *train,
                                            "--student_hidden_size", "200"),
        "balance_a_regressor": ["distill", "--teacher", str(work["regressor"]), "--output",
                                str(out), "--student_preset", "tiny", "--train",
                                str(work["scores"]), "--balance_transfer", "true"],
    }[case]  # fmt: skip
    assert expected in one_line_error(argv, capsys)
    assert not out.exists()  # refused before anything is written


STS_ROWS = [
    ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
    ("A woman is slicing an onion.", "A woman cuts an onion.", 4.5),
    ("A dog runs across the field.", "A dog is running on the grass.", 3.9),
    ("Two children are playing football.", "Kids kick a ball in the park.", 3.2),
    ("The stock market fell sharply today.", "Share prices dropped this morning.", 3.0),
    ("A cat sleeps on the sofa.", "A man is reading a newspaper.", 0.4),
    ("The train arrived late.", "She bought a new red dress.", 0.0),
    ("A chef is cooking pasta.", "Someone is preparing food in a kitchen.", 2.9),
    ("The sun sets over the ocean.", "A plane lands at the airport.", 0.6),
    ("A boy is riding a bicycle.", "A child rides a bike down the street.", 4.0),
]


def test_an_embedding_teacher_validated_on_scored_pairs(work, minilm_dir, tmp_path, capsys):
    """--validation_columns A B SCORE: the student (and the teacher) are scored as STS on the
    pairs, the Spearman of their cosines with the gold score, which picks the best student;
    both numbers are what sentence-transformers' vectors of the saved models give. Two
    columns score retrieval; misused, the option is a one-line error."""
    st = pytest.importorskip("sentence_transformers")
    stats = pytest.importorskip("scipy.stats")
    val = tmp_path / "sts.tsv"
    val.write_text(
        "s1\ts2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in STS_ROWS), encoding="utf-8"
    )
    out = tmp_path / "minilm-sts"
    argv = ["distill", "--teacher", str(minilm_dir), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--unlabelled", str(work["unlabelled"]), "--max_length", "24"]
    argv += ["--max_unlabelled", "40", "--max_steps", "4", "--eval_every", "2"]
    sts = ["--validation", str(val), "--validation_columns", "s1", "s2", "score"]
    assert cli.main([*argv, *sts]) == 0
    log = capsys.readouterr().err
    assert "validating on 20;" in log and "best spearman " in log, log
    results = json.loads((out / "eval_results.json").read_text())
    gold = np.array([s for _, _, s in STS_ROWS])

    def spearman_of(model_dir: Path) -> float:
        model = st.SentenceTransformer(str(model_dir), device="cpu")
        a = model.encode([r[0] for r in STS_ROWS])
        b = model.encode([r[1] for r in STS_ROWS])
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return float(stats.spearmanr(gold, cos).statistic)

    assert results["teacher"]["spearman"] == pytest.approx(spearman_of(minilm_dir), abs=1e-6)
    assert results["teacher"]["spearman"] > 0.8  # the hand-scored pairs are easy for MiniLM
    assert results["validation"]["spearman"] == pytest.approx(spearman_of(out), abs=1e-6)
    best = max(r["spearman"] for r in read_metrics(out) if r["split"] == "val")
    assert results["validation"]["spearman"] == pytest.approx(best, abs=1e-9)

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("q\td\n" + "".join(f"{a}\t{b}\n" for a, b, _ in STS_ROWS), encoding="utf-8")
    argv2 = [*argv, "--output", str(tmp_path / "ret"), "--validation", str(pairs)]
    assert cli.main([*argv2, "--validation_columns", "q", "d"]) == 0
    results = json.loads((tmp_path / "ret" / "eval_results.json").read_text())
    assert results["teacher"]["mrr@10"] > 0.8 and 0 < results["validation"]["mrr@10"] <= 1
    assert "best mrr@10 " in capsys.readouterr().err

    bad = [*argv, "--output", str(tmp_path / "bad"), "--validation", str(val)]
    assert "without --validation_columns naming a score column" in one_line_error(
        [*bad, "--metric", "spearman"], capsys
    )
    assert "--validation_columns s1: name two text columns" in one_line_error(
        [*bad, "--validation_columns", "s1"], capsys
    )
    assert "no column 's3'" in one_line_error([*bad, "--validation_columns", "s1", "s3"], capsys)
    assert "choose one of cosine, spearman, pearson" in one_line_error(
        [*bad, "--validation_columns", "s1", "s2", "score", "--metric", "mrr@10"], capsys
    )
    task = distill_argv(work, tmp_path / "task", "--student_layers", "1", "--train", str(val))
    assert "--validation_columns is for an embedding teacher" in one_line_error(
        [*task, *sts], capsys
    )
