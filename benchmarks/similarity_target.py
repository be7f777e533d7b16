"""How well the pair-similarity loss's target and its trained prediction rank STS-B, zero-shot.

``--train.similarity_weight`` trains the mean of a pair's pooled [CLS] units to rank pairs as a
target does: the cosine between the two segments' word-vector sums, each word weighed as
word2vec subsamples it. This scores both on STS-B dev (Spearman x 100 against the gold scores,
no fine-tuning), for each model given:

- ``target``: the loss's target on the STS-B pairs (the model's own word embeddings);
- ``pooled [CLS] mean``: the prediction the loss trains, the pair encoded together;

so a run shows whether its target carries sentence similarity at all, and how much of it the
cross-encoder's [CLS] learned to compute.

    python benchmarks/similarity_target.py --data runs/general/data-8192-128-nsp \
        --models runs/general/run/model runs/screen-sim/run/model
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import torch
from _common import SHARED_DATA

from bertforge.data.dataset import PretrainingDataset
from bertforge.evaluation.metrics import spearman
from bertforge.modeling.model import BertForPreTraining, bag_of_words_weights, segment_similarity
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.objectives import BOW_TOKENS


def read_sts(path: Path) -> tuple[list[str], list[str], list[float]]:
    """STS-B's sentence pairs and gold scores (GLUE's dev.tsv: sentence1, sentence2, label)."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return (
        [r["sentence1"] for r in rows],
        [r["sentence2"] for r in rows],
        [float(r["label"]) for r in rows],
    )


def score(model_dir: Path, weights: torch.Tensor, sts: Path, batch: int = 256) -> dict[str, float]:
    """Spearman x 100 of the target and of the pooled [CLS] mean against the gold scores."""
    tokenizer = Tokenizer.from_file(model_dir)
    model = BertForPreTraining.from_pretrained(model_dir).eval()
    first, second, gold = read_sts(sts)
    targets, predictions = [], []
    words = model.bert.embeddings.word_embeddings.weight
    for a in range(0, len(gold), batch):
        enc = tokenizer.encode_batch(
            first[a : a + batch], second[a : a + batch], max_length=128, return_tensors="pt"
        )
        ids, types, mask = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
        with torch.no_grad():
            pooled = model.bert(ids, mask, types).pooler_output  # (B, H)
            targets.append(segment_similarity(words, ids, types, weights))
            predictions.append(pooled.mean(-1))
    return {
        "target": 100 * spearman(torch.cat(targets).numpy(), gold),
        "pooled [CLS] mean": 100 * spearman(torch.cat(predictions).numpy(), gold),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", type=Path, required=True)
    parser.add_argument(
        "--data", type=Path, required=True, help="prepared data: the word counts' source"
    )
    parser.add_argument(
        "--sts", type=Path, default=SHARED_DATA / "glue" / "STS-B" / "dev.tsv", help="STS-B dev"
    )
    args = parser.parse_args(argv)
    tokenizer = Tokenizer.from_file(args.data / "tokenizer")
    train = PretrainingDataset(args.data, "train", tokenizer)
    counts = train.token_counts(tokenizer.vocab_size, tokenizer.special_ids, BOW_TOKENS)
    weights = bag_of_words_weights(torch.from_numpy(counts))
    results = {str(m): score(m, weights, args.sts) for m in args.models}
    print("| model | target (Spearman) | pooled [CLS] mean (Spearman) |")
    print("|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['target']:.1f} | {r['pooled [CLS] mean']:.1f} |")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
