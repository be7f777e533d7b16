#!/usr/bin/env bash
# `make demo`: pretrain a small BERT from scratch on the Tiny Shakespeare text shipped in this
# repository (data/tiny_shakespeare), then show what it learned. Needs only the repository and
# its .venv (the Makefile puts .venv/bin first on PATH). Takes about 5 minutes on 2 CPU cores.
#
#   BERTFORGE_DEMO_TIME=10m make demo      # a longer pretraining budget
#   BERTFORGE_DEMO_DIR=/tmp/demo make demo # somewhere else than runs/demo
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${BERTFORGE_DEMO_DIR:-runs/demo}"
BUDGET="${BERTFORGE_DEMO_TIME:-3m}"
CORPUS=data/tiny_shakespeare/input.txt

rm -rf "$OUT"  # a demo starts from scratch (a kept run directory would resume instead)
mkdir -p "$OUT"

echo "== 1/4  train a WordPiece tokenizer on $CORPUS"
bertforge tokenizer train --input "$CORPUS" --vocab-size 4096 --output "$OUT/tokenizer"

echo
echo "== 2/4  prepare 128-token training sequences (5% of the speeches held out for validation)"
bertforge prepare --input "$CORPUS" --tokenizer "$OUT/tokenizer" --output "$OUT/data" \
    --max-seq-length 128 --mode packed --validation-fraction 0.05 --no-progress

echo
echo "== 3/4  pretrain a BERT-Tiny-sized encoder for $BUDGET (configs/demo.yaml)"
bertforge pretrain --config configs/demo.yaml --data "$OUT/data" --output "$OUT/run" \
    --train.max_time "$BUDGET"

echo
echo "== 4/4  fill in the blanks with the trained model"
python - "$OUT/run/model" <<'PY'
import sys

from bertforge.model import BertForMaskedLM
from bertforge.predict import fill_mask
from bertforge.tokenizer import Tokenizer

model_dir = sys.argv[1]
model = BertForMaskedLM.from_pretrained(model_dir)
tokenizer = Tokenizer.from_file(model_dir)
texts = [
    "to be , or not to [MASK] : that is the question .",
    "my [MASK] , the king is dead .",
    "i will not [MASK] thee , my lord .",
    "what say you to [MASK] ?",
    "o romeo , romeo ! wherefore art [MASK] romeo ?",
]
for result in fill_mask(model, tokenizer, texts, top_k=5):
    print(result["text"])
    for candidates in result["masks"]:
        print("    [MASK] ->", "  ".join(f"{c['token']} ({c['score']:.0%})" for c in candidates))
PY

echo
echo "model:   $OUT/run/model   (try: bertforge fill-mask --model $OUT/run/model \"good [MASK] , my lord\")"
echo "plot:    $OUT/run/curves.png"
echo "metrics: $OUT/run/metrics.jsonl"
