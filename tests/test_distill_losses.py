"""The distillation losses (``bertforge.training.distill_losses``) against values computed by hand
on tiny tensors (closed forms with ``math``, not the torch code under test), and the
temperature's gradient scale: ``T^2 KL`` has the gradient ``T (p_s - p_t) / N``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertforge.training.distill_losses import (
    AttentionLoss,
    EmbeddingLoss,
    HiddenStateLoss,
    LogitsLoss,
    RelationLoss,
    SpanLoss,
    combine,
    cosine_matrix_mse,
    distribution_kl,
    pca_projection,
    self_relations,
    soft_target_kl,
    token_mse,
    uniform_layer_map,
)


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True) if a > 0)


def softmax(x: list[float]) -> list[float]:
    e = [math.exp(v) for v in x]
    return [v / sum(e) for v in e]


def test_soft_target_kl_by_hand_at_two_temperatures():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])  # softmax: 0.75, 0.25
    assert float(soft_target_kl(student, teacher, 1.0)) == pytest.approx(
        0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-6
    )
    p_t = [math.sqrt(3) / (math.sqrt(3) + 1), 1 / (math.sqrt(3) + 1)]  # softmax(t / 2)
    assert float(soft_target_kl(student, teacher, 2.0)) == pytest.approx(
        4 * kl(p_t, [0.5, 0.5]), abs=1e-6
    )
    assert float(soft_target_kl(teacher, teacher, 3.0)) == pytest.approx(0.0, abs=1e-6)


def test_temperature_squared_keeps_the_gradient_scale():
    """d/ds T^2 KL(softmax(t/T) || softmax(s/T)) = T (softmax(s/T) - softmax(t/T)) / N: at a high
    temperature the soft targets' gradient is about (s - t) / (C N), whatever T (without T^2 it
    would shrink as 1/T^2)."""
    s0 = [[0.5, -1.0, 2.0], [0.0, 1.0, 0.0]]
    t = [[1.0, 0.0, -1.0], [2.0, 0.0, 1.0]]
    grads = {}
    for T in (1.0, 4.0, 1000.0):
        s = torch.tensor(s0, dtype=torch.float64, requires_grad=True)
        soft_target_kl(s, torch.tensor(t, dtype=torch.float64), T).backward()
        expected = [
            [T * (a - b) / 2 for a, b in zip(softmax([v / T for v in sr]), softmax([v / T for v in tr]), strict=True)]
            for sr, tr in zip(s0, t, strict=True)
        ]  # fmt: skip
        torch.testing.assert_close(s.grad, torch.tensor(expected, dtype=torch.float64))
        grads[T] = s.grad
    # high-temperature limit: (s - t) / (C N), centred per row (Hinton et al. 2015, eq. 3-4)
    limit = torch.tensor(s0, dtype=torch.float64) - torch.tensor(t, dtype=torch.float64)
    limit = (limit - limit.mean(-1, keepdim=True)) / (3 * 2)
    torch.testing.assert_close(grads[1000.0], limit, atol=3e-4, rtol=0)


def test_soft_target_kl_mask_keeps_the_labelled_tokens_only():
    student = torch.tensor([[[0.0, 0.0], [5.0, -5.0]]])  # (B=1, T=2, C=2)
    teacher = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, False]])
    got = soft_target_kl(student, teacher, 1.0, mask)
    assert float(got) == pytest.approx(kl([0.75, 0.25], [0.5, 0.5]), abs=1e-6)


def test_logits_loss_mixes_soft_and_gold_by_alpha():
    loss = LogitsLoss(regression=False, alpha=0.25, temperature=1.0)
    student = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    labels = torch.tensor([0, 1])
    terms = loss(student, teacher, labels, torch.tensor([True, False]))
    soft = kl([0.75, 0.25], [0.5, 0.5])
    assert float(terms["soft"]) == pytest.approx(soft, abs=1e-6)
    assert float(terms["hard"]) == pytest.approx(math.log(2.0), abs=1e-6)  # row 0 only
    assert float(loss.loss(terms)) == pytest.approx(0.25 * soft + 0.75 * math.log(2), abs=1e-6)
    alone = loss(student, teacher, labels, torch.tensor([False, False]))  # transfer text
    assert set(alone) == {"soft"} and float(loss.loss(alone)) == pytest.approx(soft, abs=1e-6)


def test_regression_loss_is_mse_to_the_teacher_and_to_gold():
    loss = LogitsLoss(regression=True, alpha=0.5, temperature=2.0)
    terms = loss(
        torch.tensor([[1.0], [3.0]]), torch.tensor([[2.0], [1.0]]), torch.tensor([0.0, 3.0])
    )
    assert float(terms["soft"]) == pytest.approx((1 + 4) / 2)  # the temperature plays no part
    assert float(terms["hard"]) == pytest.approx((1 + 0) / 2)
    assert float(loss.loss(terms)) == pytest.approx(0.5 * 2.5 + 0.5 * 0.5)


def test_span_loss_compares_start_and_end_over_real_tokens():
    mask = torch.tensor([[1, 1, 0]])
    student = (torch.tensor([[0.0, 0.0, 9.0]]), torch.tensor([[0.0, 0.0, -9.0]]))
    teacher = (torch.tensor([[math.log(3.0), 0.0, 9.0]]), torch.tensor([[0.0, 0.0, 9.0]]))
    terms = SpanLoss(alpha=0.5, temperature=1.0)(
        student, teacher, mask, (torch.tensor([0]), torch.tensor([1]))
    )
    # the padded third position counts for neither model: start KL as by hand, end equal
    assert float(terms["soft"]) == pytest.approx(kl([0.75, 0.25], [0.5, 0.5]) / 2, abs=1e-6)
    assert float(terms["hard"]) == pytest.approx(math.log(2.0), abs=1e-6)


def test_embedding_loss_mse_and_cosine_terms():
    student = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    teacher = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    terms = EmbeddingLoss(cosine_weight=2.0)(student, teacher)
    assert float(terms["mse"]) == pytest.approx(1 / 4)
    # student cosines [[1, 0], [0, 1]]; teacher's off-diagonal cos 45 degrees
    c = 1 / math.sqrt(2)
    assert float(terms["cosine"]) == pytest.approx(2 * c**2 / 4, abs=1e-6)
    assert float(cosine_matrix_mse(student, teacher)) == pytest.approx(c**2 / 2, abs=1e-6)
    assert float(combine(terms, {"mse": 1.0, "cosine": 2.0})) == pytest.approx(0.25 + c**2)
    projected = EmbeddingLoss(projection=np.array([[1.0, 1.0]], dtype=np.float32))
    # a 2-wide teacher onto a 1-wide student: targets 2 and 2
    terms = projected(torch.tensor([[1.0], [2.0]]), teacher)
    assert float(terms["mse"]) == pytest.approx((1 + 0) / 2)


def test_pca_projection_finds_the_main_direction():
    rng = np.random.default_rng(0)
    along = rng.normal(size=(200, 1)) * 5.0
    across = rng.normal(size=(200, 1)) * 0.1
    u = np.array([1.0, 2.0, 0.0]) / math.sqrt(5)
    w = np.array([-2.0, 1.0, 0.0]) / math.sqrt(5)
    x = 3.0 + along * u + across * w  # (200, 3) near a line through (3, 3, 3)
    p = pca_projection(x, 1)
    assert p.shape == (1, 3)
    np.testing.assert_allclose(p[0], u, atol=5e-3)  # a sample: not exactly u
    assert abs(pca_projection(x, 2)[1] @ w) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError):
        pca_projection(x, 4)


def test_hidden_state_loss_projects_then_averages_real_tokens():
    student = [torch.tensor([[[1.0, 0.0], [3.0, 3.0]]])]  # (1, 2, 2)
    teacher = [torch.zeros(1, 2, 2), torch.tensor([[[0.0, 2.0], [0.0, 0.0]]])]
    mask = torch.tensor([[1, 0]])
    loss = HiddenStateLoss(2, 2, [(0, 1)])  # same widths: starts as the identity
    assert float(loss(student, teacher, mask)["hidden"].detach()) == pytest.approx((1 + 4) / 2)
    assert float(token_mse(student[0], teacher[1])) == pytest.approx(((1 + 4) / 2 + 9) / 2)
    wider = HiddenStateLoss(2, 3, [(0, 0)])
    assert wider.projection.weight.shape == (3, 2)
    terms = wider(student, [torch.zeros(1, 2, 3)], mask)
    terms["hidden"].backward()
    assert wider.projection.weight.grad is not None  # learned with the student


def test_attention_kl_by_hand_and_head_counts():
    student = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]]]])  # (B=1, nh=1, T=2, T=2)
    teacher = torch.tensor([[[[0.75, 0.25], [1.0, 0.0]]]])
    mask = torch.tensor([[1, 1]])
    got = distribution_kl(student, teacher, mask)
    expected = (kl([0.75, 0.25], [0.5, 0.5]) + kl([1.0, 0.0], [0.5, 0.5])) / 2
    assert float(got) == pytest.approx(expected, abs=1e-6)
    assert float(AttentionLoss([(0, 0)])([student], [teacher], mask)["attention"]) == pytest.approx(
        expected, abs=1e-6
    )
    with pytest.raises(ValueError, match="relation loss"):
        AttentionLoss([(0, 0)])([student], [teacher.repeat(1, 2, 1, 1)], mask)


def test_self_relations_and_the_relation_loss_across_head_counts():
    v = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # (B=1, T=2, D=2)
    mask = torch.tensor([[1, 1]])
    r = self_relations(v, mask, heads=1)  # softmax(v v^T / sqrt(2))
    row0 = softmax([1 / math.sqrt(2), 0.0])
    row1 = softmax([0.0, 4 / math.sqrt(2)])
    torch.testing.assert_close(r[0, 0], torch.tensor([row0, row1]), atol=1e-6, rtol=0)
    padded = self_relations(v, torch.tensor([[1, 0]]), heads=1)
    torch.testing.assert_close(padded[0, 0, :, 0], torch.ones(2))  # no weight on a padded key
    # a 2-wide student (its own heads irrelevant) against a 4-wide teacher, 1 relation head
    teacher = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    loss = RelationLoss([(0, 0)], heads=1)
    got = loss([(v, v, v)], [(teacher, teacher, teacher)], mask)["relation"]
    t_rows = [softmax([1 / 2, 0.0]), [0.5, 0.5]]  # teacher: d = 4
    expected = (kl(t_rows[0], row0) + kl(t_rows[1], row1)) / 2
    assert float(got) == pytest.approx(expected, abs=1e-6)


def test_uniform_layer_map_meets_at_the_last_layer():
    assert uniform_layer_map(2, 6) == [(0, 2), (1, 5)]
    assert uniform_layer_map(3, 12) == [(0, 3), (1, 7), (2, 11)]
    assert uniform_layer_map(4, 6)[-1] == (3, 5)
    with pytest.raises(ValueError):
        uniform_layer_map(7, 6)
