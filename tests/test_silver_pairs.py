"""``benchmarks/silver_pairs.py``'s sampling of neighbour pairs: one pair per rank band drawn from
each anchor's true neighbours, a random one, no self-pair and no pair twice."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from silver_pairs import neighbour_pairs, parse_bands  # noqa: E402


def unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_each_band_is_drawn_from_the_anchors_ranked_neighbours():
    vectors = unit_rows(40, 8, seed=1)
    bands = [(1, 1), (2, 4), (5, 12)]
    pairs = neighbour_pairs(vectors, bands, seed=0, random_pair=False, chunk=7)
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    rank = {}  # (anchor, other) -> 1-based rank of other among anchor's neighbours
    for i in range(len(vectors)):
        for r, j in enumerate(np.argsort(-sims[i]), start=1):
            rank[i, int(j)] = r
    keys = [(min(i, j), max(i, j)) for i, j in pairs]
    assert len(keys) == len(set(keys)) and all(i != j for i, j in pairs)
    assert all(any(lo <= rank[p] <= hi for lo, hi in bands) for p in pairs)
    firsts = {i: j for i, j in pairs if rank[i, j] == 1}
    nearest = {i: int(np.argmax(sims[i])) for i in range(len(vectors))}
    # every anchor's nearest neighbour is paired with it, from its side or already from the other
    assert all(firsts.get(i) == nearest[i] or (nearest[i], i) in pairs for i in nearest)
    # a pair is only left out as a repeat: each anchor has at most one pair per band
    assert len(vectors) * 2 < len(pairs) <= len(vectors) * len(bands)


def test_random_pairs_and_bands_deeper_than_the_rows():
    vectors = unit_rows(6, 4, seed=2)
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    second = {(i, int(np.argsort(-sims[i])[1])) for i in range(6)}  # rank 2: in no band
    without = neighbour_pairs(vectors, [(1, 1), (3, 50)], seed=3, random_pair=False)
    assert not second & set(without)  # a band past the last row takes what there is
    with_random = neighbour_pairs(vectors, [(1, 1), (3, 50)], seed=3)
    assert all(0 <= i < 6 and 0 <= j < 6 and i != j for i, j in with_random)
    assert neighbour_pairs(vectors, [(1, 1)], seed=3) == neighbour_pairs(vectors, [(1, 1)], seed=3)


def test_bands_are_parsed_and_checked():
    assert parse_bands("1 2-3 4-10") == [(1, 1), (2, 3), (4, 10)]
    with pytest.raises(SystemExit, match="1 <= LOW <= HIGH"):
        parse_bands("3-2")
    with pytest.raises(SystemExit, match="1 <= LOW <= HIGH"):
        parse_bands("0")
