"""``bertforge benchmark --suite embedding``: a sentence-embedding model scored zero-shot (no
training) on public data, beside constant and random vectors:

- **STS-B dev** (``glue/STS-B/dev.tsv``, 1,500 sentence pairs with 0-5 similarity scores):
  Spearman and Pearson of the cosine against the gold score;
- **XQuAD-en retrieval** (``qa/xquad_en_test.json.gz``, 1,190 questions over the 240 paragraphs
  they were written on): each question retrieves its paragraph among all 240 (MRR@10, nDCG@10,
  recall@1/10/100).

The folders are those of ``../shared/data`` (or ``--data_dir``); see docs/embeddings.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.data.pairs import PairData, load_pairs
from bertforge.data.qa import read_qa
from bertforge.data.suite_files import find_file
from bertforge.evaluation.embedding import Vectors, baselines, score_vectors
from bertforge.evaluation.plots import plot_grouped_bars
from bertforge.io import atomic_write_text


@dataclass(frozen=True)
class EmbeddingTask:
    """One task of the suite: where its file is and what scores it."""

    name: str
    folder: str
    file: str
    metrics: tuple[str, ...]
    """The scores reported (the first is the task's headline)."""


EMBEDDING_TASKS = (
    EmbeddingTask("STS-B", "glue/STS-B", "dev.tsv", ("spearman", "pearson")),
    EmbeddingTask(
        "XQuAD-en",
        "qa",
        "xquad_en_test.json.gz",
        ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100"),
    ),
)


def load_task(data_dir: Path, task: EmbeddingTask) -> PairData:
    """The task's pairs: STS-B's scored sentence pairs, or XQuAD's (question, paragraph)."""
    path = find_file(data_dir, task.folder, task.file, task.name)
    if task.name == "STS-B":
        return load_pairs(
            path, text_column="sentence1", text_pair_column="sentence2", label_column="label"
        )
    examples, _ = read_qa(path)
    return PairData(
        "pairs", [e.question for e in examples], [e.context for e in examples], None, None
    )


def score_task(
    data: PairData, task: EmbeddingTask, vectors: Vectors, dim: int
) -> dict[str, dict[str, float]]:
    """``{"model", "constant", "random"}`` -> the task's scores of each."""
    columns = {"model": score_vectors(data, vectors), **baselines(data, dim)}
    return {name: {m: scores[m] for m in task.metrics} for name, scores in columns.items()}


COLUMNS = ("model", "constant", "random")
"""The rows of the suite's table: the model's vectors and the two baselines'."""


def documents(data: PairData) -> int:
    """The distinct documents a retrieval task's queries search (its paragraphs)."""
    return len(set(data.positives or []))


def task_counts(name: str, entry: dict[str, Any]) -> str:
    """What a task scored, in words: ``1,500 dev pairs`` or ``each of 1,190 questions retrieves
    its paragraph among the 240`` (``entry``: a task of results.json, its ``examples`` and, for
    retrieval, ``documents``)."""
    if "documents" in entry:
        return (
            f"{name}: each of {entry['examples']:,} questions retrieves its paragraph among the "
            f"{entry['documents']:,} they were written on"
        )
    return f"{name}: cosine against the gold 0-5 score on {entry['examples']:,} dev pairs"


def smoke_line(tasks: dict[str, dict[str, Any]]) -> str:
    """The warning of a --smoke run: what it scored of each task, and that it means nothing."""
    parts = [f"{entry['examples']:,} of {entry['of']:,} {name}" for name, entry in tasks.items()]
    few = any("documents" in entry for entry in tasks.values())
    return (
        f"A --smoke run: the first rows of each task only ({'; '.join(parts)}); its numbers "
        "mean nothing" + (" (a few documents make recall@10 trivially high)." if few else ".")
    )


def write_suite_report(output: Path, result: dict[str, Any]) -> str:
    """results.md (the table, what each task scored, the --smoke warning), results.json and
    results.png (a bar per column and score) in ``output``; returns what stdout shows: the
    table, and under it the --smoke warning."""
    name, tasks = result["name"], result["tasks"]
    scores = {t: {c: entry[c] for c in COLUMNS} for t, entry in tasks.items()}
    table = suite_markdown(name, scores)
    smoke = smoke_line(tasks) if result.get("smoke") else None
    note = (
        "Points (x 100), zero-shot: no training. Constant vectors tie every similarity (a "
        "relevant document ranks last among ties); random vectors are one Gaussian vector per "
        "distinct text. " + "; ".join(task_counts(t, e) for t, e in tasks.items()) + "."
    )
    heading = f"# bertforge benchmark: {name} on embedding" + (" (--smoke)" if smoke else "")
    md = [heading, "", *([f"**{smoke}**", ""] if smoke else []), table, note]
    atomic_write_text(output / "results.md", "\n".join(md) + "\n")
    atomic_write_text(output / "results.json", json.dumps(result, indent=2) + "\n")
    labels = {"model": name, "constant": "constant vectors", "random": "random vectors"}
    categories = [f"{t}\n{m}" for t, r in scores.items() for m in r["model"]]
    bars = {
        labels[c]: {f"{t}\n{m}": 100 * v for t, r in scores.items() for m, v in r[c].items()}
        for c in COLUMNS
    }
    title = f"{name} on the embedding suite (zero-shot)"
    if smoke:
        scored = ", ".join(f"{entry['examples']} {t}" for t, entry in tasks.items())
        title += f"\n--smoke run ({scored}): the numbers mean nothing"
    plot_grouped_bars(bars, categories, output / "results.png", title=title, ylabel="points")
    return table + (f"\n{smoke}\n" if smoke else "")


def suite_markdown(name: str, results: dict[str, dict[str, dict[str, float]]]) -> str:
    """The suite's table: a row per column (model, constant, random), a column per score (x 100)."""
    header = ["", *(f"{t} {m}" for t, r in results.items() for m in r["model"])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for column in ("model", "constant", "random"):
        label = name if column == "model" else column
        cells = [f"{100 * r[column][m]:.1f}" for r in results.values() for m in r["model"]]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


__all__ = [
    "EMBEDDING_TASKS",
    "EmbeddingTask",
    "documents",
    "load_task",
    "score_task",
    "smoke_line",
    "suite_markdown",
    "task_counts",
    "write_suite_report",
]
