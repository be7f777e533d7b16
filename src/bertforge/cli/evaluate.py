"""``bertforge evaluate``: parses :class:`~bertforge.training.evaluate.EvaluateConfig` and calls
:func:`bertforge.training.evaluate.evaluate`."""

from __future__ import annotations

from bertforge.cli.options import parse_config
from bertforge.training.evaluate import EvaluateConfig, evaluate

__all__ = ["EvaluateConfig", "main"]

DESCRIPTION = (
    "Evaluate a model. A masked-language model (pretrained): MLM loss, perplexity and "
    "masked-token accuracy on a text file, next to a random-initialised network of the same "
    "shape. A fine-tuned classifier/regressor: its metrics on a labelled file, with the "
    "per-class report. A token classifier: entity-level precision/recall/F1 (seqeval's default "
    "mode), token accuracy and the per-type report on tagged files. A fine-tuned "
    "question-answering model: SQuAD v1.1 EM/F1 on a SQuAD .json or .jsonl file. A "
    "sentence-embedding model: STS Spearman/Pearson of scored pairs, or retrieval MRR@10, "
    "nDCG@10 and recall@1/10/100 of pairs or of a test set in BEIR files (--queries, --corpus, "
    "--qrels instead of --data), beside constant and random vectors."
)


def main(argv: list[str]) -> int:
    """``bertforge evaluate --model DIR --data FILE [...]`` (or ``--queries Q --corpus C --qrels R``
    in place of ``--data``)."""

    evaluate(parse_config(EvaluateConfig, argv, prog="bertforge evaluate", description=DESCRIPTION))
    return 0
