#!/usr/bin/env bash
# Pretrain a BERT from nothing on general English (../shared/data/general: a Wikipedia slice and
# Project Gutenberg books) with `bertforge recipe general`, and optionally judge it on GLUE.
#
#   bash scripts/pretrain_general.sh [OUT] [pretrain overrides, e.g. --train.max_time 30m]
#
# Steps (each skipped when its output exists in OUT, so a rerun continues): held-out documents
# (the last 100 articles of wikipedia-03 and the last 2 books of gutenberg-01), an 8,192-WordPiece
# tokenizer trained on a 100M-character sample, the whole corpus prepared as 128-token sentence
# pairs, WikiText-2 validation as out-of-domain text, then BERT-Tiny pretrained for 2 hours (the
# learning-rate schedule follows --train.max_time). The model ends at OUT/run/model (HF layout).
# Settings (environment variables):
#   GLUE=1     finish with `bertforge benchmark --suite glue`: the model beside its random twin
#              on GLUE-5 dev (Google's miniature grid: 4 epochs, lr 3e-4, 1e-4, 5e-5, 3e-5, the
#              best per task; about four times a single learning rate's time)
#   THREADS=N  torch threads of every step (default one per core; 1 beside other jobs)
#   SMOKE=1    a few hundred lines, a tiny vocabulary, 3 steps (what the test suite runs)
# Needs ../shared/data (or BERTFORGE_SHARED_DATA). docs/pretraining-study.md has the measurements.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/bertforge ]; then export PATH="$PWD/.venv/bin:$PATH"; fi

OUT="${1:-runs/general}"
shift || true
OPTIONS=(--output "$OUT")
if [ "${SMOKE:-0}" = 1 ]; then OPTIONS+=(--smoke); fi
if [ -n "${THREADS:-}" ]; then OPTIONS+=(--num_threads "$THREADS"); fi
if [ -n "${BERTFORGE_SHARED_DATA:-}" ]; then OPTIONS+=(--data "$BERTFORGE_SHARED_DATA"); fi
bertforge recipe general "${OPTIONS[@]}" -- "$@"

if [ "${GLUE:-0}" = 1 ]; then
    BENCH=(--model "$OUT/run/model" --name "general recipe" --suite glue --baseline true
           --epochs 4 --lr 3e-4 1e-4 5e-5 3e-5 --output "$OUT/glue")
    if [ "${SMOKE:-0}" = 1 ]; then BENCH+=(--smoke); fi
    if [ -n "${THREADS:-}" ]; then BENCH+=(--num_threads "$THREADS"); fi
    bertforge benchmark "${BENCH[@]}"
fi
