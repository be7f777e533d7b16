"""bertforge prepare --workers N: byte-identical output to one worker, and the chunk tokeniser."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main as cli_main
from bertforge.data.instances import split_long, tokenize_chunk
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.errors import BertforgeError
from bertforge.tokenizer.wordpiece import Tokenizer

TIMINGS = (
    "seconds",
    "tokens_per_second",
    "output",
    "workers",
    "tokenize_seconds",
    "waited_seconds",
)


@pytest.fixture(scope="module")
def tokenizer(shakespeare_file: Path) -> Tokenizer:
    return Tokenizer.train([shakespeare_file], vocab_size=800)


@pytest.fixture(scope="module")
def corpus(shared_data: Path, tmp_path_factory) -> Path:
    """WikiText valid plus documents that exercise every branch: an empty one, a one-sentence
    one (skipped in NSP mode) and a sentence far longer than a sequence (cut into pieces)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    wiki = (shared_data / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    text = []
    for i, line in enumerate(wiki.splitlines()[:1200]):
        if line.strip() and not line.startswith(" ="):
            text.append(line.strip())
            text.append("")  # every paragraph its own document: many documents and chunks
        if i == 400:
            text += ["Alone here.", "", " ".join(["word"] * 500) + ". Then an end.", ""]
    path.write_text("\n".join(text), encoding="utf-8")
    return path


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _meta_without_timings(directory: Path) -> dict:
    meta = json.loads((directory / "meta.json").read_text())
    for key in TIMINGS:
        meta["counts"].pop(key)
    return meta


@pytest.mark.parametrize("mode", ["nsp", "packed"])
def test_two_workers_write_the_same_bytes_as_one(
    mode: str, corpus: Path, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    options = dict(max_seq_length=48, mode=mode, validation_fraction=0.05, progress=False)
    # ~40 chunks: results must come back in order to match
    knobs = dict(chunk_chars=10_000, shard_tokens=15_000)
    one_cfg = PrepareConfig([str(corpus)], "", str(tmp_path / "one"), **options)
    two_cfg = PrepareConfig([str(corpus)], "", str(tmp_path / "two"), workers=2, **options)
    one = prepare(one_cfg, tokenizer, **knobs)
    two = prepare(two_cfg, tokenizer, **knobs)
    files_one, files_two = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert sorted(files_one) == sorted(files_two)
    assert sum(name.startswith("train-") for name in files_one) >= 6  # several shards
    for name in files_one:
        if name not in ("meta.json", "manifest.json"):  # timings, and the hash of meta.json
            assert files_one[name] == files_two[name], name
    assert _meta_without_timings(tmp_path / "one") == _meta_without_timings(tmp_path / "two")
    assert one["instances"] == two["instances"] and one["instances"]["validation"] > 0
    assert one["long_sentences_split"] >= 1
    if mode == "nsp":
        assert one["skipped_documents"]["fewer than 2 sentences (NSP)"] >= 1


def test_cli_workers_option(corpus: Path, tokenizer: Tokenizer, tmp_path: Path, capsys) -> None:
    tokenizer.save(tmp_path / "tok")
    args = ["prepare", "--input", str(corpus), "--tokenizer", str(tmp_path / "tok")]
    args += ["--max_seq_length", "64", "--progress", "false"]
    assert cli_main([*args, "--output", str(tmp_path / "a")]) == 0
    assert cli_main([*args, "--output", str(tmp_path / "b"), "--workers", "2"]) == 0
    assert (tmp_path / "a" / "train-00000.ids").read_bytes() == (
        tmp_path / "b" / "train-00000.ids"
    ).read_bytes()
    assert cli_main([*args, "--output", str(tmp_path / "c"), "--workers", "0"]) == 2
    assert "--workers 0: must be at least 1" in capsys.readouterr().err
    with pytest.raises(BertforgeError, match="--workers 0: must be at least 1"):
        prepare(PrepareConfig([str(corpus)], "", str(tmp_path / "d"), workers=0), tokenizer)


def test_tokenize_chunk_matches_sentence_by_sentence_encoding(tokenizer: Tokenizer) -> None:
    documents = [
        ["The first sentence.", "A second, longer sentence of the same document."],
        [""],  # a document with no tokens
        ["word " * 40],  # 40 tokens: cut into 24 + 16 at limit 24
    ]
    chunk = tokenize_chunk(tokenizer.backend, documents, limit=24)
    docs = chunk.documents()
    assert len(docs) == 3 and docs[1] == [] and chunk.n_cut == 1
    for document, pieces in zip(documents, docs, strict=True):
        expected, _ = split_long(
            [np.array(tokenizer.backend.encode(s, add_special_tokens=False).ids) for s in document],
            24,
        )
        assert len(pieces) == len(expected)
        for got, want in zip(pieces, expected, strict=True):
            assert got.dtype == np.int64 and np.array_equal(got, want)
    assert [len(p) for p in docs[2]] == [24, 16]
