"""Evaluation: masked-LM loss/accuracy against a random-initialised twin (``mlm``), task scores
of a fine-tuned model (``task_scores``), the metrics as pure NumPy functions (``metrics``) and the
plots (``plots``)."""

from bertforge.evaluation.mlm import comparison_table, evaluate_mlm, random_init_like
from bertforge.evaluation.task_scores import evaluate_sequence_model, task_report

__all__ = [
    "comparison_table",
    "evaluate_mlm",
    "evaluate_sequence_model",
    "random_init_like",
    "task_report",
]
