"""The on-disk format of prepared pretraining data: the shard writer and the memmap reader.

Layout of a data directory (``bertforge prepare`` writes it to a hidden temporary sibling and
renames it when complete, so an interrupted run never leaves something that looks whole)::

    manifest.json             size and SHA-256 of every other file (sizes checked at each open,
                              hashes by ``bertforge verify``)
    meta.json                 format version, mode, max_seq_length, vocab_size, token dtype,
                              tokenizer fingerprint, special ids, settings, counts, shard list
    tokenizer/                the tokenizer the ids belong to (vocab.txt, tokenizer.json, ...)
    train-00000.ids           token ids of whole sequences ([CLS] A [SEP] B [SEP]) back to back,
                              uint16 when the vocabulary fits, else uint32
    train-00000.idx           int64 (n, 4): offset, length, first position of segment B, NSP label
    validation-00000.ids/.idx the same for the validation split

- :class:`PretrainingDataset` ``(data_dir, split="train"|"validation", tokenizer=None)`` reads a
  split: ``len(ds)``; ``ds[i]`` is a dict with ``input_ids`` and ``token_type_ids`` (int64 numpy
  arrays, special tokens included) and ``next_sentence_label`` (0 IsNext, 1 NotNext as in
  transformers, -1 in packed mode); ``ds.lengths`` (for length bucketing); ``ds.meta`` (the
  ``meta.json`` dict); ``ds.tokenizer_dir``. Given a tokenizer, it checks the fingerprint and
  raises :class:`~bertforge.errors.BertforgeError` saying what to do on a mismatch.
- :func:`read_meta` loads and checks ``meta.json`` (format version) and the sizes the manifest
  records.
- :class:`ShardWriter` appends sequences to a split's shards (used by ``prepare``).

All of it is re-exported by :mod:`bertforge.data.shards`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.instances import Instance
from bertforge.errors import BertforgeError
from bertforge.io import read_json_object, verify_manifest

FORMAT_VERSION = 1
META_FILE = "meta.json"
TOKENIZER_DIR = "tokenizer"
SPLITS = ("train", "validation")
_IDX_COLUMNS = 4  # offset, length, b_start, nsp label
_COUNT_BLOCK_CELLS = 1 << 26  # cells of one block of co-occurrence counts (256 MiB of int32)
_COUNT_CHUNK_TOKENS = 1 << 22  # tokens counted at once (~200 MB of working arrays)


class ShardWriter:
    """Appends finished sequences of one split to shard files, starting a new file when full."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.split, self.dtype = directory, split, dtype
        self.shard_tokens = shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._ids = self._idx = None
        self.instances = self.tokens = self.not_next = 0

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}"
        self.shards.append({"name": name, "instances": 0, "tokens": 0})
        self._ids = open(self.directory / f"{name}.ids", "wb")  # noqa: SIM115
        self._idx = open(self.directory / f"{name}.idx", "wb")  # noqa: SIM115

    def write(self, instances: list[Instance], cls_id: int, sep_id: int) -> None:
        if not instances:
            return
        cls, sep = np.array([cls_id]), np.array([sep_id])
        pieces, rows = [], np.zeros((len(instances), _IDX_COLUMNS), dtype=np.int64)
        for row, inst in zip(rows, instances, strict=True):
            la = len(inst.tokens_a)
            if inst.tokens_b is None:
                pieces += [cls, inst.tokens_a, sep]
                row[1:] = (la + 2, la + 2, -1)
            else:
                pieces += [cls, inst.tokens_a, sep, inst.tokens_b, sep]
                row[1:] = (la + len(inst.tokens_b) + 3, la + 2, int(inst.is_random_next))
        if self._ids is None or self.shards[-1]["tokens"] >= self.shard_tokens:
            self.close()
            self._open()
        shard = self.shards[-1]
        rows[:, 0] = shard["tokens"] + np.concatenate([[0], np.cumsum(rows[:-1, 1])])
        ids = np.concatenate(pieces).astype(self.dtype)
        self._ids.write(ids.tobytes())
        self._idx.write(rows.tobytes())
        shard["instances"] += len(rows)
        shard["tokens"] += len(ids)
        self.instances += len(rows)
        self.tokens += len(ids)
        self.not_next += int((rows[:, 3] == 1).sum())

    def close(self) -> None:
        for fh in (self._ids, self._idx):
            if fh is not None:
                fh.close()
        self._ids = self._idx = None


