"""CPU inference as users deploy it: bertforge eager vs ONNX Runtime fp32 vs ONNX Runtime int8.

Two models: all-MiniLM-L6-v2 (``embed``, mean pooling) and an IMDB sentiment classifier fine-tuned
from it (``classify``). For each backend: texts/s at batch 1 and batch 32 on real IMDB test
reviews (the whole call: tokenising, batching, the model; 256 tokens at most), and the accuracy
on a fixed slice of the IMDB test set (``--test`` reviews drawn with seed 0 from the 25,000).
The classifier's accuracy is its own; MiniLM's is a nearest-centroid classifier on its
embeddings (centroids of ``--centroid-train`` IMDB train reviews embedded by the same backend),
scored on the first ``--minilm-test`` reviews of the same test slice.

Each ONNX model is exported twice: with standard ONNX operators (``bertforge export``'s default)
and with ONNX Runtime's fused ones (``--fuse true``).

The classifier is fine-tuned once if ``--classifier`` is not given (1 epoch on 2,000 IMDB train
reviews, max length 256, lr 1e-4, dropout 0) and kept in ``--work`` with the exports.

    python benchmarks/bench_onnx.py                      # everything (~15 minutes on 2 quiet cores)
    python benchmarks/bench_onnx.py --classifier DIR     # an existing IMDB classifier

Targets (issue 15): bertforge's default path >= ONNX Runtime fp32 in texts/s at batch 32, and
int8 >= 1.5x bertforge fp32 with <= 1 point of accuracy lost.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import SHARED_DATA, alternate, cpu_kind, fmt, log, machine_markdown, markdown_table
from _common import minilm_dir as find_minilm

import bertforge
from bertforge.inference.onnx import export_onnx, load_onnx
from bertforge.modeling.model import BertForSequenceClassification, BertModel
from bertforge.runtime import cpu_has_fast_bf16
from bertforge.tokenizer.wordpiece import Tokenizer

MAX_LENGTH = 256


def imdb(split: str, n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """``n`` reviews of an IMDB split (all four parts), shuffled with ``seed``: texts, labels."""
    rows: list[tuple[str, int]] = []
    for part in sorted((SHARED_DATA / "imdb").glob(f"{split}-*.csv.gz")):
        with gzip.open(part, "rt", encoding="utf-8", newline="") as f:
            rows += [(r["text"], int(r["label"])) for r in csv.DictReader(f)]
    random.Random(seed).shuffle(rows)
    rows = rows[:n]
    return [t for t, _ in rows], np.array([y for _, y in rows])


def fine_tune_classifier(work: Path) -> Path:
    """The IMDB classifier of this benchmark (fine-tuned once, then reused from ``work``)."""
    out = work / "imdb-minilm"
    if (out / "model.safetensors").is_file():
        return out
    texts, labels = imdb("train", 2000, seed=0)
    train = work / "imdb-train-2000.csv"
    with open(train, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels.tolist(), strict=True))
    log(f"fine-tuning MiniLM on {train} into {out}")
    from bertforge.cli import main as cli

    argv = ["finetune", "--model", str(find_minilm()), "--train", str(train)]
    argv += ["--output", str(out), "--epochs", "1", "--lr", "1e-4", "--dropout", "0"]
    if cli([*argv, "--max_length", str(MAX_LENGTH), "--progress", "false"]) != 0:
        raise SystemExit("fine-tuning failed")
    return out


EXPORTS = {  # backend name -> export_onnx options
    "ONNX Runtime fp32 (standard operators: the export's default)": {
        "quantize": None,
        "fuse": False,
    },
    "ONNX Runtime fp32 (fused: --fuse true)": {"quantize": None, "fuse": True},
    "ONNX Runtime int8 (standard operators: the export's default)": {
        "quantize": "int8",
        "fuse": False,
    },
    "ONNX Runtime int8 (fused: --fuse true)": {"quantize": "int8", "fuse": True},
}
ORT_FP32, INT8 = list(EXPORTS)[0], list(EXPORTS)[2]  # what `bertforge export` writes
EAGER_FP32 = "bertforge eager fp32"  # the extra eager row on a CPU where `auto` is bf16


def exports(model_dir: Path, work: Path, name: str) -> dict[str, Path]:
    """The ONNX exports of :data:`EXPORTS` of ``model_dir`` (made once, reused from ``work``)."""
    out = {}
    for backend, options in EXPORTS.items():
        kind = f"{options['quantize'] or 'fp32'}-{'fused' if options['fuse'] else 'standard'}"
        path = work / f"{name}-onnx-{kind}"
        if not (path / "model.onnx").is_file():
            log(f"exporting {model_dir} -> {path}")
            export_onnx(model_dir, path, **options)
        out[backend] = path
    return out


def backends(model_dir: Path, onnx_dirs: dict[str, Path], cls: type) -> dict[str, tuple[Any, str]]:
    """name -> (model, precision): bertforge eager in what ``auto`` picks (and bf16 where the
    CPU runs it natively), and the ONNX Runtime exports."""
    eager = cls.from_pretrained(model_dir).eval()
    auto = "bf16" if cpu_has_fast_bf16() else "fp32"
    out = {f"bertforge eager {auto} (default)": (eager, auto)}
    if auto == "fp32":
        log("bf16: skipped, this CPU has no AVX512-BF16/AMX (bf16 would be emulated, slower)")
    else:
        out[EAGER_FP32] = (eager, "fp32")
    for backend, directory in onnx_dirs.items():
        out[backend] = (load_onnx(directory), "fp32")
    return out


def throughput(
    run: Callable[[Any, str, list[str], int], Any],
    models: dict[str, tuple[Any, str]],
    texts: list[str],
    reps: int,
) -> dict[str, dict[int, float]]:
    """texts/s of each backend at batch 1 (32 texts, one by one) and batch 32 (128 texts)."""
    out: dict[str, dict[int, float]] = {name: {} for name in models}
    for batch, n in ((1, 32), (32, 128)):
        chunk = texts[:n]
        cases = {
            name: (lambda m=m, p=p, c=chunk, b=batch: run(m, p, c, b))
            for name, (m, p) in models.items()
        }
        log(f"throughput at batch {batch}: {len(cases)} backends x {reps}")
        timings = alternate(cases, warmup=1, reps=reps)
        for name, t in timings.items():
            out[name][batch] = n / t.median
    return out


def classify_run(model: Any, precision: str, texts: list[str], batch: int, tok: Tokenizer):
    return bertforge.classify(
        model, tok, texts, batch_size=batch, max_length=MAX_LENGTH, precision=precision
    )


def embed_run(model: Any, precision: str, texts: list[str], batch: int, tok: Tokenizer):
    return bertforge.embed(
        model, tok, texts, "mean", batch_size=batch, max_length=MAX_LENGTH, precision=precision
    )


def classifier_accuracy(model: Any, precision: str, tok: Tokenizer, texts, labels) -> float:
    results = classify_run(model, precision, texts, 32, tok)
    predicted = np.array([int(r["label"]) if r["label"].isdigit() else -1 for r in results])
    return float((predicted == labels).mean())


def centroid_accuracy(model: Any, precision: str, tok: Tokenizer, train, test) -> float:
    """Nearest-centroid accuracy on unit-length mean-pooled embeddings."""
    (train_texts, train_labels), (test_texts, test_labels) = train, test
    x = embed_run(model, precision, train_texts, 32, tok)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    centroids = np.stack([x[train_labels == c].mean(0) for c in (0, 1)])  # (2, H)
    y = embed_run(model, precision, test_texts, 32, tok)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return float(((y @ centroids.T).argmax(1) == test_labels).mean())


def section(
    title: str,
    models: dict[str, tuple[Any, str]],
    speed: dict[str, dict[int, float]],
    accuracy: dict[str, float],
    n_test: int,
) -> tuple[str, dict[str, float]]:
    names = list(models)
    default, ort, int8 = names[0], ORT_FP32, INT8
    # the int8 targets are against our fp32 (the default itself where `auto` is fp32)
    fp32 = EAGER_FP32 if EAGER_FP32 in models else default
    rows = []
    for name in names:
        rows.append(
            [
                name,
                fmt(speed[name][1], 1),
                fmt(speed[name][32], 1),
                f"{speed[name][32] / speed[default][32]:.2f}x",
                f"{accuracy[name]:.2%}",
            ]
        )
    header = ["backend", "texts/s, batch 1", "texts/s, batch 32", "vs default (b32)"]
    header.append(f"accuracy, {n_test:,} IMDB test reviews")
    checks = {
        "default / ORT fp32 (b32)": speed[default][32] / speed[ort][32],
        "int8 / our fp32 (b32)": speed[int8][32] / speed[fp32][32],
        "int8 / our fp32 (b1)": speed[int8][1] / speed[fp32][1],
        "int8 / default (b32)": speed[int8][32] / speed[default][32],
        # rounded as printed, so that 1.00 is not "NOT met" by a float's last bit
        "accuracy lost by int8 (points)": round(100 * (accuracy[fp32] - accuracy[int8]), 2),
    }
    return f"#### {title}\n\n" + markdown_table(header, rows), checks


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classifier", type=Path, help="an IMDB classifier (default: fine-tune one)")
    p.add_argument("--work", type=Path, default=Path("/tmp/bertforge-bench-onnx"))
    p.add_argument("--test", type=int, default=2000, help="IMDB test reviews for accuracy")
    p.add_argument("--minilm-test", type=int, default=1000, help="the first N of --test for MiniLM")
    p.add_argument("--centroid-train", type=int, default=500)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    test = imdb("test", args.test, seed=0)
    speed_texts = imdb("test", 128, seed=1)[0]  # real reviews, not the accuracy slice's order
    out = [f"### ONNX Runtime inference on {cpu_kind()}\n", machine_markdown(), ""]
    results: dict[str, Any] = {"cpu": cpu_kind()}

    classifier = args.classifier or fine_tune_classifier(args.work)
    tok = Tokenizer.from_file(classifier)
    models = backends(
        classifier, exports(classifier, args.work, "imdb"), BertForSequenceClassification
    )
    speed = throughput(
        lambda m, pr, t, b: classify_run(m, pr, t, b, tok), models, speed_texts, args.reps
    )
    accuracy = {}
    for name, (model, precision) in models.items():
        log(f"accuracy of {name} on {args.test} test reviews")
        accuracy[name] = classifier_accuracy(model, precision, tok, *test)
    text, checks = section(
        "IMDB sentiment classifier (MiniLM fine-tuned, `classify`)",
        models,
        speed,
        accuracy,
        args.test,
    )
    out.append(text)
    results["classifier"] = {"speed": speed, "accuracy": accuracy, "checks": checks}
    print("\n".join(out), flush=True)  # the classifier's table as soon as it is done
    printed = len(out)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    del models

    minilm = find_minilm()
    tok = Tokenizer.from_file(minilm)
    models = backends(minilm, exports(minilm, args.work, "minilm"), BertModel)
    speed = throughput(
        lambda m, pr, t, b: embed_run(m, pr, t, b, tok), models, speed_texts, args.reps
    )
    train = imdb("train", args.centroid_train, seed=0)
    minilm_test = (test[0][: args.minilm_test], test[1][: args.minilm_test])
    accuracy = {}
    for name, (model, precision) in models.items():
        log(f"nearest-centroid accuracy of {name}")
        accuracy[name] = centroid_accuracy(model, precision, tok, train, minilm_test)
    text, checks_m = section(
        "all-MiniLM-L6-v2 embeddings (`embed --pooling mean`; accuracy: nearest centroid of "
        f"{args.centroid_train:,} train reviews)",
        models,
        speed,
        accuracy,
        len(minilm_test[0]),
    )
    out.append("\n" + text)
    results["minilm"] = {"speed": speed, "accuracy": accuracy, "checks": checks_m}

    lines = ["", "Targets (issue 15):"]
    for model_name, c in (("classifier", checks), ("MiniLM", checks_m)):
        lines.append(
            f"- {model_name}: default / ORT fp32 at batch 32 = {c['default / ORT fp32 (b32)']:.2f}x "
            f"(target >= 1.00: {'met' if c['default / ORT fp32 (b32)'] >= 1 else 'NOT met'}); "
            f"int8 / our fp32 = {c['int8 / our fp32 (b32)']:.2f}x at batch 32, "
            f"{c['int8 / our fp32 (b1)']:.2f}x at batch 1 (target >= 1.5: "
            f"{'met' if c['int8 / our fp32 (b32)'] >= 1.5 else 'NOT met'}; int8 / default "
            f"{c['int8 / default (b32)']:.2f}x); int8 loses "
            f"{c['accuracy lost by int8 (points)']:.2f} accuracy points vs our fp32 (target <= 1: "
            f"{'met' if c['accuracy lost by int8 (points)'] <= 1 else 'NOT met'})"
        )
    out += lines
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return "\n".join(out[printed:])  # the classifier's part was printed above


if __name__ == "__main__":
    print(main(sys.argv[1:]))
