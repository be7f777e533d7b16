#!/usr/bin/env bash
# Pretrain a BERT on IMDB review text with the CPU recipe of docs/pretraining-study.md, and
# optionally measure what it is worth downstream.
#
#   flock /tmp/bertforge-heavy.lock bash scripts/pretrain_imdb.sh [OUT] [--train.max_time 60m ...]
#
# (flock is optional: a wall-clock budget buys fewer steps when another heavy job shares the
# cores, so on a shared machine heavy runs take one lock and run one at a time.)
#
# The text: the 50,000 unlabelled + 25,000 train reviews, minus every review whose text equals a
# test review (so the model can later be fine-tuned and tested on IMDB without having read the
# test set), 1% of the reviews held out for validation; WikiText-2 validation as out-of-domain
# text. Settings (environment variables):
#   CONFIG      pretraining config (default configs/imdb-20m.yaml; configs/imdb-60m.yaml for an hour;
#               configs/imdb-moonshot.yaml, 95 minutes at 256 tokens, with DOWNSTREAM=full: the moonshot)
#   VOCAB       WordPiece vocabulary size (default 8192: the recipe's; the MLM output layer costs
#               as much as the whole encoder of BERT-Tiny at 30k)
#   SEQ         tokens per pretraining sequence (default: the number in CONFIG's
#               "# pretrain_imdb.sh SEQ=N" line, which configs/imdb-moonshot.yaml has, else 128)
#   MODE        nsp (sentence pairs with 50% random next, for --train.objective mlm_nsp) or
#               packed (full sequences, for mlm or rtd); default: nsp when CONFIG's objective is
#               mlm_nsp (the 20-minute recipe), else packed
#   DOWNSTREAM  1 = finish with `bertforge downstream`: fine-tune the model and its random twin
#               on 5,000 train reviews (500 more for validation) and test both on 5,000 test
#               reviews, 128 tokens (the study's protocol); full = the same on all of IMDB:
#               24,000 train reviews (1,000 more for validation), scored on the 25,000 test
#               reviews, 256 tokens with head+tail truncation (the moonshot's protocol, Maas et
#               al. 2011's split)
#   STAGES      data = stop once the text, slices, tokenizer and prepared data are there (what
#               scripts/dapt_general.sh does before it times two pretraining runs side by side)
# A downstream probe (logistic regression on frozen features, 1,000 + 1,000 train reviews) runs
# at every evaluation and is drawn in OUT/run/curves.png. Needs ../shared/data (or
# BERTFORGE_SHARED_DATA). Steps already done in OUT (tokenizer, prepared data, slices) are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/bertforge ]; then export PATH="$PWD/.venv/bin:$PATH"; fi

OUT="${1:-runs/imdb}"
shift || true
CONFIG="${CONFIG:-configs/imdb-20m.yaml}"
VOCAB="${VOCAB:-8192}"
if [ -z "${SEQ:-}" ]; then  # the sequence length belongs to prepare: a config can ask for one
    SEQ="$(sed -n 's/^# *pretrain_imdb\.sh  *SEQ=\([0-9][0-9]*\).*/\1/p' "$CONFIG" | head -n 1)"
    SEQ="${SEQ:-128}"
fi
if [ -z "${MODE:-}" ]; then
    MODE=packed
    if grep -q '^ *objective: *mlm_nsp' "$CONFIG"; then MODE=nsp; fi
