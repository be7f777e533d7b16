"""What ``bertforge finetune --task embedding`` makes of a model, beyond the sentence-transformers
comparison of ``embedding_reference.py`` (issue 52). Four parts, each a few ``bertforge``
commands, every model scored by the same command, ``bertforge benchmark --suite embedding``
(STS-B dev cosine Spearman, zero-shot; XQuAD-en retrieval of each question's paragraph among 240):

``scratch``
    Our own general-English BERT (``--general_model``, e.g. ``bertforge recipe general``'s
    ``OUT/run/model``) and its random twin (same config, fresh weights; ``--twin`` or made here)
    trained alike, in three stages, each from the previous one: SimCSE on general-corpus sentences
    (no labels), in-batch negatives on squad_dev_train (question, paragraph) pairs, CoSENT on STS-B
    train. Scored after every stage, with average GloVe and all-MiniLM-L6-v2 as reference lines.
``simcse``
    SimCSE on plain text alone: all-MiniLM-L6-v2 (the MiniLM-sized model at hand) and the general
    BERT-Tiny, before and after.
``adapt``
    Domain adaptation as a user does it: all-MiniLM-L6-v2 trained for ``--adapt_time`` on the
    Wikipedia-QA domain's (question, paragraph) pairs (squad_dev_train), scored on that domain's
    unseen questions (XQuAD-en: SQuAD dev's other 240 paragraphs) and on STS-B (general
    similarity), before and after.
``adapt_ours``
    The same for our general BERT-Tiny (``--general_model``), straight from its pretraining.
``gradcache``
    Peak resident memory of one optimiser step of all-MiniLM-L6-v2 with in-batch negatives: batch
    64 plain, batch 256 with GradCache (``--micro_batch_size 32``) and batch 256 plain.

    python benchmarks/embedding_study.py --general_model runs/general30/run/model \
        --twin runs/glue-general30/random_init_model --output runs/embedding-study

Prints a markdown table per part; writes ``results.json`` into ``--output``. A part already
measured in ``--output`` is reused (and so is each trained model and score): remove the folder
to measure again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from _common import (
    SHARED_DATA,
    log,
    machine_markdown,
    markdown_table,
    minilm_dir,
    squad_question_paragraphs,
)

PARTS = ("scratch", "simcse", "adapt", "adapt_ours", "gradcache")
GLOVE_STSB = 58.0  # average GloVe, STS-B test (Reimers & Gurevych 2019, SBERT, Table 1)
SHOWN = (("STS-B", "spearman"), ("XQuAD-en", "mrr@10"), ("XQuAD-en", "recall@1"))


# ---- data ---------------------------------------------------------------------------------------


def general_sentences(path: Path, count: int, seed: int) -> int:
    """``path``: ``count`` sentences (5-60 words) drawn at random from the first paragraphs of
    the general corpus's first Wikipedia and Gutenberg files (the training part: the recipe holds
    out the last articles of wikipedia-03 and the last books of gutenberg-01), one
    ``{"text"}`` per line."""
    from bertforge.data.corpus import split_sentences
    from bertforge.io import text_lines

    pool: list[str] = []
    for name in ("wikipedia-00.txt.bz2", "gutenberg-00.txt.bz2"):
        found = 0
        for line in text_lines(SHARED_DATA / "general" / name):
            for sentence in split_sentences(line.strip()):
                if 5 <= len(sentence.split()) <= 60:
                    pool.append(sentence)
                    found += 1
            if found >= 2 * count:
                break
    chosen = random.Random(seed).sample(pool, min(count, len(pool)))
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": s}) + "\n" for s in chosen)
    return len(chosen)


def squad_pairs(path: Path) -> int:
    """``path``: one ``{"question", "context"}`` per question of squad_dev_train (9,380)."""
    rows = squad_question_paragraphs()
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


def sentences_file(args: argparse.Namespace, work: Path) -> Path:
    """``work/general_sentences.jsonl``, drawn once (:func:`general_sentences`)."""
    path = work / "general_sentences.jsonl"
    if not path.exists():
        log(f"general sentences: {general_sentences(path, args.simcse_sentences, args.seed):,}")
    return path


def pairs_file(work: Path) -> Path:
    """``work/squad_pairs.jsonl``, written once (:func:`squad_pairs`)."""
    path = work / "squad_pairs.jsonl"
    if not path.exists():
        log(f"SQuAD pairs: {squad_pairs(path):,}")
    return path


# ---- commands -----------------------------------------------------------------------------------


def bertforge(args: argparse.Namespace, *words: str) -> dict:
    """Run ``bertforge WORDS...`` on ``--num_threads`` threads; its wall seconds and peak
    resident memory (the child's own, from ``wait4``)."""
    command = [sys.executable, "-m", "bertforge", *words]
    log("$ bertforge " + " ".join(words))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.num_threads), TOKENIZERS_PARALLELISM="false")
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL if args.quiet else None)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"bertforge {words[0]} failed; see its output above")
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": usage.ru_maxrss / 1024}


