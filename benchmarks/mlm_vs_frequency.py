"""Held-out MLM loss of a pretrained model next to a guesser that ignores context.

The guesser predicts every masked token from the training split's token frequencies (add-0.5
smoothed). Both are scored on the SAME masked tokens: the validation split of the prepared data,
masked at a fixed rate (default BERT's 15%, whatever rate the run trained with) and seed, so runs
with different masking rates compare fairly. A model that has learned to use context is well
below the guesser; one stuck at the guesser's loss has learned word frequencies only.

    python benchmarks/mlm_vs_frequency.py --model runs/imdb/run/model --data runs/imdb/data-8192-128
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from bertforge.data.dataset import PretrainingDataset
from bertforge.data.loader import PretrainingCollator, validation_batches
from bertforge.evaluation.mlm import evaluate_mlm
from bertforge.modeling.model import BertForMaskedLM
from bertforge.tokenizer.wordpiece import Tokenizer


def token_counts(data_dir: Path, tokenizer: Tokenizer) -> np.ndarray:
    """How often each (non-special) token id occurs in the training split."""
    train = PretrainingDataset(data_dir, "train", tokenizer)
    return train.token_counts(tokenizer.vocab_size, tokenizer.special_ids)


def compare(
    model_dir: Path, data_dir: Path, rate: float = 0.15, max_examples: int = 2048, seed: int = 1234
) -> dict[str, float]:
    """MLM loss/accuracy of the model and of the frequency guesser on the same masked tokens."""
    tokenizer = Tokenizer.from_file(data_dir / "tokenizer")
    model = BertForMaskedLM.from_pretrained(model_dir)
    if any(k.startswith("cls.") for k in model.loading_info["missing"]):
        raise SystemExit(
            f"{model_dir}: no MLM head to score (an encoder only); for a --train.objective rtd "
            "run give its generator/ directory"
        )
    collator = PretrainingCollator(tokenizer, mlm_probability=rate, seed=seed)
    val = PretrainingDataset(data_dir, "validation", tokenizer)
    batches = list(validation_batches(val, collator, 64, max_examples=max_examples))
    ours = evaluate_mlm(model, batches, torch.device("cpu"), "fp32")
    counts = token_counts(data_dir, tokenizer)
    log_p = np.log((counts + 0.5) / (counts + 0.5).sum())
    labels = np.concatenate([b["labels"].numpy().ravel() for b in batches])
    labels = labels[labels >= 0]
    guess_loss = float(-log_p[labels].mean())
    return {
        "masking_rate": rate,
        "masked_tokens": int(labels.size),
        "model_loss": ours["loss"],
        "model_accuracy": ours["accuracy"],
        "frequency_loss": guess_loss,
        "frequency_accuracy": float((labels == counts.argmax()).mean()),
        "nats_below_frequency": guess_loss - ours["loss"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="pretrained model directory")
    parser.add_argument("--data", required=True, type=Path, help="its prepared data directory")
    parser.add_argument("--rate", type=float, default=0.15, help="masking rate (default 0.15)")
    parser.add_argument("--max-examples", type=int, default=2048, help="validation sequences")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = compare(args.model, args.data, args.rate, args.max_examples)
    print(
        f"{result['masked_tokens']:,} masked tokens ({args.rate:.0%} of the validation split): "
        f"model loss {result['model_loss']:.3f} accuracy {result['model_accuracy']:.2%}; "
        f"token frequencies loss {result['frequency_loss']:.3f} accuracy "
        f"{result['frequency_accuracy']:.2%}; the model is "
        f"{result['nats_below_frequency']:.2f} nats below"
    )
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
