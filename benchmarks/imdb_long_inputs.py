"""IMDB from whole reviews: a ModernBERT fine-tuned at 128 tokens (head + tail, what
``bertforge finetune`` does to a long review today with ``--truncation head_tail``) against 512
and 1,024 tokens, from the same start, on the same training reviews for the same number of
examples seen; test accuracy on a fixed sample of the test split and the training time of each.

The start is a tiny ModernBERT pretrained here with the repo's own commands (``tokenizer
train``, ``prepare --mode packed --max_seq_length 1024``, ``pretrain --model.architecture
modernbert``) on IMDB's unlabelled reviews for ``--pretrain_time`` (test reviews' twins left
out), with 1,024 positions: every fine-tuning length is one the start has seen. ``--start DIR``
reuses a start instead (e.g. the ``start/`` of an earlier run); ``--start random`` fine-tunes a
random init of the same shape.

Each fine-tuning is ``bertforge finetune --max_length L --truncation head_tail`` (at 512 and
1,024 tokens most reviews are whole: the table says how many were cut), then ``bertforge
evaluate`` on the test sample. Test reviews that repeat a train review
(``train_test_overlap.csv``) are not sampled. One seed; the standard error is that of a
proportion over the test sample, sqrt(p (1 - p) / n).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/imdb_long_inputs.py --output runs/imdb-long
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, SHARED_DATA, log, machine_markdown, markdown_table

from bertforge.tokenizer.wordpiece import Tokenizer

IMDB = SHARED_DATA / "imdb"
BREAK = re.compile(r"<br\s*/?>")


def clean(text: str) -> str:
    """IMDB's ``<br />`` line breaks as spaces (what the unsup part already has)."""
    return BREAK.sub(" ", text)


