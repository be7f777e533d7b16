"""Reading corpora: sentence splitting, every input format, stable expansion, bad input."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import pytest

from bertforge.data.corpus import (
    detect_format,
    expand_inputs,
    iter_documents,
    read_documents,
    split_sentences,
)
from bertforge.errors import BertforgeError
from bertforge.tokenizer.wordpiece import Tokenizer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Dr. Smith paid $3.50 for it. Then he left!",
            ["Dr. Smith paid $3.50 for it.", "Then he left!"],
        ),
        (
            '"Really?" she asked. "Yes." He nodded.',
            ['"Really?" she asked.', '"Yes."', "He nodded."],
        ),
        (
            "J. R. R. Tolkien wrote it, e.g. The Hobbit. It was 1937.",
            ["J. R. R. Tolkien wrote it, e.g. The Hobbit.", "It was 1937."],
        ),
        (
            "Pi is 3.14159 roughly. The U.S. Army came. Mr. T is here.",
            ["Pi is 3.14159 roughly.", "The U.S. Army came.", "Mr. T is here."],
        ),
        ("He said (quietly.) Then went.", ["He said (quietly.)", "Then went."]),
        ("Great film!<br /><br />A must see.", ["Great film!", "A must see."]),
        ("no capital after. so one sentence", ["no capital after. so one sentence"]),
        ("   ", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_plain_text_blank_line_separates_documents(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text(
        "First sentence.\nSecond one. Third one here.\n\n\nOther doc.\n", encoding="utf-8"
    )
    assert detect_format(path) == "text"
    assert list(read_documents(path)) == [
        ["First sentence.", "Second one.", "Third one here."],
        ["Other doc."],
    ]


def test_one_document_per_line_is_detected_and_gzip_is_transparent(tmp_path: Path) -> None:
    path = tmp_path / "reviews.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("Great movie. Loved it.<br />Really.\nAwful. Avoid.\nMeh it was ok.\n")
    assert detect_format(path) == "lines"
    assert list(read_documents(path)) == [
        ["Great movie.", "Loved it.", "Really."],
        ["Awful.", "Avoid."],
        ["Meh it was ok."],
    ]


@pytest.mark.parametrize("opener", [bz2.open, lzma.open], ids=["bz2", "xz"])
def test_bz2_and_xz_files_stream_as_gzip_does(tmp_path: Path, opener) -> None:
    suffix = ".bz2" if opener is bz2.open else ".xz"
    text = tmp_path / f"books.txt{suffix}"
    with opener(text, "wt", encoding="utf-8") as f:
        f.write("Call me Ishmael. Some years ago I went.\nIt was cold.\n\nA second book.\n")
    table = tmp_path / f"rows.csv{suffix}"
    with opener(table, "wt", encoding="utf-8") as f:
        f.write("label,text\n1,Good film. Loved it.\n")
    assert detect_format(text) == "text" and detect_format(table) == "csv"
    assert list(read_documents(text)) == [
        ["Call me Ishmael.", "Some years ago I went.", "It was cold."],
        ["A second book."],
    ]
    assert list(read_documents(table, text_column="text")) == [["Good film.", "Loved it."]]
    assert expand_inputs([tmp_path]) == sorted([table, text])
    bad = tmp_path / f"bad.txt{suffix}"
    with opener(bad, "wb") as f:
        f.write(b"fine line\ncaf\xe9 au lait\n")
    with pytest.raises(
        BertforgeError, match=rf"bad.txt\{suffix}:2: not UTF-8 .*after decompression"
    ):
        list(read_documents(bad, format="text"))
    cut = tmp_path / f"cut.txt{suffix}"
    cut.write_bytes(text.read_bytes()[:20])
    with pytest.raises(BertforgeError, match="cannot read the file"):
        list(read_documents(cut, format="text"))


def test_paragraph_per_line_books_longer_than_the_old_64k_scan_are_documents(tmp_path: Path):
    # ../shared/data/general's layout: one paragraph a line, a blank line between books; the
    # first book runs for hundreds of kilobytes before its blank line
    paragraph = "It was a dark night. The wind blew hard, and Mr. Holmes sat by the fire."
    book = "\n".join([paragraph] * 3000)  # ~220 KB
    path = tmp_path / "gutenberg.txt.bz2"
    with bz2.open(path, "wt", encoding="utf-8") as f:
        f.write(book + "\n\n" + book + "\n")
    assert detect_format(path) == "text"
    documents = list(read_documents(path))
    assert len(documents) == 2
    assert documents[0][:3] == [
        "It was a dark night.",
        "The wind blew hard, and Mr. Holmes sat by the fire.",
        "It was a dark night.",
    ]
    assert len(documents[0]) == 6000


def test_wikitext_titles_start_documents_and_sections_do_not(tmp_path: Path) -> None:
    path = tmp_path / "wiki.valid.tokens"
    path.write_text(
        " \n = Alpha = \n \n It has 3 @.@ 5 legs . It is well @-@ known . \n"
        " \n = = History = = \n \n Founded in 1 @,@ 900 . \n \n = Beta = \n \n Beta text . \n",
        encoding="utf-8",
    )
    assert detect_format(path) == "wikitext"
    assert list(read_documents(path)) == [
        ["It has 3.5 legs .", "It is well-known .", "Founded in 1,900 ."],
        ["Beta text ."],
    ]


def test_real_wikitext_has_one_document_per_article(shared_data: Path) -> None:
    docs = list(read_documents(shared_data / "wikitext2" / "wiki.valid.tokens"))
    assert len(docs) == 60  # the README counts 60 articles
    assert all(len(doc) > 1 for doc in docs)


def test_csv_tsv_jsonl_with_text_column_and_multiline_cells(tmp_path: Path) -> None:
    csv_path = tmp_path / "d.csv"
    csv_path.write_text(
        'id,text\n1,"Line one.\nLine two, same cell."\n2,Short one.\n', encoding="utf-8"
    )
    assert list(read_documents(csv_path, text_column="text")) == [
        ["Line one.", "Line two, same cell."],
        ["Short one."],
    ]
    tsv_path = tmp_path / "d.tsv"
    tsv_path.write_text("text\tlabel\nA tab row. Two.\t1\n", encoding="utf-8")
    assert list(read_documents(tsv_path, text_column="text")) == [["A tab row.", "Two."]]
    jsonl = tmp_path / "d.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        f.write(
            json.dumps({"body": "One.\nTwo here.", "x": 1})
            + "\n\n"
            + json.dumps({"body": "Three."})
            + "\n"
        )
    assert list(read_documents(jsonl, text_column="body")) == [["One.", "Two here."], ["Three."]]


def test_real_imdb_csv_strips_br_tags(shared_data: Path) -> None:
    docs = iter_documents([shared_data / "imdb" / "train-00.csv.gz"], text_column="text")
    first = [next(docs) for _ in range(300)]
    assert all("<br" not in s for doc in first for s in doc)
    assert sum(len(doc) for doc in first) > 1500  # reviews are split into sentences


def test_directories_and_globs_expand_in_sorted_order(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", "sub/c.txt.gz", "README.md", ".hidden.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert [p.relative_to(tmp_path).as_posix() for p in expand_inputs([tmp_path])] == [
        "a.txt",
        "b.txt",
        "sub/c.txt.gz",
    ]
    assert [p.name for p in expand_inputs([str(tmp_path / "*.txt")])] == ["a.txt", "b.txt"]
    assert [p.name for p in expand_inputs([str(tmp_path / "[ab].txt")])] == ["a.txt", "b.txt"]


def test_missing_input_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(BertforgeError, match="nope.txt: no such file"):
        expand_inputs([tmp_path / "nope.txt"])
    with pytest.raises(BertforgeError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.none")])


def test_invalid_utf8_reports_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Good line.\nBad \xff byte.\n")
    with pytest.raises(
        BertforgeError,
        match=r"bad.txt:2: not UTF-8 text .*at character 5.*--encoding_errors replace",
    ):
        list(read_documents(path))
    assert list(read_documents(path, encoding_errors="replace")) == [
        ["Good line.", "Bad \ufffd byte."]
    ]


def test_csv_without_the_column_lists_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("label,review\n1,Nice.\n", encoding="utf-8")
    with pytest.raises(
        BertforgeError, match=r"no column 'text'; the columns are \['label', 'review'\]"
    ):
        list(read_documents(path, text_column="text"))
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"a": "x"}\n', encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"the keys are \['a'\]"):
        list(read_documents(jsonl, text_column="text"))


# ---- wikitext ------------------------------------------------------------------------------------


def test_wikitext_unk_becomes_one_unk_token(tmp_path, mlm_dir):
    wiki = tmp_path / "wiki.valid.tokens"
    wiki.write_text(" = Title = \n\n The <unk> was in 1990 and <unk> @-@ like . \n")
    docs = list(read_documents(wiki))
    assert docs == [["The [UNK] was in 1990 and [UNK]-like ."]]
    tok = Tokenizer.from_file(mlm_dir)
    ids = tok.backend.encode(docs[0][0], add_special_tokens=False).ids
    assert ids.count(tok.unk_id) >= 2 and "unk" not in tok.decode(ids)
