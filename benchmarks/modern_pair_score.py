"""What a ModernBERT's pair-similarity head scores zero-shot: the Spearman correlation, on
STS-B dev, of ``split_half_score`` of its head at the [CLS] of ``[CLS] a [SEP] b [SEP]`` (the
prediction ``--train.similarity_weight`` trains) with the gold similarity, no fine-tuning
(docs/pretraining-study.md, "ModernBERT with the pair-similarity loss").

    python benchmarks/modern_pair_score.py runs/s2/modern-sim/model
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from _common import SHARED_DATA

from bertforge.data.encoding import collate, encode_examples
from bertforge.evaluation.metrics import spearman
from bertforge.modeling.model import split_half_score
from bertforge.modeling.modernbert import ModernBertForMaskedLM
from bertforge.tokenizer.wordpiece import Tokenizer

MAX_LENGTH = 128
"""The pretraining pairs' length (runs/g30's data); STS-B pairs are shorter."""


def read_pairs(path: Path) -> tuple[list[tuple[str, str]], list[float]]:
    """STS-B's dev.tsv (sentence1, sentence2, label): the pairs and their gold scores."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r["sentence1"], r["sentence2"]) for r in rows], [float(r["label"]) for r in rows]


@torch.no_grad()
def pair_scores(model_dir: Path, pairs: list[tuple[str, str]], batch_size: int = 64) -> list[float]:
    """The head's split-half score at each pair's [CLS], batch by batch (padding masked)."""
    model = ModernBertForMaskedLM.from_pretrained(model_dir).eval()
    tokenizer = Tokenizer.from_file(model_dir)
    firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    examples = encode_examples(tokenizer, firsts, seconds, max_length=MAX_LENGTH)
    scores: list[float] = []
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start : start + batch_size], tokenizer.pad_id)
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"], cls_head=True)
        scores += split_half_score(out.cls_head_output).tolist()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a ModernBERT MLM directory (pretrain's model/)")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "glue" / "STS-B" / "dev.tsv")
    parser.add_argument("--num_threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    pairs, gold = read_pairs(args.data)
    rho = spearman(gold, pair_scores(args.model, pairs))
    print(f"{args.model}: zero-shot Spearman {100 * rho:.1f} on {len(gold):,} pairs of {args.data}")


if __name__ == "__main__":
    main()
