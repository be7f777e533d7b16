"""The pair-similarity loss on the pooler (``--train.similarity_weight``): the target is the cosine
of the two segments' weighted word-vector sums, written out by hand; the loss is one minus a
Pearson correlation (blind to the prediction's scale and offset); a real run logs it, adds it to
the total, and trains the pooled [CLS] to rank pairs as their targets do."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.corpus import pooler_scores, runs_with_and_without
from test_pretrain import tiny_cfg

from bertforge.errors import BertforgeError
from bertforge.modeling.model import (
    IGNORE_INDEX,
    segment_similarity,
    similarity_loss,
)
from bertforge.progress import read_metrics
from bertforge.training.config import TrainConfig
from bertforge.training.objectives import MaskedLMWithNSP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def cosine(u: list[float], v: list[float]) -> float:
    dot = sum(a * b for a, b in zip(u, v, strict=True))
    return dot / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def test_segment_similarity_is_the_cosine_of_the_weighted_segment_sums():
    torch.manual_seed(0)
    words = torch.randn(6, 4)
    token_weights = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.25, 1.0])  # word 0: special, weighs 0
    tokens = torch.tensor([[0, 1, 2, 0, 3, 4, 4, 0], [0, 5, 0, 5, 0, 0, 0, 0]])
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0]])
    got = segment_similarity(words, tokens, segments, token_weights)

    def weighted_sum(row: int, segment: int) -> list[float]:
        total = [0.0] * 4
        for t, s in zip(tokens[row].tolist(), segments[row].tolist(), strict=True):
            if s == segment:
                weight = float(token_weights[t])
                total = [x + weight * float(e) for x, e in zip(total, words[t], strict=True)]
        return total

    expected = [cosine(weighted_sum(r, 0), weighted_sum(r, 1)) for r in range(2)]
    assert got.tolist() == pytest.approx(expected, rel=1e-5)
    assert float(got[1]) == pytest.approx(1.0, rel=1e-6)  # the same word on both sides
    empty = segment_similarity(words, torch.tensor([[0, 1, 0]]), torch.tensor([[0, 0, 1]]),
                               token_weights)  # fmt: skip
    assert empty.tolist() == [0.0]  # a second segment of special tokens only


def test_similarity_loss_is_one_minus_the_pearson_correlation():
    target = torch.tensor([0.1, 0.5, 0.2, 0.9])
    assert float(similarity_loss(target * 3 + 7, target)) == pytest.approx(0.0, abs=1e-6)
    assert float(similarity_loss(-target, target)) == pytest.approx(2.0, abs=1e-6)
    prediction = torch.tensor([0.3, 0.1, 0.4, 0.8])
    p, t = prediction - prediction.mean(), target - target.mean()
    r = float((p * t).sum() / (p.norm() * t.norm()))
    assert float(similarity_loss(prediction, target)) == pytest.approx(1 - r, rel=1e-6)
    prediction.requires_grad_(True)
    similarity_loss(prediction, target).backward()  # type: ignore[union-attr]
    assert torch.isfinite(prediction.grad).all() and prediction.grad.abs().sum() > 0
    # masked rows count for nothing: the loss of the other rows alone
    rows = torch.tensor([True, False, True, True, False])
    padded_p = torch.tensor([0.3, 9.0, 0.4, 0.8, -5.0])
    padded_t = torch.tensor([0.1, -3.0, 0.2, 0.9, 4.0])
    alone = similarity_loss(torch.tensor([0.3, 0.4, 0.8]), torch.tensor([0.1, 0.2, 0.9]))
    assert float(similarity_loss(padded_p, padded_t, rows)) == pytest.approx(float(alone))
    assert similarity_loss(torch.tensor([1.0]), torch.tensor([0.5])) is None  # one pair
    flat = torch.tensor([1.0, 2.0], requires_grad=True)
    constant = similarity_loss(flat, torch.tensor([0.5, 0.5]))  # no ranking to learn
    constant.backward()  # type: ignore[union-attr]
    assert float(constant.detach()) == 1.0 and flat.grad.eq(0).all()


def test_the_objective_targets_the_unmasked_text_of_each_pair():
    objective = MaskedLMWithNSP(TrainConfig(similarity_weight=2.0))
    assert objective.terms["similarity_loss"].weight == 2.0
    assert objective.terms["similarity_loss"].unit == "pairs"
    objective.bow_weights = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.25, 1.0])
    ids = torch.tensor([[0, 1, 2, 0, 5, 2, 0], [0, 3, 3, 0, 1, 3, 0], [0, 1, 0, 2, 0, 0, 0]])
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]])
    labels = torch.full_like(ids, IGNORE_INDEX)
    ids[0, 4], labels[0, 4] = 4, 1  # second segment's "1" masked (as word 4)
    torch.manual_seed(0)
    pooled, words = torch.randn(3, 5), torch.randn(6, 5)
    model = SimpleNamespace(
        bert=SimpleNamespace(
            embeddings=SimpleNamespace(word_embeddings=SimpleNamespace(weight=words))
        )
    )
    output = SimpleNamespace(mlm_loss=torch.tensor(1.0), nsp_loss=None, pooler_output=pooled)
    nsp = torch.tensor([0, 1, -1])  # the third row only pads the batch
    batch = {"input_ids": ids, "labels": labels, "token_type_ids": types,
             "next_sentence_label": nsp}  # fmt: skip
    got = objective.losses(output, batch, model)  # type: ignore[arg-type]
    text = torch.where(labels != IGNORE_INDEX, labels, ids)[:2]
    target = segment_similarity(words, text, types[:2], objective.bow_weights)
    expected = similarity_loss(pooled[:2].mean(-1), target)  # the padding row left out
    assert float(got["similarity_loss"]) == pytest.approx(float(expected), rel=1e-6)
    assert "bow_loss" not in got  # the bag-of-words loss stays off


def test_similarity_weight_adds_the_loss_and_trains_the_pooler_to_rank_pairs(
    pretraining_corpus, tmp_path, capsys
):
    data = pretraining_corpus["nsp"]
    runs, records = runs_with_and_without(data, tmp_path, "similarity_weight")
    for r in records:
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["nsp_loss"] + r["similarity_loss"])
    assert all("similarity_loss" not in r for r in read_metrics(runs[0.0]))
    # the same validation pairs scored by both models: the pooled [CLS] of the one trained with
    # the loss ranks them by their target better than the one trained without it
    scored = pooler_scores(
        runs,
        data,
        lambda pooled, words, ids, types, w: similarity_loss(
            pooled.mean(-1), segment_similarity(words, ids, types, w)
        ),
    )
    assert scored[1.0] < scored[0.0] - 0.1, scored
    # benchmarks/similarity_target.py scores both on an STS-B-shaped file: the target of
    # identical sentences ranks them above unrelated ones, perfectly
    from similarity_target import main as similarity_target

    sts = tmp_path / "dev.tsv"
    lines = [f"{a}\t{b}\t{y}" for a, b, y in [
        ("the king is dead", "the king is dead", 5.0),
        ("my lord, the queen", "my lord, the queen comes", 4.0),
        ("to be or not", "what light through yonder", 0.5),
        ("good night, sweet prince", "the rest is silence", 0.0),
    ]]  # fmt: skip
    sts.write_text("sentence1\tsentence2\tlabel\n" + "\n".join(lines) + "\n")
    argv = [
        "--data",
        str(data),
        "--sts",
        str(sts),
        "--models",
        *(str(r / "model") for r in runs.values()),
    ]
    assert similarity_target(argv) == 0
    table = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert set(table) == {str(r / "model") for r in runs.values()}
    for row in table.values():
        assert row["target"] > 50 and -100 <= row["pooled [CLS] mean"] <= 100
    with pytest.raises(BertforgeError, match="--train.similarity_weight 1.0 trains the pooler"):
        tiny_cfg(pretraining_corpus["packed"], tmp_path, objective="mlm", similarity_weight=1.0)
    with pytest.raises(BertforgeError, match="--train.similarity_weight -1.0 must be 0 or more"):
        tiny_cfg(data, tmp_path, similarity_weight=-1.0)
