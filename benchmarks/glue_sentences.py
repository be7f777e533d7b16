"""In-domain transfer text for docs/distillation.md's embedding study: the unique sentences of
the *training* files of ``../shared/data/glue`` (STS-B, MRPC, RTE, CoLA, SST-2), one a line,
no labels and no dev rows. ``distill --unlabelled`` reads it beside the general paragraphs
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    seen: set[str] = set()
    with args.output.open("w", encoding="utf-8") as out:
        for task in COLUMNS:
            kept = 0
            for text in task_sentences(task):
                if len(text.split()) >= 3 and text not in seen:
                    seen.add(text)
                    out.write(text + "\n")
                    kept += 1
            print(f"{task}: {kept} sentences")
    print(f"{len(seen)} sentences -> {args.output}")


if __name__ == "__main__":
    main()
