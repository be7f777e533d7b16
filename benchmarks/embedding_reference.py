"""all-MiniLM-L6-v2 trained with in-batch negatives on ``qa/squad_dev_train`` (question, its
paragraph) pairs: ``bertforge finetune --task embedding`` beside sentence-transformers' own
``SentenceTransformerTrainer`` with the same loss, data, batch, epochs and learning rate
(issue 52). Prints XQuAD-en retrieval and STS-B dev before and after, training time and peak
memory side by side, as ratios.

Both sides start from the same checkpoint and train ``--epochs`` over the same pairs (all 9,380
of squad_dev_train, or a fixed random ``--max_train_examples`` of them when the CPU is short) in
batches of ``--batch_size`` in which no text occurs twice (ours: ``unique_batches``; theirs:
``BatchSamplers.NO_DUPLICATES``), MultipleNegativesRankingLoss at scale 20, texts truncated to
``--max_length`` tokens, peak ``--lr`` with 10% linear warm-up then linear decay, AdamW (weight
decay 0.01, eps 1e-6), clipping at 1, the model's dropout, fp32. ``--mini_batch_size`` runs
GradCache on both sides (ours: ``--micro_batch_size``; theirs:
``CachedMultipleNegativesRankingLoss``).

Every model (the start, ours, theirs) is scored by the same code,
``bertforge.evaluation.embedding_suite`` over ``bertforge embed`` vectors at ``--score_length``
tokens: XQuAD-en (each of 1,190 questions retrieves its paragraph among 240; MRR@10, recall@1)
and STS-B dev (cosine Spearman). XQuAD-en is SQuAD v1.1 dev's other 240 paragraphs: disjoint
from the training pairs (``../shared/data/qa/README.md``).

The two sides run at the same time, one process each with ``--num_threads`` threads (or one after
the other with ``--schedule alternate``). Training seconds are each library's own clock.

    python benchmarks/embedding_reference.py --max_train_examples 2048 --batch_size 32

Prints a markdown table; writes ``results.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import json
import random
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
    run_sides,
    side_command,
    squad_question_paragraphs,
)

SCALE = 20.0


def prepare(args: argparse.Namespace, work: Path) -> int:
    """``work/train.jsonl``: one ``{"question", "context"}`` per question of squad_dev_train (a
    fixed sample of ``--max_train_examples`` of them when given); its row count."""
    work.mkdir(parents=True, exist_ok=True)
    rows = squad_question_paragraphs()
    if args.max_train_examples:
        rows = random.Random(args.seed).sample(rows, args.max_train_examples)
    with open(work / "train.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


# ---- the two sides, each run in its own process -------------------------------------------------


def run_ours(args: argparse.Namespace, work: Path) -> dict:
    out = work / "bertforge"
    command = [
        sys.executable, "-m", "bertforge", "finetune", "--task", "embedding",
        "--model", str(minilm_dir()), "--train", str(work / "train.jsonl"),
        "--text_column", "question", "--text_pair_column", "context",
        "--validation_fraction", "0.01", "--output", str(out),
        "--max_length", str(args.max_length), "--batch_size", str(args.batch_size),
        "--micro_batch_size", str(args.mini_batch_size or args.batch_size),
        "--lr", str(args.lr), "--epochs", str(args.epochs), "--scale", str(SCALE),
        "--warmup_ratio", str(WARMUP_RATIO), "--weight_decay", str(TRAINER_RECIPE["weight_decay"]),
        "--max_grad_norm", str(TRAINER_RECIPE["max_grad_norm"]), "--seed", str(args.seed),
        "--precision", "fp32", "--device", "cpu", "--num_threads", str(args.num_threads),
        "--progress", "false", "--keep_final_checkpoint", "false",
    ]  # fmt: skip
    log("bertforge: " + " ".join(command))
    subprocess.run(command, check=True)
    result = json.loads((out / "eval_results.json").read_text())
    return {"train_seconds": result["train_seconds"], "steps": result["steps"], "model": str(out)}


def run_sentence_transformers(args: argparse.Namespace, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.training_args import BatchSamplers

    torch.set_num_threads(args.num_threads)
    from bertforge.data.pairs import load_pairs

    pairs = load_pairs(work / "train.jsonl", text_column="question", text_pair_column="context")
    keep = _our_training_rows(args, len(pairs))  # ours holds out 1% for validation: the same 99%
    data = Dataset.from_dict(
        {"anchor": [pairs.anchors[i] for i in keep],
         "positive": [pairs.positives[i] for i in keep]}  # type: ignore[index]
    )  # fmt: skip
    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    model.max_seq_length = args.max_length
    if args.mini_batch_size:
        loss = losses.CachedMultipleNegativesRankingLoss(
            model, scale=SCALE, mini_batch_size=args.mini_batch_size
        )
    else:
        loss = losses.MultipleNegativesRankingLoss(model, scale=SCALE)
    out = work / "sentence_transformers"
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_ratio=WARMUP_RATIO,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        use_cpu=True,
        seed=args.seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        weight_decay=TRAINER_RECIPE["weight_decay"],
        adam_epsilon=TRAINER_RECIPE["adam_epsilon"],
        max_grad_norm=TRAINER_RECIPE["max_grad_norm"],
    )
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=data, loss=loss)
    result = trainer.train()
    model.save(str(out / "model"))
    return {
        "train_seconds": float(result.metrics["train_runtime"]),
        "steps": int(result.global_step),
        "model": str(out / "model"),
    }


def _our_training_rows(args: argparse.Namespace, n: int) -> list[int]:
    """The rows bertforge trains on after holding out ``--validation_fraction 0.01`` (the
    same pure function of the seed as ``training.embedding.load_embedding_data``)."""
    import numpy as np

    order = np.random.default_rng(args.seed).permutation(n)
    cut = int(round(0.01 * n))
    return sorted(int(i) for i in order[cut:])


# ---- scoring: the same code for every model ------------------------------------------------------


def score(model_dir: str, args: argparse.Namespace) -> dict[str, float]:
    """XQuAD-en retrieval and STS-B dev of ``model_dir`` through ``bertforge embed``."""
    import torch

    from bertforge.evaluation.embedding import model_vectors
    from bertforge.evaluation.embedding_suite import EMBEDDING_TASKS, load_task, score_task
    from bertforge.modeling.model import BertModel
    from bertforge.tokenizer.wordpiece import Tokenizer

    torch.set_num_threads(args.num_threads * 2 if args.schedule == "parallel" else args.num_threads)
    model, tokenizer = BertModel.from_pretrained(model_dir), Tokenizer.from_file(model_dir)
    vectors = model_vectors(model, tokenizer, max_length=args.score_length, precision="fp32")
    scores = {}
    for task in EMBEDDING_TASKS:
        data = load_task(SHARED_DATA, task)
        model_scores = score_task(data, task, vectors, model.config.hidden_size)["model"]
        scores |= {f"{task.name} {k}": v for k, v in model_scores.items()}
    return scores


# ---- the driver ---------------------------------------------------------------------------------

SIDE_OPTIONS = (
    "epochs", "lr", "batch_size", "mini_batch_size", "max_length", "max_train_examples",
    "num_threads", "seed",
)  # fmt: skip
SHOWN = ("XQuAD-en mrr@10", "XQuAD-en recall@1", "STS-B spearman")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--mini_batch_size", type=int, default=0, help="GradCache (0: off)")
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--max_train_examples", type=int, default=0, help="0: all 9,380")
    parser.add_argument("--score_length", type=int, default=256)
    add_side_options(parser)
    parser.add_argument("--output", default="runs/embedding-reference")
    parser.add_argument(
        "--side", choices=("bertforge", "sentence_transformers"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    work = Path(args.output)
    if args.side:  # a worker: train one side, write <side>.json
        run = run_ours if args.side == "bertforge" else run_sentence_transformers
        result = run(args, work)
        (work / f"{args.side}.json").write_text(json.dumps(result, indent=2) + "\n")
        return

    pairs = prepare(args, work)
    log(f"training pairs: {pairs:,}")
    sides = ("bertforge", "sentence_transformers")
    results = run_sides(
        args.schedule, sides,
        lambda side: launch_side(side_command(__file__, args, side, SIDE_OPTIONS), args.num_threads),
        lambda side: work / f"{side}.json",
    )  # fmt: skip
    log("scoring the start model and both trained models")
    scored = {"before (all-MiniLM-L6-v2)": score(str(minilm_dir()), args)}
    scored |= {side: score(results[side]["model"], args) for side in sides}
    rows = []
    for name, scores in scored.items():
        run = results.get(name, {})
        rows.append(
            [name, *(f"{100 * scores[k]:.1f}" for k in SHOWN)]
            + [str(run.get("steps", "")), f"{run['train_seconds']:.0f}" if run else "",
               f"{run['wall_seconds']:.0f}" if run else "", f"{run['peak_rss_mb']:.0f}" if run else ""]
        )  # fmt: skip
    header = ["model", *SHOWN, "steps", "train s", "process s", "peak RSS MB"]
    ours, theirs = results["bertforge"], results["sentence_transformers"]
    time_ratio = theirs["train_seconds"] / ours["train_seconds"]
    memory_ratio = theirs["peak_rss_mb"] / ours["peak_rss_mb"]
    diff = {k: 100 * (scored["bertforge"][k] - scored["sentence_transformers"][k]) for k in SHOWN}
    print(
        f"\nall-MiniLM-L6-v2, in-batch negatives (scale {SCALE:g}) on {pairs:,} squad_dev_train "
        f"(question, paragraph) pairs (1% held out by both): {args.epochs:g} epoch(s) of batch "
        f"{args.batch_size}" + (f" (GradCache mini-batch {args.mini_batch_size})" if args.mini_batch_size else "")
        + f", max_length {args.max_length}, lr {args.lr:g}, fp32, {args.num_threads} thread(s) "
        f"each, {args.schedule}; scored at {args.score_length} tokens\n\n"
        f"{markdown_table(header, rows)}\n\n"
        + "difference (bertforge - sentence-transformers), points: "
        + ", ".join(f"{k} {v:+.1f}" for k, v in diff.items())
        + f"\ntraining time ratio (sentence-transformers / bertforge): {time_ratio:.2f}x; "
        f"peak RSS ratio: {memory_ratio:.2f}x\n\n{machine_markdown()}"
    )  # fmt: skip
    payload = {"args": vars(args), "pairs": pairs, "sides": results, "scores": scored,
               "time_ratio": time_ratio, "memory_ratio": memory_ratio}  # fmt: skip
    (work / "results.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
