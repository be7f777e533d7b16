"""The bag-of-words loss on the pooler (``--train.bow_weight``): the loss equals a cross-entropy
against the weighted bag written by hand, frequent words are subsampled as word2vec does, and a
real run logs the loss, adds it to the total and trains the pooler to predict its text's words."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from support.corpus import pooler_scores, runs_with_and_without
from test_pretrain import tiny_cfg

from bertforge.errors import BertforgeError
from bertforge.modeling.model import (
    IGNORE_INDEX,
    bag_of_words_loss,
    bag_of_words_weights,
)
from bertforge.progress import read_metrics
from bertforge.training.config import TrainConfig
from bertforge.training.objectives import MaskedLMWithNSP
from bertforge.training.pretrain import pretrain


def hand_written_loss(features: torch.Tensor, words: torch.Tensor, bags: dict) -> float:
    """The bag-of-words loss written out: per row of ``bags`` ({row: {word: weight}}), the
    cross-entropy of the feature's softmax over ``words`` against the normalised bag; the mean."""
    expected = 0.0
    for row, bag in bags.items():
        logits = [float(features[row] @ words[v]) for v in range(len(words))]
        log_z = math.log(sum(math.exp(x) for x in logits))
        total = sum(bag.values())
        expected += -sum(w / total * (logits[v] - log_z) for v, w in bag.items())
    return expected / len(bags)


def test_bag_of_words_loss_is_the_cross_entropy_against_the_weighted_bag():
    torch.manual_seed(0)
    features, words = torch.randn(3, 4), torch.randn(6, 4)
    token_weights = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.25, 1.0])  # word 0: special, weighs 0
    tokens = torch.tensor(
        [
            [0, 1, 1, 2, -1],  # bag: word 1 twice (2.0), word 2 (0.5)
            [0, 0, -1, -1, -1],  # only a special word: no weight, left out
            [3, 4, 5, 4, 0],  # word 3 (1.0), word 4 twice (0.5), word 5 (1.0)
        ]
    )
    bags = {0: {1: 2.0, 2: 0.5}, 2: {3: 1.0, 4: 0.5, 5: 1.0}}
    loss = bag_of_words_loss(features, words, tokens, token_weights)
    assert loss is not None and float(loss) == pytest.approx(
        hand_written_loss(features, words, bags), rel=1e-5
    )
    features.requires_grad_(True)
    bag_of_words_loss(features, words, tokens, token_weights).backward()  # type: ignore[union-attr]
    assert features.grad[1].eq(0).all() and features.grad[0].abs().sum() > 0  # row 1 left out
    nothing = torch.tensor([[0, -1], [-1, -1]])
    assert bag_of_words_loss(features[:2], words, nothing, token_weights) is None


def test_shared_bag_is_the_words_both_segments_have_in_common():
    torch.manual_seed(0)
    features, words = torch.randn(3, 4), torch.randn(6, 4)
    token_weights = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.25, 1.0])
    first = torch.tensor([[0, 1, 1, 2, -1], [0, 3, 3, -1, -1], [0, 4, 4, 5, -1]])
    second = torch.tensor([[1, 2, 2, 0], [1, 2, 0, -1], [4, 4, 4, 5]])
    # row 0: word 1 min(2, 1) = 1.0, word 2 min(0.5, 1.0) = 0.5; row 1: nothing in common, left
    # out; row 2: word 4 min(0.5, 0.75) = 0.5, word 5 min(1, 1) = 1.0
    bags = {0: {1: 1.0, 2: 0.5}, 2: {4: 0.5, 5: 1.0}}
    loss = bag_of_words_loss(features, words, first, token_weights, shared_with=second)
    assert loss is not None and float(loss) == pytest.approx(
        hand_written_loss(features, words, bags), rel=1e-5
    )
    swapped = bag_of_words_loss(features, words, second, token_weights, shared_with=first)
    assert swapped is not None and float(swapped) == pytest.approx(float(loss), rel=1e-6)
    apart = torch.tensor([[5, -1], [4, 4], [1, 2]])  # no word of `first` in any row
    assert bag_of_words_loss(features, words, first, token_weights, shared_with=apart) is None


