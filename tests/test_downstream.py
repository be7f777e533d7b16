"""``bertforge downstream``: a briefly pretrained tiny encoder and its random twin, fine-tuned alike
on the keyword-sentiment task and scored on a test file, side by side."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from conftest import QUICK_FINETUNE, TaskFiles, noise
from safetensors.torch import load_file

from bertforge import cli
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForPreTraining
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.downstream import RESULTS_FILE, TWIN_DIR, downstream_table
from bertforge.training.model_card import read_card_metadata

FAST = [
    "--max_length",
    "32",
    "--batch_size",
    "16",
    "--lr",
    "3e-3",
    "--epochs",
    "3",
    "--num_threads",
    "1",
    "--dropout",
    "0",
    "--precision",
    "fp32",
    "--progress",
    "false",
]


def pretrain_a_little(task_files, start: Path, out: Path, steps: int = 30) -> Path:
    """``start`` after ``steps`` real masked-LM steps on keyword sentences: trained weights that
    are not any fresh initialisation."""
    model = BertForPreTraining.from_pretrained(start)
    tokenizer = Tokenizer.from_file(start)
    rng = random.Random(5)
    texts = [task_files.sentence(rng, rng.choice(["good", "bad"])) for _ in range(64)]
    batch = tokenizer.encode_batch(texts, max_length=32, return_tensors="pt")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = batch["input_ids"].clone()
        chosen = (torch.rand(ids.shape, generator=generator) < 0.2) & (ids > 4)
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        ids[chosen] = tokenizer.mask_id
        out_ = model(ids, attention_mask=batch["attention_mask"], labels=labels)
        out_.mlm_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out, tokenizer=tokenizer)
    return out


@pytest.fixture(scope="module")
def work(task_files, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("downstream")
    start = task_files.tiny_start_model(root)
    paths = {
        "root": root,
        "start": start,
        "pretrained": pretrain_a_little(task_files, start, root / "pretrained-model"),
        "train": root / "train.csv",
        "test": root / "test.csv",
    }
    task_files.write_sentiment(paths["train"], 240, seed=1)
    task_files.write_sentiment(paths["test"], 120, seed=2)
    return paths


@pytest.fixture(scope="module")
def result(work) -> dict:
    out = work["root"] / "ds"
    argv = [
        "downstream",
        "--model",
        str(work["pretrained"]),
        "--train",
        str(work["train"]),
        "--test",
        str(work["test"]),
        "--output",
        str(out),
        "--baseline",
        str(work["start"]),
        "--init_seed",
        "7",
        *FAST,
    ]
    assert cli.main(argv) == 0
    return json.loads((out / RESULTS_FILE).read_text())


def test_both_columns_and_the_baseline_are_scored_on_the_test_file(result, work, capsys):
    for name in ("pretrained", "random_init", "baseline"):
        column = result[name]
        assert 0.0 <= column["accuracy"] <= 1.0 and 0.0 <= column["macro_f1"] <= 1.0
        assert column["examples"] == 120  # the test file, not the validation split
        assert column["steps"] == 3 * 14  # 3 epochs of 216 train rows (10% held out), batch 16
    # the keyword rule is learnable from scratch: the twin and the baseline (both random
    # initialisations) are far above chance after the same fine-tuning
    assert min(result[n]["accuracy"] for n in ("random_init", "baseline")) > 0.8
    diff = result["difference"]["accuracy"]
    assert diff == pytest.approx(
        result["pretrained"]["accuracy"] - result["random_init"]["accuracy"]
    )
    assert result["pretrained"]["model"] == str(work["pretrained"])
    assert result["finetune"]["lr"] == 3e-3 and result["finetune"]["max_length"] == 32
    # the fine-tuned model's card: its test scores beside the random-init twin's
    meta = read_card_metadata(work["root"] / "ds" / "pretrained")
    validation, test = meta["model-index"][0]["results"]
    assert "test.csv" in test["dataset"]["name"]
    scores = {m["type"]: m["value"] for m in test["metrics"]}
    assert scores["accuracy"] == result["pretrained"]["accuracy"]
    card = (work["root"] / "ds" / "pretrained" / "README.md").read_text()
    twin = f"| {result['random_init']['accuracy']:.4f} |"
    assert "random-init twin (fine-tuned the same way)" in card and twin in card


def test_the_table_prints_every_column(work, capsys):
    out = work["root"] / "ds"
    table = downstream_table(json.loads((out / RESULTS_FILE).read_text()))
    header = table.splitlines()[1]
    assert header.split() == ["pretrained", "random", "init", "baseline"]
    assert any(
        line.startswith("accuracy") and len(line.split()) == 4 for line in table.splitlines()
    )
    assert any(line.startswith("macro-F1") for line in table.splitlines())
    assert "pretraining vs random init: accuracy" in table


def test_the_twin_is_a_fresh_initialisation_with_the_seed(result, work):
    twin = load_file(work["root"] / "ds" / TWIN_DIR / "model.safetensors")
    pretrained = load_file(work["pretrained"] / "model.safetensors")
    config = BertConfig.load(work["pretrained"])
    assert BertConfig.load(work["root"] / "ds" / TWIN_DIR).to_dict() == config.to_dict()
    torch.manual_seed(7)
    fresh = BertForPreTraining(config).state_dict()
    assert set(twin) == set(pretrained)  # the same layout
    for key, value in twin.items():
        torch.testing.assert_close(value, fresh[key], rtol=0, atol=0, msg=key)
    changed = [k for k in twin if not torch.equal(twin[k], pretrained[k])]
    assert "bert.embeddings.word_embeddings.weight" in changed
    assert "bert.encoder.layer.0.attention.self.query.weight" in changed
    tokens = (work["root"] / "ds" / TWIN_DIR / "vocab.txt").read_text()
    assert tokens == (work["pretrained"] / "vocab.txt").read_text()
    # both fine-tuning runs started from their own model with the same settings
    runs = {
        n: json.loads((work["root"] / "ds" / n / "finetune_config.json").read_text())
        for n in ("pretrained", "random_init")
    }
    assert runs["random_init"]["model"].endswith(TWIN_DIR)
    assert {k: v for k, v in runs["pretrained"].items() if k not in ("model", "output")} == {
        k: v for k, v in runs["random_init"].items() if k not in ("model", "output")
    }


def test_verify_checks_every_run_of_a_downstream_output(result, work, tmp_path, capsys):
    out = shutil.copytree(work["root"] / "ds", tmp_path / "ds")
    assert cli.main(["verify", str(out)]) == 0
    report = capsys.readouterr().out
    for name in ("baseline", "pretrained", "random_init", TWIN_DIR):
        assert f"OK         model      {out / name}  (" in report, report
    assert report.count("\nchecked ") == 4  # one report per directory
    weights = out / "random_init" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert cli.main(["verify", "--sizes_only", str(out)]) == 0  # same size, other bytes
    capsys.readouterr()
    assert cli.main(["verify", str(out)]) == 1
    report = capsys.readouterr().out
    assert f"DAMAGED    model      {out / 'random_init'}  (" in report, report
    assert f"OK         model      {out / 'pretrained'}  (" in report


def test_regression_reports_spearman(task_files, work, tmp_path, capsys):
    scores = tmp_path / "scores.csv"
    task_files.write_scores(scores, 200, seed=3)
    argv = ["downstream", "--model", str(work["pretrained"]), "--train", str(scores)]
    argv += ["--test", str(scores), "--output", str(tmp_path / "r"), "--task", "regression"]
    argv += ["--text_column", "review", "--label_column", "score", *FAST]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "Spearman" in table and "accuracy" not in table
    result = json.loads((tmp_path / "r" / RESULTS_FILE).read_text())
    assert {"spearman", "pearson", "mse"} <= set(result["random_init"])
    assert "spearman" in result["difference"]


def _error(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_bad_input_gets_a_one_line_error_before_any_training(task_files, work, tmp_path, capsys):
    base = ["downstream", "--train", str(work["train"]), *FAST]
    no_label = tmp_path / "unlabelled.csv"
    task_files.write_rows(no_label, [{"text": "a good film", "rating": 9}])
    argv = [*base, "--model", str(work["pretrained"]), "--output", str(tmp_path / "a")]
    err = _error([*argv, "--test", str(no_label)], capsys)
    assert "no column 'label'" in err and "unlabelled.csv" in err
    assert not (tmp_path / "a").exists()  # nothing was trained
    gpt = tmp_path / "gpt2"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    argv = [*base, "--test", str(work["test"]), "--output", str(tmp_path / "b")]
    assert "not a BERT model" in _error([*argv, "--model", str(gpt)], capsys)
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    assert "not a BERT model directory" in _error([*argv, "--model", str(empty)], capsys)
    assert "not a BERT" in _error(
        [*argv, "--model", str(work["pretrained"]), "--baseline", str(gpt)], capsys
    )
    err = _error(
        [*argv, "--model", str(work["pretrained"]), "--baseline", str(tmp_path / "nope")], capsys
    )
    assert err.startswith(f"error: --baseline {tmp_path / 'nope'}: no such directory"), err
    err = _error([*argv, "--model", str(work["pretrained"]), "--baseline", str(empty)], capsys)
    assert err.startswith(f"error: --baseline {empty}: no config.json"), err
    assert not (tmp_path / "b").exists()


# ---- a run where nothing can be learned ---------------------------------------------------------


@pytest.fixture(scope="module")
def collapsed(start, tmp_path_factory) -> dict:
    """A downstream run where nothing can be learned: texts without signal, 80 % one class."""
    root = tmp_path_factory.mktemp("collapsed")
    rng = random.Random(1)
    rows = [{"text": noise(rng), "label": "a" if i % 5 else "b"} for i in range(50)]
    TaskFiles.write_rows(root / "train.csv", rows)
    TaskFiles.write_rows(root / "test.csv", rows[:20])
    argv = ["downstream", "--model", str(start), "--train", str(root / "train.csv")]
    argv += ["--test", str(root / "test.csv"), "--output", str(root / "ds")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main([*argv, *QUICK_FINETUNE, "--max_steps", "2", "--lr", "1e-6"]) == 0
    return {"out": root / "ds", "table": out.getvalue(), "root": root}


def test_downstream_flags_a_column_that_does_not_beat_the_majority_baseline(collapsed):
    """No column can beat always guessing the majority class. The table and downstream.json
    must say so, and the headline difference is not a fair one."""
    table = collapsed["table"]
    result = json.loads((collapsed["out"] / "downstream.json").read_text())
    assert result["pretrained"]["beats_baseline"] is False
    assert result["random_init"]["beats_baseline"] is False
    assert result["majority_baseline"]["predicts"] == "a"
    assert result["majority_baseline"]["accuracy"] == pytest.approx(16 / 20)
    assert "beats majority baseline" in table and "NO" in table
    assert "NOT a fair comparison" in table and "--lr" in table and "--epochs" in table


def test_the_fair_case_has_no_warning(collapsed):
    result = json.loads((collapsed["out"] / "downstream.json").read_text())
    for name in ("pretrained", "random_init"):
        result[name]["beats_baseline"] = True
    table = downstream_table(result)
    assert "NOT a fair comparison" not in table and "NO" not in table
    result["pretrained"]["beats_baseline"] = False  # one column is enough to say it
    assert "NOT a fair comparison: pretrained did not beat" in downstream_table(result)


def test_a_downstream_output_given_as_a_model_names_its_models(collapsed, capsys):
    out = collapsed["out"]
    err = _error(["classify", "--model", str(out), "some text"], capsys)
    assert f"{out}: not a model directory, but it holds 3: pretrained, random_init, " in err
    assert f"give one of them, e.g. {out / 'pretrained'}" in err
