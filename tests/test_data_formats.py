"""Corpora and tables in Parquet, Arrow, ``datasets`` folders and zstd: the same documents, shards,
tokenizer text and labelled rows as from the same text in plain or bzip2 files, and the missing
extras as one-line errors (the damaged files are cases of tests/test_bad_input.py)."""

from __future__ import annotations

import bz2
import itertools
import json
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertforge import cli
from bertforge.cli.tokenizer import TokenizerTrainConfig, training_text
from bertforge.data import columnar
from bertforge.data.corpus import iter_documents
from bertforge.data.labelled import load_labelled
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.data.tables import iter_texts, read_texts
from bertforge.data.tagging import texts_to_tag
from bertforge.errors import BertforgeError
from bertforge.io import text_lines
from bertforge.tokenizer.wordpiece import Tokenizer


def _zstd_frames(data: bytes, parts: int = 3) -> bytes:
    """``data`` as ``parts`` zstd frames one after the other (what ``pzstd`` and ``cat`` write)."""
    step = len(data) // parts + 1
    return b"".join(
        zstandard.ZstdCompressor().compress(data[i : i + step]) for i in range(0, len(data), step)
    )


@pytest.fixture(scope="module")
def docs(shared_data: Path) -> list[list[str]]:
    """The first 12 articles of the general corpus, as lines (paragraphs)."""
    found: list[list[str]] = []
    doc: list[str] = []
    for line in text_lines(shared_data / "general" / "wikipedia-00.txt.bz2"):
        if line.strip():
            doc.append(line.rstrip("\n"))
        elif doc:
            found.append(doc)
            doc = []
            if len(found) == 12:
                break
    return found


@pytest.fixture(scope="module")
def containers(docs, tmp_path_factory) -> dict[str, Path]:
    """The same articles in every container: text (plain, bz2, several zstd frames), JSON lines
    in zstd, a Parquet file of several row groups beside an id column, a folder of two Parquet
    files, and a folder ``datasets``' save_to_disk wrote in three Arrow files."""
    root = tmp_path_factory.mktemp("formats")
    text = "".join("\n".join(d) + "\n\n" for d in docs).encode()
    cells = ["\n".join(d) for d in docs]
    (root / "c.txt").write_bytes(text)
    (root / "c.txt.bz2").write_bytes(bz2.compress(text))
    (root / "c.txt.zst").write_bytes(_zstd_frames(text))
    rows = "".join(json.dumps({"text": c}) + "\n" for c in cells).encode()
    (root / "c.jsonl.zst").write_bytes(_zstd_frames(rows))
    table = pa.table({"id": list(range(len(cells))), "text": cells})
    pq.write_table(table, root / "c.parquet", row_group_size=5)
    (root / "hub" / "data").mkdir(parents=True)
    pq.write_table(table.slice(0, 7), root / "hub" / "data" / "train-00000-of-00002.parquet")
    pq.write_table(table.slice(7), root / "hub" / "data" / "train-00001-of-00002.parquet")
    datasets.Dataset.from_dict({"text": cells}).save_to_disk(root / "ds", num_shards=3)
    return {p.name: p for p in root.iterdir()}


def test_every_container_gives_the_same_shards_as_the_text(containers, tmp_path) -> None:
    assert len(list((containers["ds"]).glob("data-*.arrow"))) == 3
    tok = Tokenizer.train([containers["c.txt"]], vocab_size=600)
    shards: dict[str, dict[str, bytes]] = {}
    for name, path in containers.items():
        out = tmp_path / name
        column = None if name.startswith("c.txt") else "text"
        cfg = PrepareConfig([str(path)], "", str(out), text_column=column, progress=False)
        cfg.validation_fraction = 0.2
        summary = prepare(cfg, tok)
        assert summary["documents"] == 12, name
        shards[name] = {p.name: p.read_bytes() for p in out.glob("*-*.i*")}
    reference = shards.pop("c.txt")
    assert {"train-00000.ids", "train-00000.idx", "validation-00000.ids"} <= set(reference)
    for name, files in shards.items():
        assert files == reference, name  # byte for byte


def test_tokenizer_text_tables_and_iter_texts_read_every_container(containers, docs) -> None:
    """``tokenizer train`` trains on the sentences of the column, whatever holds it;
    ``iter_texts`` (the streaming reader for distill) yields each row's text."""
    tables = ["c.jsonl.zst", "c.parquet", "hub", "ds"]
    seen = [
        list(training_text(TokenizerTrainConfig([str(containers[n])], 100, "o", "text")))
        for n in tables
    ]
    sentences = [s for doc in iter_documents([containers["c.txt"]]) for s in doc]
    assert all(s == sentences for s in seen) and len(sentences) > 100
    cells = ["\n".join(d) for d in docs]
    for name in tables:
        assert list(iter_texts(containers[name])) == cells
    # what classify, embed, fill-mask (read_texts) and tag (texts_to_tag) read from --input
    assert read_texts(containers["ds"])[0] == cells == texts_to_tag(containers["c.parquet"])
    lines = [line for d in docs for line in d]
    assert list(iter_texts([containers["c.txt.zst"], containers["c.txt.bz2"]])) == lines * 2


