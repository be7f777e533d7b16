"""``bertforge benchmark``: :class:`~bertforge.training.benchmark.BenchmarkConfig`'s options, then
:func:`bertforge.training.benchmark.benchmark`."""

from __future__ import annotations

from bertforge.cli.options import parse_config
from bertforge.evaluation import benchmark as B
from bertforge.evaluation.embedding_suite import EMBEDDING_TASKS
from bertforge.training.benchmark import BenchmarkConfig, benchmark

# each suite with its tasks, as the code declares them (a new suite or task appears in --help)
_SUITES = {name: [spec.name for spec in specs] for name, specs in B.SUITES.items()}
_SUITES["embedding"] = [task.name for task in EMBEDDING_TASKS]
DESCRIPTION = (
    "Fine-tune a model on a suite of public tasks ("
    + "; ".join(f"{name}: {', '.join(tasks)}" for name, tasks in _SUITES.items())
    + "; embedding scores the model's vectors as they are, no training) and score each on its "
    "dev/test file, beside a constant "
    "baseline, optionally the model's random twin (--baseline), and for glue Google's published "
    "BERT miniatures (GLUE test-set numbers). Writes "
    "results.json, results.md and results.png; run it again to resume (finished tasks are "
    "skipped). With --curve, draws finished glue benchmarks of runs' snapshots against "
    "pretraining minutes instead, a line per run (curve.png). See docs/benchmark.md."
)


def main(argv: list[str]) -> int:
    """``bertforge benchmark --model DIR --output DIR [--suite glue] [options]``, or
    ``bertforge benchmark --curve RESULTS_DIR ... --output DIR``."""
    cfg = parse_config(BenchmarkConfig, argv, prog="bertforge benchmark", description=DESCRIPTION)
    benchmark(cfg)
    return 0
