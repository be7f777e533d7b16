"""Learning-rate schedule (pure) and AdamW parameter groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.training.config import FinetuneConfig, TrainConfig
from bertforge.training.optim import build_optimizer, lr_at, lr_at_progress, param_groups


def test_linear_warmup_then_linear_decay_to_floor():
    lrs = [lr_at(s, max_lr=1.0, warmup=4, total=14) for s in range(14)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0)  # first decay step starts at the peak
    assert lrs[-1] == pytest.approx(0.1)  # (total - 1 - warmup) / (total - warmup) of the way
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:], strict=False))  # strictly decreasing
    assert lr_at(14, max_lr=1.0, warmup=4, total=14) == 0.0  # past the end: the floor


def test_cosine_decay_shape_and_floor():
    kw = dict(max_lr=2.0, warmup=0, total=100, schedule="cosine", min_lr_ratio=0.1)
    assert lr_at(0, **kw) == pytest.approx(2.0)
    assert lr_at(50, **kw) == pytest.approx(0.2 + 1.8 * 0.5)  # half way: middle of the cosine
    assert lr_at(100, **kw) == pytest.approx(0.2)
    assert lr_at(25, **kw) > 0.2 + 1.8 * 0.75  # cosine stays above the line early on


def test_constant_schedule_after_warmup():
    assert [
        lr_at(s, max_lr=3.0, warmup=2, total=10, schedule="constant") for s in (0, 1, 5, 9)
    ] == [1.5, 3.0, 3.0, 3.0]


def test_progress_schedule_matches_its_definition():
    kw = dict(max_lr=1.0, warmup=0.1, schedule="linear")
    assert lr_at_progress(0.0, **kw) == 0.0
    assert lr_at_progress(0.05, **kw) == pytest.approx(0.5)
    assert lr_at_progress(0.1, **kw) == pytest.approx(1.0)
    assert lr_at_progress(0.55, **kw) == pytest.approx(0.5)
    assert lr_at_progress(1.0, **kw) == 0.0
    assert lr_at_progress(7.0, **kw) == 0.0  # over budget: clamped to the floor
    cos = lr_at_progress(0.55, max_lr=1.0, warmup=0.1, schedule="cosine", min_lr_ratio=0.2)
    assert cos == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_trapezoid_holds_the_peak_then_decays_as_one_minus_sqrt():
    """Warmup, the peak until the last decay_ratio of training, then 1 - sqrt to the floor; by
    steps (the last 20 of 100) and by progress (wall-clock budgets) alike."""
    kw = dict(max_lr=2.0, warmup=10, total=100, schedule="trapezoid", decay_ratio=0.2)
    lrs = [lr_at(s, **kw) for s in range(100)]
    assert lrs[:10] == pytest.approx([2.0 * (s + 1) / 10 for s in range(10)])
    assert lrs[10:80] == pytest.approx([2.0] * 70)  # the flat top
    assert lrs[80] == pytest.approx(2.0)  # the first decay step starts at the peak
    assert lrs[85] == pytest.approx(2.0 * (1 - math.sqrt(5 / 20)))  # a quarter in: 1 - 0.5
    assert all(a > b for a, b in zip(lrs[80:], lrs[81:], strict=False))
    drops = [a - b for a, b in zip(lrs[80:], lrs[81:], strict=False)]
    assert drops[0] > 3 * drops[-1]  # steep first, flat near the end: not a straight line
    assert lr_at(100, **kw) == 0.0
    assert lr_at(100, **kw, min_lr_ratio=0.1) == pytest.approx(0.2)
    by_time = dict(max_lr=1.0, warmup=0.1, schedule="trapezoid", decay_ratio=0.5)
    assert lr_at_progress(0.05, **by_time) == pytest.approx(0.5)
    assert lr_at_progress(0.4, **by_time) == pytest.approx(1.0)
    assert lr_at_progress(0.5 + 0.5 * 0.64, **by_time) == pytest.approx(1 - 0.8)
    assert lr_at_progress(1.0, **by_time) == 0.0


def test_bad_schedule_arguments_raise_with_the_fix():
    # the configs check the schedule's options once; lr_at runs every step unchecked
    with pytest.raises(BertforgeError, match="--train.schedule 'step': choose one of linear"):
        TrainConfig(schedule="step")  # type: ignore[arg-type]
    with pytest.raises(BertforgeError, match="--schedule 'step': choose one of linear"):
        FinetuneConfig(model="m", train=["t"], output="o", schedule="step")  # type: ignore[arg-type]
    with pytest.raises(BertforgeError, match="min_lr_ratio"):
        TrainConfig(min_lr_ratio=1.5)
    with pytest.raises(BertforgeError, match="--train.decay_ratio 0.0 must lie in"):
        TrainConfig(decay_ratio=0.0)
    with pytest.raises(BertforgeError, match="warmup and decay would overlap"):
        TrainConfig(schedule="trapezoid", warmup_ratio=0.3, decay_ratio=0.8)
    TrainConfig(warmup_ratio=0.3, decay_ratio=0.8)  # a linear schedule never reads decay_ratio
    with pytest.raises(BertforgeError, match="total=0"):
        lr_at(0, max_lr=1.0, warmup=0, total=0)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10)
        self.out.weight = self.emb.weight  # tied, as BERT's decoder is


def test_param_groups_exclude_biases_and_layernorm_and_count_tied_once():
    model = _Block()
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == ids([model.dense.weight, model.emb.weight])
    assert ids(no_decay["params"]) == ids(
        [model.dense.bias, model.LayerNorm.weight, model.LayerNorm.bias, model.out.bias]
    )


def test_build_optimizer_steps_and_only_decays_matrices():
    torch.manual_seed(0)
    model = _Block()
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5)
    ln_before = model.LayerNorm.weight.detach().clone()
    w_before = model.dense.weight.detach().clone()
    # zero gradients: Adam's update is 0, so only decoupled weight decay moves a parameter
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(model.LayerNorm.weight, ln_before)
    assert torch.allclose(model.dense.weight, w_before * (1 - 0.1 * 0.5))
    with pytest.raises(BertforgeError, match="learning rate"):
        build_optimizer(model, lr=0.0)
