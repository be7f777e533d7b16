"""The files of a benchmark suite (``bertforge benchmark``): where the suite's data folder is,
each task's files in it, and fixed random samples of them (``--smoke``,
``--max_train_examples``) in the three layouts the suites use: CSV/TSV/JSONL tables (GLUE),
CoNLL token-per-line files (NER) and SQuAD JSON (QA)."""

from __future__ import annotations

import csv
import io
import json
import os
import random
from pathlib import Path
from typing import Any

from bertforge.data.tables import read_table
from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text, read_text, text_lines

DATA_ENV = "BERTFORGE_DATA"
"""Environment variable naming the folder that holds the suites' data folders (glue/, ner/, qa/)."""


def data_directory(data_dir: str | None, suite: str, example: str) -> Path:
    """The suite's data folder: ``data_dir``, else ``$BERTFORGE_DATA/<suite>``, else
    ``../shared/data/<suite>`` from the current directory. A missing one is a one-line error
    saying where it was looked for and how to point at it (``example``: a file it should hold)."""
    if data_dir is not None:
        path, how = Path(data_dir), "--data_dir"
    elif os.environ.get(DATA_ENV):
        path, how = Path(os.environ[DATA_ENV]) / suite, f"${DATA_ENV}/{suite}"
    else:
        path, how = Path("..") / "shared" / "data" / suite, "the default"
    if not path.is_dir():
        raise BertforgeError(
            f"--data_dir {path} ({how}): no such directory; pass --data_dir DIR holding the "
            f"{'' if suite in ('', '.') else suite + ' '}data ({example}, ...) or set "
            f"{DATA_ENV} to the folder above it "
            "(docs/benchmark.md)"
        )
    return path


def find_file(data_dir: Path, folder: str, name: str, what: str) -> Path:
    """``data_dir/folder/name``, or its twin with (or without) ``.gz``; else a one-line error
    naming the file."""
    twin = name[:-3] if name.endswith(".gz") else name + ".gz"
    for candidate in (data_dir / folder / name, data_dir / folder / twin):
        if candidate.is_file():
            return candidate
    raise BertforgeError(
        f"--data_dir {data_dir}: no {Path(folder) / name} (the {what} file); point --data_dir "
        "at the suite's folder (docs/benchmark.md)"
    )


def _pick(total: int, count: int, seed: int) -> list[int]:
    """``count`` of ``range(total)`` drawn with ``seed``, in order (all when there are fewer)."""
    if total <= count:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), count))


def sample_table(path: Path, count: int, output: Path, seed: int = 0) -> Path:
    """``count`` rows of a CSV/TSV/JSONL table, written as a TSV with its header to ``output``."""
    header, rows = read_table(path)
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t", lineterminator="\n")
    writer.writerow(header)
    writer.writerows([rows[i].get(c, "") for c in header] for i in _pick(len(rows), count, seed))
    return atomic_write_text(output, text.getvalue())


def conll_sentences(path: Path) -> list[list[str]]:
    """The sentences of a CoNLL file: its blocks of lines between blank lines."""
    blocks: list[list[str]] = [[]]
    for raw in text_lines(path):
        line = raw.rstrip("\r\n")
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def _tags(sentence: list[str]) -> set[str]:
    return {line.split()[-1] for line in sentence}


def sample_conll(
    path: Path, count: int, output: Path, seed: int = 0, cover: Path | None = None
) -> Path:
    """``count`` sentences of a CoNLL file, lines unchanged; with ``cover`` (another CoNLL
    file), for each tag of ``cover`` the sample lacks, the file's first sentence that has it is
    added too (a training sample must know every tag the scored sample holds)."""
    sentences = conll_sentences(path)
    chosen = _pick(len(sentences), count, seed)
    if cover is not None:
        have = set().union(*(_tags(sentences[i]) for i in chosen))
        wanted = set().union(*map(_tags, conll_sentences(cover))) - have
        for i, sentence in enumerate(sentences):
            if wanted & _tags(sentence):
                wanted -= _tags(sentence)
                chosen.append(i)
        chosen = sorted(set(chosen))
    text = "".join("\n".join(sentences[i]) + "\n\n" for i in chosen)
    return atomic_write_text(output, text)


def sample_squad(path: Path, count: int, output: Path, seed: int = 0) -> Path:
    """``count`` questions of a SQuAD v1.1 JSON file, with their paragraphs and articles (those
    left without a question are dropped)."""
    dataset = json.loads(read_text(path))
    where = [
        (a, p, q)
        for a, article in enumerate(dataset["data"])
        for p, paragraph in enumerate(article["paragraphs"])
        for q in range(len(paragraph["qas"]))
    ]
    keep = {where[i] for i in _pick(len(where), count, seed)}
    articles: list[dict[str, Any]] = []
    for a, article in enumerate(dataset["data"]):
        paragraphs = []
        for p, paragraph in enumerate(article["paragraphs"]):
            qas = [qa for q, qa in enumerate(paragraph["qas"]) if (a, p, q) in keep]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    return atomic_write_text(output, json.dumps({**dataset, "data": articles}) + "\n")


def sample_file(
    path: Path, count: int, directory: Path, stem: str, seed: int = 0, cover: Path | None = None
) -> Path:
    """``count`` examples of ``path`` (rows, sentences or questions by its layout) written to
    ``directory/<stem>.tsv|.conll|.json``; ``cover``: see :func:`sample_conll`."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    suffix = Path(name).suffix
    if suffix == ".conll":
        return sample_conll(path, count, directory / f"{stem}.conll", seed, cover)
    if suffix == ".json":
        return sample_squad(path, count, directory / f"{stem}.json", seed)
    return sample_table(path, count, directory / f"{stem}.tsv", seed)


__all__ = [
    "DATA_ENV",
    "data_directory",
    "find_file",
    "conll_sentences",
    "sample_conll",
    "sample_file",
    "sample_squad",
    "sample_table",
]