def test_bag_of_words_weights_subsample_frequent_words():
    counts = torch.tensor([0, 9_000, 900, 90, 10])  # 10,000 tokens; word 0 never seen
    weights = bag_of_words_weights(counts, threshold=1e-2)
    expected = [0.0, math.sqrt(1e-2 / 0.9), math.sqrt(1e-2 / 0.09), 1.0, 1.0]
    assert weights.tolist() == pytest.approx(expected, rel=1e-6)


def test_bow_weight_adds_the_loss_and_trains_the_pooler_to_predict_its_words(
    pretraining_corpus, tmp_path
):
    data = pretraining_corpus["nsp"]
    runs, records = runs_with_and_without(data, tmp_path, "bow_weight")
    for r in records:
        total = r["mlm_loss"] + r["nsp_loss"] + r["bow_loss"]
        assert r["loss"] == pytest.approx(total, rel=1e-6)
    assert all("bow_loss" not in r for r in read_metrics(runs[0.0]))
    assert (runs[1.0] / "curves.png").stat().st_size > 10_000  # drawn beside the NSP loss
    # the same validation pairs scored by both models: the one trained with the loss predicts
    # each pair's words from its pooled [CLS] better than the one trained without it
    scored = pooler_scores(
        runs, data, lambda pooled, words, ids, types, w: bag_of_words_loss(pooled, words, ids, w)
    )
    assert scored[1.0] < scored[0.0] - 0.05, scored
    with pytest.raises(BertforgeError, match="--train.bow_target shared chooses the target"):
        tiny_cfg(data, tmp_path, bow_target="shared")
    with pytest.raises(BertforgeError, match="--train.bow_target 'x'"):
        tiny_cfg(data, tmp_path, bow_weight=1.0, bow_target="x")
    with pytest.raises(BertforgeError, match="--train.bow_weight 1.0 trains the pooler"):
        tiny_cfg(pretraining_corpus["packed"], tmp_path, objective="mlm", bow_weight=1.0)
    with pytest.raises(BertforgeError, match="--train.bow_weight -1.0 must be 0 or more"):
        tiny_cfg(data, tmp_path, bow_weight=-1.0)


def test_bow_target_shared_trains_on_the_words_the_two_segments_share(pretraining_corpus, tmp_path):
    data = pretraining_corpus["nsp"]
    run = tmp_path / "shared"
    pretrain(tiny_cfg(data, run, max_steps=30, bow_weight=1.0, bow_target="shared"))
    records = [r for r in read_metrics(run) if r["split"] == "train"]
    assert len(records) == 30 and all(math.isfinite(r["bow_loss"]) for r in records)
    assert records[-1]["bow_loss"] < records[0]["bow_loss"]
    # the objective's term on a batch: the shared-bag loss of each pair's first segment (masked
    # words restored from the labels) against its second, not the bag of the whole pair
    objective = MaskedLMWithNSP(TrainConfig(bow_weight=1.0, bow_target="shared"))
    objective.bow_weights = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.25, 1.0])
    ids = torch.tensor([[0, 1, 2, 0, 5, 2, 0], [0, 3, 3, 0, 1, 3, 0]])  # 0: [CLS]/[SEP]
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])
    labels = torch.full_like(ids, IGNORE_INDEX)
    ids[0, 4], labels[0, 4] = 4, 1  # second segment's "1" masked (as word 4)
    pooled, words = torch.randn(2, 3), torch.randn(6, 3)
    model = SimpleNamespace(
        bert=SimpleNamespace(
            embeddings=SimpleNamespace(word_embeddings=SimpleNamespace(weight=words))
        )
    )
    output = SimpleNamespace(mlm_loss=torch.tensor(1.0), nsp_loss=None, pooler_output=pooled)
    batch = {"input_ids": ids, "labels": labels, "token_type_ids": types}
    term = objective.losses(output, batch, model)["bow_loss"]  # type: ignore[arg-type]
    # row 0 shares words 1 and 2 (1.0 and 0.5), row 1 word 3 (1.0)
    first = torch.tensor([[1, 2, -1], [3, 3, -1]])
    second = torch.tensor([[1, 2, -1], [1, 3, -1]])
    expected = bag_of_words_loss(pooled, words, first, objective.bow_weights, shared_with=second)
    assert expected is not None and float(term) == pytest.approx(float(expected), rel=1e-6)
    whole = bag_of_words_loss(pooled, words, ids.where(labels < 0, labels), objective.bow_weights)
    assert whole is not None and abs(float(whole) - float(term)) > 1e-3
