"""Hostile and malformed input, generated with hypothesis: the tokenizer, every corpus and
table reader, fill-mask, classify and embed always give a result or bertforge's one-line error,
never a traceback and never a hang (each case runs under an alarm).

Example counts are bounded (support/reliability_table.py) and the search is derandomized, so the suite
stays fast and a failure reproduces; hypothesis prints the smallest failing input.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.reliability import record
from support.reliability_table import INFERENCE_EXAMPLES, READER_EXAMPLES, TEXT_EXAMPLES

from bertforge.data.corpus import read_documents
from bertforge.data.labelled import load_labelled
from bertforge.data.tables import read_table, read_texts
from bertforge.errors import BertforgeError
from bertforge.inference.predict import classify, embed, fill_mask
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification
from bertforge.tokenizer.wordpiece import Tokenizer

SECONDS_PER_CASE = 30  # a hang is a failure; generous because a CI machine may be shared
HUGE = 100_000  # characters of the long-text cases
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# characters that break naive code: NUL and controls, BOM, RTL marks and scripts, CJK, emoji
# (with joiners and skin tones), combining marks, unpaired surrogates, line separators
NASTY = [
    "\x00", "\x01", "\x1b", "\x7f", "\ufeff", "\u200b", "\u200d", "\u200f", "\u202e",
    "\u2028", "\u2029", "\r", "\r\n", "\t", "\x85", "\ud800", "\udfff", "\ufffd",
    "مرحبا", "שלום", "漢字かなカナ", "한국어", "🙂", "👩\u200d👩\u200d👧", "👍🏽", "e\u0301",
    "\u0300\u0301\u0302", "[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "##", "<br />",
]  # fmt: skip
texts = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=20)), max_size=30).map("".join)


@contextlib.contextmanager
def bounded(seconds: int = SECONDS_PER_CASE) -> Iterator[None]:
    """Fail (instead of hanging) when the block runs longer than ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Outcomes:
    """Counts results and documented errors; anything else propagates (a failure)."""

    def __init__(self) -> None:
        self.results = self.errors = 0

    def __call__(self, run: Callable[[], Any]) -> Any:
        with bounded():
            try:
                value = run()
            except BertforgeError as err:
                message = str(err)
                assert message and "\n" not in message, repr(message)
                self.errors += 1
                return None
        self.results += 1
        return value

    @property
    def total(self) -> int:
        return self.results + self.errors


