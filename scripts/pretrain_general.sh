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
#   CURVE=1    GLUE=1, and every snapshot of the run (--train.snapshots 15m 30m 60m) benchmarked
#              alike into OUT/glue-15m ..., then `bertforge benchmark --curve` draws GLUE-5,
#              STS-B and SST-2 against pretraining minutes into OUT/curve (curve.png, curve.md)
#   LRS="..."  the fine-tuning learning rates of GLUE=1/CURVE=1 (default the grid above; one
#              value, e.g. LRS=3e-4, takes a quarter of the time)
#   TASK_BUDGET=3m  cap each task's fine-tuning time (all its seeds together)
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

# GLUE-5 dev of one model into its own folder; the random twin (one serves every snapshot: it
# depends on the config alone) with the final model only
glue() {  # MODEL FOLDER NAME BASELINE
    # shellcheck disable=SC2206  # LRS is a list of words on purpose
    local bench=(--model "$1" --output "$2" --name "$3" --suite glue --baseline "$4"
                 --epochs 4 --lr ${LRS:-3e-4 1e-4 5e-5 3e-5})
    if [ -n "${TASK_BUDGET:-}" ]; then bench+=(--task_budget "$TASK_BUDGET"); fi
    if [ "${SMOKE:-0}" = 1 ]; then bench+=(--smoke); fi
    if [ -n "${THREADS:-}" ]; then bench+=(--num_threads "$THREADS"); fi
    bertforge benchmark "${bench[@]}"
}

if [ "${GLUE:-0}" = 1 ] || [ "${CURVE:-0}" = 1 ]; then
    glue "$OUT/run/model" "$OUT/glue" "general recipe" true
fi
if [ "${CURVE:-0}" = 1 ]; then
    folders=()
    for snapshot in "$OUT"/run/snapshots/model-*; do
        [ -d "$snapshot" ] || continue  # none: the run had no --train.snapshots
        at="${snapshot##*/model-}"
        glue "$snapshot" "$OUT/glue-$at" "general recipe at $at" false
        folders+=("$OUT/glue-$at")
    done
    bertforge benchmark --curve "${folders[@]}" "$OUT/glue" --output "$OUT/curve"
fi
