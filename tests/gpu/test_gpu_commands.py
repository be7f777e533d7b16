"""The commands on the GPU: finetune, evaluate, classify, embed, fill-mask, downstream and serve
run with ``--device`` the device under test and answer as on the CPU (tiny models; fp32)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support.serve import request, serve

from bertforge import cli
from bertforge.modeling.model import BertForSequenceClassification
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer

TEXTS = ["a good film about town", "the movie was bad", "music at night"]
FP32 = ["--precision", "fp32"]
SHORT = ["--max_length", "64"]  # the tiny models' positions


def run(*argv: str) -> str:
    """``bertforge ARGV``: its standard output; a non-zero exit fails with its standard error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    assert code == 0, f"bertforge {' '.join(argv)} exited {code}:\n{err.getvalue()[-3000:]}"
    return out.getvalue()


@pytest.fixture(scope="module")
def work(task_files, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu-commands")
    mlm = task_files.tiny_start_model(root, kind="mlm")
    torch.manual_seed(1)
    clf = BertForSequenceClassification.from_pretrained(
        mlm, num_labels=2, id2label={0: "neg", 1: "pos"}
    )
    clf.save_pretrained(root / "clf", tokenizer=Tokenizer.from_file(mlm))
    paths = {"mlm": mlm, "clf": root / "clf", "root": root}
    paths |= {"train": root / "train.csv", "test": root / "test.csv"}
    task_files.write_sentiment(paths["train"], 160, seed=1)
    task_files.write_sentiment(paths["test"], 64, seed=2)
    paths["texts"] = root / "texts.txt"
    paths["texts"].write_text("\n".join(TEXTS) + "\n")
    paths["masked"] = root / "masked.txt"
    paths["masked"].write_text("the [MASK] was good .\na [MASK] film about [MASK] .\n")
    return paths


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_finetune_then_classify_on_the_device(work, device):
    """Fine-tuning on the device learns the keyword rule; classify on the device answers as
    classify on the CPU with the same model."""
    out = work["root"] / "finetuned"
    run(
        "finetune",
        "--model",
        str(work["mlm"]),
        "--train",
        str(work["train"]),
        "--output",
        str(out),
        "--device",
        device,
        "--max_steps",
        "60",
        "--batch_size",
        "16",
        "--lr",
        "3e-3",
        "--dropout",
        "0",
        "--progress",
        "false",
        *SHORT,
        *FP32,
    )
    answers = {}
    for where in (device, "cpu"):
        target = work["root"] / f"classified-{where}.jsonl"
        run(
            "classify",
            "--model",
            str(out),
            "--input",
            str(work["test"]),
            "--output",
            str(target),
            "--device",
            where,
            *FP32,
        )
        answers[where] = lines(target)
    a, b = answers[device], answers["cpu"]
    assert [r["label"] for r in a] == [r["label"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert x["scores"] == pytest.approx(y["scores"], abs=1e-4)
    truth = [row.split(",")[-1] for row in work["test"].read_text().splitlines()[1:]]
    right = sum(r["label"] == t for r, t in zip(a, truth, strict=True))
    assert right / len(truth) > 0.7  # the keyword rule is learnt


def test_compiled_finetuning_follows_the_eager_losses(work, device):
    """``finetune --compile true`` on CUDA (batches of changing length): the eager run's
    losses within the rounding of Inductor's fused kernels."""
    if torch.device(device).type != "cuda":
        pytest.skip("compiling on the CPU takes minutes on a small machine")
    losses = {}
    for compiled in ("true", "false"):
        out = work["root"] / f"finetuned-compile-{compiled}"
        run(
            "finetune", "--model", str(work["mlm"]), "--train", str(work["train"]),
            "--output", str(out), "--device", device, "--max_steps", "12",
            "--batch_size", "16", "--lr", "1e-3", "--dropout", "0", "--progress", "false",
            "--log_every", "1", "--compile", compiled, *SHORT, *FP32,
        )  # fmt: skip
        records = [r for r in read_metrics(out) if r["split"] == "train"]
        losses[compiled] = [r["loss"] for r in records]
    assert len(losses["true"]) == len(losses["false"]) == 12
    assert losses["true"] == pytest.approx(losses["false"], rel=2e-3, abs=2e-3)


def test_evaluate_on_the_device_equals_the_cpu(work, device):
    results = {}
    for where in (device, "cpu"):
        target = work["root"] / f"eval-{where}.json"
        run(
            "evaluate",
            "--model",
            str(work["clf"]),
            "--data",
            str(work["test"]),
            "--output",
            str(target),
            "--device",
            where,
            *FP32,
        )
        results[where] = json.loads(target.read_text())
    _assert_close_json(results[device], results["cpu"])


NOISY = ("second", "device", "per_s", "time", "date", "memory")
"""Keys whose values differ between two runs by nature: timings, the device's name."""


def _assert_close_json(a, b, path: str = "") -> None:
    """Equal structure and strings; numbers within 1e-4 (timings and the device aside)."""
    if isinstance(a, dict):
        keys = {k for k in a if not any(w in k for w in NOISY)}
        assert keys == {k for k in b if not any(w in k for w in NOISY)}, path
        for key in keys:
            _assert_close_json(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_close_json(x, y, f"{path}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert a == pytest.approx(b, abs=1e-4, rel=1e-4), path
    else:
        assert a == b, path


def test_embed_and_fill_mask_on_the_device_equal_the_cpu(work, device):
    vectors, filled = {}, {}
    for where in (device, "cpu"):
        npy = work["root"] / f"vectors-{where}.npy"
        run(
            "embed",
            "--model",
            str(work["mlm"]),
            "--input",
            str(work["texts"]),
            "--output",
            str(npy),
            "--pooling",
            "mean",
            "--device",
            where,
            *FP32,
        )
        vectors[where] = np.load(npy)
        target = work["root"] / f"filled-{where}.jsonl"
        run(
            "fill-mask",
            "--model",
            str(work["mlm"]),
            "--input",
            str(work["masked"]),
            "--output",
            str(target),
            "--device",
            where,
            *FP32,
        )
        filled[where] = lines(target)
    np.testing.assert_allclose(vectors[device], vectors["cpu"], atol=1e-5)
    assert vectors[device].shape == (len(TEXTS), 32)
    for a, b in zip(filled[device], filled["cpu"], strict=True):
        assert [[c["id"] for c in m] for m in a["masks"]] == [
            [c["id"] for c in m] for m in b["masks"]
        ]


def test_downstream_on_the_device(work, device):
    out = work["root"] / "downstream"
    run(
        "downstream",
        "--model",
        str(work["mlm"]),
        "--train",
        str(work["train"]),
        "--test",
        str(work["test"]),
        "--output",
        str(out),
        "--device",
        device,
        "--max_steps",
        "20",
        "--batch_size",
        "16",
        "--progress",
        "false",
        *SHORT,
        *FP32,
    )
    assert any(out.rglob("*.json"))


def test_serve_on_the_device_answers_as_the_cpu(work, device, tmp_path):
    """``bertforge serve --device DEVICE``: /info says where the models are; /predict, /embed
    and /fill-mask answer as a server on the CPU does."""
    models = {"mlm": work["mlm"], "clf": work["clf"]}
    answers = {}
    for where in (device, "cpu"):
        with serve(models, "--device", where, log=tmp_path / f"serve-{where}.log") as (port, _):
            status, info = request(port, "GET", "/info")
            assert status == 200
            if where != "cpu":
                assert all(m.get("device", "").startswith(where) for m in info["models"]), info
            answers[where] = [
                request(port, "POST", "/predict", {"inputs": TEXTS, "model": "clf"}),
                request(
                    port, "POST", "/embed", {"inputs": TEXTS, "model": "mlm", "pooling": "mean"}
                ),
                request(
                    port,
                    "POST",
                    "/fill-mask",
                    {"inputs": ["the [MASK] was good ."], "model": "mlm"},
                ),
            ]
    (predict, embed, fill), (predict_cpu, embed_cpu, fill_cpu) = answers[device], answers["cpu"]
    assert predict[0] == embed[0] == fill[0] == 200
    assert [r["label"] for r in predict[1]] == [r["label"] for r in predict_cpu[1]]
    np.testing.assert_allclose(embed[1], embed_cpu[1], atol=1e-5)
    assert [c["id"] for c in fill[1][0]["masks"][0]] == [
        c["id"] for c in fill_cpu[1][0]["masks"][0]
    ]