def read_meta(data_dir: str | Path) -> dict[str, Any]:
    """Load and check ``meta.json`` of a prepared data directory."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise BertforgeError(
            f"{data_dir}: no {META_FILE}, so not a complete prepared data set (an interrupted "
            "bertforge prepare leaves none); run bertforge prepare --output there"
        )
    meta = read_json_object(path, "re-run bertforge prepare")
    # sizes only (a stat per file): hashing every shard at each open would read the whole data
    fix = "the data was altered or partly copied; re-run bertforge prepare or copy it again"
    verify_manifest(data_dir, hashes=False, fix=fix)
    if meta.get("format_version") != FORMAT_VERSION:
        raise BertforgeError(
            f"{path}: data format version {meta.get('format_version')}, this bertforge reads "
            f"version {FORMAT_VERSION}; re-run bertforge prepare with this version"
        )
    _check_meta(meta, path)
    return meta


def _check_meta(meta: dict[str, Any], path: Path) -> None:
    """The fields the reader relies on, with their types (a hand-edited or damaged file fails
    here, by name, instead of deep in training)."""
    expected = {"mode": str, "max_seq_length": int, "vocab_size": int, "dtype": str}
    expected |= {"tokenizer_fingerprint": str, "splits": dict}
    for key, kind in expected.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise BertforgeError(
                f"{path}: field {key!r} is missing or not of type {kind.__name__}; the file is "
                "damaged, re-run bertforge prepare"
            )
    if meta["dtype"] not in ("uint16", "uint32"):
        raise BertforgeError(
            f"{path}: dtype {meta['dtype']!r} is not uint16 or uint32; re-run bertforge prepare"
        )
    for split in SPLITS:
        info = meta["splits"].get(split)
        shards = info.get("shards") if isinstance(info, dict) else None
        ok = isinstance(shards, list) and isinstance(info.get("instances"), int)
        for shard in shards if ok else []:
            ok = ok and isinstance(shard, dict) and isinstance(shard.get("name"), str)
            ok = ok and Path(shard["name"]).name == shard["name"]  # a file here, not elsewhere
            ok = ok and all(isinstance(shard.get(k), int) for k in ("instances", "tokens"))
        if not ok:
            raise BertforgeError(
                f"{path}: splits.{split} is missing or malformed (needs instances and a list of "
                "shards with name, instances, tokens); re-run bertforge prepare"
            )


def _check_shard(base: Path, idx: np.ndarray, ids: np.ndarray, meta: dict[str, Any]) -> None:
    """Every index row must describe a sequence inside the shard and every id lie in the
    vocabulary: a damaged shard of the right size fails here, not as an index error mid-run."""
    offset, length, b_start, label = idx.T
    bad = (length < 2) | (length > meta["max_seq_length"]) | (offset < 0)
    bad |= (offset > len(ids) - length) | (b_start < 1) | (b_start > length)
    bad |= (label < -1) | (label > 1)
    if bad.any():
        row = int(np.argmax(bad))
        raise BertforgeError(
            f"{base}.idx: row {row} ({idx[row].tolist()}) does not describe a sequence of the "
            "shard; the file is damaged, re-run bertforge prepare"
        )
    top = int(ids.max())
    if top >= meta["vocab_size"]:
        raise BertforgeError(
            f"{base}.ids: token id {top} is outside the vocabulary of {meta['vocab_size']}; the "
            "file is damaged, re-run bertforge prepare"
        )


def _pairs_at(
    tokens: np.ndarray,
    sequence: np.ndarray,
    distance: int,
    word_of: torch.Tensor,
    column: torch.Tensor,
    symmetric: bool,
) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
    """The token pairs ``distance`` apart in a run of ``tokens`` (int64, with each token's
    sequence number in ``sequence``): whether each lies inside one sequence, and its (word row,
    context column) pairs, -1 where a side is not counted (``word_of``: -1 for special tokens and
    ids past the vocabulary; ``column``: -1 for non-contexts); both directions unless
    ``symmetric`` (every word is a context, and the caller adds the transpose)."""
    m = len(tokens) - distance
    ids = torch.from_numpy(tokens)
    inside = ids < len(word_of)
    x = torch.where(inside, word_of[ids.clamp(0, len(word_of) - 1)], -1)
    col = column[x.clamp_min(0)].masked_fill_(x < 0, -1)  # each token's context column
    same = torch.from_numpy(sequence[:m] == sequence[distance:])
    pairs = ((x[:m], col[distance:]),)  # (word, its context's column)
    if not symmetric:
        pairs += ((x[distance:], col[:m]),)
    return same, pairs


class PretrainingDataset:
    """Random access to one split of a prepared data directory (numpy memmaps, no loading)."""

    def __init__(self, data_dir: str | Path, split: str = "train", tokenizer: Any = None) -> None:
        self.data_dir = Path(data_dir)
        self.meta = read_meta(self.data_dir)
        self.tokenizer_dir = self.data_dir / TOKENIZER_DIR
        if tokenizer is not None and tokenizer.fingerprint != self.meta["tokenizer_fingerprint"]:
            raise BertforgeError(
                f"{self.data_dir / META_FILE}: prepared with tokenizer {self.meta['tokenizer_fingerprint']}"
                f" but the given tokenizer is {tokenizer.fingerprint}; use the tokenizer in "
                f"{self.tokenizer_dir} or re-run bertforge prepare with this tokenizer"
            )
        if split not in SPLITS:
            raise BertforgeError(f"split {split!r} is unknown; choose train or validation")
        if not self.meta["splits"][split]["instances"]:
            raise BertforgeError(
                f"{self.data_dir}: the {split} split is empty; prepare with a larger "
                "--validation_fraction or with --validation FILE"
            )
        self.split = split
        dtype = np.dtype(self.meta["dtype"])
        self._ids, self._idx = [], []
        for shard in self.meta["splits"][split]["shards"]:
            base = self.data_dir / shard["name"]
            sizes = {".ids": shard["tokens"] * dtype.itemsize}
            sizes[".idx"] = shard["instances"] * _IDX_COLUMNS * 8
            for suffix, size in sizes.items():
                if not base.with_suffix(suffix).is_file():
                    raise BertforgeError(f"{base}{suffix}: missing; re-run bertforge prepare")
                if base.with_suffix(suffix).stat().st_size != size or not size:
                    raise BertforgeError(
                        f"{base}: size differs from meta.json; re-run bertforge prepare"
                    )
            # plain ndarray views of the maps: the same mapped pages without np.memmap's
            # per-slice Python overhead (a batch of 256 sequences: 14 ms of the GIL -> 2 ms)
            ids = np.memmap(base.with_suffix(".ids"), dtype=dtype, mode="r")
            self._ids.append(ids.view(np.ndarray))
            idx = np.memmap(base.with_suffix(".idx"), dtype=np.int64, mode="r")
            self._idx.append(idx.reshape(-1, _IDX_COLUMNS).view(np.ndarray))
            _check_shard(base, self._idx[-1], self._ids[-1], self.meta)
        self._ends = np.cumsum([len(i) for i in self._idx])
        self._lengths: np.ndarray | None = None

    def __reduce__(self):
        # reopen the memmaps in a worker process instead of pickling their contents
        return (PretrainingDataset, (self.data_dir, self.split))

    @property
    def mode(self) -> str:
        return self.meta["mode"]

    def __len__(self) -> int:
        return int(self._ends[-1])

    @property
    def lengths(self) -> np.ndarray:
        """Sequence length of every example (for length bucketing)."""
        if self._lengths is None:
            self._lengths = np.concatenate([idx[:, 1] for idx in self._idx])
        return self._lengths

    def token_counts(
        self, vocab_size: int, special_ids: Iterable[int] = (), max_tokens: int | None = None
    ) -> np.ndarray:
        """How often each token id occurs in the split (read shard by shard; the first
        ``max_tokens`` only if given), ``special_ids`` counted as 0: the instances' tokens lie
        back to back in the shards, so this equals counting every instance's ``input_ids``."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        left = max_tokens
        for ids in self._ids:
            n = len(ids) if left is None else min(len(ids), left)
            for a in range(0, n, _COUNT_CHUNK_TOKENS):  # bincount widens to int64: by chunks
                chunk = np.asarray(ids[a : min(a + _COUNT_CHUNK_TOKENS, n)])
                counts += np.bincount(chunk, minlength=vocab_size)[:vocab_size]
            if left is not None:
                left -= n
                if left <= 0:
                    break
        counts[sorted(special_ids)] = 0
        return counts

    def cooccurrence_counts(
        self,
        vocab_size: int,
        contexts: np.ndarray,
        window: int,
        special_ids: Iterable[int] = (),
        max_tokens: int | None = None,
    ) -> torch.Tensor:
        """(vocab_size, len(contexts)) float32 matrix: entry (w, j) counts how often token id
        ``contexts[j]`` occurs within ``window`` tokens of ``w`` inside one sequence, each
        occurrence weighted 1/distance (read shard by shard; the first ``max_tokens`` only if
        given). Pairs that cross from one sequence into the next, or involve a special token,
        are not counted. Counted exactly in integers per shard and distance (so the result does
        not depend on the order of additions), in blocks of at most ``_COUNT_BLOCK_CELLS`` cells
        of rows, ``_COUNT_CHUNK_TOKENS`` tokens at a time: memory stays ~0.5 GB for an 8k
        vocabulary whatever the shard's size (whole 64M-token shards took ~3 GB)."""
        n_ctx = len(contexts)
        column = torch.full((vocab_size,), -1, dtype=torch.int64)
        column[torch.as_tensor(np.asarray(contexts, dtype=np.int64))] = torch.arange(n_ctx)
        symmetric = n_ctx == vocab_size and bool((column == torch.arange(vocab_size)).all())
        block = max(1, min(vocab_size, _COUNT_BLOCK_CELLS // n_ctx))
        counts = torch.zeros(vocab_size, n_ctx)
        tally = torch.zeros(block * n_ctx + 1, dtype=torch.int32)  # the last cell: not counted
        word_of = torch.arange(vocab_size)  # a token's row; -1: special, never counted
        word_of[torch.as_tensor(sorted(special_ids), dtype=torch.int64)] = -1
        ones = torch.ones(_COUNT_CHUNK_TOKENS, dtype=torch.int32)
        left = max_tokens
        for ids, idx in zip(self._ids, self._idx, strict=True):
            n = len(ids) if left is None else min(len(ids), left)
            first = np.array(idx[1:, 0])  # where the shard's sequences start (after the first)

            for distance in range(1, window + 1):
                for lo in range(0, vocab_size, block):
                    hi = min(lo + block, vocab_size)
                    tally.zero_()  # exact integer counts of the whole shard at this distance
                    for a in range(0, n - distance, _COUNT_CHUNK_TOKENS):
                        end = min(a + _COUNT_CHUNK_TOKENS, n - distance) + distance
                        tokens = np.asarray(ids[a:end]).astype(np.int64)
                        ends = np.searchsorted(first, np.arange(a, end), "right")
                        same, pairs = _pairs_at(tokens, ends, distance, word_of, column, symmetric)
                        for word, context in pairs:
                            ok = same & (word >= lo) & (word < hi) & (context >= 0)
                            cells = torch.where(ok, (word - lo) * n_ctx + context, block * n_ctx)
                            tally.index_add_(0, cells, ones[: len(cells)])
                    rows = tally[: (hi - lo) * n_ctx].view(hi - lo, n_ctx)
                    counts[lo:hi].add_(rows, alpha=1.0 / distance)
            if left is not None:
                left -= n
                if left <= 0:
                    break
        return counts + counts.T if symmetric else counts

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """``[self[i] for i in indices]``, with the shard look-up and the index rows read for all
        of them at once (the name torch's DataLoader uses for a batched fetch). A GPU step's
        256 sequences otherwise hold the interpreter lock for milliseconds per step, time taken
        from the thread that launches the device's work."""
        at = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if at.size and not (at.min() >= -n and at.max() < n):
            bad = int(at[(at < -n) | (at >= n)][0])
            raise IndexError(f"index {bad} out of range for {n} examples")
        at %= max(n, 1)
        shards = np.searchsorted(self._ends, at, side="right")
        starts = np.concatenate([[0], self._ends[:-1]])
        items = []
        for shard, local in zip(shards.tolist(), (at - starts[shards]).tolist(), strict=True):
            offset, length, b_start, label = self._idx[shard][local].tolist()
            types = np.zeros(length, dtype=np.int64)
            types[b_start:] = 1
            ids = self._ids[shard][offset : offset + length].astype(np.int64)
            items.append({"input_ids": ids, "token_type_ids": types, "next_sentence_label": label})
        return items

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} examples")
        index %= n
        shard = int(np.searchsorted(self._ends, index, side="right"))
        local = index - (int(self._ends[shard - 1]) if shard else 0)
        offset, length, b_start, label = self._idx[shard][local].tolist()
        ids = np.array(self._ids[shard][offset : offset + length], dtype=np.int64)
        types = np.zeros(length, dtype=np.int64)
        types[b_start:] = 1
        return {"input_ids": ids, "token_type_ids": types, "next_sentence_label": label}
