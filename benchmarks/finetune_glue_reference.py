"""GLUE dev scores of all-MiniLM-L6-v2: ``bertforge benchmark --suite glue`` beside the same recipe
in transformers' ``Trainer`` with ``run_glue``'s conventions (issue 39).

Both sides read the same files (``--output``/data: the shared GLUE train and dev files, SST-2's
training file cut to a fixed random sample of ``--sst2_examples`` rows, seed 0, the same rows for
both), start from the same checkpoint and train with the same recipe: one seed, ``--epochs``,
peak ``--lr`` with 10% linear warmup then linear decay, ``--batch_size``, ``--max_length``,
AdamW (weight decay 0.01, eps 1e-6), clipping at 1, the model's own dropout (or ``--dropout`` on
both), ``--precision`` (fp32, or bf16 autocast: ``Trainer(bf16=True)`` on the CPU), the final
model scored on the whole dev file by the same metric code (``bertforge.evaluation.benchmark``).

* bertforge: the CLI, ``bertforge benchmark --suite glue --tasks T --seeds S+1`` (seed S = ``--seed``;
  the earlier seeds are skipped when this ``--output`` holds them) with the recipe's
  options (its defaults: batches of similar length, padded to their longest).
* transformers: ``run_glue``: ``tokenizer(s1, s2, truncation=True, max_length=...)``, labels
  sorted (regression: one output, raw targets), ``AutoModelForSequenceClassification``
  (``transformers.set_seed`` first), ``Trainer`` with ``DataCollatorWithPadding`` (run_glue's
  ``--pad_to_max_length False``: padded to the batch's longest, as ours; run_glue's default pads
  every row to ``max_length``, slower), ``trainer.predict`` on dev.

Recipe differences that remain: bertforge z-scores STS-B's targets while training
(``--normalize_targets``, its default; the saved head is rescaled), Trainer regresses the raw
0-5 scores; bertforge groups rows of similar length into a batch, Trainer shuffles freely.

Per task, the two sides run as two processes at the same time (``--schedule parallel``, each
``--num_threads`` threads, so both share whatever else loads the machine), or one after the other
with the first side swapped from task to task (``--schedule alternate``). Training seconds are
each library's own clock (``train_seconds`` of the fine-tuning run, ``train_runtime`` of
``Trainer.train``).

    python benchmarks/finetune_glue_reference.py --tasks RTE MRPC STS-B CoLA SST-2 --epochs 1 \\
        --lr 1e-4 --batch_size 32 --max_length 128 --sst2_examples 10000 --precision bf16

Prints a markdown table; writes ``results.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

from _common import (
    SHARED_DATA,
    add_side_options,
    launch_side,
    log,
    machine_markdown,
    markdown_table,
    minilm_dir,
    reference_trainer,
    run_sides,
    side_command,
)

TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "RTE")


def spec_of(name: str):
    from bertforge.evaluation.benchmark import select_tasks

    return select_tasks("glue", [name])[0]


def read_tsv(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows (the data README's reader: csv with tabs, quotes honoured)."""
    import gzip
    import io

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    return rows[0], rows[1:]


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerows([header, *rows])


def prepare(args: argparse.Namespace, work: Path) -> dict[str, int]:
    """``work/data/<task>/train.tsv`` and ``dev.tsv``, which both sides read; the training rows."""
    import numpy as np

    counts = {}
    for name in args.tasks:
        spec = spec_of(name)
        src = SHARED_DATA / "glue" / spec.folder
        dst = work / "data" / spec.folder
        dst.mkdir(parents=True, exist_ok=True)
        header, rows = read_tsv(next(src.glob("train.tsv*")))
        limit = args.sst2_examples if name == "SST-2" else args.train_examples
        if limit and limit < len(rows):  # a fixed random sample, in the file's order
            keep = np.sort(np.random.default_rng(0).permutation(len(rows))[:limit])
            rows = [rows[i] for i in keep]
        write_tsv(dst / "train.tsv", header, rows)
        shutil.copyfile(src / "dev.tsv", dst / "dev.tsv")
        counts[name] = len(rows)
    return counts


# ---- the two sides, each run in its own process -------------------------------------------------