def read_split(split: str) -> list[dict[str, str]]:
    rows = []
    for part in sorted(IMDB.glob(f"{split}-*.csv.gz")):
        with gzip.open(part, "rt", encoding="utf-8", newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for r in rows:
            writer.writerow([clean(r["text"]), r["label"]])


def bertforge(*argv: str) -> None:
    cmd = [sys.executable, "-m", "bertforge", *argv]
    log("$ bertforge " + " ".join(argv))
    subprocess.run(cmd, check=True, cwd=ROOT)


def task_files(args: argparse.Namespace, out: Path) -> dict[str, Path]:
    """train / validation samples of IMDB train (disjoint), a test sample of IMDB test without
    the reviews that repeat a train review; written once, the same for every length."""
    files = {k: out / f"{k}.csv" for k in ("train", "validation", "test")}
    if all(p.exists() for p in files.values()):
        return files
    rng = random.Random(args.seed)
    train = read_split("train")
    rng.shuffle(train)
    write_csv(files["train"], train[: args.train_examples])
    cut = args.train_examples + args.validation_examples
    write_csv(files["validation"], train[args.train_examples : cut])
    with (IMDB / "train_test_overlap.csv").open(encoding="utf-8") as f:
        repeats = {(r["test_label"], r["test_id"]) for r in csv.DictReader(f)}
    test = [r for r in read_split("test") if (r["label"], r["id"]) not in repeats]
    write_csv(files["test"], random.Random(args.seed + 1).sample(test, args.test_examples))
    return files


def unsup_tokenizer(args: argparse.Namespace, out: Path) -> tuple[Path, Path]:
    """IMDB unsup's first ``--unsup_reviews`` lines (those equal to a test review left out) and
    an 8,192-piece WordPiece trained on them: (text file, tokenizer directory)."""
    text, tok = out / "unsup.txt", out / "tokenizer"
    if not text.exists():
        test = {clean(r["text"]) for r in read_split("test")}
        kept = 0
        with text.open("w", encoding="utf-8") as f:
            for part in sorted(IMDB.glob("unsup-*.txt.gz")):
                with gzip.open(part, "rt", encoding="utf-8") as lines:
                    for line in lines:
                        if kept < args.unsup_reviews and line.rstrip("\n") not in test:
                            f.write(line)
                            kept += 1
    if not tok.exists():
        bertforge("tokenizer", "train", "--input", str(text), "--vocab_size", "8192",
                  "--output", str(tok), "--progress", "false")  # fmt: skip
    return text, tok


def pretrain_start(args: argparse.Namespace, out: Path) -> Path:
    """Packed 1,024-token shards of IMDB unsup and a ModernBERT pretrained on them for the
    budget; returns its model directory."""
    model = out / "start" / "model"
    if model.exists():
        return model
    text, tok = unsup_tokenizer(args, out)
    data = out / "data-1024"
    if not data.exists():
        bertforge("prepare", "--input", str(text), "--tokenizer", str(tok), "--output",
                  str(data), "--max_seq_length", "1024", "--mode", "packed", "--format",
                  "lines", "--progress", "false")  # fmt: skip
    bertforge(
        "pretrain", "--data", str(data), "--output", str(out / "start"),
        "--model.architecture", "modernbert", "--model.preset", args.preset,
        "--model.max_position_embeddings", "1024", "--train.objective", "mlm",
        "--masking.mlm_probability", "0.25", "--train.batch_size", "16",
        "--train.lr", "1e-3", "--train.warmup_ratio", "0.1",
        "--train.max_time", args.pretrain_time, "--train.num_threads", "1",
        "--train.progress", "false",
    )  # fmt: skip
    return model


def random_start(args: argparse.Namespace, out: Path) -> Path:
    """A random init of the pretrained start's config (its shape, tokenizer and dropout, 0.1
    as ``pretrain`` saves it) when that start is there, else of the preset."""
    import dataclasses

    import torch

    from bertforge.modeling.config import ModernBertConfig, load_config
    from bertforge.modeling.modernbert import ModernBertForMaskedLM

    model = out / "random-start"
    if model.exists():
        return model
    tok = Tokenizer.from_file(unsup_tokenizer(args, out)[1])
    pretrained = out / "start" / "model"
    if pretrained.exists():
        config = dataclasses.replace(load_config(pretrained), architectures=None)
    else:
        special = dict(pad_token_id=tok.pad_id, cls_token_id=tok.cls_id, sep_token_id=tok.sep_id)
        config = ModernBertConfig.preset(
            args.preset, vocab_size=tok.vocab_size, max_position_embeddings=1024,
            bos_token_id=tok.cls_id, eos_token_id=tok.sep_id, **special,
        )  # fmt: skip
    torch.manual_seed(args.seed)
    ModernBertForMaskedLM(config).save_pretrained(model, tokenizer=tok)
    return model


def cut_share(start: Path, texts: list[str], length: int) -> float:
    """The share of ``texts`` longer than ``length`` tokens with [CLS] and [SEP]."""
    tok = Tokenizer.from_file(start)
    return sum(len(tok.encode(t)["input_ids"]) > length for t in texts) / len(texts)


def test_accuracy(model_dir: Path, test: Path, length: int) -> dict:
    """The fine-tuned classifier on the test sample at its own length and truncation, in
    process (``bertforge evaluate`` reads BERT directories only)."""
    import numpy as np
    import torch

    from bertforge.data.encoding import encode_examples
    from bertforge.evaluation.task_scores import evaluate_sequence_model
    from bertforge.modeling.modernbert import ModernBertForSequenceClassification

    torch.set_num_threads(1)
    model = ModernBertForSequenceClassification.from_pretrained(model_dir)
    tok = Tokenizer.from_file(model_dir)
    with test.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    labels = np.array([model.config.label2id[r["label"]] for r in rows])
    texts = [r["text"] for r in rows]
    encoded = encode_examples(tok, texts, max_length=length, truncation="head_tail")
    started = time.perf_counter()
    metrics, predicted = evaluate_sequence_model(model, encoded, labels, tok.pad_id, batch_size=32)
    correct = (np.asarray(predicted) == labels).astype(int).tolist()
    return {**metrics, "examples": len(rows), "seconds": time.perf_counter() - started,
            "correct": correct}  # fmt: skip


def paired_difference(a: list[int], b: list[int]) -> tuple[float, float]:
    """Accuracy of ``b`` minus that of ``a`` on the same test reviews (1 where right), with its
    paired standard error: the standard deviation of the per-review differences / sqrt(n)."""
    n = len(a)
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, math.sqrt(var / n)


def finetune_at(
    args: argparse.Namespace, start: Path, files: dict[str, Path], L: int, tag: str
) -> dict:
    out = Path(args.output) / f"{tag}finetune-{L}"
    results = out / "eval_results.json"
    if not results.exists():
        bertforge(
            "finetune", "--model", str(start), "--train", str(files["train"]),
            "--validation", str(files["validation"]), "--output", str(out),
            "--max_length", str(L), "--truncation", "head_tail",
            "--batch_size", str(args.batch_size), "--epochs", str(args.epochs),
            "--lr", str(args.lr), "--seed", str(args.seed), "--num_threads", "1",
            "--progress", "false",
        )  # fmt: skip
    finished = json.loads(results.read_text(encoding="utf-8"))
    return {
        "train_seconds": finished["train_seconds"],
        "steps": finished["steps"],
        "tokens": finished["tokens"],
        "validation_accuracy": finished["validation"]["accuracy"],
        "test": test_accuracy(out, files["test"], L),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="runs/imdb-long")
    parser.add_argument("--start", default=None, help="a model directory, or 'random'")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--pretrain_time", default="12m")
    parser.add_argument("--unsup_reviews", type=int, default=20_000)
    parser.add_argument("--lengths", default="128,512,1024")
    parser.add_argument("--train_examples", type=int, default=4000)
    parser.add_argument("--validation_examples", type=int, default=500)
    parser.add_argument("--test_examples", type=int, default=2000)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    files = task_files(args, out)
    if args.start == "random":
        start, what, tag = random_start(args, out), f"random init ({args.preset})", "random-"
    elif args.start:
        start, what, tag = Path(args.start), f"{args.start}", f"{Path(args.start).name}-"
    else:
        start, tag = pretrain_start(args, out), ""
        what = f"{args.preset} ModernBERT pretrained {args.pretrain_time} on IMDB unsup"
    with files["train"].open(encoding="utf-8", newline="") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    rows, record, first = [], {"start": what, "args": vars(args), "lengths": {}}, None
    for L in map(int, args.lengths.split(",")):
        r = finetune_at(args, start, files, L, tag)
        r["cut"] = cut_share(start, texts, L)
        record["lengths"][L] = r
        acc, n = r["test"]["accuracy"], r["test"]["examples"]
        se = math.sqrt(acc * (1 - acc) / n)
        seen = round(args.epochs * args.train_examples)
        first = first or (L, r["test"]["correct"])
        gain, gain_se = paired_difference(first[1], r["test"]["correct"])
        rows.append(
            [
                f"{L:,}",
                f"{r['cut']:.0%}",
                f"{seen:,} ({r['steps']} steps)",
                f"{r['tokens'] / seen:,.0f}",
                f"{r['train_seconds']:,.0f} s",
                f"{r['validation_accuracy']:.2%}",
                f"**{acc:.2%}** ± {se:.2%}",
                "" if first[0] == L else f"{gain:+.2%} ± {gain_se:.2%}",
            ]
        )
    (out / f"{tag}imdb_long_inputs.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    print(machine_markdown())
    print(f"\nstart: {what}; test sample {args.test_examples:,} reviews, seed {args.seed}\n")
    header = ["tokens per review", "reviews cut (head + tail)", "examples seen",
              "real tokens per example", "training time", "validation accuracy",
              "test accuracy ± s.e.", f"against {first[0] if first else ''} tokens, paired"]  # fmt: skip
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
