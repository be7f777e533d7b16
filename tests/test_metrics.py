"""Metrics against values worked out by hand (and, where it is installed, against scipy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertforge.evaluation import metrics as M

# three classes, hand-counted: cm = [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
T3 = [0, 0, 1, 1, 2, 2]
P3 = [0, 1, 1, 1, 2, 0]


def test_confusion_matrix_rows_are_true_columns_are_predicted():
    assert M.confusion_matrix(T3, P3).tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert M.confusion_matrix([0], [0], num_classes=3).shape == (3, 3)
    with pytest.raises(ValueError):
        M.confusion_matrix([0, 3], [0, 1], num_classes=3)


def test_accuracy_f1_mcc_hand_computed():
    assert M.accuracy(T3, P3) == pytest.approx(4 / 6)
    # per-class F1: 1/2, 4/5, 2/3
    assert M.macro_f1(T3, P3) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    # Gorodkin: (c*n - t.p) / sqrt((n^2 - t.t)(n^2 - p.p)) = (24 - 12) / sqrt(24 * 22)
    assert M.mcc(T3, P3) == pytest.approx(12 / math.sqrt(24 * 22))


def test_binary_mcc_equals_the_two_by_two_formula():
    # TP=2 FN=1 TN=1 FP=1 -> (2*1 - 1*1) / sqrt(3*3*2*2)
    assert M.mcc([1, 1, 1, 0, 0], [1, 1, 0, 0, 1]) == pytest.approx(1 / 6)
    assert M.mcc([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert M.mcc([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert M.mcc([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0  # constant prediction: undefined -> 0


def test_per_class_report_and_text_table():
    report = M.per_class_report(T3, P3, ["neg", "neu", "pos"])
    assert [r["label"] for r in report] == ["neg", "neu", "pos"]
    assert report[1] == {
        "label": "neu",
        "precision": pytest.approx(2 / 3),
        "recall": 1.0,
        "f1": pytest.approx(0.8),
        "support": 2,
    }
    assert report[2]["precision"] == 1.0 and report[2]["recall"] == 0.5
    text = M.format_report(report, {"accuracy": 4 / 6})
    assert "neu" in text.splitlines()[2] and "0.6667" in text.splitlines()[-1]


def test_class_never_predicted_has_zero_precision_not_nan():
    report = M.per_class_report([0, 1, 1], [1, 1, 1], ["a", "b"])
    assert report[0]["precision"] == 0.0 and report[0]["f1"] == 0.0
    assert M.macro_f1([0, 1, 1], [1, 1, 1]) == pytest.approx((0 + 0.8) / 2)


def test_regression_metrics_hand_computed():
    assert M.mse([1, 2, 3], [2, 2, 5]) == pytest.approx(5 / 3)
    assert M.mae([1, 2, 3], [2, 2, 5]) == pytest.approx(1.0)
    # centred x = (-1, 0, 1), centred y = (-7/3, -1/3, 8/3): cov 5, var 2 and 114/9
    assert M.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert M.pearson([1, 2, 3], [5, 5, 5]) == 0.0


def test_spearman_uses_average_ranks_for_ties():
    assert M.rankdata([5, 6, 7, 8, 7]).tolist() == [1.0, 2.0, 3.5, 5.0, 3.5]
    # ranks (1..5) vs (1, 2, 3.5, 5, 3.5): cov 8, variances 10 and 9.5
    assert M.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert M.spearman([1, 2, 3], [1, 8, 27]) == pytest.approx(1.0)  # monotone, not linear
    assert M.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_matches_scipy_on_random_data():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 10, 200), rng.normal(size=200)
    assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_mismatched_or_empty_inputs_are_rejected():
    with pytest.raises(ValueError, match="3 values"):
        M.accuracy([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="at least one"):
        M.mse([], [])