def run_ours(args: argparse.Namespace, work: Path, task: str) -> dict:
    """``bertforge benchmark`` for one task, seed ``--seed``; its own clock and score. The
    benchmark runs seeds 0..N-1 and skips those whose results are on disk, so it is asked for
    ``--seed + 1`` seeds in an output directory that every ``--seed`` of this ``--output``
    shares: the seeds before it are reused when they ran already."""
    out = work / "bertforge" / task
    command = [
        sys.executable, "-m", "bertforge", "benchmark", "--model", str(minilm_dir()),
        "--suite", "glue", "--tasks", task, "--seeds", str(args.seed + 1),
        "--data_dir", str(work / "data"),
        "--output", str(out), "--epochs", str(args.epochs), "--lr", str(args.lr),
        "--batch_size", str(args.batch_size), "--max_length", str(args.max_length),
        "--precision", args.precision, "--num_threads", str(args.num_threads),
    ]  # fmt: skip
    if args.dropout is not None:
        command += ["--dropout", str(args.dropout)]
    log("bertforge: " + " ".join(command))
    subprocess.run(command, check=True)
    result = json.loads((out / "results" / "model" / f"{task}.json").read_text())
    from bertforge.evaluation.benchmark import task_score

    seed = result["seeds"][args.seed]
    assert seed["seed"] == args.seed, (seed["seed"], args.seed)
    return {
        "scores": seed["scores"],
        "score": task_score(seed["scores"], spec_of(task)),
        "train_seconds": seed["train_seconds"],
        "steps": seed["steps"],
    }


