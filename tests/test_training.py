"""The per-step pieces both training loops share (bertforge.training): the schedule by steps or
by time, the budget, skipping non-finite steps, the log-line means, resume checks and checkpoint
writing; and the JSON-lines reader the corpus and the task tables share."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from bertforge.data.corpus import read_documents
from bertforge.data.tables import read_table
from bertforge.errors import BertforgeError
from bertforge.modeling.model import BertModel
from bertforge.training.checkpoints import (
    check_same_run,
    list_checkpoints,
    load_train_state,
    write_checkpoint,
)
from bertforge.training.optim import build_optimizer, lr_at, lr_at_progress
from bertforge.training.steps import NonFiniteGuard, RunningMeans, budget_spent, scheduled_lr

SCHEDULE = SimpleNamespace(lr=1e-3, warmup_ratio=0.1, schedule="linear", decay_ratio=0.2)


def test_lr_follows_steps_without_a_time_budget_and_time_with_one():
    for step in (0, 5, 50, 99):
        expected = lr_at(step, max_lr=1e-3, warmup=10, total=100, schedule="linear")
        assert scheduled_lr(step, 123.0, SCHEDULE, total_steps=100, budget=None) == expected
    half_time = lr_at_progress(0.5, max_lr=1e-3, warmup=0.1, schedule="linear")
    assert scheduled_lr(10, 30.0, SCHEDULE, total_steps=100, budget=60.0) == half_time
    # the steps are further along than the clock: the schedule follows them
    steps_ahead = lr_at_progress(0.8, max_lr=1e-3, warmup=0.1, schedule="linear")
    assert scheduled_lr(80, 30.0, SCHEDULE, total_steps=100, budget=60.0) == steps_ahead
    assert scheduled_lr(80, 30.0, SCHEDULE, total_steps=None, budget=60.0) == half_time
    floor = SimpleNamespace(**vars(SCHEDULE), min_lr_ratio=0.5)
    assert scheduled_lr(100, 0.0, floor, total_steps=100, budget=None) == pytest.approx(5e-4)
    with pytest.raises(BertforgeError, match="set a budget"):
        scheduled_lr(0, 0.0, SCHEDULE, total_steps=None, budget=None)


def test_budget_is_spent_by_steps_or_by_time():
    assert not budget_spent(9, 1e9, total_steps=10, budget=None)
    assert budget_spent(10, 0.0, total_steps=10, budget=None)
    assert budget_spent(3, 60.0, total_steps=10, budget=60.0)
    assert not budget_spent(10**6, 59.0, total_steps=None, budget=60.0)


def test_non_finite_steps_are_skipped_until_too_many_in_a_row():
    guard = NonFiniteGuard(3, "lower --lr")
    assert guard.allows(1.0, 2.0, step=1)
    assert not guard.allows(math.nan, 2.0, step=2)
    assert not guard.allows(1.0, math.inf, step=3)
    assert guard.allows(1.0, 2.0, step=4)  # a good step resets the streak
    assert not guard.allows(math.inf, 1.0, step=5)
    assert not guard.allows(math.nan, 1.0, step=6)
    with pytest.raises(BertforgeError, match=r"non-finite for 3 steps in a row \(step 7\); lower"):
        guard.allows(math.nan, 1.0, step=7)


def test_running_means_leave_out_non_finite_losses_but_count_their_time():
    window = RunningMeans()
    window.add(100, 1.0, loss=2.0, mlm_loss=1.5)
    window.add(100, 1.0, loss=math.nan, mlm_loss=1.0)
    window.add(200, 2.0, loss=4.0, mlm_loss=3.5)
    assert window.means("loss", "mlm_loss") == {"loss": 3.0, "mlm_loss": 2.5}
    assert window.tokens_per_s == 100.0
    window.reset()
    assert window.means("loss") == {"loss": 0.0} and window.tokens == 0.0


def test_resume_refuses_changed_settings_by_their_option_name(tmp_path):
    saved = {"batch_size": 16, "seed": 0}
    check_same_run(tmp_path, saved, {"batch_size": 16, "seed": 0})
    with pytest.raises(BertforgeError, match="--batch_size was 16, now 8"):
        check_same_run(
            tmp_path,
            saved,
            {"batch_size": 8, "seed": 0},
            option=lambda k: "--" + k,
        )


def test_checkpoints_are_written_whole_and_rotated(tiny_config, tmp_path):
    model = BertModel(tiny_config)
    optimizer = build_optimizer(model, 1e-3, 0.01)
    for step in (1, 2, 3):
        state = {"step": step, "elapsed": float(step)}
        path = write_checkpoint(tmp_path, model, None, state=state, optimizer=optimizer, keep=2)
        assert path.name == f"checkpoint-{step:08d}"
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-00000002",
        "checkpoint-00000003",
    ]
    state, _ = load_train_state(tmp_path / "checkpoint-00000003", optimizer=optimizer)
    assert state == {"step": 3, "elapsed": 3.0}
    again = BertModel.from_pretrained(tmp_path / "checkpoint-00000003")
    expected, loaded = model.state_dict(), again.state_dict()
    assert all(torch.equal(expected[k], loaded[k]) for k in expected)


def test_corpus_and_task_tables_report_a_bad_json_line_alike(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "fine", "label": 1}\n{"text": broken\n', encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"rows.jsonl:2: not valid JSON .*; fix the line"):
        read_table(path)
    with pytest.raises(BertforgeError, match=r"rows.jsonl:2: not valid JSON .*; fix the line"):
        list(read_documents(path, text_column="text"))