def train(args: argparse.Namespace, model: str, out: Path, data: Path, *options: str) -> dict:
    """``finetune --task embedding`` from ``model`` into ``out`` (reused when already there)."""
    if not (out / "eval_results.json").exists():
        run = bertforge(
            args, "finetune", "--task", "embedding", "--model", model, "--train", str(data),
            "--output", str(out), "--seed", str(args.seed), "--precision", "fp32",
            "--num_threads", str(args.num_threads), "--progress", "false",
            "--keep_final_checkpoint", "false", *options,
        )  # fmt: skip
        (out / "study_run.json").write_text(json.dumps(run) + "\n")
    result = json.loads((out / "eval_results.json").read_text())
    run = json.loads((out / "study_run.json").read_text())
    return {"steps": result.get("steps"), "train_seconds": result.get("train_seconds"), **run}


def score(args: argparse.Namespace, model: str, out: Path) -> dict[str, float]:
    """``benchmark --suite embedding`` of ``model``: {"STS-B spearman": ..., ...} in points."""
    if not (out / "results.json").exists():
        bertforge(args, "benchmark", "--suite", "embedding", "--model", model, "--output",
                  str(out), "--data_dir", str(SHARED_DATA), "--num_threads", str(args.num_threads))  # fmt: skip
    tasks = json.loads((out / "results.json").read_text())["tasks"]
    return {f"{t} {m}": 100 * tasks[t]["model"][m] for t, m in SHOWN}


def score_row(name: str, scores: dict[str, float], *extra: str) -> list[str]:
    return [name, *(f"{scores[f'{t} {m}']:.1f}" for t, m in SHOWN), *extra]


SCORE_HEADER = [f"{t} {m}" for t, m in SHOWN]


# ---- the parts ----------------------------------------------------------------------------------


def part_scratch(args: argparse.Namespace, work: Path) -> dict:
    """The general BERT and its twin through SimCSE, SQuAD pairs and STS-B CoSENT."""
    if not args.general_model:
        raise SystemExit(
            "the scratch part needs --general_model (bertforge recipe general's model)"
        )
    twin = args.twin
    if not twin:
        from bertforge.training.downstream import make_random_twin

        twin = str(work / "twin")
        if not (work / "twin" / "config.json").exists():
            make_random_twin(args.general_model, Path(twin), seed=0)
    sentences = sentences_file(args, work)
    pairs = pairs_file(work)
    sts = SHARED_DATA / "glue" / "STS-B" / "train.tsv"
    stages = [
        ("+ SimCSE on general sentences", sentences,
         ("--max_length", "32", "--batch_size", "64", "--lr", str(args.small_lr), "--epochs", "1")),
        ("+ in-batch negatives on SQuAD pairs", pairs,
         ("--text_column", "question", "--text_pair_column", "context", "--max_length", "128",
          "--batch_size", "64", "--lr", str(args.small_lr), "--epochs", "1")),
        ("+ CoSENT on STS-B train", sts,
         ("--text_column", "sentence1", "--text_pair_column", "sentence2", "--label_column",
          "label", "--max_length", "64", "--batch_size", "32", "--lr", str(args.small_lr),
          "--epochs", "4")),
    ]  # fmt: skip
    result: dict = {}
    for label, start in (("general", args.general_model), ("twin", twin)):
        rows = [{"stage": "zero-shot", **score(args, start, work / f"{label}-0-score")}]
        model = start
        for i, (stage, data, options) in enumerate(stages, 1):
            out = work / f"{label}-{i}"
            run = train(args, model, out, data, *options)
            rows.append(
                {"stage": stage, **score(args, str(out), work / f"{label}-{i}-score"), **run}
            )
            model = str(out)
        result[label] = rows
    result["minilm"] = score(args, str(minilm_dir()), work / "minilm-score")
    return result


