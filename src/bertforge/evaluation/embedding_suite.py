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

from dataclasses import dataclass
from pathlib import Path

from bertforge.data.pairs import PairData, load_pairs
from bertforge.data.qa import read_qa
from bertforge.data.suite_files import find_file
from bertforge.evaluation.embedding import Vectors, baselines, score_vectors


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


def suite_markdown(name: str, results: dict[str, dict[str, dict[str, float]]]) -> str:
    """The suite's table: a row per column (model, constant, random), a column per score (x 100)."""
    header = ["", *(f"{t} {m}" for t, r in results.items() for m in r["model"])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for column in ("model", "constant", "random"):
        label = name if column == "model" else column
        cells = [f"{100 * r[column][m]:.1f}" for r in results.values() for m in r["model"]]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["EMBEDDING_TASKS", "EmbeddingTask", "load_task", "score_task", "suite_markdown"]
