"""bertforge prepare and the memmap reader: round trips, atomic output, checks, bad input."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FILLER
from support.cli import Terminal, run_cli

from bertforge.cli import main as cli_main
from bertforge.data import shards
from bertforge.data.corpus import iter_documents
from bertforge.data.shards import PrepareConfig, PretrainingDataset, prepare
from bertforge.errors import BertforgeError
from bertforge.io import write_manifest
from bertforge.tokenizer.wordpiece import Tokenizer


def prepare_quietly(
    path: Path, tokenizer: Tokenizer, out: Path, *, knobs: dict | None = None, **options
) -> dict:
    """``prepare`` one file with ``tokenizer`` (``options``: :class:`PrepareConfig` fields;
    ``knobs``: ``chunk_chars``/``shard_tokens``) without a progress bar; returns its summary."""
    cfg = PrepareConfig([str(path)], "", str(out), progress=False, **options)
    return prepare(cfg, tokenizer, **(knobs or {}))


@pytest.fixture(scope="module")
def tokenizer(shakespeare_file: Path) -> Tokenizer:
    return Tokenizer.train([shakespeare_file], vocab_size=800)


@pytest.fixture(scope="module")
def tok_dir(tokenizer: Tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok")
    tokenizer.save(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data: Path) -> Path:
    """WikiText valid (60 articles) as a small real corpus."""
    return shared_data / "wikitext2" / "wiki.valid.tokens"


def test_prepare_takes_a_published_model_name_for_its_tokenizer(minilm_dir, tmp_path, capsys):
    # --tokenizer all-MiniLM-L6-v2 is the installed model's tokenizer, as --model resolves it
    text = tmp_path / "c.txt"
    text.write_text("One sentence here. And a second one.\n\nOther doc. Two more.\n")
    argv = ["prepare", "--input", str(text), "--output", str(tmp_path / "d"), "--mode", "packed"]
    assert cli_main([*argv, "--tokenizer", "all-MiniLM-L6-v2", "--progress", "false"]) == 0, (
        capsys.readouterr().err
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["vocab_size"] == Tokenizer.from_file(minilm_dir).vocab_size == 30522


def test_nsp_data_round_trip(corpus: Path, tokenizer: Tokenizer, tmp_path: Path) -> None:
    out = tmp_path / "data"
    summary = prepare_quietly(corpus, tokenizer, out, max_seq_length=64, validation_fraction=0.05)
    ds = PretrainingDataset(out, "train", tokenizer)
    val = PretrainingDataset(out, "validation", tokenizer)
    assert len(ds) == summary["instances"]["train"] > 500 and len(val) > 10
    assert ds.meta["mode"] == "nsp" and ds.meta["vocab_size"] == tokenizer.vocab_size
    assert ds.meta["dtype"] == "uint16" and summary["documents_used"]["validation"] == 3
    labels = []
    for i in range(len(ds)):
        ex = ds[i]
        ids, types = ex["input_ids"], ex["token_type_ids"]
        assert ids.dtype == np.int64 and len(ids) <= 64 and len(ids) == len(types)
        seps = np.flatnonzero(ids == tokenizer.sep_id)
        assert ids[0] == tokenizer.cls_id and len(seps) == 2 and seps[1] == len(ids) - 1
        assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1 :] == 1).all()
        assert not np.isin(ids[1:-1], [tokenizer.cls_id, tokenizer.pad_id, tokenizer.mask_id]).any()
        labels.append(ex["next_sentence_label"])
    assert set(labels) == {0, 1} and 0.45 < np.mean(labels) < 0.56
    assert np.array_equal(ds.lengths, [len(ds[i]["input_ids"]) for i in range(len(ds))])
    # the tokenizer travels with the data
    assert Tokenizer.from_file(ds.tokenizer_dir).fingerprint == tokenizer.fingerprint
    assert type(ds[0]["input_ids"]) is np.ndarray
    assert "common lobster" in tokenizer.decode(ds[0]["input_ids"].tolist())  # the first article


@pytest.mark.slow
def test_packed_shards_reproduce_the_token_stream_exactly(
    corpus: Path, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    out = tmp_path / "packed"
    prepare_quietly(
        corpus,
        tokenizer,
        out,
        max_seq_length=48,
        mode="packed",
        validation_fraction=0.0,
        knobs={"shard_tokens": 20_000, "chunk_chars": 50_000},
    )
    ds = PretrainingDataset(out, "train", tokenizer)
    assert len(ds.meta["splits"]["train"]["shards"]) > 3  # several shards, read as one
    stream = []
    for i in range(len(ds)):
        ex = ds[i]
        assert ex["next_sentence_label"] == -1 and not ex["token_type_ids"].any()
        assert len(ex["input_ids"]) <= 48 and ex["input_ids"][0] == tokenizer.cls_id
        body = ex["input_ids"][1:-1]
        assert body[0] != tokenizer.sep_id
        stream.append(body[body != tokenizer.sep_id])  # drop document separators
    sentences = [s for doc in iter_documents([corpus]) for s in doc]
    expected = [np.array(e.ids) for e in tokenizer.backend.encode_batch(sentences)]
    assert np.array_equal(np.concatenate(stream), np.concatenate(expected))


def test_interrupted_prepare_leaves_nothing(
    corpus: Path, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Fine text here.\n\nThen \xc3\x28 broken.\n")
    out = tmp_path / "data"
    with pytest.raises(BertforgeError, match=r"bad.txt:3: not UTF-8 text"):
        prepare(PrepareConfig([str(corpus), str(bad)], "", str(out), progress=False), tokenizer)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]  # no temporary left
    # a directory without meta.json (what a killed run could leave under another name) is refused
    half = tmp_path / "half"
    half.mkdir()
    (half / "train-00000.ids").write_bytes(b"\0" * 64)
    with pytest.raises(BertforgeError, match="no meta.json, so not a complete prepared data set"):
        PretrainingDataset(half)


def test_tokenizer_and_format_mismatches_say_what_to_do(
    corpus: Path, tokenizer: Tokenizer, shakespeare_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "data"
    prepare_quietly(corpus, tokenizer, out, max_seq_length=32)
    other = Tokenizer.train([shakespeare_file], vocab_size=600)
    with pytest.raises(
        BertforgeError,
        match=rf"prepared with tokenizer {tokenizer.fingerprint} but "
        rf"the given tokenizer is {other.fingerprint}; use the tokenizer in .*tokenizer",
    ):
        PretrainingDataset(out, "train", other)
    meta = json.loads((out / "meta.json").read_text())
    shard = out / f"{meta['splits']['train']['shards'][0]['name']}.ids"
    shard.write_bytes(shard.read_bytes()[:-2])  # truncated shard
    with pytest.raises(
        BertforgeError, match=r"train-00000.ids: [\d,]+ bytes, the manifest recorded"
    ):
        PretrainingDataset(out)
    (out / "manifest.json").unlink()  # data of an older bertforge: meta.json's sizes still catch it
    with pytest.raises(
        BertforgeError, match="size differs from meta.json; re-run bertforge prepare"
    ):
        PretrainingDataset(out)
    meta["format_version"] = 99
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BertforgeError, match="format version 99, this bertforge reads version 1"):
        PretrainingDataset(out)
    with pytest.raises(BertforgeError, match="already exists; .* --overwrite"):
        prepare_quietly(corpus, tokenizer, out)


def test_short_documents_skipped_and_long_lines_split(tokenizer: Tokenizer, tmp_path: Path) -> None:
    text = tmp_path / "c.txt"
    long_line = " ".join(["word"] * 300)
    text.write_text(
        "Only one sentence here.\n\n" + "First of two. Second of two.\n\n" + long_line + "\n"
        "A closing sentence.\n\n   \n\nAnother single one.\n",
        encoding="utf-8",
    )
    summary = prepare_quietly(
        text, tokenizer, tmp_path / "nsp", max_seq_length=32, validation_fraction=0.0
    )
    assert summary["documents"] == 4
    assert summary["skipped_documents"] == {"fewer than 2 sentences (NSP)": 2}
    assert summary["long_sentences_split"] == 1
    packed = prepare_quietly(
        text,
        tokenizer,
        tmp_path / "packed",
        max_seq_length=32,
        mode="packed",
        validation_fraction=0.0,
    )
    ds = PretrainingDataset(tmp_path / "packed")
    n_word = sum(
        int((ds[i]["input_ids"] == tokenizer.token_to_id("word")).sum()) for i in range(len(ds))
    )
    assert n_word == 300 and packed["skipped_documents"] == {}


def _cli(capsys, *args: str) -> tuple[int, str]:
    rc = cli_main(["prepare", "--progress", "false", *args])
    return rc, capsys.readouterr().err


def test_cli_bad_inputs_give_one_line_errors(tok_dir: Path, tmp_path: Path, capsys) -> None:
    base = ["--tokenizer", str(tok_dir), "--output", str(tmp_path / "out")]
    rc, err = _cli(capsys, "--input", str(tmp_path / "missing.txt"), *base)
    assert rc == 2 and err.startswith("error: ") and "missing.txt: no such file" in err
    assert err.count("\n") == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    rc, err = _cli(capsys, "--input", str(empty), *base)
    assert rc == 2 and "no text found; the input is empty" in err
    table = tmp_path / "t.csv"
    table.write_text("label,review\n1,Good film. Loved it.\n", encoding="utf-8")
    rc, err = _cli(capsys, "--input", str(table), "--text_column", "text", *base)
    assert rc == 2 and "the columns are ['label', 'review']" in err
    bad = tmp_path / "bad.txt"
    bad.write_bytes(
        b"It was fine. Really \xff good.\nAnd more here. Yes indeed.\n\nOther doc. With two.\n"
    )
    rc, err = _cli(capsys, "--input", str(bad), *base)
    assert rc == 2 and "bad.txt:1: not UTF-8 text" in err
    rc, _ = _cli(
        capsys,
        "--input",
        str(bad),
        "--encoding_errors",
        "replace",
        "--validation_fraction",
        "0",
        "--max_seq_length",
        "16",
        *base,
    )
    assert rc == 0 and len(PretrainingDataset(tmp_path / "out")) > 0
    vocab = tmp_path / "novocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    rc, err = _cli(
        capsys, "--input", str(bad), "--tokenizer", str(vocab), "--output", str(tmp_path / "o2")
    )
    assert rc == 2 and "lacks the special token(s) [MASK]" in err


def test_exclude_drops_documents_of_an_evaluation_set(tokenizer: Tokenizer, tmp_path: Path) -> None:
    corpus = tmp_path / "unsup.txt"
    corpus.write_text(
        "A fine film. I liked it.<br />Really.\nBad plot. Bad acting.\nThird review. It is ok.\n",
        encoding="utf-8",
    )
    test_set = tmp_path / "test.csv"
    test_set.write_text('label,text\n1,"A fine film.  I liked it. Really."\n', encoding="utf-8")
    summary = prepare_quietly(
        corpus,
        tokenizer,
        tmp_path / "out",
        max_seq_length=16,
        validation_fraction=0.0,
        exclude=[str(test_set)],
        text_column="text",
    )
    assert summary["skipped_documents"] == {"text in --exclude": 1}
    assert summary["documents_used"]["train"] == 2


def test_dataset_pickles_as_a_reference(corpus: Path, tokenizer: Tokenizer, tmp_path: Path) -> None:
    import pickle

    prepare_quietly(corpus, tokenizer, tmp_path / "d", max_seq_length=32)
    ds = PretrainingDataset(tmp_path / "d", "validation", tokenizer)
    blob = pickle.dumps(ds)
    assert len(blob) < 2000  # the path, not the tokens
    again = pickle.loads(blob)
    assert len(again) == len(ds) and np.array_equal(again[3]["input_ids"], ds[3]["input_ids"])


def test_uint32_shards_read_back_equal(corpus: Path, tokenizer: Tokenizer, tmp_path: Path) -> None:
    """Vocabularies over 65,536 ids are stored as uint32; the reader follows meta.json's dtype."""
    out = tmp_path / "d"
    prepare_quietly(corpus, tokenizer, out, max_seq_length=32)
    before = PretrainingDataset(out, "validation")
    expected = [before[i]["input_ids"] for i in range(len(before))]
    meta = json.loads((out / "meta.json").read_text())
    for shard in meta["splits"]["validation"]["shards"]:
        path = out / f"{shard['name']}.ids"
        path.write_bytes(np.fromfile(path, dtype=np.uint16).astype(np.uint32).tobytes())
    meta["dtype"] = "uint32"
    (out / "meta.json").write_text(json.dumps(meta))
    write_manifest(out)  # the files were rewritten on purpose
    after = PretrainingDataset(out, "validation")
    assert all(np.array_equal(after[i]["input_ids"], e) for i, e in enumerate(expected))


