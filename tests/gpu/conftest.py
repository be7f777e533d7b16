"""The GPU suite: every test here is marked ``cuda`` and runs on ``BERTFORGE_TEST_DEVICE``
(default ``cuda``), skipped where that device is absent. ``scripts/gpu_check.sh`` runs it;
``BERTFORGE_TEST_DEVICE=cpu pytest tests/gpu -m cuda`` runs the same tests on the CPU (each
then compares the CPU with itself: a check of the tests, not of a GPU).

Its data is made here from the task fixtures' words (no ``../shared/data``: a GPU machine may
have only this repository)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from support.corpus import prepare_both_ways

from bertforge.tokenizer.wordpiece import Tokenizer

HERE = Path(__file__).resolve().parent
DEVICE = os.environ.get("BERTFORGE_TEST_DEVICE", "cuda")


def _available(name: str) -> bool:
    kind = torch.device(name).type
    return kind == "cpu" or (kind == "cuda" and torch.cuda.is_available())


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    skip = pytest.mark.skip(reason=f"{DEVICE} not available (BERTFORGE_TEST_DEVICE={DEVICE})")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.cuda)
            if not _available(DEVICE):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    """The device under test (``cuda`` unless ``BERTFORGE_TEST_DEVICE`` says otherwise)."""
    return DEVICE


@pytest.fixture
def deterministic(monkeypatch):
    """Deterministic kernels for the test (cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` set before
    its first use: ``scripts/gpu_check.sh`` exports it)."""
    monkeypatch.setenv(
        "CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    )
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(scope="session")
def gpu_corpus(task_files, tmp_path_factory) -> dict[str, Path]:
    """Keyword sentences in documents, a tokenizer trained on them, the text prepared as
    sentence pairs (``nsp``) and packed sequences (``packed``) of 32 tokens."""
    root = tmp_path_factory.mktemp("gpu-corpus")
    rng = random.Random(0)
    docs = []
    for _ in range(120):
        lines = [task_files.sentence(rng, rng.choice(["good", "bad", "fine"])) for _ in range(8)]
        docs.append("\n".join(lines))
    text = root / "docs.txt"
    text.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    tokenizer = Tokenizer.train(text, vocab_size=120, min_frequency=1)
    return prepare_both_ways(text, tokenizer, root)
