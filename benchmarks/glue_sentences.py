"""In-domain transfer text for docs/distillation.md's embedding study: the unique sentences of
the *training* files of ``../shared/data/glue`` (STS-B, MRPC, RTE, CoLA, SST-2), one a line,
no labels, and none that also appears in a dev file (STS-B's captions recur across its
splits: 249 of the 2,910 distinct STS-B dev sentences are also training sentences, and a
student that saw the teacher's vectors of them would be scored on text it was taught). ``distill --unlabelled`` reads it beside the general paragraphs
(``general_paragraphs.py``): text like the STS-B pairs (captions, headlines, forum posts) that
Wikipedia and Gutenberg lack.

    python benchmarks/glue_sentences.py glue-sentences.txt
"""

from __future__ import annotations

import argparse
import csv
import gzip
from pathlib import Path

from _common import SHARED_DATA

COLUMNS = {
    "STS-B": ("sentence1", "sentence2"),
    "MRPC": ("sentence1", "sentence2"),
    "RTE": ("sentence1", "sentence2"),
    "CoLA": ("sentence",),
    "SST-2": ("sentence",),
}
"""The text columns of each task's ``train.tsv`` (``.gz`` where stored so)."""


def task_sentences(task: str) -> list[str]:
    """The texts of one task's training file, in file order."""
    folder = SHARED_DATA / "glue" / task
    path = folder / "train.tsv"
    opener = open if path.exists() else gzip.open
    path = path if path.exists() else folder / "train.tsv.gz"
    texts: list[str] = []
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            texts += [" ".join(row[c].split()) for c in COLUMNS[task]]
    return texts


def dev_sentences() -> set[str]:
    """Every text of the five tasks' dev files, as :func:`task_sentences` writes them."""
    texts: set[str] = set()
    for task, columns in COLUMNS.items():
        path = SHARED_DATA / "glue" / task / "dev.tsv"
        with path.open(encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                texts.update(" ".join(row[c].split()) for c in columns)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    seen: set[str] = set()
    held_out = dev_sentences()
    with args.output.open("w", encoding="utf-8") as out:
        for task in COLUMNS:
            kept = dropped = 0
            for text in task_sentences(task):
                if len(text.split()) < 3 or text in seen:
                    continue
                if text in held_out:
                    seen.add(text)  # counted once
                    dropped += 1
                    continue
                seen.add(text)
                out.write(text + "\n")
                kept += 1
            print(f"{task}: {kept} sentences ({dropped} also in a dev file, left out)")
    print(f"{len(seen - held_out)} sentences -> {args.output}")


if __name__ == "__main__":
    main()