def cooccurrence_by_loop(ds: PretrainingDataset, vocab: int, contexts, window: int, special):
    """The definition of ``cooccurrence_counts``, one pair at a time."""
    column = {int(c): j for j, c in enumerate(contexts)}
    counts = np.zeros((vocab, len(contexts)))
    for i in range(len(ds)):
        ids = [int(t) for t in ds[i]["input_ids"]]
        for p, word in enumerate(ids):
            for q in range(max(0, p - window), min(len(ids), p + window + 1)):
                context = ids[q]
                if q != p and word not in special and context not in special and context in column:
                    counts[word, column[context]] += 1.0 / abs(q - p)
    return counts


def test_cooccurrence_counts_equal_the_pair_by_pair_definition(
    corpus: Path, tokenizer: Tokenizer, tmp_path: Path, monkeypatch
) -> None:
    """Within sequences only, special tokens left out, 1/distance weights; the same across
    shards, with a subset of context words (the asymmetric path) and in row blocks."""
    import bertforge.data.dataset as dataset_module

    out = tmp_path / "data"
    prepare_quietly(
        corpus, tokenizer, out, max_seq_length=32, mode="packed", knobs={"shard_tokens": 4000}
    )
    ds = PretrainingDataset(out, "train", tokenizer)
    assert len(ds.meta["splits"]["train"]["shards"]) > 3
    vocab, special = tokenizer.vocab_size, set(tokenizer.special_ids)
    every = np.arange(vocab)
    some = np.sort(np.random.default_rng(0).choice(vocab, 97, replace=False))
    for contexts, window in ((every, 3), (some, 2)):
        expected = cooccurrence_by_loop(ds, vocab, contexts, window, special)
        if window == 3:
            expected_every = expected
        got = ds.cooccurrence_counts(vocab, contexts, window, special)
        assert got.shape == expected.shape and got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-4)
        assert expected.sum() > 1000 and (expected[sorted(special)] == 0).all()
    monkeypatch.setattr(dataset_module, "_COUNT_BLOCK_CELLS", 50 * 97)  # 50 rows at a time
    blocked = ds.cooccurrence_counts(vocab, some, 2, special)
    assert torch.equal(blocked, got)
    # a few tokens at a time: pairs across chunk edges (and not across sequences) still count
    monkeypatch.setattr(dataset_module, "_COUNT_BLOCK_CELLS", 1 << 26)
    monkeypatch.setattr(dataset_module, "_COUNT_CHUNK_TOKENS", 1001)
    assert torch.equal(ds.cooccurrence_counts(vocab, some, 2, special), got)
    whole = ds.cooccurrence_counts(vocab, every, 3, special)
    np.testing.assert_allclose(whole.numpy(), expected_every, rtol=1e-5, atol=1e-4)
    first = ds.cooccurrence_counts(vocab, every, 1, special, max_tokens=1000).sum()
    assert 0 < first < ds.cooccurrence_counts(vocab, every, 1, special).sum() / 10