fi
SHARED="${BERTFORGE_SHARED_DATA:-../shared/data}"
IMDB="$SHARED/imdb"
TOK="$OUT/tokenizer-$VOCAB"
DATA="$OUT/data-$VOCAB-$SEQ"
if [ "$MODE" != "packed" ]; then DATA="$DATA-$MODE"; fi
SLICES="$OUT/slices"
mkdir -p "$OUT"
stage() { printf "== [%s, %dm%02ds in] %s\n" "$(date +%T)" $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

if [ ! -f "$SLICES/test_full.csv" ]; then
    stage "text: pretraining text and fixed, balanced IMDB slices (<br /> removed)"
    python - "$IMDB" "$OUT/imdb_pretrain.txt" "$SLICES" <<'PY'
import csv, gzip, random, re, sys
from pathlib import Path

root, target, slices = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
br = re.compile(r"<br\s*/?>", re.IGNORECASE)

def rows(split):
    out = []
    for path in sorted(root.glob(f"{split}-*.csv.gz")):
        out += csv.DictReader(gzip.open(path, "rt", encoding="utf-8", newline=""))
    return out

def clean(text):
    return " ".join(br.sub(" ", text).split())

train, test = rows("train"), rows("test")
test_texts = {r["text"] for r in test}
with open(target, "w", encoding="utf-8") as out:  # the tokenizer's text: no test review
    for path in sorted(root.glob("unsup-*.txt.gz")):
        for line in gzip.open(path, "rt", encoding="utf-8"):
            if line.rstrip("\n") not in test_texts:
                out.write(clean(line) + "\n")
    for r in train:
        if r["text"] not in test_texts:
            out.write(clean(r["text"]) + "\n")

def balanced(pool, n, seed):
    rng = random.Random(seed)
    pos = [r for r in pool if r["label"] == "1"]
    neg = [r for r in pool if r["label"] == "0"]
    rng.shuffle(pos)
    rng.shuffle(neg)
    picked = pos[: n // 2] + neg[: n // 2]
    rng.shuffle(picked)
    return picked

def write(name, picked):
    with open(slices / name, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "text"])
        w.writerows([r["label"], clean(r["text"])] for r in picked)

slices.mkdir(parents=True, exist_ok=True)
pool = balanced([r for r in train if r["text"] not in test_texts], 8000, 12345)
write("train5000.csv", pool[:5000])          # downstream fine-tuning
write("val500.csv", pool[5000:5500])         # its validation (model selection)
write("probe_train.csv", pool[5500:6500])    # the probe during pretraining: train reviews only
write("probe_test.csv", pool[6500:7500])
write("test5000.csv", balanced(test, 5000, 12345))  # scored once, never tuned on
full = balanced(train, 25000, 54321)  # all of IMDB train, shuffled (the moonshot)
write("train_full.csv", full[:24000])
write("val_full.csv", full[24000:])
write("test_full.csv", balanced(test, 25000, 54321))
PY
fi

if [ ! -f "$TOK/vocab.txt" ]; then
    stage "tokenizer: $VOCAB WordPieces trained on the pretraining reviews"
    bertforge tokenizer train --input "$OUT/imdb_pretrain.txt" --vocab_size "$VOCAB" --output "$TOK"
fi
if [ ! -f "$DATA/meta.json" ]; then
    stage "prepare: $MODE $SEQ-token sequences, test-review texts excluded"
    bertforge prepare --input "$IMDB"/unsup-*.txt.gz "$IMDB"/train-*.csv.gz --text_column text \
        --exclude "$IMDB"/test-*.csv.gz --tokenizer "$TOK" --output "$DATA" \
        --max_seq_length "$SEQ" --mode "$MODE" --validation_fraction 0.01 --progress false
fi
if [ ! -f "$OUT/wikitext2-$VOCAB/meta.json" ]; then
    stage "prepare: WikiText-2 validation with the same tokenizer (out-of-domain evaluation)"
    bertforge prepare --input "$SHARED/wikitext2/wiki.valid.tokens" --tokenizer "$TOK" \
        --output "$OUT/wikitext2-$VOCAB" --max_seq_length "$SEQ" --mode packed \
        --validation_fraction 0 --progress false
fi

if [ "${STAGES:-all}" = data ]; then stage "data ready in $OUT (STAGES=data: no pretraining)"; exit 0; fi

stage "pretrain ($CONFIG)"
bertforge pretrain --config "$CONFIG" --data "$DATA" --extra_eval "[$OUT/wikitext2-$VOCAB]" \
    --probe.train "$SLICES/probe_train.csv" --probe.test "$SLICES/probe_test.csv" \
    --output "$OUT/run" "$@"

LENGTH=(--max_length 128)
case "${DOWNSTREAM:-0}" in
    1) SPLIT=(train5000 val500 test5000 downstream) ;;
    full) SPLIT=(train_full val_full test_full downstream-full)
        # the moonshot reads 256 tokens, the first quarter and the last three quarters of a review
        LENGTH=(--max_length 256 --truncation head_tail) ;;
    *) SPLIT=() ;;
esac
if [ "${#SPLIT[@]}" -gt 0 ]; then
    stage "downstream: the pretrained encoder vs its random twin on IMDB sentiment (${SPLIT[2]})"
    bertforge downstream --model "$OUT/run/model" --train "$SLICES/${SPLIT[0]}.csv" \
        --validation "$SLICES/${SPLIT[1]}.csv" --test "$SLICES/${SPLIT[2]}.csv" \
        --output "$OUT/${SPLIT[3]}" "${LENGTH[@]}" --batch_size 32 --lr 3e-4 --epochs 3 \
        --warmup_ratio 0.1 --dropout 0 --num_threads 2 --progress false
fi
stage "done"
