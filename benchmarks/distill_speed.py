"""Texts/s of sequence classifiers side by side (a distillation's teacher and its student):
eager, fp32, one thread, SST-2 dev sentences, each model with its own tokenizer, at batch 32
(all 872) and batch 1 (the first 200), best of three rounds with the models alternating, so a
loaded machine slows both sides alike (docs/distillation.md).

    python benchmarks/distill_speed.py runs/teacher runs/student
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import SHARED_DATA

from bertforge.data.encoding import encode_examples
from bertforge.data.labelled import load_labelled
from bertforge.inference.predict import sequence_logits
from bertforge.modeling.model import BertForSequenceClassification
from bertforge.tokenizer.wordpiece import Tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories (sequence classifiers)")
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dev = SHARED_DATA / "glue" / "SST-2" / "dev.tsv"
    texts = load_labelled([dev], text_column="sentence", label_column=None)[0].texts
    models = {d: BertForSequenceClassification.from_pretrained(d).eval() for d in args.models}
    encoded = {
        d: encode_examples(Tokenizer.from_file(d), texts, max_length=args.max_length)
        for d in models
    }
    rates: dict[tuple[str, int], list[float]] = {(d, b): [] for d in models for b in (32, 1)}
    for _ in range(args.rounds):
        for d, model in models.items():
            for batch, count in ((32, len(texts)), (1, 200)):
                pad = model.config.pad_token_id
                t0 = time.perf_counter()
                sequence_logits(model, encoded[d][:count], pad, batch_size=batch)
                rates[(d, batch)].append(count / (time.perf_counter() - t0))
    first = args.models[0]
    for (d, batch), values in rates.items():
        ratio = max(values) / max(rates[(first, batch)])
        print(f"{d:32s} batch {batch:2d}: {max(values):7.1f} texts/s ({ratio:.1f}x the first)")


if __name__ == "__main__":
    main()