@pytest.mark.parametrize("terminal", [True, False])
def test_prepare_draws_its_bar_only_on_a_terminal(
    corpus: Path, tokenizer: Tokenizer, tmp_path: Path, monkeypatch, terminal: bool
) -> None:
    """A log file gets the summary, not tqdm's carriage-return redraws."""
    import sys

    import bertforge.data.shards as shards

    seen: list[bool] = []

    def recording_tqdm(*args, **kwargs):
        seen.append(kwargs["disable"])
        return shards_tqdm(*args, **kwargs)

    shards_tqdm = shards.tqdm
    monkeypatch.setattr(shards, "tqdm", recording_tqdm)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal, raising=False)
    cfg = PrepareConfig([str(corpus)], "", str(tmp_path / "d"), max_seq_length=32, mode="packed")
    prepare(cfg, tokenizer)
    assert seen == [not terminal]


def test_prepare_in_a_log_file_says_how_far_it_has_read_every_few_percent(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Where no bar is drawn (a log file, a recipe's step) a long prepare prints a line every
    5% of its input's bytes on disk, compressed files by their compressed bytes, none before
    it has run PROGRESS_AFTER seconds (a short prepare says nothing); --progress false: none."""
    import gzip

    rng = random.Random(0)
    docs = ["\n".join(_filler(rng, 20) for _ in range(8)) for _ in range(200)]
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_text("\n\n".join(docs[:100]) + "\n")
    packed.write_bytes(gzip.compress(("\n\n".join(docs[100:]) + "\n").encode()))
    monkeypatch.setattr(shards, "PROGRESS_AFTER", 0.0)
    inputs = [str(plain), str(packed)]
    cfg = PrepareConfig(inputs, "", str(tmp_path / "d"), max_seq_length=32, mode="packed")
    prepare(cfg, tokenizer)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("prepare: ")]
    shares = [int(x.split("%")[0].removeprefix("prepare: ")) for x in lines]
    assert len(shares) >= 12 and shares == sorted(shares) and shares[-1] >= 95, lines
    assert all(b - a >= 5 for a, b in itertools.pairwise(shares)), " ".join(map(str, shares))
    assert "% of the input read, " in lines[0] and " tokens, " in lines[0] and " left" in lines[0]
    half = plain.stat().st_size / (plain.stat().st_size + packed.stat().st_size)
    assert any(abs(s / 100 - half) < 0.06 for s in shares)  # the first file ends there
    quiet = PrepareConfig(inputs, "", str(tmp_path / "q"), max_seq_length=32, mode="packed")
    prepare(replace(quiet, progress=False), tokenizer)
    assert "% of the input read" not in capsys.readouterr().err
    monkeypatch.setattr(shards, "PROGRESS_AFTER", 3600.0)
    prepare(replace(quiet, output=str(tmp_path / "s")), tokenizer)
    assert "% of the input read" not in capsys.readouterr().err


# ---- bertforge prepare: one error, small validation splits ---------------------------------------


def _filler(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(n)) + " ."


def test_prepare_errors_and_small_validation_splits(mlm_dir, tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    base = ["prepare", "--tokenizer", str(mlm_dir)]
    assert cli_main([*base, "--input", str(empty), "--output", str(tmp_path / "d0")]) == 2
    monkeypatch.undo()
    assert "prepare: 0 docs" not in terminal.text and terminal.text.count("error:") == 1
    # packed mode, 1 % of 60 documents: a validation split of one document
    rng = random.Random(0)
    docs = "\n\n".join(" ".join(_filler(rng) for _ in range(3)) for _ in range(60))
    (tmp_path / "c.txt").write_text(docs + "\n")
    argv = [*base, "--input", str(tmp_path / "c.txt"), "--mode", "packed", "--progress", "false"]
    code, out, _ = run_cli(
        [*argv, "--output", str(tmp_path / "d1"), "--max_seq_length", "16"], capsys
    )
    assert code == 0
    assert "warning: the validation split holds 1 document of 60" in out
    assert "--validation_fraction 0.09" in out  # about 5 documents


# ---- a killed prepare's temporary directory ---------------------------------------------------


def test_the_next_prepare_removes_what_a_killed_one_left_and_says_so(
    tokenizer, tmp_path, capsys, monkeypatch
):
    text = tmp_path / "c.txt"
    text.write_text("The film was good. It was long.\n\nA story about people. They went home.\n")
    out = tmp_path / "data"
    killed = tmp_path / ".data.tmp-k1ll3d"  # as atomic_directory names it; its writer is dead
    (killed / "tokenizer").mkdir(parents=True)
    (killed / "train-00000.bin").write_bytes(b"half")
    live = tmp_path / ".data.tmp-l1ve"  # another prepare into data/, still running: holds a lock
    live.mkdir()
    other = tmp_path / ".other.tmp-x"  # another output's: not this run's to judge
    other.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    seen = []

    def manifest_then_look(directory):  # inside the block: this run's own temporary is alive
        seen.extend(shards.remove_killed_temporaries(out))
        return write_manifest(directory)

    monkeypatch.setattr(shards, "write_manifest", manifest_then_look)
    try:
        prepare_quietly(text, tokenizer, out, max_seq_length=16, mode="packed")
    finally:
        os.close(fd)
    assert seen == []  # neither its own temporary nor the live one
    assert (
        not killed.exists() and live.exists() and other.exists() and (out / "meta.json").is_file()
    )
    err = capsys.readouterr().err
    assert f"prepare: removed {killed}, left by a killed run" in err
    assert "l1ve" not in err and "other" not in err
    # the lock is released with the process (here: the descriptor): now it is debris too
    assert shards.remove_killed_temporaries(out) == [live] and not live.exists()