def table_scratch(result: dict) -> str:
    rows = []
    for label in ("general", "twin"):
        for row in result[label]:
            rows.append(score_row(f"{label}: {row['stage']}", row,
                                  f"{row['train_seconds']:.0f}" if "train_seconds" in row else ""))  # fmt: skip
    rows.append(["average GloVe (SBERT paper; STS-B *test*)", f"{GLOVE_STSB:.1f}", "", "", ""])
    rows.append(score_row("all-MiniLM-L6-v2 (as installed)", result["minilm"], ""))
    return markdown_table(["model", *SCORE_HEADER, "training s"], rows)


def part_simcse(args: argparse.Namespace, work: Path) -> dict:
    """SimCSE alone on general sentences: MiniLM (few sentences: it is 14x Tiny's compute) and
    the general BERT-Tiny."""
    sentences = sentences_file(args, work)
    few = work / "general_sentences_minilm.jsonl"
    if not few.exists():
        lines = sentences.read_text(encoding="utf-8").splitlines()[: args.minilm_sentences]
        few.write_text("\n".join(lines) + "\n", encoding="utf-8")
    models = [("all-MiniLM-L6-v2", str(minilm_dir()), few, "3e-5")]
    if args.general_model:
        models.append(("general BERT-Tiny", args.general_model, sentences, str(args.small_lr)))
    result = {}
    for i, (name, model, data, lr) in enumerate(models):
        out = work / f"simcse-{i}"
        run = train(args, model, out, data, "--max_length", "32", "--batch_size", "64",
                    "--lr", lr, "--epochs", "1")  # fmt: skip
        result[name] = {
            "before": score(args, model, work / f"simcse-{i}-before-score"),
            "after": score(args, str(out), work / f"simcse-{i}-after-score"),
            "sentences": len(data.read_text(encoding="utf-8").splitlines()),
            "lr": lr,
            **run,
        }
    return result


def table_simcse(result: dict) -> str:
    rows = []
    for name, r in result.items():
        rows.append(score_row(f"{name}, before", r["before"], "", ""))
        rows.append(score_row(f"{name}, after SimCSE", r["after"], f"{r['sentences']:,} (lr {r['lr']})",
                              f"{r['train_seconds']:.0f}"))  # fmt: skip
    return markdown_table(["model", *SCORE_HEADER, "sentences", "training s"], rows)


def adapt(
    args: argparse.Namespace, work: Path, model: str, folder: str, batch_size: int, lr: str
) -> dict:
    """``model`` trained for ``--adapt_time`` on the SQuAD pairs into ``work/folder``, scored
    after (``work/folder-score``); the callers score the model before."""
    pairs = pairs_file(work)
    out = work / folder
    run = train(args, model, out, pairs, "--text_column", "question",
                "--text_pair_column", "context", "--max_length", "128",
                "--batch_size", str(batch_size), "--lr", lr, "--epochs", "1",
                "--max_time", args.adapt_time)  # fmt: skip
    return {"after": score(args, str(out), work / f"{folder}-score"),
            "max_time": args.adapt_time, **run}  # fmt: skip