@pytest.fixture(scope="module")
def models(task_files, tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hostile")
    path = task_files.tiny_start_model(root, kind="mlm")
    torch.manual_seed(0)
    return {
        "tokenizer": Tokenizer.from_file(path),
        "mlm": BertForMaskedLM.from_pretrained(path).eval(),
        "clf": BertForSequenceClassification.from_pretrained(
            path, num_labels=2, id2label={0: "neg", 1: "pos"}
        ).eval(),
    }


# ---- the tokenizer ---------------------------------------------------------------------------
def test_tokenizer_encodes_any_text(models):
    tokenizer, seen = models["tokenizer"], Outcomes()

    @settings(max_examples=TEXT_EXAMPLES, **SETTINGS)
    @given(text=texts, pair=st.none() | texts, max_length=st.none() | st.integers(3, 40))
    def check(text: str, pair: str | None, max_length: int | None) -> None:
        out = seen(lambda: tokenizer.encode(text, pair, max_length=max_length))
        if out is None:
            return
        ids = out["input_ids"]
        assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
        assert all(0 <= i < tokenizer.vocab_size for i in ids)
        assert max_length is None or len(ids) <= max_length
        seen(lambda: tokenizer.decode(ids))
        pairs = None if pair is None else [pair, pair]
        batch = seen(
            lambda: tokenizer.encode_batch([text, text[::-1]], pairs, max_length=max_length)
        )
        assert batch is not None and sum(batch["attention_mask"][0]) == len(ids)
        assert batch["input_ids"][0][: len(ids)] == ids  # the rest is padding

    check()
    huge = seen(lambda: tokenizer.encode("漢🙂 " * (HUGE // 3)))
    assert huge is not None and len(huge["input_ids"]) > HUGE // 3
    assert seen.results > 0 and seen.errors == 0  # text is never an error for the tokenizer
    record("tokenizer: hostile text", examples=seen.total, tracebacks=0)


# ---- corpus and table readers ----------------------------------------------------------------
CORPUS_NAMES = ["c.txt", "c.tokens", "c.csv", "c.tsv", "c.jsonl", "c.txt.gz", "c.jsonl.gz"]
TABLE_NAMES = ["t.csv", "t.tsv", "t.jsonl", "t.csv.gz"]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _read_everything(path: Path, seen: Outcomes) -> None:
    """Every reader that accepts this kind of file, with every option that changes parsing."""
    for errors in ("strict", "replace"):
        seen(lambda e=errors: list(read_documents(path, text_column="text", encoding_errors=e)))
    if not path.name.startswith("t."):
        return
    seen(lambda: read_table(path))
    seen(lambda: read_texts(path, "text"))
    for task in ("classification", "regression"):
        seen(lambda t=task: load_labelled(path, text_column="text", label_column="label", task=t))


# fragments of tables gone wrong: ragged rows, quoted newlines, stray quotes, NUL, lines that are
# JSON but not objects, invalid UTF-8 and Latin-1 bytes, a BOM, CRLF
FRAGMENTS = [
    b"text,label\n", b"text\tlabel\n", b'"a, b",pos\n', b"only one cell\n", b"a,b,c,d,e\n",
    b'"quoted\nnewline",neg\n', b'"unterminated,pos\n', b'""""\n', b"\x00,\x00\n", b"\n",
    b"\r\n", b'{"text": "hi", "label": "pos"}\n', b'{"text": null, "label": 3}\n',
    b"[1, 2]\n", b"3\n", b"null\n", b'"a string"\n', b'{"text": "\\ud800"}\n', b"{broken\n",
    b"caf\xc3\xa9 \xe9t\xe9\n", b"\xff\xfe\x00\n", b"\xef\xbb\xbftext,label\n",
    "🙂 漢字 مرحبا,pos\n".encode(), b"<br />,neg\n", b" = Title = \n", b" = = Sub = = \n",
]  # fmt: skip
hostile_files = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=40)), max_size=25
).map(b"".join)


def test_every_reader_on_malformed_and_random_files(tmp_path):
    seen = Outcomes()

    @settings(max_examples=READER_EXAMPLES, **SETTINGS)
    @given(data=hostile_files, name=st.sampled_from(CORPUS_NAMES + TABLE_NAMES))
    def check(data: bytes, name: str) -> None:
        _read_everything(_write(tmp_path / name, data), seen)

    check()
    record("readers: random and malformed files", examples=seen.total, tracebacks=0)


@pytest.mark.parametrize("name", CORPUS_NAMES + TABLE_NAMES)
@pytest.mark.parametrize(
    "content",
    [
        b"",  # empty
        b"\n\n\n",  # blank lines only
        b"text,label\n",  # a header and nothing else
        b"text,label\n" + b"x" * (1 << 20) + b",pos\n",  # a 1 MB line
        b"x" * (1 << 20),  # a 1 MB line without a newline
        b"\x00" * 1000,  # NUL bytes
        'text,label\n"é",pos\n'.encode("latin-1") + '"é",neg\n'.encode(),  # mixed encodings
    ],
    ids=["empty", "blank", "header-only", "1mb-line", "1mb-no-newline", "nul", "mixed-encoding"],
)
def test_every_reader_on_edge_case_files(tmp_path, name, content):
    seen = Outcomes()
    _read_everything(_write(tmp_path / name, content), seen)
    record("readers: edge-case files", examples=seen.total, tracebacks=0)


# ---- inference inputs ------------------------------------------------------------------------
masks = st.integers(0, 12).map(lambda n: " ".join(["[MASK]"] * n))
fill_texts = st.lists(st.one_of(texts, masks), min_size=1, max_size=3).map(" ".join)


def test_fill_mask_on_any_text(models):
    model, tokenizer, seen = models["mlm"], models["tokenizer"], Outcomes()
    limit = model.config.max_position_embeddings

    @settings(max_examples=INFERENCE_EXAMPLES, **SETTINGS)
    @given(batch=st.lists(fill_texts, min_size=1, max_size=4))
    def check(batch: list[str]) -> None:
        out = seen(lambda: fill_mask(model, tokenizer, batch, top_k=3))
        if out is None:  # the documented errors: a text without [MASK], or too long
            return
        for result, text in zip(out, batch, strict=True):
            n_masks = int(
                (np.asarray(tokenizer.encode(text)["input_ids"]) == tokenizer.mask_id).sum()
            )
            assert len(result["masks"]) == n_masks > 0

    check()
    fixed = {
        "no mask": "a film with no blank",
        "only masks": " ".join(["[MASK]"] * (limit - 2)),
        "more masks than positions": " ".join(["[MASK]"] * limit),
        "100k characters": "the movie [MASK] " + "film " * (HUGE // 5),
        "empty": "",
    }
    outcomes = {
        name: seen(lambda t=t: fill_mask(model, tokenizer, [t])) for name, t in fixed.items()
    }
    assert (
        outcomes["only masks"] is not None and len(outcomes["only masks"][0]["masks"]) == limit - 2
    )
    assert outcomes["no mask"] is None and outcomes["100k characters"] is None
    record("fill-mask: hostile text", examples=seen.total, tracebacks=0)


def test_classify_and_embed_on_any_text(models):
    model, mlm, tokenizer, seen = models["clf"], models["mlm"], models["tokenizer"], Outcomes()

    @settings(max_examples=INFERENCE_EXAMPLES, **SETTINGS)
    @given(batch=st.lists(texts, min_size=1, max_size=4))
    def check(batch: list[str]) -> None:
        labels = seen(lambda: classify(model, tokenizer, batch))
        assert labels is not None and len(labels) == len(batch)
        assert all(math.isclose(sum(r["scores"].values()), 1.0, rel_tol=1e-5) for r in labels)
        vectors = seen(lambda: embed(mlm, tokenizer, batch, pooling="mean"))
        assert vectors.shape == (len(batch), mlm.config.hidden_size)
        assert np.isfinite(vectors).all()

    check()
    extremes = ["", " ", "\x00", "x" * HUGE, "🙂" * HUGE, "word " * (HUGE // 5)]
    labels = seen(lambda: classify(model, tokenizer, extremes))
    assert labels is not None and len(labels) == len(extremes)
    pairs = seen(lambda: classify(model, tokenizer, extremes, pairs=extremes[::-1]))
    assert pairs is not None
    vectors = seen(lambda: embed(mlm, tokenizer, extremes, pooling="cls"))
    assert vectors is not None and np.isfinite(vectors).all()
    assert seen.errors == 0  # any text gets an answer: long ones are truncated
    record("classify/embed: hostile text", examples=seen.total, tracebacks=0)


def test_jsonl_cells_that_are_not_text(tmp_path):
    """A JSON-lines corpus whose text cells are numbers, lists, objects or unpaired surrogates:
    each is a result or one line."""
    seen = Outcomes()
    rows = [{"text": v} for v in (1, 2.5, None, True, [1, "a"], {"a": 1}, "\ud800 x", "ok")]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    _read_everything(path, seen)
    docs = seen(lambda: list(read_documents(path, text_column="text")))
    assert docs is None or all(isinstance(s, str) for d in docs for s in d)
    record("readers: edge-case files", examples=seen.total, tracebacks=0)


def test_a_text_column_given_as_labels_is_quoted_short(tmp_path):
    """Reviews in the label column (``--label_column text`` by mistake): the error is one short
    line that quotes the start of the cell and its length, not the whole review."""
    review = "This film " + "was long and slow, " * 60 + "the end."
    rows = [{"text": f"odd {i}", "label": f"{review} {i}"} for i in range(8)]
    rows += [{"text": f"review {i}", "label": "pos" if i % 2 else "neg"} for i in range(40)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(BertforgeError) as regression:
        load_labelled(path, text_column="text", label_column="label", task="regression")
    with pytest.raises(BertforgeError) as classification:
        load_labelled(path, text_column="text", label_column="label")
    for err in (regression.value, classification.value):
        message = str(err)
        assert "\n" not in message and len(message) < 700, message
        assert "'This film was long and slow, was lon...' (1,16" in message
        assert review not in message
    assert "not a number" in str(regression.value)
    assert "and 3 more" in str(classification.value)  # 8 odd labels: five shown
