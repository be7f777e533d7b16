"""XQuAD-en EM/F1 of all-MiniLM-L6-v2 fine-tuned on ``qa/squad_dev_train``: ``bertforge finetune
--task question_answering`` beside the same recipe in transformers' ``Trainer`` with
``run_qa``'s conventions (issue 39).

Not the standard SQuAD split: training is SQuAD v1.1 dev minus XQuAD's 240 paragraphs, testing
XQuAD-en (``../shared/data/qa/README.md``); say so wherever a number is reported.

Both sides start from the same checkpoint and train ``--max_steps`` optimizer steps of
``--batch_size`` windows (384 tokens, stride 128; a subset of an epoch when the CPU is short),
peak ``--lr`` with 10% linear warmup then linear decay to 0 at the last step, AdamW (weight decay
0.01, eps 1e-6), clipping at 1, the model's dropout, ``--precision`` (bf16 = autocast on both:
``Trainer(bf16=True)``), then answer all 1,190 XQuAD-en questions with n-best 20 x 20 and
answers of at most 30 tokens, scored by the official SQuAD v1.1 EM/F1
(``bertforge.evaluation.qa.squad_metrics``, the same function for both sides' answers).

* bertforge: the CLI, ``bertforge finetune --task question_answering --validation XQUAD``
  (evaluated once, at the end).
* transformers: ``run_qa``'s ``prepare_train_features`` / ``prepare_validation_features``
  (``truncation="only_second"``, ``return_overflowing_tokens``, ``stride``, offsets; a window
  without the first answer labelled at [CLS]), ``AutoModelForQuestionAnswering``
  (``transformers.set_seed`` first), ``Trainer`` with ``DataCollatorWithPadding`` (run_qa's
  ``--pad_to_max_length False``; its default pads every window to 384, slower), and
  ``postprocess_qa_predictions`` written out below (transformers 5 ships no QA pipeline).

The two sides run at the same time, one process each with ``--num_threads`` threads (or one after
the other with ``--schedule alternate``). Training seconds are each library's own clock.

    python benchmarks/finetune_qa_reference.py --max_steps 60 --batch_size 32 --lr 1e-4 \\
        --precision bf16

Prints a markdown table; writes ``results.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
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

WEIGHT_DECAY = TRAINER_RECIPE["weight_decay"]  # our side runs the same recipe
MAX_GRAD_NORM = TRAINER_RECIPE["max_grad_norm"]
N_BEST = 20
MAX_ANSWER_LENGTH = 30


def prepare(args: argparse.Namespace, work: Path) -> dict[str, int]:
    """``work/train.json`` and ``work/test.json`` (SQuAD JSON), which both sides read: the
    shared files, or with ``--smoke`` their first paragraphs."""
    import gzip

    work.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, src in (("train", "squad_dev_train.json.gz"), ("test", "xquad_en_test.json.gz")):
        with gzip.open(SHARED_DATA / "qa" / src) as fh:
            doc = json.load(fh)
        if args.smoke:
            doc["data"] = [dict(doc["data"][0], paragraphs=doc["data"][0]["paragraphs"][:6])]
        (work / f"{name}.json").write_text(json.dumps(doc), encoding="utf-8")
        counts[name] = sum(len(p["qas"]) for a in doc["data"] for p in a["paragraphs"])
    return counts


# ---- the two sides, each run in its own process -------------------------------------------------


def run_ours(args: argparse.Namespace, work: Path) -> dict:
    out = work / "bertforge"
    command = [
        sys.executable, "-m", "bertforge", "finetune", "--model", str(minilm_dir()),
        "--task", "question_answering", "--train", str(work / "train.json"),
        "--validation", str(work / "test.json"), "--output", str(out),
        "--max_length", str(args.max_length), "--doc_stride", str(args.doc_stride),
        "--max_answer_length", str(MAX_ANSWER_LENGTH), "--batch_size", str(args.batch_size),
        "--lr", str(args.lr), "--max_steps", str(args.max_steps),
        "--warmup_ratio", str(WARMUP_RATIO), "--weight_decay", str(WEIGHT_DECAY),
        "--max_grad_norm", str(MAX_GRAD_NORM), "--seed", str(args.seed),
        "--precision", args.precision, "--device", "cpu", "--num_threads", str(args.num_threads),
        "--progress", "false",
    ]  # fmt: skip
    log("bertforge: " + " ".join(command))
    subprocess.run(command, check=True)
    result = json.loads((out / "eval_results.json").read_text())
    v = result["validation"]
    return {
        "exact_match": v["exact_match"],
        "f1": v["f1"],
        "windows": v["windows"],
        "train_seconds": result["train_seconds"],
        "steps": result["steps"],
    }


def hf_features(tokenizer, examples, args: argparse.Namespace, train: bool) -> list[dict]:
    """run_qa's ``prepare_train_features`` (``train``) or ``prepare_validation_features``: the
    windows of every question, with start/end labels, or with the example index and offsets
    (None outside the context) that post-processing needs."""
    enc = tokenizer(
        [e.question.lstrip() for e in examples],
        [e.context for e in examples],
        truncation="only_second",
        max_length=args.max_length,
        stride=args.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    rows = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        example = examples[enc["overflow_to_sample_mapping"][i]]
        sequence_ids = enc.sequence_ids(i)
        row = {k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")}
        if train:
            cls = enc["input_ids"][i].index(tokenizer.cls_token_id)
            start_char = example.starts[0]
            end_char = start_char + len(example.answers[0])
            first = sequence_ids.index(1)
            last = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
            if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
                row["start_positions"] = row["end_positions"] = cls
            else:
                while first < len(offsets) and offsets[first][0] <= start_char:
                    first += 1
                while offsets[last][1] >= end_char:
                    last -= 1
                row["start_positions"], row["end_positions"] = first - 1, last + 1
        else:
            row["example"] = enc["overflow_to_sample_mapping"][i]
            row["offsets"] = [
                o if s == 1 else None for o, s in zip(offsets, sequence_ids, strict=True)
            ]
        rows.append(row)
    return rows


def postprocess(examples, features: list[dict], starts, ends) -> dict[str, str]:
    """run_qa's ``postprocess_qa_predictions`` for SQuAD v1.1: per question, the best-scoring
    span (start logit + end logit) among the ``N_BEST`` best starts x ends of each of its
    windows, inside the context, end >= start, at most ``MAX_ANSWER_LENGTH`` tokens."""
    import numpy as np

    best: dict[int, tuple[float, str]] = {}
    for feature, start_logits, end_logits in zip(features, starts, ends, strict=True):
        offsets, context = feature["offsets"], examples[feature["example"]].context
        n = len(offsets)  # logits past it are the batch's padding
        for s in np.argsort(start_logits[:n])[-1 : -N_BEST - 1 : -1]:
            for e in np.argsort(end_logits[:n])[-1 : -N_BEST - 1 : -1]:
                if offsets[s] is None or offsets[e] is None:
                    continue
                if e < s or e - s + 1 > MAX_ANSWER_LENGTH:
                    continue
                score = float(start_logits[s] + end_logits[e])
                if feature["example"] not in best or score > best[feature["example"]][0]:
                    best[feature["example"]] = (score, context[offsets[s][0] : offsets[e][1]])
    return {e.id: best[i][1] if i in best else "" for i, e in enumerate(examples)}


def run_transformers(args: argparse.Namespace, work: Path) -> dict:
    import numpy as np
    import torch
    import transformers

    from bertforge.data.qa import read_qa
    from bertforge.evaluation.qa import squad_metrics

    torch.set_num_threads(args.num_threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    train, _ = read_qa(work / "train.json")
    test, _ = read_qa(work / "test.json")
    model_dir = minilm_dir()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    train_rows = hf_features(tokenizer, train, args, train=True)
    test_features = hf_features(tokenizer, test, args, train=False)
    test_rows = [{k: f[k] for k in ("input_ids", "token_type_ids", "attention_mask")} for f in test_features]  # fmt: skip
    transformers.set_seed(args.seed)  # as run_qa does before loading: the new head's init
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(
        args.score_model or model_dir
    )
    trainer = reference_trainer(
        transformers,
        model,
        train_rows,
        transformers.DataCollatorWithPadding(tokenizer),
        work / "transformers",
        args,
        args.max_steps,
        max_steps=args.max_steps,
    )
    out = None if args.score_model else trainer.train()
    starts, ends = trainer.predict(test_rows).predictions
    answers = postprocess(test, test_features, np.asarray(starts), np.asarray(ends))
    metrics = squad_metrics(answers, {e.id: e.answers for e in test})
    return {
        **metrics,
        "windows": len(test_features),
        "train_windows": len(train_rows),
        "train_seconds": float(out.metrics["train_runtime"]) if out else 0.0,
        "steps": int(out.global_step) if out else 0,
    }


# ---- the driver ---------------------------------------------------------------------------------


SIDE_OPTIONS = (
    "max_steps", "lr", "batch_size", "max_length", "doc_stride", "num_threads", "seed", "precision",
)  # fmt: skip
"""What both sides are given (with --group_by_length)."""


def launch(args: argparse.Namespace, side: str) -> tuple[subprocess.Popen, float]:
    return launch_side(side_command(__file__, args, side, SIDE_OPTIONS), args.num_threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=384)
    parser.add_argument("--doc_stride", type=int, default=128)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    add_side_options(parser)
    parser.add_argument("--smoke", action="store_true", help="6 paragraphs, 2 steps: a quick test")
    parser.add_argument(
        "--score_model", default=None,
        help="with --side transformers: no training, score this fine-tuned model (e.g. "
        "bertforge's OUTPUT/bertforge) through the Trainer side's predict and post-processing",
    )  # fmt: skip
    parser.add_argument("--output", default="runs/qa-reference")
    parser.add_argument("--side", choices=("bertforge", "transformers"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.max_steps, args.batch_size, args.max_length, args.doc_stride = 2, 8, 192, 64
    work = Path(args.output)
    if args.side:  # a worker: train and score one side, write <side>.json
        run = run_ours if args.side == "bertforge" else run_transformers
        result = run(args, work)
        (work / f"{args.side}.json").write_text(json.dumps(result, indent=2) + "\n")
        return

    counts = prepare(args, work)
    log(f"questions: {counts}")
    results = run_sides(
        args.schedule, ("bertforge", "transformers"), lambda side: launch(args, side),
        lambda side: work / f"{side}.json",
    )  # fmt: skip
    ours, theirs = results["bertforge"], results["transformers"]
    rows = [
        [
            name,
            f"{100 * r['exact_match']:.1f}",
            f"{100 * r['f1']:.1f}",
            str(r["steps"]),
            str(r["windows"]),
            f"{r['train_seconds']:.0f}",
            f"{r['wall_seconds']:.0f}",
            f"{r['peak_rss_mb']:.0f}",
        ]
        for name, r in (("bertforge", ours), ("transformers Trainer", theirs))
    ]
    header = ["run", "XQuAD-en EM", "F1", "steps", "test windows", "train s", "process s"]
    table = markdown_table([*header, "peak RSS MB"], rows)
    ratio = theirs["train_seconds"] / ours["train_seconds"]
    print(
        f"\nXQuAD-en ({counts['test']:,} questions) after fine-tuning on squad_dev_train "
        f"({counts['train']:,} questions, {theirs['train_windows']:,} windows; not the standard "
        f"SQuAD split): {args.max_steps} steps of batch {args.batch_size} "
        f"({args.max_steps * args.batch_size / theirs['train_windows']:.2f} epochs), lr "
        f"{args.lr:g}, windows {args.max_length}/{args.doc_stride}, {args.precision}, "
        f"{args.num_threads} thread(s) each, {args.schedule}\n\n{table}\n\n"
        f"F1 difference (bertforge - transformers): {100 * (ours['f1'] - theirs['f1']):+.1f} "
        f"points; training time ratio (transformers / bertforge): {ratio:.2f}x\n\n"
        f"{machine_markdown()}"
    )
    payload = {"args": vars(args), "counts": counts, **results, "ratio": ratio}
    (work / "results.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
