"""Micro-batching checks shared by the distillation tests: the gradient of one step over a
batch of rows, taken whole and in micro-batches, from a real run's setup."""

from __future__ import annotations

import numpy as np
import torch

from bertforge.cli.options import parse_config
from bertforge.training.distill import setup, train_step
from bertforge.training.distill_config import DistillConfig


def step_gradients(argv: list[str], rows: np.ndarray, micros: list[int]) -> list[dict]:
    """For each micro-batch size in ``micros``: the gradients of one step over ``rows`` (every
    trained parameter, the layer losses' projection included) and its logged losses."""
    cfg = parse_config(DistillConfig, argv[1:], prog="bertforge distill", description="")
    run, _ = setup(cfg)
    trained = [p for p in [*run.model.parameters(), *run.layers.parameters()] if p.requires_grad]
    out = []
    for micro in micros:
        run.cfg.micro_batch_size = micro
        for p in trained:
            p.grad = None
        report = train_step(run, rows)
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in trained]
        out.append({"grads": grads, "losses": report.losses, "run": run})
    return out


def assert_same_step(steps: list[dict]) -> None:
    """Every micro-batched step has the whole batch's gradients and logged losses."""
    whole = steps[0]
    for other in steps[1:]:
        for a, b in zip(whole["grads"], other["grads"], strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
        assert whole["losses"].keys() == other["losses"].keys()
        for name, value in whole["losses"].items():
            assert abs(other["losses"][name] - value) <= 1e-5 * max(1.0, abs(value)), name
