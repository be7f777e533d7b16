#!/usr/bin/env bash
# `make demo`: pretrain a small BERT from scratch on the Tiny Shakespeare text shipped in this
# repository (data/tiny_shakespeare), then show what it learned. Needs only the repository and
# its .venv (the Makefile puts .venv/bin first on PATH). About 5 minutes on 2 CPU cores, nearly
# all of it pretraining (configs/demo.yaml explains the recipe).
#
#   BERTFORGE_DEMO_STEPS=10000 make demo   # a longer pretraining budget (default 3000 steps)
#   BERTFORGE_DEMO_SEED=1 make demo        # another seed (initialisation, batch order, masks)
#   BERTFORGE_DEMO_DIR=/tmp/demo make demo # somewhere else than runs/demo
#   bash scripts/demo.sh --train.num_threads 2   # extra options go to `bertforge pretrain`
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${BERTFORGE_DEMO_DIR:-runs/demo}"
STEPS="${BERTFORGE_DEMO_STEPS:-3000}"
SEED="${BERTFORGE_DEMO_SEED:-0}"
CORPUS=data/tiny_shakespeare/input.txt

rm -rf "$OUT"  # a demo starts from scratch (a kept run directory would resume instead)
mkdir -p "$OUT"
START=$SECONDS

echo "== 1/4  train a WordPiece tokenizer on $CORPUS"
bertforge tokenizer train --input "$CORPUS" --vocab_size 2048 --output "$OUT/tokenizer"

echo
echo "== 2/4  prepare 32-token training sequences (5% of the speeches held out for validation)"
bertforge prepare --input "$CORPUS" --tokenizer "$OUT/tokenizer" --output "$OUT/data" \
    --max_seq_length 32 --mode packed --validation_fraction 0.05 --progress false

echo
echo "== 3/4  pretrain a BERT-Tiny-sized encoder for $STEPS steps, seed $SEED (configs/demo.yaml)"
bertforge pretrain --config configs/demo.yaml --data "$OUT/data" --output "$OUT/run" \
    --train.max_steps "$STEPS" --train.seed "$SEED" --train.num_threads 1 "$@"

echo
echo "== 4/4  fill in the blanks with the trained model"
python - "$OUT/run" <<'PY'
import json
import sys
from pathlib import Path

import numpy as np

from bertforge.data.shards import PretrainingDataset
from bertforge.modeling.model import BertForMaskedLM
from bertforge.inference.predict import fill_mask
from bertforge.tokenizer.wordpiece import Tokenizer

run = Path(sys.argv[1])
model = BertForMaskedLM.from_pretrained(run / "model")
tokenizer = Tokenizer.from_file(run / "model")
# Each blank asks for something the context decides: what follows "not to", the pronoun "art"
# takes, a verb before "you", a form of address before ", the king", a pronoun for "a good man",
# what follows "I know". Lines 2 and 6 occur in the text; the others are Shakespeare-like
# phrasing that does not.
texts = [
    "To be, or not to [MASK]: that is the question.",
    "O Romeo, Romeo! wherefore art [MASK] Romeo?",
    "I [MASK] you, good sir, tell me your name.",
    "My [MASK], the king is dead.",
    "He is a good man, and [MASK] is my friend.",
    "I know [MASK] what to say.",
]
for result in fill_mask(model, tokenizer, texts, top_k=5):
    print(result["text"])
    for candidates in result["masks"]:
        print("    [MASK] ->", "  ".join(f"{c['token']} ({c['score']:.0%})" for c in candidates))


# A guesser that ignores context: the training text's token frequencies (add-0.5 smoothed),
# scored on the same held-out text. Beating it is what "learned context" means.
def token_counts(split):
    ds = PretrainingDataset(run.parent / "data", split, tokenizer)
    ids = np.concatenate([ds[i]["input_ids"] for i in range(len(ds))])
    ids = ids[~np.isin(ids, tokenizer.special_ids)]
    return np.bincount(ids, minlength=tokenizer.vocab_size)


train, held_out = token_counts("train"), token_counts("validation")
log_p = np.log((train + 0.5) / (train + 0.5).sum())
top = int(train.argmax())
final = json.loads((run / "results.json").read_text())["final"]["val"]
print(
    f"\nheld-out text: the trained model (table above) loss {final['loss']:.3f}, accuracy "
    f"{final['accuracy']:.2%}; no context (token frequencies) loss "
    f"{-(held_out * log_p).sum() / held_out.sum():.3f}, accuracy "
    f"{held_out[top] / held_out.sum():.2%} (always {tokenizer.id_to_token(top)!r})"
)
PY

echo
echo "took $(( (SECONDS - START) / 60 ))m$(( (SECONDS - START) % 60 ))s in all"
echo "model:   $OUT/run/model   (try: bertforge fill-mask --model $OUT/run/model \"Good [MASK], my lord.\")"
echo "plot:    $OUT/run/curves.png"
echo "metrics: $OUT/run/metrics.jsonl"
echo "next:    README.md, \"A model's life on your own data\"; each stage in docs/guide.md"
