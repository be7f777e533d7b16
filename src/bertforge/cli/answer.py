"""``bertforge answer``: extractive question answering with a fine-tuned model
(:func:`bertforge.inference.qa.answer`): one question and its context from the command line, or
a SQuAD .json / .jsonl file of questions written as SQuAD-style predictions."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.cli.common import BackendOption, ModelOptions, load_model, load_onnx_model
from bertforge.cli.options import parse_config
from bertforge.data.corpus import EncodingErrors
from bertforge.data.qa import QAExample, Span, read_qa
from bertforge.errors import BertforgeError
from bertforge.evaluation.qa import squad_metrics
from bertforge.inference.qa import answer
from bertforge.io import atomic_write_text
from bertforge.modeling.model import BertForQuestionAnswering
from bertforge.training.config import check_at_least, check_choice

QA_HEAD = (
    "qa_outputs.",
    "the checkpoint has no question-answering head (qa_outputs.*); fine-tune it first "
    "(bertforge finetune --task question_answering) or point --model at such a model",
)


@dataclass(kw_only=True)
class AnswerConfig(ModelOptions, BackendOption):
    """Options of ``bertforge answer``."""

    question: str | None = None
    """The question (with --context)."""
    batch_size: int = 32
    """Windows per forward pass (a window: the question and a piece of its context)."""
    context: str | None = None
    """The text that holds the answer (with --question)."""
    input: str | None = None
    """A file of questions instead: SQuAD .json or .jsonl rows {id, question, context} (answers
    optional; with them EM/F1 are printed), optionally .gz, .bz2 or .xz."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes of --input that are not UTF-8 (naming the line); replace: read them
    as U+FFFD."""
    output: str | None = None
    """With --input: the SQuAD-style predictions {id: answer} JSON to write."""
    details: str | None = None
    """With --input: the JSON lines {id, answer, score, probability, start, end} to write
    (default: --output with .jsonl in place of .json)."""
    max_length: int | None = None
    """Tokens per window (default: as in fine-tuning)."""
    doc_stride: int | None = None
    """Overlap of the windows of a long context (default: as in fine-tuning, else 128)."""
    max_answer_length: int | None = None
    """Longest answer in tokens, at least 1 (default: as in fine-tuning, else 30)."""
    top_k: int = 1
    """Spans per question: above 1, the next-best top_k - 1 distinct spans are listed in
    "alternatives" (as the server's /answer)."""

    def __post_init__(self) -> None:
        ModelOptions.__post_init__(self)
        BackendOption.__post_init__(self)
        check_choice(self.encoding_errors, EncodingErrors, "--encoding_errors")
        check_at_least(self, lambda name: f"--{name}", max_answer_length=1, doc_stride=0, top_k=1)
        if self.input is None and (self.question is None or self.context is None):
            raise BertforgeError("give --question Q --context C, or --input FILE --output F")
        if self.input is not None and (self.question is not None or self.context is not None):
            raise BertforgeError("give --question/--context or --input, not both")
        if self.input is not None and self.output is None:
            raise BertforgeError("--input needs --output PREDICTIONS.json")


def span_row(span: Span, top_k: int = 1) -> dict[str, Any]:
    """A span as JSON: ``score`` is None when no span fitted (an empty answer), so the output is
    always valid JSON (no ``-Infinity``); ``alternatives`` with ``top_k`` above 1."""
    score = round(span.score, 4) if math.isfinite(span.score) else None
    row = {"answer": span.text, "score": score, "probability": round(span.probability, 4),
           "start": span.start, "end": span.end}  # fmt: skip
    if top_k > 1:
        row["alternatives"] = [span_row(a) for a in span.alternatives]
    return row


def main(argv: list[str]) -> int:
    """``bertforge answer --model DIR --question Q --context C`` or ``--input F --output P``."""
    cfg = parse_config(
        AnswerConfig,
        argv,
        prog="bertforge answer",
        description="Find the answer to a question in its context (extractive QA).",
    )
    if cfg.input:
        examples, warnings = read_qa(cfg.input, labelled=False, encoding_errors=cfg.encoding_errors)
        for warning in warnings:
            print(warning, file=sys.stderr)
    else:
        examples = [QAExample("0", str(cfg.question), str(cfg.context))]
    if cfg.backend == "onnx":
        model, tokenizer, options = load_onnx_model(cfg, output="start_logits")
    else:
        model, tokenizer, options = load_model(BertForQuestionAnswering, cfg, require=QA_HEAD)
    spans = answer(
        model,
        tokenizer,
        examples,
        max_length=cfg.max_length,
        doc_stride=cfg.doc_stride,
        max_answer_length=cfg.max_answer_length,
        top_k=cfg.top_k,
        **options,
    )
    rows = [{"id": e.id, **span_row(s, cfg.top_k)} for e, s in zip(examples, spans, strict=True)]
    if not cfg.input:
        row = {k: v for k, v in rows[0].items() if k != "id"}
        print(json.dumps(row, ensure_ascii=False, allow_nan=False))
        return 0
    output = Path(str(cfg.output))
    details = Path(cfg.details) if cfg.details else output.with_suffix(".jsonl")
    predictions = {r["id"]: r["answer"] for r in rows}
    atomic_write_text(output, json.dumps(predictions, ensure_ascii=False, indent=1) + "\n")
    lines = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)
    atomic_write_text(details, lines)
    print(f"wrote {len(rows):,} answers to {output} and {details}", file=sys.stderr)
    gold = {e.id: e.answers for e in examples if e.answers}
    if gold:
        scores = squad_metrics(predictions, gold)
        print(
            f"exact_match {scores['exact_match']:.4f} f1 {scores['f1']:.4f} on {len(gold):,} "
            "answered questions (SQuAD v1.1 official, as fractions)",
            file=sys.stderr,
        )
    return 0
