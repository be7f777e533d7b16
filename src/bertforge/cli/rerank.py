"""``bertforge rerank``: order candidate texts by their relevance to a query with a cross-encoder
(a fine-tuned pair classifier or regressor) or a sentence-embedding model
(:mod:`bertforge.inference.rerank`); prints the candidates best first."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from bertforge.cli.options import parse_config
from bertforge.data.corpus import EncodingErrors
from bertforge.data.encoding import Truncation
from bertforge.data.tables import read_texts
from bertforge.errors import BertforgeError
from bertforge.inference.rerank import load_reranker, rerank
from bertforge.io import atomic_write_text
from bertforge.training.options import ModelOptions


@dataclass(kw_only=True)
class RerankConfig(ModelOptions):
    """Options of ``bertforge rerank``."""

    query: str
    """The query the candidates are ranked for."""
    texts: list[str] = field(default_factory=list)
    """Candidate texts given as arguments."""
    input: str | None = None
    """File of candidates: one per line, or a CSV/TSV/JSONL table (the column --text_column)."""
    text_column: str | None = None
    """Column of a table input (default text)."""
    top_k: int | None = None
    """Print the best N only (default: all)."""
    max_length: int | None = None
    """Tokens per (query, candidate) pair, or per text of an embedding model (default: as in
    fine-tuning, else the model's positions)."""
    truncation: Truncation | None = None
    """Cross-encoder: head, head_tail or tail (default: as in fine-tuning)."""
    output: str | None = None
    """Write the JSON lines here instead of standard output."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes of --input that are not UTF-8 (naming the line); replace: read them
    as U+FFFD."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.texts) == bool(self.input):
            raise BertforgeError("give candidate texts as arguments or --input FILE (one of them)")
        if not self.query.strip():
            raise BertforgeError("--query is empty; give the text the candidates are ranked for")
        if self.top_k is not None and self.top_k < 1:
            raise BertforgeError(f"--top_k {self.top_k}: give 1 or more (or leave it unset)")


def main(argv: list[str]) -> int:
    """``bertforge rerank --model DIR --query Q --input candidates.jsonl`` (or candidates as
    arguments): one JSON line per candidate, best first, ``{"rank", "index", "score", "text"}``
    (``index``: its position in the input; ``score``: the raw score, see
    :mod:`bertforge.inference.rerank`)."""
    cfg = parse_config(
        RerankConfig,
        argv,
        prog="bertforge rerank",
        description="Rank candidate texts for a query, best first; one JSON object per candidate.",
        positional=("texts", "candidate texts (or --input FILE)"),
    )
    if cfg.input:
        texts = read_texts(cfg.input, cfg.text_column, encoding_errors=cfg.encoding_errors).texts
    else:
        texts = list(cfg.texts)
    reranker = load_reranker(cfg)
    ranked = rerank(
        reranker,
        cfg.query,
        texts,
        top_k=cfg.top_k,
        max_length=cfg.max_length,
        truncation=cfg.truncation,
    )
    lines = [
        json.dumps({"rank": r + 1, **item, "text": texts[item["index"]]}, ensure_ascii=False)
        for r, item in enumerate(ranked)
    ]
    text = "".join(line + "\n" for line in lines)
    how = "pair scores" if reranker.kind == "cross-encoder" else "cosine of the vectors"
    if cfg.output:
        atomic_write_text(cfg.output, text)
        print(f"wrote {len(lines):,} ranked candidates to {cfg.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(f"{reranker.kind} ({how}): {len(texts):,} candidates ranked", file=sys.stderr)
    return 0
