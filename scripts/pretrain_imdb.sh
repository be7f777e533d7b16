#!/usr/bin/env bash
# Pretrain BERT-Mini for 15 minutes (configs/imdb-mini-15m.yaml) on IMDB review text: the 50,000
# unlabelled + 25,000 train reviews, minus every review whose text equals a test review (so the
# model can later be fine-tuned and tested on IMDB without having read the test set), 1% of the
# reviews held out for validation. Evaluates on those and, as out-of-domain text, on WikiText-2
# validation. Needs ../shared/data (or BERTFORGE_SHARED_DATA). Heavy: run it under the lock,
#
#   flock /tmp/bertforge-heavy.lock bash scripts/pretrain_imdb.sh [OUT] [--train.lr 5e-4 ...]
#
# Steps already done in OUT (tokenizer, prepared data) are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/bertforge ]; then export PATH="$PWD/.venv/bin:$PATH"; fi

OUT="${1:-runs/imdb-mini}"
shift || true
SHARED="${BERTFORGE_SHARED_DATA:-../shared/data}"
IMDB="$SHARED/imdb"
mkdir -p "$OUT"

if [ ! -f "$OUT/tokenizer/vocab.txt" ]; then
    echo "== tokenizer: 30,522 WordPieces trained on the pretraining reviews"
    python - "$IMDB" "$OUT/imdb_pretrain.txt" <<'PY'
import csv, gzip, re, sys
from pathlib import Path

root, target = Path(sys.argv[1]), sys.argv[2]
br = re.compile(r"<br\s*/?>", re.IGNORECASE)
with open(target, "w", encoding="utf-8") as out:
    for path in sorted(root.glob("unsup-*.txt.gz")):
        for line in gzip.open(path, "rt", encoding="utf-8"):
            out.write(br.sub(" ", line.rstrip("\n")) + "\n")
    for path in sorted(root.glob("train-*.csv.gz")):
        for row in csv.DictReader(gzip.open(path, "rt", encoding="utf-8", newline="")):
            out.write(br.sub(" ", row["text"]).replace("\n", " ") + "\n")
PY
    bertforge tokenizer train --input "$OUT/imdb_pretrain.txt" --vocab_size 30522 \
        --output "$OUT/tokenizer"
fi

if [ ! -f "$OUT/data/meta.json" ]; then
    echo "== prepare: packed 128-token sequences, test-review texts excluded"
    bertforge prepare --input "$IMDB"/unsup-*.txt.gz "$IMDB"/train-*.csv.gz --text_column text \
        --exclude "$IMDB"/test-*.csv.gz --tokenizer "$OUT/tokenizer" --output "$OUT/data" \
        --max_seq_length 128 --mode packed --validation_fraction 0.01 --progress false
fi
if [ ! -f "$OUT/wikitext2/meta.json" ]; then
    echo "== prepare: WikiText-2 validation with the same tokenizer (out-of-domain evaluation)"
    bertforge prepare --input "$SHARED/wikitext2/wiki.valid.tokens" --tokenizer "$OUT/tokenizer" \
        --output "$OUT/wikitext2" --max_seq_length 128 --mode packed --validation_fraction 0 \
        --progress false
fi

echo "== pretrain"
bertforge pretrain --config configs/imdb-mini-15m.yaml --data "$OUT/data" \
    --extra_eval "[$OUT/wikitext2]" --output "$OUT/run" "$@"
