"""MLM evaluation metrics against a direct computation, the comparison table and the curves plot."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import FILLER, TaskFiles, noise
from support.cli import run_cli

from bertforge.evaluation import plots
from bertforge.evaluation.mlm import (
    SUMS,
    comparison_table,
    evaluate_mlm,
    mlm_metrics,
    random_init_like,
)
from bertforge.evaluation.plots import eval_style, plot_training_curves
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining
from bertforge.progress import MetricsLogger
from bertforge.tokenizer.wordpiece import Tokenizer


def _batches(vocab: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(3):
        ids = torch.randint(5, vocab, (4, 12), generator=g)
        attention = torch.ones_like(ids)
        attention[0, 9:] = 0  # one padded row
        ids[0, 9:] = 0
        labels = torch.full_like(ids, -100)
        chosen = (torch.rand(ids.shape, generator=g) < 0.3) & attention.bool()
        chosen[:, 1] = True
        labels[chosen] = ids[chosen]
        out.append(
            {
                "input_ids": ids,
                "attention_mask": attention,
                "token_type_ids": torch.zeros_like(ids),
                "labels": labels,
                "next_sentence_label": torch.tensor([0, 1, 1, 0]),
            }
        )
    return out


def test_mlm_metrics_equal_a_direct_computation(tiny_config):
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_config).eval()
    batches = _batches(tiny_config.vocab_size)
    metrics = evaluate_mlm(model, batches, torch.device("cpu"), "fp32")

    losses, hits, hits5 = [], [], []
    with torch.no_grad():
        for b in batches:
            logits = model(b["input_ids"], b["attention_mask"], b["token_type_ids"]).logits
            keep = b["labels"] != -100
            sel, target = logits[keep], b["labels"][keep]  # (n, V), (n,)
            losses.append(F.cross_entropy(sel, target, reduction="none"))
            hits.append(sel.argmax(-1) == target)
            hits5.append((sel.topk(5, -1).indices == target[:, None]).any(-1))
    loss = torch.cat(losses).mean().item()
    assert metrics["tokens"] == sum(int((b["labels"] != -100).sum()) for b in batches)
    assert math.isclose(metrics["loss"], loss, rel_tol=1e-5)
    assert math.isclose(metrics["perplexity"], math.exp(loss), rel_tol=1e-5)
    assert metrics["accuracy"] == torch.cat(hits).sum().item() / metrics["tokens"]
    assert metrics["top5_accuracy"] == torch.cat(hits5).sum().item() / metrics["tokens"]
    assert metrics["nsp_accuracy"] is None  # no NSP head
    assert metrics["sequences"] == 12


def test_nsp_accuracy_and_random_baseline(tiny_config):
    torch.manual_seed(1)
    model = BertForPreTraining(tiny_config)
    batches = _batches(tiny_config.vocab_size, seed=1)
    metrics = evaluate_mlm(model, batches, torch.device("cpu"), "fp32")
    with torch.no_grad():
        pred = torch.cat(
            [
                model(b["input_ids"], b["attention_mask"]).seq_relationship_logits.argmax(-1)
                for b in batches
            ]
        )
    truth = torch.cat([b["next_sentence_label"] for b in batches])
    assert metrics["nsp_accuracy"] == (pred == truth).sum().item() / len(truth)
    not_next = int((truth == 1).sum())  # the baseline: always the more frequent label
    assert metrics["nsp_majority"] == max(not_next, len(truth) - not_next) / len(truth)
    assert model.training  # evaluation restores the mode it found

    fresh = random_init_like(model, seed=5)
    assert type(fresh) is BertForPreTraining and fresh.config == model.config
    same = random_init_like(model, seed=5)
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), same.parameters(), strict=True)
    )
    table = comparison_table(
        {"random init": evaluate_mlm(fresh, batches, torch.device("cpu")), "trained": metrics},
        title="val",
    )
    lines = table.splitlines()
    assert lines[0] == "val" and "random init" in lines[1] and "trained" in lines[1]
    assert any(line.startswith("NSP accuracy") for line in lines)
    assert any(line.startswith("NSP majority class") for line in lines)
    assert any(line.startswith("masked-token top-5 accuracy") for line in lines)


def test_nsp_majority_is_the_share_of_the_more_frequent_label():
    # prepare said "NotNext share 0.655": always guessing NotNext scores 65.5 %, what NSP must beat
    sums = dict.fromkeys(SUMS, 0.0) | {"loss": 10.0, "tokens": 5, "nsp_pairs": 200}
    metrics = mlm_metrics(sums | {"not_next": 131, "nsp_correct": 160})
    assert metrics["nsp_accuracy"] == 0.8 and metrics["nsp_majority"] == 0.655
    assert mlm_metrics(sums | {"not_next": 60, "nsp_correct": 100})["nsp_majority"] == 0.7
    assert mlm_metrics(sums | {"nsp_pairs": 0})["nsp_majority"] is None  # no NSP: no baseline


def test_plot_from_metrics_file(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 101):
        log.log(step, "train", loss=8.0 / math.sqrt(step), lr=1e-3 * (1 - step / 100))
        if step % 25 == 0:
            log.log(step, "val", loss=7.0 / math.sqrt(step), accuracy=step / 400)
        if step in (1, 100):  # an --extra_eval set: before and after training only
            log.log(step, "val:wiki", loss=9.0 / math.sqrt(step), accuracy=step / 500)
    log.close()
    assert eval_style(2)["linestyle"] == "none"  # two points: markers, no invented line
    assert eval_style(4).get("linestyle", "-") != "none"
    path = plot_training_curves(tmp_path, tmp_path / "plots" / "curves.png", title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not list((tmp_path / "plots").glob(".*tmp"))  # written atomically, no leftovers


# ---- bertforge evaluate on an MLM, NSP without NotNext pairs, curves -----------------------------


def test_evaluate_accepts_the_encoding_errors_it_suggests(mlm_dir, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the film was good .\nthe \xff story about people .\n" * 4)
    code, _, err = run_cli(["evaluate", "--model", str(mlm_dir), "--data", str(bad)], capsys)
    assert code == 2 and "--encoding_errors replace" in err
    code, _, err = run_cli(
        ["evaluate", "--model", str(mlm_dir), "--data", str(bad), "--encoding_errors", "replace"],
        capsys,
    )
    assert code == 0, err


def test_nsp_accuracy_without_notnext_pairs_says_so():
    row = {"loss": 2.0, "perplexity": 7.4, "accuracy": 0.1, "top5_accuracy": 0.3}
    table = comparison_table(
        {
            "random init": {**row, "nsp_accuracy": None, "nsp_note": "no NotNext pairs"},
            "this model": {**row, "nsp_accuracy": None, "nsp_note": "no NotNext pairs"},
        }
    )
    nsp = next(line for line in table.splitlines() if line.startswith("NSP accuracy"))
    assert "n/a" in nsp and "no NotNext pairs" in nsp and "%" not in nsp


def test_evaluate_mlm_reports_no_notnext_pairs(mlm_dir):
    torch_model = BertForPreTraining.from_pretrained(mlm_dir)
    tok = Tokenizer.from_file(mlm_dir)
    ids = tok.encode_batch(["the film was good", "a story about people"], padding=True)

    batch = {k: torch.tensor(v) for k, v in ids.items()}
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1] = batch["input_ids"][:, 1]
    batch["labels"] = labels
    batch["next_sentence_label"] = torch.zeros(2, dtype=torch.long)  # IsNext only
    result = evaluate_mlm(torch_model, [batch], torch.device("cpu"))
    assert result["nsp_accuracy"] is None and result["nsp_note"] == "no NotNext pairs"


def test_evaluate_of_an_mlm_prints_the_word_count_guesser(start, tmp_path, capsys):
    text = tmp_path / "held_out.txt"
    rng = random.Random(7)
    text.write_text("\n".join(noise(rng, 10) for _ in range(60)) + "\n", encoding="utf-8")
    assert TaskFiles.evaluate_cli(start, text, tmp_path / "r.json", "--progress", "false") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["random", "init", "word", "counts", "this", "model"]
    assert "word counts: a guesser without context" in out
    guess = json.loads((tmp_path / "r.json").read_text())["frequency_guesser"]
    assert 0 < guess["loss"] < math.log(len(FILLER)) + 0.5 and guess["tokens"] > 0


def test_curves_plot_like_with_like_and_draw_points_for_short_runs(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log(step, "train", loss=9.0 + step, mlm_loss=8.0, nsp_loss=1.0 + step, lr=1e-4)
    logger.log(3, "val", loss=8.5, accuracy=0.1, nsp_accuracy=0.5)
    logger.close()
    drawn = {}
    real_save = plots._save

    def spy(fig, output):
        drawn.update({ax.get_title(): ax for ax in fig.axes})
        return real_save(fig, output)

    plots._save = spy
    try:
        plots.plot_training_curves(tmp_path, tmp_path / "curves.png")
    finally:
        plots._save = real_save
    mlm = drawn["masked-LM loss"]
    labels = {line.get_label(): line for line in mlm.lines}
    # the train line is the MLM part, not MLM + NSP, on the axis of the validation MLM loss
    assert list(labels["train"].get_ydata()) == [8.0, 8.0, 8.0]
    assert labels["train"].get_marker() not in (None, "None", "")  # 3 points: drawn as points
    nsp = drawn["NSP loss"]
    assert list(nsp.lines[0].get_ydata()) == [2.0, 3.0, 4.0]
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_the_evaluation_panel_says_score_not_accuracy_for_f1(tmp_path, monkeypatch):
    # a question-answering run logs val f1: its axis said "accuracy"
    drawn = {}
    real_save = plots._save

    def spy(fig, output):
        drawn.update({ax.get_title(): ax for ax in fig.axes})
        return real_save(fig, output)

    monkeypatch.setattr(plots, "_save", spy)
    for name, record in (("qa", {"f1": 0.4, "exact_match": 0.3}), ("mlm", {"accuracy": 0.1})):
        logger = MetricsLogger(tmp_path / name)
        logger.log(1, "train", loss=2.0, lr=1e-4)
        logger.log(1, "val", loss=1.5, **record)
        logger.close()
        plots.plot_training_curves(tmp_path / name, tmp_path / name / "curves.png")
        expected = "score" if name == "qa" else "accuracy"
        assert drawn["evaluation"].get_ylabel() == expected, name


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"entity_f1": 0.6, "token_accuracy": 0.9, "precision": 0.5, "entities": 30},
         ["val token_accuracy", "val entity_f1"]),  # a tagger's panel was empty
        ({"f1": 0.4, "exact_match": 0.3}, ["val f1", "val exact_match"]),
        ({"accuracy": 0.7, "mcc": 0.2, "macro_f1": 0.6, "agreement": 0.9},
         ["val accuracy", "val macro_f1", "val mcc", "val agreement"]),
        ({"cosine": 0.8, "mse": 0.01, "examples": 40}, ["val cosine"]),  # an embedding student
    ],
)  # fmt: skip
def test_the_evaluation_panel_draws_every_tasks_scores(tmp_path, monkeypatch, record, expected):
    drawn = {}
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, output: drawn.update(
        {ax.get_title(): ax for ax in fig.axes}) or real_save(fig, output))  # fmt: skip
    logger = MetricsLogger(tmp_path)
    for step in (1, 2):
        logger.log(step, "train", loss=2.0 / step, lr=1e-4)
        logger.log(step, "val", loss=1.5, **record)
    logger.close()
    plots.plot_training_curves(tmp_path, tmp_path / "curves.png")
    assert [line.get_label() for line in drawn["evaluation"].lines] == expected


def test_an_embedding_runs_evaluation_panel_draws_its_retrieval_scores_from_step_0(
    tmp_path, monkeypatch
):
    drawn = {}
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, output: drawn.update(
        {ax.get_title(): ax for ax in fig.axes}) or real_save(fig, output))  # fmt: skip
    logger = MetricsLogger(tmp_path)
    scores = {"mrr@10": 0.4, "ndcg@10": 0.5, "recall@1": 0.3, "recall@10": 0.9, "recall@100": 1.0}
    logger.log(0, "val", **{k: v / 2 for k, v in scores.items()})  # the start model
    for step in (1, 2):
        logger.log(step, "train", loss=2.0 / step, lr=1e-4)
    logger.log(2, "val", **scores)
    logger.close()
    plots.plot_training_curves(tmp_path, tmp_path / "curves.png")
    panel = drawn["evaluation"]
    lines = {line.get_label(): line for line in panel.lines}
    assert list(lines) == ["val mrr@10", "val ndcg@10", "val recall@1", "val recall@10"]
    assert list(lines["val mrr@10"].get_xdata()) == [0, 2]
    assert list(lines["val mrr@10"].get_ydata()) == [0.2, 0.4]
    assert panel.get_ylabel() == "retrieval score"
    assert panel.get_xlabel() == "step (0: before training)"
