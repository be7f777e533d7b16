"""``bertforge fill-mask``, ``classify`` and ``embed``: texts from the command line or a file
through the inference functions of ``bertforge.inference.predict``; one JSON object per text (or
a .npy matrix for ``embed``)."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.cli.common import (
    BackendOption,
    ModelOptions,
    TaskOptions,
    TextInputs,
    finetune_defaults,
    load_model,
    load_onnx_model,
)
from bertforge.cli.options import parse_config
from bertforge.data.corpus import EncodingErrors
from bertforge.data.tables import read_texts
from bertforge.errors import BertforgeError
from bertforge.inference.predict import (
    PoolingMode,
    classify,
    embed,
    fill_mask,
    fill_mask_side_by_side,
    resolve_pooling,
)
from bertforge.io import atomic_write_bytes, atomic_write_text
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.progress import plural

MLM_HEAD = (
    "cls.predictions.transform",
    "the checkpoint has no masked-language-model head (cls.predictions.*); fill-mask needs a "
    "pretrained MLM model",
)
CLASSIFIER = (
    "classifier.",
    "the checkpoint has no classifier weights; fine-tune it first (bertforge finetune) or point "
    "--model at a fine-tuned model",
)
TEXTS = ("texts", "texts (or --input FILE)")  # the bare words of the command line


@dataclass(kw_only=True)
class FillMaskConfig(ModelOptions, TextInputs):
    """Options of ``bertforge fill-mask``."""

    text_column: str | None = None
    """Column of a CSV/TSV/JSONL input (default text)."""
    top_k: int = 5
    """Candidates per [MASK]."""
    compare: str | None = None
    """A second MLM model (e.g. the run's starting point): print both top-k side by side."""
    output: str | None = None
    """Write the JSON lines here instead of standard output."""

    def __post_init__(self) -> None:
        ModelOptions.__post_init__(self)
        TextInputs.__post_init__(self)


@dataclass(kw_only=True)
class ClassifyConfig(ModelOptions, TaskOptions, TextInputs, BackendOption):
    """Options of ``bertforge classify``."""

    output: str | None = None
    """Write the JSON lines here instead of standard output."""
    text_pair: list[str] | None = None
    """The second text of each text argument, for a model fine-tuned on pairs, in order:
    classify --model M "first text" --text_pair "second text" (with --input: --text_pair_column)."""

    def __post_init__(self) -> None:
        ModelOptions.__post_init__(self)
        TextInputs.__post_init__(self)
        BackendOption.__post_init__(self)
        if self.text_pair and self.input:
            raise BertforgeError(
                "--text_pair goes with texts given as arguments; with --input FILE name the "
                "second text's column with --text_pair_column"
            )
        if self.text_pair and len(self.text_pair) != len(self.texts):
            raise BertforgeError(
                f"{len(self.texts)} text(s) but {len(self.text_pair)} --text_pair value(s); give "
                "one second text per text, in order"
            )


@dataclass(kw_only=True)
class EmbedConfig(ModelOptions, BackendOption):
    """Options of ``bertforge embed``."""

    input: str
    """File of texts: one per line, or a CSV/TSV/JSONL table, a Parquet file or a datasets
    folder (with --text_column)."""
    output: str
    """The .npy file to write: an (N, hidden) float32 matrix."""
    text_column: str | None = None
    """Column of a table input (default text)."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes of --input that are not UTF-8 (naming the line); replace: read them
    as U+FFFD."""
    pooling: PoolingMode | None = None
    """cls (the [CLS] vector), mean (the mean over the real tokens), max or mean_sqrt_len;
    unset: what the model declares in 1_Pooling/config.json (sentence-transformers), else cls."""
    normalize: bool | None = None
    """Scale vectors to unit length; unset: as the model's modules.json declares (a 2_Normalize
    module), else no."""
    max_length: int | None = None
    """Truncate longer texts (default: the model's positions)."""

    def __post_init__(self) -> None:
        ModelOptions.__post_init__(self)
        BackendOption.__post_init__(self)
        if not self.output or not self.output.endswith(".npy"):
            raise BertforgeError("--output FILE.npy is required (a NumPy file)")


def _write_lines(records: list[dict[str, Any]], output: str | None) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if output:
        atomic_write_text(output, text)
        print(f"wrote {len(records):,} rows to {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _inputs(cfg: FillMaskConfig | ClassifyConfig) -> tuple[list[str], list[str] | None]:
    if cfg.input:
        pair_column = getattr(cfg, "text_pair_column", None)
        texts, pairs, _ = read_texts(cfg.input, cfg.text_column, pair_column, cfg.encoding_errors)
        return texts, pairs  # each output row shows its text: a skipped blank line is visible
    return list(cfg.texts), None


def fill_mask_main(argv: list[str]) -> int:
    """``bertforge fill-mask --model DIR "the man went to the [MASK] ." --top_k 5``; with
    ``--compare DIR2`` both models' guesses side by side (a table; JSON lines with --output)."""
    cfg = parse_config(
        FillMaskConfig,
        argv,
        prog="bertforge fill-mask",
        description="Predict every [MASK] of each text.",
        positional=TEXTS,
    )
    texts, _ = _inputs(cfg)
    model, tokenizer, options = load_model(BertForMaskedLM, cfg, require=MLM_HEAD)
    results = fill_mask(model, tokenizer, texts, cfg.top_k, **options)
    if not cfg.compare:
        _write_lines(results, cfg.output)
        return 0
    del model
    other = dataclasses.replace(cfg, model=cfg.compare)
    model, tokenizer, options = load_model(BertForMaskedLM, other, require=MLM_HEAD)
    compared = fill_mask(model, tokenizer, texts, cfg.top_k, **options)
    if cfg.output:
        _write_lines(
            [
                {"text": a["text"], "models": {cfg.model: a, cfg.compare: b}}
                for a, b in zip(results, compared, strict=True)
            ],
            cfg.output,
        )
    else:
        sys.stdout.write(fill_mask_side_by_side({cfg.model: results, cfg.compare: compared}))
    return 0


def classify_main(argv: list[str]) -> int:
    """``bertforge classify --model DIR TEXT...`` or ``--input FILE [--text_column C]``."""
    cfg = parse_config(
        ClassifyConfig,
        argv,
        prog="bertforge classify",
        description="Classify texts; one JSON object per text, in order.",
        positional=TEXTS,
    )
    defaults = finetune_defaults(cfg.model)
    cfg.text_column = cfg.text_column or defaults.get("text_column")
    if cfg.input and cfg.text_pair_column is None:
        cfg.text_pair_column = defaults.get("text_pair_column")
    texts, pairs = _inputs(cfg)
    if cfg.text_pair:
        if defaults and not defaults.get("text_pair_column"):
            raise BertforgeError(
                f"{cfg.model} was fine-tuned on single texts, not pairs; drop --text_pair"
            )
        pairs = list(cfg.text_pair)
    if cfg.backend == "onnx":
        model, tokenizer, options = load_onnx_model(cfg, output="logits")
    else:
        model, tokenizer, options = load_model(
            BertForSequenceClassification, cfg, require=CLASSIFIER
        )
    results = classify(
        model,
        tokenizer,
        texts,
        pairs,
        # unset: what fine-tuning saved (classify() also reads it beside a PyTorch model)
        max_length=cfg.max_length if cfg.max_length is not None else defaults.get("max_length"),
        truncation=cfg.truncation or defaults.get("truncation"),
        **options,
    )
    _write_lines(results, cfg.output)
    return 0


def embed_main(argv: list[str]) -> int:
    """``bertforge embed --model DIR --input FILE --output FILE.npy --pooling cls|mean``."""
    cfg = parse_config(
        EmbedConfig,
        argv,
        prog="bertforge embed",
        description="Embed texts into an (N, hidden) float32 .npy matrix.",
    )
    texts, _, blank = read_texts(cfg.input, cfg.text_column, encoding_errors=cfg.encoding_errors)
    if cfg.backend == "onnx":
        model, tokenizer, options = load_onnx_model(cfg, output="last_hidden_state")
    else:
        model, tokenizer, options = load_model(BertModel, cfg)
    choice = resolve_pooling(model, cfg.pooling, cfg.normalize)
    vectors = embed(
        model,
        tokenizer,
        texts,
        choice.pooling,
        max_length=cfg.max_length,
        normalize=choice.normalize,
        **options,
    )
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    atomic_write_bytes(cfg.output, buffer.getvalue())
    pooled = "--pooling" if choice.pooling_source == "given" else choice.pooling_source
    flag = f"--normalize {str(choice.normalize).lower()}"
    normed = flag if choice.normalize_source == "given" else choice.normalize_source
    # rows stand for texts, not lines: a left-out blank line shifts every row after it
    skipped = ", ".join(map(str, blank[:5])) + (", ..." if len(blank) > 5 else "")
    shifted = (
        f"; {plural(len(blank), 'blank line')} of {cfg.input} left out "
        f"(line {skipped}): row i is not line i"
        if blank
        else ""
    )
    print(
        f"wrote {cfg.output}: {vectors.shape[0]} x {vectors.shape[1]} float32; "
        f"{choice.pooling} pooling ({pooled}), "
        f"{'' if choice.normalize else 'not '}normalized ({normed}){shifted}",
        file=sys.stderr,
    )
    return 0
