"""BERT's pair-similarity loss on a ModernBERT (``--train.objective mlm --train.similarity_weight``
on ``--mode nsp`` data): the split-half direction by hand, the [CLS] head the model hands out,
a real run that logs the loss and saves exactly transformers' keys, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.corpus import prepare_quiet

from bertforge.errors import BertforgeError
from bertforge.modeling.config import ModernBertConfig
from bertforge.modeling.model import split_half_score
from bertforge.modeling.modernbert import ModernBertForMaskedLM
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import ModelSection, PretrainConfig, TrainConfig
from bertforge.training.setup import open_data

MODERN = [
    "--model.architecture", "modernbert", "--model.preset", "tiny",
    "--model.hidden_size", "32", "--model.num_attention_heads", "2",
    "--model.max_position_embeddings", "64", "--model.local_attention", "16",
]  # fmt: skip
FAST = [
    "--train.objective", "mlm", "--train.max_steps", "4", "--train.batch_size", "8",
    "--train.precision", "fp32", "--train.progress", "false", "--train.num_threads", "1",
    "--train.eval_every", "0", "--train.save_every", "0", "--train.eval_examples", "8",
    "--train.log_every", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(shakespeare_file: Path, tmp_path_factory) -> dict[str, Path]:
    """A small WordPiece vocabulary and the text prepared as NSP pairs and packed."""
    root = tmp_path_factory.mktemp("modern_sim")
    text = root / "text.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    tokenizer = Tokenizer.train(text, vocab_size=300)
    return {
        mode: prepare_quiet(text, tokenizer, root / mode, length=40, mode=mode)
        for mode in ("nsp", "packed")
    }


def test_split_half_score_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]])
    assert split_half_score(x).tolist() == [1.5 - 3.5, 0.0 - 1.0]
    assert split_half_score(torch.tensor([1.0, 1.0, 4.0, 4.0, 4.0])).item() == -3.0  # 2 | 3
    with pytest.raises(ValueError, match="at least 2 units"):
        split_half_score(torch.ones(3, 1))
    # after a bias-free LayerNorm at weight 1 the units' mean is 0 whatever the input, and no
    # gradient flows back through it; the split halves move with the input
    h = torch.randn(5, 8, requires_grad=True)
    normed = torch.nn.LayerNorm(8, bias=False)(h)
    assert normed.mean(-1).abs().max() < 1e-6
    (grad,) = torch.autograd.grad(split_half_score(normed).sum(), h)
    assert grad.abs().max() > 1e-3


def test_the_cls_head_is_the_head_at_position_0_of_a_padded_batch():
    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, local_attention=4, max_position_embeddings=32,
        pad_token_id=0, cls_token_id=1, sep_token_id=2,
    )  # fmt: skip
    model = ModernBertForMaskedLM(config).eval()
    ids = torch.randint(3, 50, (3, 10))
    ids[:, 0] = 1
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding: the unpadded rows
    ids[1, 6:] = 0
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    with torch.no_grad():
        plain = model(ids, mask, labels=labels)
        asked = model(ids, mask, labels=labels, cls_head=True)
        hidden = model.model(ids, mask).last_hidden_state  # (B, T, H)
        expected = model.head(hidden[:, 0])
    assert plain.cls_head_output is None
    assert torch.equal(plain.loss, asked.loss)  # the usual output is untouched
    assert asked.cls_head_output.shape == (3, 16)
    assert torch.allclose(asked.cls_head_output, expected, atol=1e-6)


def run(corpus: dict[str, Path], out: Path, *extra: str) -> list[dict]:
    from bertforge import cli

    argv = ["pretrain", "--data", str(corpus["nsp"]), "--output", str(out), *MODERN, *FAST]
    assert cli.main([*argv, *extra]) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_modernbert_trains_the_similarity_loss_and_keeps_its_keys(corpus, tmp_path):
    plain = run(corpus, tmp_path / "plain")  # MLM alone reads pair data as well
    pairs = run(corpus, tmp_path / "pairs", "--train.similarity_weight", "1")
    train = [r for r in pairs if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for r in train:
        assert 0.0 <= r["similarity_loss"] <= 2.0  # one minus a correlation: finite
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["similarity_loss"])
    assert all("similarity_loss" not in r for r in plain)
    a = load_file(tmp_path / "plain" / "model" / "model.safetensors")
    b = load_file(tmp_path / "pairs" / "model" / "model.safetensors")
    assert a.keys() == b.keys()  # no parameter added: transformers' names, nothing else
    assert not torch.equal(a["head.dense.weight"], b["head.dense.weight"])  # the loss reached it


def config(data: Path, out: Path, architecture: str = "modernbert", **train) -> PretrainConfig:
    model = ModelSection(architecture=architecture, preset="tiny", hidden_size=32,
                         num_attention_heads=2, max_position_embeddings=64,
                         local_attention=16)  # fmt: skip
    return PretrainConfig(data=str(data), output=str(out), model=model,
                          train=TrainConfig(max_steps=1, **train))  # fmt: skip


def test_the_refusals_are_one_line_and_say_what_to_do(corpus, tmp_path):
    with pytest.raises(BertforgeError, match="'packed' mode; --train.similarity_weight 1.0 comp"):
        open_data(config(corpus["packed"], tmp_path, objective="mlm", similarity_weight=1.0))
    with pytest.raises(BertforgeError, match="trains the pooler of --train.objective mlm_nsp on a"):
        config(corpus["nsp"], tmp_path, "bert", objective="mlm", similarity_weight=1.0)
    with pytest.raises(BertforgeError, match="ModernBERT's \\[CLS\\] head with mlm\\); this run"):
        TrainConfig(objective="rtd", similarity_weight=1.0)
    with pytest.raises(BertforgeError, match="use --train.objective mlm \\(with --train.simil"):
        open_data(config(corpus["nsp"], tmp_path, objective="mlm_nsp", similarity_weight=1.0))
    assert open_data(config(corpus["nsp"], tmp_path, objective="mlm", similarity_weight=1.0))


def test_the_curves_draw_a_modernberts_similarity_loss_on_a_panel_of_its_own(tmp_path, monkeypatch):
    from bertforge.evaluation import plots
    from bertforge.progress import MetricsLogger

    drawn = {}
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, output: drawn.update(
        {ax.get_title(): ax for ax in fig.axes}) or real_save(fig, output))  # fmt: skip
    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log(step, "train", loss=9.0, mlm_loss=8.0, similarity_loss=1.0 - step / 10, lr=1)
    logger.close()
    plots.plot_training_curves(tmp_path, tmp_path / "curves.png")
    (line,) = drawn["pair-similarity loss (1 - Pearson r)"].lines  # drawn once
    assert list(line.get_ydata()) == pytest.approx([0.9, 0.8, 0.7])
    assert list(drawn["masked-LM loss"].lines[0].get_ydata()) == [8.0, 8.0, 8.0]


def test_a_similarity_run_resumes_bit_exactly(corpus, tmp_path):
    """The word weights are counted again on resume: the same losses and the same weights."""
    save = ["--train.similarity_weight", "1", "--train.save_every", "2"]
    full = run(corpus, tmp_path / "full", *save, "--train.keep_checkpoints", "0")
    checkpoint = tmp_path / "full" / "checkpoint-00000002"
    resumed = run(corpus, tmp_path / "resumed", *save, "--resume", str(checkpoint))

    def losses(records):
        return {r["step"]: r["similarity_loss"] for r in records if r["split"] == "train"}

    assert sorted(losses(resumed)) == [3, 4]
    assert [losses(full)[s] for s in (3, 4)] == [losses(resumed)[s] for s in (3, 4)]
    a = load_file(tmp_path / "full" / "model" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_continuing_a_bert_with_mlm_and_the_similarity_loss_is_refused(tmp_path, task_files):
    """--init_from a BERT directory (the architecture known only once it is read) with
    --train.objective mlm and the similarity loss: the same one-line refusal as a new BERT."""
    start = task_files.tiny_start_model(tmp_path, kind="mlm")
    text = tmp_path / "text.txt"
    text.write_text("the film was good .\nthe plot was bad .\n\n" * 200, encoding="utf-8")
    data = prepare_quiet(text, start, tmp_path / "nsp", length=32, mode="nsp")
    train = TrainConfig(max_steps=1, objective="mlm", similarity_weight=1.0)
    with pytest.raises(BertforgeError, match="trains the pooler of --train.objective mlm_nsp on a"):
        cfg = PretrainConfig(data=str(data), output=str(tmp_path / "out"), init_from=str(start),
                             train=train)  # fmt: skip
        open_data(cfg)
