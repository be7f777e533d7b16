"""Labelled task files (``bertforge.data.tasks.load_labelled``): a label typo, ragged rows and
broken quoting are reported with the file, the line and the fix, never trained on silently."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TaskFiles

from bertforge.data import tasks
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
        tasks.load_labelled(path, **columns)
    message = str(err.value)
    assert "'x' (1 row: line 13)" in message and "--allow_rare_labels" in message
    data, id2label = tasks.load_labelled(path, **columns, allow_rare_labels=True)
    assert list(id2label.values()) == ["1", "2", "3", "4", "x"] and len(data) == 41


def test_ragged_rows_and_broken_quoting_name_the_file_and_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\ngood film,1\nbad film\nok,2\n")
    with pytest.raises(BertforgeError, match=r"ragged.csv:3: 1 field where the header has 2"):
        tasks.load_labelled(path, text_column="text", label_column="label")
    path.write_text("text,label\ngood film,1\nbad film,2,3\nok,2\n")
    with pytest.raises(BertforgeError, match=r"ragged.csv:3: 3 fields where the header has 2"):
        tasks.load_labelled(path, text_column="text", label_column="label")
    path = tmp_path / "quote.csv"
    path.write_text('text,label\ngood film,1\n"bad film,2\nok,2\nfine,1\n')
    with pytest.raises(BertforgeError, match=r"quote.csv:3: a quoted field opened here"):
        tasks.load_labelled(path, text_column="text", label_column="label")
    path = tmp_path / "missing.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n')
    with pytest.raises(BertforgeError, match=r"missing.jsonl:2: no 'label'"):
        tasks.load_labelled(path, text_column="text", label_column="label")
