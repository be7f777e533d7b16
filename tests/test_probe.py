"""The downstream probe: logistic regression on frozen features (pure functions), and the probe
during pretraining (logged in metrics.jsonl at every evaluation, drawn, and free of side effects
on the training run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertforge import cli
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.evaluation.probe import fit_logistic_regression, probe_scores
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer


def test_logistic_regression_reaches_the_regularised_optimum():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    y = x[:, :3].argmax(-1)  # 3 linearly separable classes
    w, b = fit_logistic_regression(x, y, 3, l2=1e-2)
    weight = torch.tensor(w, requires_grad=True)
    bias = torch.tensor(b, requires_grad=True)
    features, targets = torch.tensor(x), torch.tensor(y)
    loss = F.cross_entropy(features @ weight + bias, targets) + 1e-2 * weight.pow(2).sum()
    loss.backward()
    assert weight.grad.abs().max() < 1e-5 and bias.grad.abs().max() < 1e-5  # a stationary point
    assert ((x @ w + b).argmax(-1) == y).mean() > 0.9


def test_probe_scores_informative_features_high_and_noise_at_chance():
    rng = np.random.default_rng(1)
    y_train, y_test = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    signal = lambda y: rng.normal(size=(len(y), 8)) + 3.0 * y[:, None]  # noqa: E731
    good = probe_scores(signal(y_train), y_train, signal(y_test), y_test, 2)
    assert good["accuracy"] > 0.95 and good["macro_f1"] > 0.95
    noise = probe_scores(rng.normal(size=(400, 8)), y_train, rng.normal(size=(400, 8)), y_test, 2)
    assert 0.4 < noise["accuracy"] < 0.6


@pytest.fixture(scope="module")
def setup(task_files, shakespeare_file: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("probe")
    text = root / "text.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:150_000], encoding="utf-8")
    tokenizer = Tokenizer.train(text, vocab_size=400)
    options = dict(max_seq_length=32, mode="packed", progress=False)
    prepare(PrepareConfig([str(text)], "", str(root / "data"), **options), tokenizer)
    task_files.write_sentiment(root / "probe-train.csv", 160, seed=1)
    task_files.write_sentiment(root / "probe-test.csv", 100, seed=2)
    return {"root": root, "data": root / "data"}


def pretrain_argv(setup: dict[str, Path], output: Path, *extra: str) -> list[str]:
    argv = ["pretrain", "--data", str(setup["data"]), "--output", str(output)]
    argv += ["--model.preset", "tiny", "--model.hidden_size", "32"]
    argv += ["--model.num_attention_heads", "4", "--model.intermediate_size", "64"]
    argv += ["--model.max_position_embeddings", "64", "--train.objective", "mlm"]
    for key, value in dict(
        batch_size=16, lr=3e-3, max_steps=40, eval_every=20, eval_examples=64, save_every=0,
        log_every=1, precision="fp32", device="cpu", num_threads=1, progress="false",
    ).items():  # fmt: skip
        argv += [f"--train.{key}", str(value)]
    return [*argv, *extra]


def test_the_probe_is_logged_at_every_evaluation_and_leaves_training_alone(setup, capsys):
    root = setup["root"]
    probe = ["--probe.train", str(root / "probe-train.csv"), "--probe.test"]
    probe += [str(root / "probe-test.csv"), "--probe.max_examples", "80"]
    assert cli.main(pretrain_argv(setup, root / "with", *probe)) == 0
    assert "downstream probe" in capsys.readouterr().err
    records = read_metrics(root / "with")
    probes = [r for r in records if r["split"] == "probe"]
    assert [r["step"] for r in probes] == [0, 20, 40]
    for r in probes:
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["macro_f1"] <= 1.0
        assert r["examples"] == 80 and 0.0 <= r["train_accuracy"] <= 1.0
    result = json.loads((root / "with" / "results.json").read_text())
    assert [p["accuracy"] for p in result["probe"]] == [r["accuracy"] for r in probes]
    assert (root / "with" / "curves.png").stat().st_size > 10_000

    # the same run without the probe: identical training (the probe draws no random numbers)
    assert cli.main(pretrain_argv(setup, root / "without")) == 0
    losses = lambda run: [r["loss"] for r in read_metrics(run) if r["split"] == "train"]  # noqa: E731
    assert losses(root / "with") == losses(root / "without")
    assert not [r for r in read_metrics(root / "without") if r["split"] == "probe"]


def test_bad_probe_options_fail_in_one_line_before_training(task_files, setup, tmp_path, capsys):
    root = setup["root"]
    argv = pretrain_argv(setup, tmp_path / "a", "--probe.train", str(root / "probe-train.csv"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "probe.train and probe.test go together" in err and err.count("\n") == 1
    unlabelled = tmp_path / "unlabelled.csv"
    task_files.write_rows(
        unlabelled, [{"text": "a good play", "stars": 5}, {"text": "bad", "stars": 1}]
    )
    argv = pretrain_argv(setup, tmp_path / "b", "--probe.train", str(unlabelled))
    assert cli.main([*argv, "--probe.test", str(root / "probe-test.csv")]) == 2
    err = capsys.readouterr().err
    assert "no column 'label'" in err and err.count("\n") == 1
    assert not (tmp_path / "b" / "metrics.jsonl").exists()