def part_adapt(args: argparse.Namespace, work: Path) -> dict:
    result = adapt(args, work, str(minilm_dir()), "adapt", 32, "2e-5")
    return {"before": score(args, str(minilm_dir()), work / "minilm-score"), **result}


def part_adapt_ours(args: argparse.Namespace, work: Path) -> dict:
    """The same for our general BERT-Tiny (``--general_model``): from its pretraining straight to
    ``--adapt_time`` on the SQuAD pairs (batch 64, ``--small_lr``)."""
    if not args.general_model:
        raise SystemExit(
            "the adapt_ours part needs --general_model (bertforge recipe general's model)"
        )
    result = adapt(args, work, args.general_model, "adapt-ours", 64, str(args.small_lr))
    before = score(args, args.general_model, work / "general-0-score")
    return {"model": "general BERT-Tiny", "before": before, **result}


def table_adapt(result: dict) -> str:
    rows = [
        score_row(result.get("model", "all-MiniLM-L6-v2"), result["before"], ""),
        score_row(
            f"+ {result['steps']} steps on SQuAD pairs (--max_time {result['max_time']})",
            result["after"],
            f"{result['train_seconds']:.0f}",
        ),  # fmt: skip
    ]
    diff = {k: result["after"][k] - result["before"][k] for k in result["before"]}
    return (
        markdown_table(["model", *SCORE_HEADER, "training s"], rows)
        + "\n\nchange, points: "
        + ", ".join(f"{k} {v:+.1f}" for k, v in diff.items())
    )


def part_gradcache(args: argparse.Namespace, work: Path) -> dict:
    pairs = pairs_file(work)
    result = {}
    for name, batch, micro in (("batch 64", 64, 64), ("batch 256, GradCache mini-batch 32", 256, 32),
                               ("batch 256", 256, 256)):  # fmt: skip
        out = work / f"gradcache-{batch}-{micro}"
        result[name] = train(
            args, str(minilm_dir()), out, pairs, "--text_column", "question",
            "--text_pair_column", "context", "--max_length", "128", "--batch_size", str(batch),
            "--micro_batch_size", str(micro), "--lr", "2e-5", "--max_steps", "1",
            "--validation_fraction", "0.01",
        )  # fmt: skip
    return result


def table_gradcache(result: dict) -> str:
    rows = [[name, str(r["steps"]), f"{r['peak_rss_mb']:,.0f}", f"{r['seconds']:.0f}"]
            for name, r in result.items()]  # fmt: skip
    return markdown_table(
        ["all-MiniLM-L6-v2, in-batch negatives", "steps", "peak RSS MB", "process s"], rows
    )


RUN = {
    "scratch": part_scratch,
    "simcse": part_simcse,
    "adapt": part_adapt,
    "adapt_ours": part_adapt_ours,
    "gradcache": part_gradcache,
}
TABLE = {
    "scratch": table_scratch,
    "simcse": table_simcse,
    "adapt": table_adapt,
    "adapt_ours": table_adapt,
    "gradcache": table_gradcache,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--general_model", help="our general-English BERT (recipe general)")
    parser.add_argument("--twin", help="its random twin (default: made here, seed 0)")
    parser.add_argument("--simcse_sentences", type=int, default=20_000)
    parser.add_argument("--minilm_sentences", type=int, default=4_096)
    parser.add_argument("--small_lr", type=float, default=1e-4, help="learning rate for Tiny")
    parser.add_argument("--adapt_time", default="5m")
    parser.add_argument("--num_threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="hide the commands' own output")
    parser.add_argument("--output", default="runs/embedding-study")
    args = parser.parse_args()
    work = Path(args.output)
    work.mkdir(parents=True, exist_ok=True)
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for part in args.parts:
        if part not in results:
            results[part] = RUN[part](args, work)
            results_path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\n## {part}\n\n{TABLE[part](results[part])}")
    print(f"\n{machine_markdown()}")


if __name__ == "__main__":
    main()
