"""Labelled task files (``bertforge.data.labelled.load_labelled``): a label typo, ragged rows and
broken quoting are reported with the file, the line and the fix, never trained on silently."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import TaskFiles, noise

from bertforge.data.corpus import read_documents
from bertforge.data.labelled import load_labelled
from bertforge.data.tables import read_texts
from bertforge.errors import BertforgeError


def _labelled(tmp_path: Path, extra: list[dict]) -> Path:
    rows = [{"text": f"text {i}", "label": 1 + i % 4} for i in range(40)]
    rows[11:11] = extra
    path = tmp_path / "train.csv"
    TaskFiles.write_rows(path, rows)
    return path


def test_a_label_typo_is_reported_with_its_count_and_rows_unless_accepted(tmp_path):
    path = _labelled(tmp_path, [{"text": "a typo", "label": "x"}])
    columns = dict(text_column="text", label_column="label")
    with pytest.raises(BertforgeError) as err:
        load_labelled(path, **columns)
    message = str(err.value)
    assert "'x' (1 row: line 13)" in message and "--allow_rare_labels" in message
    data, id2label = load_labelled(path, **columns, allow_rare_labels=True)
    assert list(id2label.values()) == ["1", "2", "3", "4", "x"] and len(data) == 41


def test_ragged_rows_and_broken_quoting_name_the_file_and_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\ngood film,1\nbad film\nok,2\n")
    with pytest.raises(BertforgeError, match=r"ragged.csv:3: 1 field where the header has 2"):
        load_labelled(path, text_column="text", label_column="label")
    path.write_text("text,label\ngood film,1\nbad film,2,3\nok,2\n")
    with pytest.raises(BertforgeError, match=r"ragged.csv:3: 3 fields where the header has 2"):
        load_labelled(path, text_column="text", label_column="label")
    path = tmp_path / "quote.csv"
    path.write_text('text,label\ngood film,1\n"bad film,2\nok,2\nfine,1\n')
    with pytest.raises(BertforgeError, match=r"quote.csv:3: a quoted field opened here"):
        load_labelled(path, text_column="text", label_column="label")
    path = tmp_path / "missing.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n')
    with pytest.raises(BertforgeError, match=r"missing.jsonl:2: no 'label'"):
        load_labelled(path, text_column="text", label_column="label")


def test_a_utf8_bom_is_read_as_nothing_everywhere(tmp_path):
    rng = random.Random(5)
    rows = [{"label": i % 2, "text": noise(rng)} for i in range(10)]
    TaskFiles.write_rows(tmp_path / "plain.csv", rows)
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "plain.csv").read_bytes())
    data, _ = load_labelled(bom, text_column="text", label_column="label")
    assert data.labels.tolist() == [r["label"] for r in rows]  # not "no column 'label'"
    docs = list(read_documents(bom, text_column="label"))
    assert docs[0] == ["0"]
    text = tmp_path / "notes.txt"
    text.write_bytes("\ufeffHello there.\n".encode())
    assert read_texts(text)[0] == ["Hello there."]
    assert list(read_documents(text)) == [["Hello there."]]
