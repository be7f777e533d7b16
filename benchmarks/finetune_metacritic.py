"""Review-score regression on Metacritic user reviews (score 0-10), from all-MiniLM-L6-v2.

Holds out a stratified 20% of the 8,581 reviews as a test set (written to OUTPUT/heldout.csv, the
rest to OUTPUT/train.csv), fine-tunes with ``bertforge finetune --task regression`` on the 80%
(which itself holds out 10% of it for model selection), scores the held-out 20% with
``bertforge evaluate``, and compares with a baseline that predicts the training mean for every
review.

    flock /tmp/bertforge-heavy.lock python benchmarks/finetune_metacritic.py --output runs/metacritic

Extra arguments after ``--`` go to ``bertforge finetune`` (e.g. ``-- --epochs 2 --lr 5e-5``).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from _common import SHARED_DATA, log, markdown_table, minilm_dir

from bertforge import cli
from bertforge.data.labelled import stratified_split
from bertforge.data.labels import to_floats
from bertforge.data.tables import read_table
from bertforge.evaluation.metrics import regression_metrics


def write_csv(path: Path, names: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="runs/metacritic")
    parser.add_argument(
        "--data", default=str(SHARED_DATA / "bert_tlsa_reviews" / "metacritic_reviews.csv")
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)

    names, rows = read_table(args.data)
    scores = to_floats([r["score"] for r in rows], "score", args.data)
    train_idx, test_idx = stratified_split(scores, 0.2, seed=args.seed, regression=True)
    write_csv(out / "train.csv", names, [rows[i] for i in train_idx])
    write_csv(out / "heldout.csv", names, [rows[i] for i in test_idx])
    log(f"{len(train_idx)} training reviews, {len(test_idx)} held out (stratified by score decile)")

    model_dir = out / "model"
    finetune = [
        "finetune",
        "--model",
        str(minilm_dir()),
        "--train",
        str(out / "train.csv"),
        "--text_column",
        "review",
        "--label_column",
        "score",
        "--task",
        "regression",
        "--output",
        str(model_dir),
        "--max_length",
        "256",
        "--truncation",
        "head_tail",
        "--batch_size",
        "32",
        "--lr",
        "1e-4",
        "--epochs",
        "3",
        "--dropout",
        "0",
        "--warmup_ratio",
        "0.06",
        "--precision",
        "bf16",
        "--progress",
        "false",
        *extra,
    ]
    evaluate = [
        "evaluate",
        "--model",
        str(model_dir),
        "--data",
        str(out / "heldout.csv"),
        "--output",
        str(out / "heldout_results.json"),
        "--plot",
        str(out / "heldout_scatter.png"),
    ]
    for command in (finetune, evaluate):
        log("bertforge " + shlex.join(command))
        start = time.perf_counter()
        if cli.main(command) != 0:
            raise SystemExit(f"bertforge {command[0]} failed")
        log(f"{command[0]}: {time.perf_counter() - start:.0f} s")

    held = json.loads((out / "heldout_results.json").read_text())
    truth = scores[test_idx]
    mean = float(scores[train_idx].mean())
    baseline = regression_metrics(truth, np.full(truth.shape, mean))
    rows_ = [
        ["fine-tuned all-MiniLM-L6-v2"]
        + [f"{held[k]:.4f}" for k in ("spearman", "pearson", "mse", "mae")],
        [f"training mean ({mean:.3f})"]
        + [f"{baseline[k]:.4f}" for k in ("spearman", "pearson", "mse", "mae")],
    ]
    print(
        f"\nMetacritic review score (0-10), {len(test_idx):,} held-out reviews\n\n"
        + markdown_table(["predictor", "Spearman", "Pearson", "MSE", "MAE"], rows_)
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "heldout": held,
                "baseline_training_mean": {"predicts": mean, **baseline},
                "finetune_command": "bertforge " + shlex.join(finetune),
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    from _common import machine_markdown

    print(machine_markdown() + "\n")  # the CPU, its vector features, what `auto` picks
    main()
