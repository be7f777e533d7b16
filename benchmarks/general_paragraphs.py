"""The transfer text of docs/distillation.md's embedding study: every 6th paragraph of at
least 8 words from three Wikipedia files and one Gutenberg file of ``../shared/data/general``
(9,000, 9,000, 9,000 and 12,000 paragraphs: mixed topics, not the first articles alone), one
paragraph a line. ``distill --transfer_unit sentence`` (the embedding default) splits them.

    python benchmarks/general_paragraphs.py general-paras.txt
"""

from __future__ import annotations

import argparse
import bz2
from pathlib import Path

from _common import SHARED_DATA

BUDGET = {"wikipedia-00": 9000, "wikipedia-01": 9000, "wikipedia-02": 9000, "gutenberg-00": 12000}
"""Paragraphs kept from each file."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--every", type=int, default=6, help="keep every Nth paragraph")
    args = parser.parse_args()
    with args.output.open("w", encoding="utf-8") as out:
        for name, budget in BUDGET.items():
            seen = kept = 0
            with bz2.open(SHARED_DATA / "general" / f"{name}.txt.bz2", "rt", encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    seen += 1
                    if seen % args.every == 0 and len(line.split()) >= 8:
                        out.write(line + "\n")
                        kept += 1
                        if kept >= budget:
                            break
            print(f"{name}: {kept:,} paragraphs")


if __name__ == "__main__":
    main()