def run_transformers(args: argparse.Namespace, work: Path, task: str) -> dict:
    import numpy as np
    import torch
    import transformers

    from bertforge.evaluation import benchmark as B

    torch.set_num_threads(args.num_threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    spec = spec_of(task)
    columns = [spec.columns["text_column"], spec.columns.get("text_pair_column")]
    regression = spec.kind == "regression"

    def load(name: str) -> tuple[list[str], list[str] | None, list[str]]:
        header, rows = read_tsv(work / "data" / spec.folder / name)
        at = {c: header.index(c) for c in header}
        first = [r[at[columns[0]]] for r in rows]
        second = [r[at[columns[1]]] for r in rows] if columns[1] else None
        return first, second, [r[at[spec.columns["label_column"]]] for r in rows]

    train, dev = load("train.tsv"), load("dev.tsv")
    names = sorted(set(train[2]))  # run_glue: label_list.sort()
    label2id = {n: i for i, n in enumerate(names)}
    model_dir = minilm_dir()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)

    def rows(data: tuple) -> list[dict]:
        first, second, labels = data
        enc = tokenizer(first, second, truncation=True, max_length=args.max_length)
        return [
            {
                "input_ids": enc["input_ids"][i],
                "token_type_ids": enc["token_type_ids"][i],
                "attention_mask": enc["attention_mask"][i],
                "labels": float(y) if regression else label2id[y],
            }
            for i, y in enumerate(labels)
        ]

    train_rows, dev_rows = rows(train), rows(dev)
    extra = {}
    if args.dropout is not None:
        extra = {
            "hidden_dropout_prob": args.dropout,
            "attention_probs_dropout_prob": args.dropout,
            "classifier_dropout": args.dropout,
        }
    if not regression:
        extra |= {"id2label": dict(enumerate(names)), "label2id": label2id}
    transformers.set_seed(args.seed)  # as run_glue does before loading: the new head's init
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1 if regression else len(names), **extra
    )
    steps = -(-len(train_rows) // args.batch_size) * args.epochs
    trainer = reference_trainer(
        transformers,
        model,
        train_rows,
        transformers.DataCollatorWithPadding(tokenizer),
        work / "transformers" / task,
        args,
        steps,
        num_train_epochs=args.epochs,
    )
    out = trainer.train()
    logits = np.asarray(trainer.predict(dev_rows).predictions, dtype=np.float64)
    if regression:
        truth, predicted = [float(y) for y in dev[2]], list(logits.reshape(-1))
    else:
        truth, predicted = dev[2], [names[i] for i in logits.argmax(-1)]
    scores = B.pick(
        B.sequence_scores(truth, predicted, regression=regression, positive=spec.positive), spec
    )
    return {
        "scores": scores,
        "score": B.task_score(scores, spec),
        "train_seconds": float(out.metrics["train_runtime"]),
        "steps": int(out.global_step),
    }


# ---- the driver ---------------------------------------------------------------------------------


SIDE_OPTIONS = ("epochs", "lr", "batch_size", "max_length", "num_threads", "seed", "precision")
"""What both sides are given (with --dropout and --group_by_length)."""


def launch(args: argparse.Namespace, side: str, task: str) -> tuple[subprocess.Popen, float]:
    command = side_command(__file__, args, side, SIDE_OPTIONS) + ["--tasks", task]
    return launch_side(command, args.num_threads)


def run_task(args: argparse.Namespace, work: Path, task: str, first: str) -> dict[str, dict]:
    sides = ("bertforge", "transformers") if first == "bertforge" else ("transformers", "bertforge")
    return run_sides(
        args.schedule, sides, lambda side: launch(args, side, task),
        lambda side: work / side / f"{task}.json",
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--sst2_examples", type=int, default=10000)
    parser.add_argument(
        "--train_examples", type=int, default=None, help="sample of every other task's train file"
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument(
        "--dropout", type=float, default=None, help="both sides; default: each model's own"
    )
    add_side_options(parser)
    parser.add_argument("--smoke", action="store_true", help="48 rows per task: a quick test")
    parser.add_argument("--output", default="runs/glue-reference")
    parser.add_argument("--side", choices=("bertforge", "transformers"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.train_examples = args.sst2_examples = 48
        args.batch_size, args.max_length = 16, 64
    work = Path(args.output)
    if args.side:  # a worker: train and score one side of one task, write <side>/<task>.json
        task = args.tasks[0]
        run = run_ours if args.side == "bertforge" else run_transformers
        result = run(args, work, task)
        (work / args.side).mkdir(parents=True, exist_ok=True)
        (work / args.side / f"{task}.json").write_text(json.dumps(result, indent=2) + "\n")
        return

    counts = prepare(args, work)
    log(f"training rows: {counts}")
    results, rows = {}, []
    for i, task in enumerate(args.tasks):
        first = "bertforge" if i % 2 == 0 else "transformers"
        log(f"[{task}] {args.schedule}, {first} first")
        results[task] = r = run_task(args, work, task, first)
        ours, theirs = r["bertforge"], r["transformers"]
        spec = spec_of(task)
        metrics = "/".join(spec.metrics)
        rows.append(
            [
                task,
                f"{counts[task]:,}",
                metrics,
                "/".join(f"{100 * ours['scores'][m]:.1f}" for m in spec.metrics),
                "/".join(f"{100 * theirs['scores'][m]:.1f}" for m in spec.metrics),
                f"{100 * (ours['score'] - theirs['score']):+.1f}",
                f"{ours['steps']} / {theirs['steps']}",
                f"{ours['train_seconds']:.0f}",
                f"{theirs['train_seconds']:.0f}",
                f"{theirs['train_seconds'] / ours['train_seconds']:.2f}x",
            ]
        )
        (work / "results.json").write_text(
            json.dumps({"args": vars(args), "counts": counts, "tasks": results}, indent=2) + "\n"
        )
    table = markdown_table(
        [
            "task", "train rows", "metric (dev)", "bertforge", "transformers Trainer",
            "score diff (points)", "steps (ours / theirs)", "train s, bertforge",
            "train s, Trainer", "time ratio (Trainer / bertforge)",
        ],
        rows,
    )  # fmt: skip
    print(
        f"\nGLUE dev, all-MiniLM-L6-v2, one seed ({args.seed}): {args.epochs} epoch(s), batch "
        f"{args.batch_size}, lr {args.lr:g} (10% warmup, linear decay), max_length "
        f"{args.max_length}, {args.precision}, dropout "
        f"{'model default' if args.dropout is None else args.dropout}, {args.num_threads} "
        f"thread(s) per side, {args.schedule}\n\n{table}\n\n{machine_markdown()}"
    )


if __name__ == "__main__":
    main()