def test_finetune_reads_labelled_parquet_and_datasets_as_csv(task_files, tmp_path) -> None:
    rows = task_files.write_sentiment(tmp_path / "train.csv", 24, seed=3)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet", row_group_size=10)
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "ds")
    reference, labels = load_labelled(
        tmp_path / "train.csv", text_column="text", label_column="label"
    )
    for path in (tmp_path / "train.parquet", tmp_path / "ds"):
        data, id2label = load_labelled(path, text_column="text", label_column="label")
        assert data.texts == reference.texts and id2label == labels
        assert data.labels.tolist() == reference.labels.tolist()
    scored = [{"text": r["text"], "score": float(i % 3)} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(scored), tmp_path / "scores.parquet")
    data, _ = load_labelled(
        tmp_path / "scores.parquet", text_column="text", label_column="score", task="regression"
    )
    assert data.labels.tolist() == [r["score"] for r in scored]
    empty = [{"text": "", "label": "pos"}, *rows]
    pq.write_table(pa.Table.from_pylist(empty), tmp_path / "empty.parquet")
    with pytest.raises(BertforgeError, match=r"empty.parquet:row 1: empty 'text'"):
        load_labelled(tmp_path / "empty.parquet", text_column="text", label_column="label")


def test_finetune_a_parquet_folder_and_evaluate_a_datasets_folder(start, task_files, tmp_path):
    """The commands end to end: ``finetune --train`` of a folder of two Parquet files (the Hub's
    layout) and ``evaluate --data`` of a save_to_disk folder holding the same rows."""
    rows = task_files.write_sentiment(tmp_path / "train.csv", 32, seed=5)
    (tmp_path / "data").mkdir()
    for part, chunk in enumerate((rows[:16], rows[16:])):
        pq.write_table(pa.Table.from_pylist(chunk), tmp_path / "data" / f"train-{part}.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "ds")
    run = tmp_path / "run"
    argv = ["finetune", "--model", str(start), "--train", str(tmp_path / "data")]
    argv += ["--output", str(run), "--max_steps", "2", "--batch_size", "8", "--max_length", "16"]
    assert cli.main([*argv, "--progress", "false", "--num_threads", "1"]) == 0
    results = tmp_path / "results.json"
    assert task_files.evaluate_cli(run, tmp_path / "ds", results, "--num_threads", "1") == 0
    scored = json.loads(results.read_text())
    assert scored["data"] == [str(tmp_path / "ds")] and 0.0 <= scored["accuracy"] <= 1.0
    assert scored["examples"] == len(rows)


def test_parquet_is_read_in_batches_of_bounded_bytes_within_row_groups(
    tmp_path, monkeypatch
) -> None:
    """Batches hold about BATCH_BYTES of rows however long the rows (pyarrow's own batches count
    rows, across row groups), and end where a row group ends."""
    monkeypatch.setattr(columnar, "BATCH_BYTES", 1_000_000)  # 10 rows of 100 kB
    rows = [f"{i} " + "word " * 20_000 for i in range(60)]
    pq.write_table(pa.table({"text": rows}), tmp_path / "long.parquet", row_group_size=50)
    batches = [b["text"] for b in columnar.column_batches(tmp_path / "long.parquet", ["text"])]
    sizes = [len(b) for b in batches]
    assert 8 <= max(sizes) <= 10 and 50 in itertools.accumulate(sizes), sizes
    assert [t for b in batches for t in b] == rows


def test_without_pyarrow_or_zstandard_the_error_names_the_extra(containers, monkeypatch) -> None:
    for module in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc", "zstandard", "compression"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(BertforgeError) as err:
        list(iter_documents([containers["c.parquet"]], text_column="text"))
    assert str(err.value).endswith("needs pyarrow; pip install 'bertforge[parquet]'")
    with pytest.raises(BertforgeError) as err:
        list(iter_documents([containers["c.txt.zst"]]))
    assert str(err.value).endswith("needs the zstandard package; pip install 'bertforge[zstd]'")


def test_a_read_meter_moves_only_for_its_own_files_and_its_own_thread(tmp_path):
    """``metered_reads``: its files' bytes count when ``text_lines`` finishes them; a nested block
    meters its own files and gives the outer meter back; a thread reading the same file at the
    same time does not move the meter of the block that is running in another."""
    import threading

    from bertforge.io import metered_reads

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\ntwo\n", encoding="utf-8")
    b.write_text("three\n", encoding="utf-8")
    with metered_reads([a, b]) as outer:
        assert outer.fraction() == 0.0
        list(text_lines(a))
        assert outer.fraction() == pytest.approx(8 / 14)
        with metered_reads([b]) as inner:
            list(text_lines(b))
            assert inner.fraction() == 1.0
        assert outer.fraction() == pytest.approx(8 / 14)  # b was read for the inner block
        reader = threading.Thread(target=lambda: list(text_lines(b)))
        reader.start()
        reader.join()
        assert outer.fraction() == pytest.approx(8 / 14)  # another thread's read
        list(text_lines(b))
        assert outer.fraction() == 1.0
