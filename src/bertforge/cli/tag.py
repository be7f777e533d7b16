"""``bertforge tag``: the named entities of texts (lines, a CSV/TSV/JSONL column, or the
sentences of a CoNLL-style file) with a fine-tuned token classifier, through
:func:`bertforge.inference.tagging.tag`; one JSON object per text, in order."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Literal

from bertforge.cli.common import (
    BackendOption,
    ModelOptions,
    TextInputs,
    finetune_defaults,
    load_model,
    load_onnx_model,
)
from bertforge.cli.options import parse_config
from bertforge.data.tagging import texts_to_tag
from bertforge.inference.tagging import Aggregation, tag
from bertforge.io import atomic_write_text
from bertforge.modeling.model import BertForTokenClassification
from bertforge.training.config import check_choice

InputFormat = Literal["auto", "lines", "table", "conll"]
TOKEN_CLASSIFIER = (
    "classifier.",
    "the checkpoint has no classifier weights; fine-tune it first (bertforge finetune --task "
    "token_classification) or point --model at a fine-tuned token classifier",
)


@dataclass(kw_only=True)
class TagConfig(ModelOptions, TextInputs, BackendOption):
    """Options of ``bertforge tag``."""

    input_format: InputFormat = "auto"
    """How --input holds its texts: lines (one per non-blank line), table (--text_column of a
    .csv/.tsv/.jsonl file), conll (the sentences of a CoNLL-style file, or of a JSONL file with
    ``tokens``, each tagged as its tokens joined by spaces); auto picks conll for .conll/.iob/
    .bio/.ner names and tokens JSONL, table for other .csv/.tsv/.jsonl, else lines."""
    text_column: str | None = None
    """Column of a table input (default text)."""
    max_length: int | None = None
    """Tokens per window with [CLS] and [SEP] (default: as in fine-tuning); longer texts are
    split into windows at word boundaries, never cut."""
    aggregation: Aggregation = "first"
    """first: a tag per word, from its first piece (as the model was trained and evaluated);
    simple: a tag per piece (transformers' aggregation_strategy="simple")."""
    output: str | None = None
    """Write the JSON lines here instead of standard output."""

    def __post_init__(self) -> None:
        ModelOptions.__post_init__(self)
        TextInputs.__post_init__(self)
        BackendOption.__post_init__(self)
        check_choice(self.input_format, InputFormat, "--input_format")
        check_choice(self.aggregation, Aggregation, "--aggregation")


def main(argv: list[str]) -> int:
    """``bertforge tag --model DIR --input FILE`` or ``bertforge tag --model DIR TEXT...``."""
    cfg = parse_config(
        TagConfig,
        argv,
        prog="bertforge tag",
        description=(
            "Find the named entities of texts with a fine-tuned token classifier; one JSON "
            'object per text: {"text", "entities": [{"entity", "word", "start", "end", '
            '"score"}]} with character offsets into the text.'
        ),
        positional=("texts", "texts (or --input FILE)"),
    )
    texts = (
        texts_to_tag(cfg.input, cfg.text_column, cfg.input_format, cfg.encoding_errors)
        if cfg.input
        else cfg.texts
    )
    if cfg.backend == "onnx":
        model, tokenizer, options = load_onnx_model(cfg, output="logits")
    else:
        model, tokenizer, options = load_model(
            BertForTokenClassification, cfg, require=TOKEN_CLASSIFIER
        )
    max_length = cfg.max_length
    if max_length is None:
        max_length = finetune_defaults(cfg.model).get("max_length")
    found = tag(
        model, tokenizer, texts, max_length=max_length, aggregation=cfg.aggregation, **options
    )
    lines = "".join(
        json.dumps({"text": t, "entities": e}, ensure_ascii=False) + "\n"
        for t, e in zip(texts, found, strict=True)
    )
    if cfg.output:
        atomic_write_text(cfg.output, lines)
        print(f"wrote {len(texts):,} rows to {cfg.output}", file=sys.stderr)
    else:
        sys.stdout.write(lines)
    return 0
