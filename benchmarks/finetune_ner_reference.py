"""Named entities from all-MiniLM-L6-v2: ``bertforge finetune --task token_classification``
beside the same recipe in transformers' ``Trainer`` (issue 39).

Both sides read the same subset of ``shared/data/ner/<set>/`` (the first ``--train_examples``
training sentences, the first ``--test_examples`` test sentences, written to CoNLL files in
``--output``), start from the same checkpoint with the same tag set, and train with the same
hyper-parameters: epochs, peak lr with 10% linear warmup then linear decay, batch, max length,
AdamW (weight decay 0.01 off biases/LayerNorm, eps 1e-6), gradient clipping at 1, ``--precision``
(fp32 by default; bf16 = autocast on both, ``Trainer(bf16=True)``, in training and the test pass), the
model's own dropout (or ``--dropout`` on both), ``--num_threads`` threads each.

* bertforge: the library's ``finetune`` as ``bertforge finetune`` runs it (its defaults: batches
  in random order, as Trainer's, unless ``--bucket true`` groups them by length; a validation pass
  at the end on the first ``--val_examples`` dev sentences), then scored on the test subset by
  ``bertforge.evaluation`` (entity F1 as seqeval's default mode).
* transformers: ``run_ner``'s conventions: ``tokenizer(words, is_split_into_words=True,
  truncation=True, max_length=...)``, the word's tag on its first piece and -100 elsewhere,
  ``DataCollatorForTokenClassification``, ``AutoModelForTokenClassification``, ``Trainer``;
  ``trainer.predict`` on the test subset, scored by ``seqeval``. A test word cut off by
  truncation is counted as predicted ``O`` (bertforge splits long sentences into windows instead;
  the table says how many test sentences were cut).

Each side runs in its own process (peak RSS is that process's); by default the two run at the
same time, so they share whatever else loads the machine. Training seconds are each library's
own clock (``train_seconds`` of ``finetune``, ``train_runtime`` of ``Trainer.train``); the process
wall time includes loading, tokenizing, validation and the test pass.

    python benchmarks/finetune_ner_reference.py --dataset wikiann --train_examples 2000 \\
        --test_examples 1000 --epochs 1 --lr 1e-4 --batch_size 32 --max_length 64 --num_threads 1

Prints a markdown table; writes ``results.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from _common import (
    SHARED_DATA,
    TRAINER_RECIPE,
    WARMUP_RATIO,
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

DATASETS = {"wikiann": "wikiann_en", "wnut17": "wnut17"}
TRAIN_FILE = {"wikiann": "train.conll.gz", "wnut17": "train.conll"}
WEIGHT_DECAY = TRAINER_RECIPE["weight_decay"]  # our side runs the same recipe
MAX_GRAD_NORM = TRAINER_RECIPE["max_grad_norm"]


def read_conll(path: Path) -> list[tuple[list[str], list[str]]]:
    """Sentences of ``token<TAB>tag`` lines (the data README's reader)."""
    import gzip

    with gzip.open(path) if path.name.endswith(".gz") else open(path, "rb") as f:
        raw = f.read()
    sents = []
    for block in raw.decode("utf-8").split("\n\n"):
        rows = [line.split("\t") for line in block.split("\n") if line]
        if rows:
            sents.append(([r[0] for r in rows], [r[-1] for r in rows]))
    return sents


def write_conll(path: Path, sents: list[tuple[list[str], list[str]]]) -> None:
    lines = []
    for words, tags in sents:
        lines += [f"{w}\t{t}" for w, t in zip(words, tags, strict=True)] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def prepare(args: argparse.Namespace, work: Path) -> dict[str, int]:
    """The subsets both sides read: train, validation (ours) and test CoNLL files in ``work``."""
    src = SHARED_DATA / "ner" / DATASETS[args.dataset]
    train = read_conll(src / TRAIN_FILE[args.dataset])[: args.train_examples]
    dev = read_conll(src / "dev.conll")[: args.val_examples]
    test = read_conll(src / "test.conll")[: args.test_examples]
    known = {t for _, tags in train for t in tags}
    # a dev/test tag the training subset lacks is an error for bertforge (as it should be): keep
    # the sentences whose tags training has, and say how many were dropped
    dev2 = [s for s in dev if set(s[1]) <= known]
    test2 = [s for s in test if set(s[1]) <= known]
    if len(test2) < len(test):
        log(f"dropped {len(test) - len(test2)} test sentences with a tag the train subset lacks")
    work.mkdir(parents=True, exist_ok=True)
    for name, sents in (("train", train), ("dev", dev2), ("test", test2)):
        write_conll(work / f"{name}.conll", sents)
    return {"train": len(train), "validation": len(dev2), "test": len(test2)}


def whole(words: list[list[str]], max_length: int) -> list[int]:
    """The sentences whose WordPieces fit in ``max_length`` with [CLS] and [SEP]: neither side
    cuts or splits them (both tokenizers give the same pieces; the test checks it)."""
    from bertforge.data.tagging import word_pieces
    from bertforge.tokenizer.wordpiece import Tokenizer

    pieces = word_pieces(Tokenizer.from_file(minilm_dir()), words)
    return [i for i, p in enumerate(pieces) if sum(len(w) for w in p) <= max_length - 2]


# ---- the two sides, each run in its own process -------------------------------------------------


def run_ours(args: argparse.Namespace, work: Path) -> dict:
    import torch

    from bertforge.cli import configure_process
    from bertforge.data.tagging import encode_tagged, read_tagged, tag_ids
    from bertforge.evaluation.tagging import evaluate_tagging_model, tag_metrics
    from bertforge.modeling.model import BertForTokenClassification
    from bertforge.tokenizer.wordpiece import Tokenizer
    from bertforge.training.benchmark import EVALUATE_ONCE
    from bertforge.training.finetune import FinetuneConfig, finetune

    configure_process("finetune")  # malloc and oneDNN's kernel caches as `bertforge finetune`
    cfg = FinetuneConfig(
        model=str(minilm_dir()),
        task="token_classification",
        train=[str(work / "train.conll")],
        validation=[str(work / "dev.conll")],
        output=str(work / "bertforge"),
        max_length=args.max_length,
        batch_size=args.batch_size,
        lr=args.lr,
        epochs=args.epochs,
        warmup_ratio=WARMUP_RATIO,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=MAX_GRAD_NORM,
        dropout=args.dropout,
        seed=args.seed,
        bucket=None if args.bucket == "default" else args.bucket == "true",
        eval_every=EVALUATE_ONCE,  # validation at the end only: the final model is scored, as Trainer's
        precision=args.precision,
        device="cpu",
        num_threads=args.num_threads,
        progress=False,
    )
    result = finetune(cfg)
    model = BertForTokenClassification.from_pretrained(cfg.output)
    tok = Tokenizer.from_file(cfg.output)
    test = read_tagged([work / "test.conll"])
    label2id = {v: k for k, v in model.config.id2label.items()}
    windows = encode_tagged(tok, test.words, None, max_length=args.max_length)
    true = tag_ids(test, label2id)
    with torch.inference_mode():
        metrics, predicted = evaluate_tagging_model(
            model, windows, true, tok.pad_id, precision=args.precision
        )
    fit = whole(test.words, args.max_length)
    uncut = tag_metrics(model.config, [true[i] for i in fit], [predicted[i] for i in fit])
    return {
        "entity_f1": metrics["entity_f1"],
        "precision": metrics["precision"],
        "recall": metrics["recall"],
        "train_seconds": result["train_seconds"],
        "steps": result["steps"],
        "cut_test_sentences": 0,
        "entity_f1_whole": uncut["entity_f1"],
        "whole_sentences": len(fit),
    }


def hf_encode(
    tokenizer, sents: list[tuple[list[str], list[str]]], label2id: dict[str, int], max_length: int
) -> tuple[list[dict], list[list[int]]]:
    """run_ner's ``tokenize_and_align_labels`` (``label_all_tokens=False``): the rows ``Trainer``
    takes, and per sentence the positions of its words' first pieces (the words truncation kept)."""
    enc = tokenizer(
        [w for w, _ in sents], is_split_into_words=True, truncation=True, max_length=max_length
    )
    rows, firsts = [], []
    for i, (_, tags) in enumerate(sents):
        labels, first, previous = [], [], None
        for position, word in enumerate(enc.word_ids(i)):
            if word is None or word == previous:
                labels.append(-100)
            else:
                labels.append(label2id[tags[word]])
                first.append(position)
            previous = word
        rows.append(
            {
                "input_ids": enc["input_ids"][i],
                "token_type_ids": enc["token_type_ids"][i],
                "attention_mask": enc["attention_mask"][i],
                "labels": labels,
            }
        )
        firsts.append(first)
    return rows, firsts


def run_transformers(args: argparse.Namespace, work: Path) -> dict:
    import numpy as np
    import torch
    import transformers
    from seqeval.metrics import f1_score, precision_score, recall_score

    from bertforge.data.tagging import build_tag_map

    torch.set_num_threads(args.num_threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    train = read_conll(work / "train.conll")
    test = read_conll(work / "test.conll")
    id2label = build_tag_map([tags for _, tags in train])  # the same tag ids as ours
    label2id = {v: k for k, v in id2label.items()}
    model_dir = minilm_dir()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)

    train_rows, _ = hf_encode(tokenizer, train, label2id, args.max_length)
    test_rows, test_firsts = hf_encode(tokenizer, test, label2id, args.max_length)
    extra = {}
    if args.dropout is not None:
        extra = {
            "hidden_dropout_prob": args.dropout,
            "attention_probs_dropout_prob": args.dropout,
            "classifier_dropout": args.dropout,
        }
    transformers.set_seed(args.seed)  # as run_ner does before loading: the new head's init
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(id2label), id2label=id2label, label2id=label2id, **extra
    )
    steps = -(-len(train_rows) // args.batch_size) * args.epochs
    trainer = reference_trainer(
        transformers,
        model,
        train_rows,
        transformers.DataCollatorForTokenClassification(tokenizer),
        work / "transformers",
        args,
        steps,
        num_train_epochs=args.epochs,
    )
    out = trainer.train()
    logits = trainer.predict(test_rows).predictions
    true, pred, cut = [], [], 0
    for i, (words, tags) in enumerate(test):
        ids = np.asarray(logits[i]).argmax(-1)
        tagged = [id2label[int(ids[p])] for p in test_firsts[i]]
        if len(tagged) < len(words):  # words truncation cut off: predicted O
            cut += 1
            tagged += ["O"] * (len(words) - len(tagged))
        true.append(tags)
        pred.append(tagged)
    fit = whole([w for w, _ in test], args.max_length)
    return {
        "entity_f1": float(f1_score(true, pred)),
        "precision": float(precision_score(true, pred)),
        "recall": float(recall_score(true, pred)),
        "train_seconds": float(out.metrics["train_runtime"]),
        "steps": int(out.global_step),
        "cut_test_sentences": cut,
        "entity_f1_whole": float(
            f1_score([true[i] for i in fit], [pred[i] for i in fit]) if fit else 0.0
        ),
    }


# ---- the driver ---------------------------------------------------------------------------------


SIDE_OPTIONS = (
    "dataset", "epochs", "lr", "batch_size", "max_length", "num_threads", "seed", "precision",
    "bucket",
)  # fmt: skip
"""What both sides are given (with --dropout and --group_by_length)."""


def launch(args: argparse.Namespace, side: str) -> tuple[subprocess.Popen, float]:
    command = side_command(__file__, args, side, SIDE_OPTIONS)
    log(f"{side}: {' '.join(command)}")
    return launch_side(command, args.num_threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="wikiann")
    parser.add_argument("--train_examples", type=int, default=2000)
    parser.add_argument("--val_examples", type=int, default=200)
    parser.add_argument("--test_examples", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument(
        "--dropout", type=float, default=None, help="both sides; default: each model's own"
    )
    parser.add_argument(
        "--bucket", choices=("default", "true", "false"), default="default",
        help="bertforge's length bucketing (the library's default for taggers: off)",
    )  # fmt: skip
    add_side_options(parser)
    parser.add_argument("--smoke", action="store_true", help="32 sentences, 2 steps: a quick test")
    parser.add_argument("--output", default=None)
    parser.add_argument("--side", choices=("bertforge", "transformers"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.train_examples, args.val_examples, args.test_examples = 32, 16, 32
        args.batch_size, args.max_length, args.epochs = 16, 32, 1
    args.output = args.output or f"runs/ner-reference-{args.dataset}"
    work = Path(args.output)
    if args.side:  # a worker: train and score one side, write <side>.json
        run = run_ours if args.side == "bertforge" else run_transformers
        result = run(args, work)
        (work / f"{args.side}.json").write_text(json.dumps(result, indent=2) + "\n")
        return

    counts = prepare(args, work)
    log(f"{args.dataset}: {counts}")
    results = run_sides(
        args.schedule, ("bertforge", "transformers"), lambda side: launch(args, side),
        lambda side: work / f"{side}.json",
    )  # fmt: skip

    ours, theirs = results["bertforge"], results["transformers"]
    n_whole = ours["whole_sentences"]
    rows = []
    for name, r in (("bertforge", ours), ("transformers Trainer", theirs)):
        rows.append(
            [
                name,
                f"{r['entity_f1']:.4f}",
                f"{r['entity_f1_whole']:.4f}",
                f"{r['precision']:.4f} / {r['recall']:.4f}",
                str(r["steps"]),
                f"{r['train_seconds']:.0f}",
                f"{r['wall_seconds']:.0f}",
                f"{r['peak_rss_mb']:.0f}",
            ]
        )
    table = markdown_table(
        [
            "run",
            "test entity F1",
            f"F1, {n_whole} uncut",
            "P / R",
            "steps",
            "train s",
            "process s",
            "peak RSS MB",
        ],
        rows,
    )
    diff = ours["entity_f1"] - theirs["entity_f1"]
    ratio = theirs["train_seconds"] / ours["train_seconds"]
    print(
        f"\n{args.dataset}: {counts['train']:,} train sentences, {counts['test']:,} test "
        f"({theirs['cut_test_sentences']} cut by transformers' truncation), validation (ours) "
        f"{counts['validation']}; {args.epochs} epoch(s), batch {args.batch_size}, lr {args.lr:g}, "
        f"max_length {args.max_length}, dropout "
        f"{'model default' if args.dropout is None else args.dropout}, {args.precision}, "
        f"{args.num_threads} thread(s) each, bertforge's length bucketing {args.bucket}, "
        f"{'one after the other' if args.schedule == 'alternate' else 'both sides at once'}\n\n{table}\n\n"
        f"entity F1 difference (bertforge - transformers): {diff:+.4f}; "
        f"training time ratio (transformers / bertforge): {ratio:.2f}x\n\n{machine_markdown()}"
    )
    payload = {"args": vars(args), "counts": counts, **results, "f1_diff": diff, "ratio": ratio}
    (work / "results.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
