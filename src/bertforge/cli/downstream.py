"""``bertforge downstream``: every ``bertforge finetune`` option (:class:`DownstreamConfig` extends
``FinetuneConfig``), plus the test file, the twin's initialisation seed and an optional baseline
model; then ``bertforge.training.downstream.downstream``."""

from __future__ import annotations

from dataclasses import dataclass, fields

from bertforge.cli.options import parse_config
from bertforge.modeling.checkpoint import resolve_model
from bertforge.training.config import FinetuneConfig
from bertforge.training.downstream import downstream

DESCRIPTION = (
    "Fine-tune a pretrained encoder and its random-initialised twin (same config, tokenizer "
    "and settings; weights of a fresh initialisation) on a labelled file, score both on a "
    "test file and print them side by side: what pretraining is worth on this task. Every "
    "option of bertforge finetune applies to all models alike."
)


@dataclass(kw_only=True)
class DownstreamConfig(FinetuneConfig):
    """Everything ``bertforge downstream`` needs: ``bertforge finetune``'s options and its own."""

    model: str
    """The pretrained model directory (e.g. RUN/model of bertforge pretrain)."""
    output: str
    """Output directory: one fine-tuning run per model (pretrained/, random_init/, baseline/), the
    twin (random_init_model/) and downstream.json."""
    test: list[str]
    """Labelled test file(s) with the same columns as --train; never used for training or model
    selection."""
    baseline: str | None = None
    """Another model fine-tuned and scored the same way, as a third column (e.g.
    all-MiniLM-L6-v2)."""
    init_seed: int = 0
    """Seed of the random twin's initialisation."""


def main(argv: list[str]) -> int:
    """``bertforge downstream --model DIR --train FILE --test FILE --output DIR [options]``."""
    cfg = parse_config(DownstreamConfig, argv, prog="bertforge downstream", description=DESCRIPTION)
    finetune_cfg = FinetuneConfig(**{f.name: getattr(cfg, f.name) for f in fields(FinetuneConfig)})
    baseline = None if cfg.baseline is None else resolve_model(cfg.baseline)
    downstream(finetune_cfg, cfg.test, baseline=baseline, init_seed=cfg.init_seed)
    return 0
