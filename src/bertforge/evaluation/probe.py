"""A cheap downstream check for pretraining runs: a linear probe on frozen features.

At each evaluation point the encoder embeds a labelled train slice and a test slice (the mean of
the last hidden states over the real tokens); a multinomial logistic regression is fitted on the
train features (standardised with the train mean and spread, L2-regularised, full-batch L-BFGS)
and scored on the test features. The encoder is not changed. A probe that rises above its value
at step 0 (the random network's features) shows *when* pretraining starts to pay off for the
task; ``bertforge downstream`` measures the full fine-tuning effect at the end.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.labelled import LabelledData, load_labelled
from bertforge.errors import BertforgeError
from bertforge.evaluation import metrics as M
from bertforge.inference.predict import embed


def fit_logistic_regression(
    x: np.ndarray, y: np.ndarray, num_classes: int, l2: float = 1e-3, max_iter: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``(D, C)`` and biases ``(C,)`` minimising mean cross-entropy of ``softmax(x W + b)``
    plus ``l2 * |W|^2`` on features ``x (N, D)`` and class ids ``y (N,)`` (float64, L-BFGS)."""
    features = torch.as_tensor(x, dtype=torch.float64)
    targets = torch.as_tensor(y, dtype=torch.int64)
    weight = torch.zeros(features.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(features @ weight + bias, targets) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach().numpy(), bias.detach().numpy()


def probe_scores(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    num_classes: int,
    l2: float = 1e-3,
) -> dict[str, float]:
    """Fit the probe on standardised train features; accuracy, macro-F1 and MCC on the test
    features (standardised with the train statistics), and the train accuracy."""
    mean = train_x.mean(0)
    std = train_x.std(0) + 1e-6
    train_z, test_z = (train_x - mean) / std, (test_x - mean) / std
    weight, bias = fit_logistic_regression(train_z, train_y, num_classes, l2=l2)
    predictions = (test_z @ weight + bias).argmax(-1)
    scores = M.classification_metrics(test_y, predictions, num_classes)
    train_accuracy = float(((train_z @ weight + bias).argmax(-1) == train_y).mean())
    return {**scores, "train_accuracy": train_accuracy}


def _subset(data: LabelledData, n: int | None, seed: int) -> LabelledData:
    if n is None or len(data) <= n:
        return data
    pick = np.sort(np.random.default_rng(seed).choice(len(data), size=n, replace=False))
    return data.subset(pick)


class LinearProbe:
    """The probe of one pretraining run: labelled train/test texts read once, scored per call.

    ``probe(model)`` embeds both slices with ``model``'s encoder (any of our BERT classes), fits
    the logistic regression and returns ``accuracy, macro_f1, mcc, train_accuracy, examples,
    seconds``. ``max_examples`` rows of each file are drawn with a fixed seed (so a file sorted
    by label still gives both classes).
    """

    def __init__(
        self,
        tokenizer: Any,
        train: Sequence[str],
        test: Sequence[str],
        *,
        text_column: str = "text",
        label_column: str = "label",
        max_examples: int | None = 1000,
        max_length: int = 128,
        l2: float = 1e-3,
        batch_size: int = 64,
    ) -> None:
        train_data, id2label = load_labelled(
            list(train), text_column=text_column, label_column=label_column
        )
        label2id = {name: i for i, name in id2label.items()}
        test_data, _ = load_labelled(
            list(test), text_column=text_column, label_column=label_column, label2id=label2id
        )
        self.train, self.test = (
            _subset(train_data, max_examples, 0),
            _subset(test_data, max_examples, 1),
        )
        if len(np.unique(self.train.labels)) < 2:
            raise BertforgeError(
                f"probe train file {', '.join(train)}: a single label in the rows read; "
                "a probe needs two classes or more"
            )
        self.num_classes = len(id2label)
        self.tokenizer, self.max_length, self.l2 = tokenizer, max_length, l2
        self.batch_size = batch_size

    def features(self, model: nn.Module, data: LabelledData) -> np.ndarray:
        """Mean-pooled last hidden states, texts cut to ``max_length`` (at most the model's
        position table)."""
        limit = model.config.max_position_embeddings
        return embed(
            model,
            self.tokenizer,
            data.texts,
            pooling="mean",
            batch_size=self.batch_size,
            max_length=min(self.max_length, limit),
        )

    def __call__(self, model: nn.Module) -> dict[str, float]:
        start = time.perf_counter()
        scores = probe_scores(
            self.features(model, self.train),
            self.train.labels,
            self.features(model, self.test),
            self.test.labels,
            self.num_classes,
            l2=self.l2,
        )
        return {
            **scores,
            "examples": len(self.test),
            "seconds": round(time.perf_counter() - start, 2),
        }


__all__ = ["LinearProbe", "fit_logistic_regression", "probe_scores"]
