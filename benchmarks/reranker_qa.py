"""A cross-encoder reranker trained on ``qa/squad_dev_train`` (question, paragraph) pairs with
hard negatives mined by all-MiniLM-L6-v2's retrieval, scored on XQuAD-en as the second stage
behind all-MiniLM-L6-v2 (issue 67): nDCG@10 / MRR@10 of the retriever alone and reranked, and
sentence-transformers' ``CrossEncoder(dir)`` scoring the same pairs as ``bertforge rerank``.

Steps, each a ``bertforge`` command or library call:

1. mine: all-MiniLM-L6-v2 embeds squad_dev_train's 1,827 paragraphs and a fixed sample of
   ``--questions`` questions; each question's ``--negatives`` best-ranked paragraphs that are
   not its own are its hard negatives, and ``--random_negatives`` paragraphs drawn at random
   from the rest its easy ones. ``train.jsonl``: one ``{"query", "passage", "label"}``
   per pair, 1 for the question's paragraph, 0 for a negative.
2. ``bertforge finetune --task classification`` (``--task``; the default) from ``--start``
   (default all-MiniLM-L6-v2 with a fresh head) on those pairs: a pointwise reranker, two
   classes 0/1 trained with cross-entropy and scored ``logit[1] - logit[0]``, or with
   ``--task regression`` one output trained with squared error on the 0/1 labels; saved as a
   cross-encoder.
3. XQuAD-en as BEIR files (1,190 questions, or a fixed sample of ``--queries`` of them when
   the CPU is short; the 240 paragraphs; each question's own paragraph relevant) and ``bertforge evaluate --model RERANKER --retriever all-MiniLM-L6-v2 --top_k K``.
4. ``CrossEncoder(RERANKER).predict`` on ``--check_pairs`` XQuAD (question, paragraph) pairs
   against ``bertforge.inference.rerank.score``: the largest difference.

XQuAD-en is SQuAD v1.1 dev's other 240 paragraphs, none in squad_dev_train (but from the same
48 articles: ``../shared/data/qa/README.md``).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/reranker_qa.py --output /tmp/reranker

Prints a markdown table; writes ``results.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import SHARED_DATA, log, machine_markdown, markdown_table, minilm_dir

from bertforge.inference.loading import LoadOptions, load_model
from bertforge.inference.predict import embed
from bertforge.inference.rerank import load_reranker, score
from bertforge.modeling.model import BertModel


def squad_rows(name: str) -> list[dict[str, str]]:
    """``{"id", "question", "context"}`` of every question of a qa/ file."""
    with gzip.open(SHARED_DATA / "qa" / name) as fh:
        doc = json.load(fh)
    return [
        {"id": qa["id"], "question": qa["question"].strip(), "context": p["context"]}
        for article in doc["data"]
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def mine(args: argparse.Namespace, work: Path) -> dict[str, int]:
    """``work/train.jsonl`` of positives and all-MiniLM-L6-v2's hard negatives (step 1)."""
    rows = squad_rows("squad_dev_train.json.gz")
    rng = random.Random(args.seed)
    sample = rng.sample(rows, min(args.questions, len(rows)))
    paragraphs = list(dict.fromkeys(r["context"] for r in rows))
    index = {p: i for i, p in enumerate(paragraphs)}
    options = LoadOptions(model=str(minilm_dir()), precision="fp32", batch_size=32)
    model, tokenizer, kw = load_model(BertModel, options)
    p_vectors = embed(model, tokenizer, paragraphs, max_length=args.max_length, **kw)
    q_vectors = embed(
        model, tokenizer, [r["question"] for r in sample], max_length=args.max_length, **kw
    )
    similarity = q_vectors @ p_vectors.T  # (Q, P) cosines: MiniLM's vectors are unit length
    pairs, own_first = [], 0
    for row, sims in zip(sample, similarity, strict=True):
        own = index[row["context"]]
        ranked = [int(i) for i in np.argsort(-sims, kind="stable")[: args.negatives + 1]]
        own_first += ranked[0] == own
        negatives = [i for i in ranked if i != own][: args.negatives]
        others = [i for i in range(len(paragraphs)) if i != own and i not in negatives]
        negatives += rng.sample(others, args.random_negatives)  # easy ones: another topic
        pairs.append({"query": row["question"], "passage": row["context"], "label": 1})
        pairs += [
            {"query": row["question"], "passage": paragraphs[i], "label": 0} for i in negatives
        ]
    rng.shuffle(pairs)
    (work / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return {"questions": len(sample), "pairs": len(pairs), "retriever_top1": own_first}


def xquad_beir(work: Path, queries: int | None, seed: int) -> dict[str, str]:
    """XQuAD-en as BEIR files: queries.jsonl (all 1,190 questions, or a fixed random sample of
    ``queries``), corpus.jsonl (all 240 paragraphs), qrels.tsv (step 3)."""
    rows = squad_rows("xquad_en_test.json.gz")
    paragraphs = list(dict.fromkeys(r["context"] for r in rows))
    if queries is not None and queries < len(rows):
        rows = random.Random(seed).sample(rows, queries)
    index = {p: f"p{i}" for i, p in enumerate(paragraphs)}
    files = {name: str(work / name) for name in ("queries.jsonl", "corpus.jsonl", "qrels.tsv")}
    Path(files["queries.jsonl"]).write_text(
        "".join(json.dumps({"_id": r["id"], "text": r["question"]}) + "\n" for r in rows)
    )
    Path(files["corpus.jsonl"]).write_text(
        "".join(json.dumps({"_id": index[p], "text": p}) + "\n" for p in paragraphs)
    )
    qrels = "".join(f"{r['id']}\t{index[r['context']]}\t1\n" for r in rows)
    Path(files["qrels.tsv"]).write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return files


def bertforge(*argv: str) -> float:
    """Run ``bertforge ARGV`` (stderr passed through); its wall seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bertforge", *argv], check=True)
    return time.perf_counter() - start


def cross_encoder_check(model: Path, files: dict[str, str], count: int) -> dict[str, float]:
    """The largest |CrossEncoder(model).predict - bertforge's score| over ``count`` XQuAD
    (question, paragraph) pairs drawn at random (step 4); for a two-class model ``predict``'s
    ``logit[1] - logit[0]``."""
    from sentence_transformers import CrossEncoder

    queries = [
        json.loads(line)["text"] for line in Path(files["queries.jsonl"]).read_text().splitlines()
    ]
    corpus = [
        json.loads(line)["text"] for line in Path(files["corpus.jsonl"]).read_text().splitlines()
    ]
    rng = random.Random(1)
    pairs = [(rng.choice(queries), rng.choice(corpus)) for _ in range(count)]
    theirs = np.asarray(CrossEncoder(str(model), device="cpu").predict(pairs, batch_size=16))
    if (
        theirs.ndim == 2
    ):  # a two-class model: predict returns both logits; the score is their log-odds
        theirs = theirs[:, 1] - theirs[:, 0]
    reranker = load_reranker(LoadOptions(model=str(model), precision="fp32", batch_size=16))
    ours = np.array([score(reranker, q, [p])[0] for q, p in pairs])
    return {"pairs": count, "max_abs_difference": float(np.abs(ours - theirs).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("/tmp/reranker_qa"))
    parser.add_argument("--start", default=None, help="start model (default all-MiniLM-L6-v2)")
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--negatives", type=int, default=3, help="hard negatives per question")
    parser.add_argument(
        "--random_negatives", type=int, default=0, help="random paragraphs per question"
    )
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max_steps", type=int, default=None, help="overrides --epochs")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument(
        "--task", choices=("classification", "regression"), default="classification"
    )
    parser.add_argument("--dropout", type=float, default=None, help="default: the model's")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--top_k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=None, help="XQuAD questions (all 1,190)")
    parser.add_argument("--check_pairs", type=int, default=64)
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = args.output
    work.mkdir(parents=True, exist_ok=True)
    start = args.start or str(minilm_dir())
    t0 = time.perf_counter()
    mined = mine(args, work)
    mine_s = time.perf_counter() - t0
    log(f"mined {mined['pairs']:,} pairs for {mined['questions']:,} questions ({mine_s:.0f} s)")
    model = work / "reranker"
    threads = ["--num_threads", str(args.num_threads), "--precision", "fp32", "--progress", "false"]
    train_s = bertforge(
        *("finetune", "--model", start, "--train", str(work / "train.jsonl")),
        *("--output", str(model), "--task", args.task, "--text_column", "query"),
        *("--text_pair_column", "passage", "--label_column", "label"),
        *("--max_length", str(args.max_length), "--epochs", str(args.epochs)),
        *("--batch_size", str(args.batch_size), "--lr", str(args.lr)),
        *("--validation_fraction", "0.05", "--seed", str(args.seed), *threads),
        *(("--max_steps", str(args.max_steps)) if args.max_steps else ()),
        *(("--dropout", str(args.dropout)) if args.dropout is not None else ()),
    )
    files = xquad_beir(work, args.queries, args.seed)
    beir = ["--queries", files["queries.jsonl"], "--corpus", files["corpus.jsonl"]]
    beir += ["--qrels", files["qrels.tsv"]]
    eval_s = bertforge(
        *("evaluate", "--model", str(model), "--retriever", str(minilm_dir()), *beir),
        *("--top_k", str(args.top_k), "--output", str(work / "rerank.json"), *threads),
    )
    result = json.loads((work / "rerank.json").read_text())
    check = cross_encoder_check(model, files, args.check_pairs)
    training = json.loads((model / "eval_results.json").read_text())
    rows = [
        [
            name,
            f"{100 * s['ndcg@10']:.1f}",
            f"{100 * s['mrr@10']:.1f}",
            f"{100 * s['recall@1']:.1f}",
        ]
        for name, s in (
            ("all-MiniLM-L6-v2 alone", result["retriever"]),
            (f"+ reranker (top {args.top_k})", result["reranked"]),
        )  # fmt: skip
    ]
    table = markdown_table(["XQuAD-en", "nDCG@10", "MRR@10", "recall@1"], rows)
    summary = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "mined": mined,
        "seconds": {
            "mine": round(mine_s, 1),
            "finetune": round(train_s, 1),
            "evaluate": round(eval_s, 1),
        },
        "training": {k: training.get(k) for k in ("steps", "train_seconds", "validation")},
        "xquad": {"retriever": result["retriever"], "reranked": result["reranked"]},
        "cross_encoder": check,
        "machine": machine_markdown(),
    }
    (work / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table)
    print(
        f"\nCrossEncoder(dir) vs bertforge on {check['pairs']} pairs: max |difference| "
        f"{check['max_abs_difference']:.2e}\nseconds: {summary['seconds']}\n{machine_markdown()}"
    )


if __name__ == "__main__":
    main()
