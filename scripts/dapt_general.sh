#!/usr/bin/env bash
# Continued pretraining that pays? (Gururangan et al. 2020's domain-adaptive pretraining, DAPT.)
# The general-English BERT continued on IMDB review text for 20 minutes, against the general model
# unadapted and against a BERT pretrained on IMDB text alone for the same 20 minutes; all three
# fine-tuned on IMDB sentiment (and on SST-2, general-domain sentiment).
#
#   bash scripts/dapt_general.sh GENERAL OUT [pretrain overrides, e.g. --train.max_time 10m]
#
# GENERAL is a scripts/pretrain_general.sh output (its tokenizer-8192/, wikitext2-8192/ and
# run/model). Steps, each skipped when its output is in OUT:
#   1. OUT/imdb: scripts/pretrain_imdb.sh's text, IMDB slices, tokenizer and prepared data
#      (STAGES=data), the IMDB-only recipe's inputs;
#   2. OUT/data-dapt: the same IMDB text (test reviews excluded) as 128-token sentence pairs with
#      the *general* model's tokenizer (a continued model keeps its vocabulary);
#   3. the two 20-minute runs with configs/imdb-20m.yaml's settings: OUT/imdb/run (from nothing)
#      and OUT/dapt (--init_from GENERAL/run/model); by default at the same time, one thread
#      each, so that both get the same share of the machine (SEQUENTIAL=1: one after the other,
#      THREADS each);
#   4. OUT/downstream-*: `bertforge downstream` on IMDB (5,000 train reviews, 500 validation,
#      5,000 test, 128 tokens; scripts/pretrain_imdb.sh's DOWNSTREAM=1 protocol): the adapted
#      model with the general one as --baseline, and the IMDB-only model, each beside its twin;
#   5. OUT/sst2-*: `bertforge benchmark --suite glue --tasks SST-2` of each of the three;
#   6. OUT/dapt.md: the table.
# Settings: THREADS (default 2) for the steps other than the side-by-side runs; SEEDS (default
# 1) fine-tuning seeds on IMDB; SST2_EPOCHS (default 1: 2,105 steps of batch 32) for SST-2, an
# equal number of steps for every model (a time budget would give a model fewer steps whenever
# another job takes the cores).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/bertforge ]; then export PATH="$PWD/.venv/bin:$PATH"; fi

if [ $# -lt 2 ]; then
    echo "usage: bash scripts/dapt_general.sh GENERAL OUT [pretrain overrides]" >&2
    echo "  GENERAL: a scripts/pretrain_general.sh output (with run/model and tokenizer-8192/)" >&2
    exit 2
fi
GENERAL="$1"
OUT="$2"
shift 2
for need in "$GENERAL/run/model/config.json" "$GENERAL/tokenizer-8192/vocab.txt" \
    "$GENERAL/wikitext2-8192/meta.json"; do
    if [ ! -f "$need" ]; then
        echo "error: $need is missing: GENERAL must be a finished scripts/pretrain_general.sh output" >&2
        exit 2
    fi
done
SHARED="${BERTFORGE_SHARED_DATA:-../shared/data}"
IMDB="$SHARED/imdb"
THREADS="${THREADS:-2}"
SEEDS="${SEEDS:-1}"
CONFIG=configs/imdb-20m.yaml
mkdir -p "$OUT"
stage() { printf "== [%s, %dm%02ds in] %s\n" "$(date +%T)" $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
stage "IMDB text, slices, tokenizer and data (scripts/pretrain_imdb.sh, STAGES=data)"
STAGES=data bash scripts/pretrain_imdb.sh "$OUT/imdb"

if [ ! -f "$OUT/data-dapt/meta.json" ]; then
    stage "prepare: the IMDB text as 128-token sentence pairs with the general tokenizer"
    bertforge prepare --input "$IMDB"/unsup-*.txt.gz "$IMDB"/train-*.csv.gz --text_column text \
        --exclude "$IMDB"/test-*.csv.gz --tokenizer "$GENERAL/tokenizer-8192" \
        --output "$OUT/data-dapt" --max_seq_length 128 --mode nsp --validation_fraction 0.01 \
        --progress false
fi

SLICES="$OUT/imdb/slices"
PROBE=(--probe.train "$SLICES/probe_train.csv" --probe.test "$SLICES/probe_test.csv")
imdb_only() {
    bash scripts/pretrain_imdb.sh "$OUT/imdb" --train.num_threads "$1" --train.progress false \
        "${@:2}"
}
adapted() {
    bertforge pretrain --config "$CONFIG" --init_from "$GENERAL/run/model" \
        --data "$OUT/data-dapt" --extra_eval "[$GENERAL/wikitext2-8192]" "${PROBE[@]}" \
        --output "$OUT/dapt" --train.num_threads "$1" --train.progress false \
        "${@:2}"
}
todo=()
if [ ! -f "$OUT/imdb/run/model/config.json" ]; then todo+=(imdb_only); fi
if [ ! -f "$OUT/dapt/model/config.json" ]; then todo+=(adapted); fi
if [ "${#todo[@]}" -eq 2 ] && [ "${SEQUENTIAL:-0}" != 1 ]; then
    stage "pretrain: IMDB-only and general+IMDB ($CONFIG) side by side, one thread each"
    imdb_only 1 "$@" > "$OUT/imdb-only.log" 2>&1 &
    first=$!
    adapted 1 "$@" > "$OUT/dapt.log" 2>&1 &
    second=$!
    status=0
    wait "$first" || status=$?
    wait "$second" || status=$?
    tail -n 3 "$OUT/imdb-only.log" "$OUT/dapt.log"
    if [ "$status" != 0 ]; then
        echo "error: a pretraining run failed; see $OUT/imdb-only.log and $OUT/dapt.log" >&2
        exit 1
    fi
else
    for step in "${todo[@]}"; do
        stage "pretrain: $step ($CONFIG)"
        "$step" "$THREADS" "$@"
    done
fi

TUNE=(--train "$SLICES/train5000.csv" --validation "$SLICES/val500.csv"
      --test "$SLICES/test5000.csv" --max_length 128 --batch_size 32 --lr 3e-4 --epochs 3
      --warmup_ratio 0.1 --dropout 0 --num_threads "$THREADS" --progress false)
for ((seed = 0; seed < SEEDS; seed++)); do
    if [ ! -f "$OUT/downstream-dapt-s$seed/downstream.json" ]; then
        stage "downstream on IMDB, seed $seed: general+IMDB, its twin, the general model"
        bertforge downstream --model "$OUT/dapt/model" --baseline "$GENERAL/run/model" \
            --output "$OUT/downstream-dapt-s$seed" --seed "$seed" "${TUNE[@]}"
    fi
    if [ ! -f "$OUT/downstream-imdb-s$seed/downstream.json" ]; then
        stage "downstream on IMDB, seed $seed: the IMDB-only model and its twin"
        bertforge downstream --model "$OUT/imdb/run/model" --output "$OUT/downstream-imdb-s$seed" \
            --seed "$seed" "${TUNE[@]}"
    fi
done
for pair in "general:$GENERAL/run/model" "dapt:$OUT/dapt/model" "imdb:$OUT/imdb/run/model"; do
    name="${pair%%:*}"
    if [ ! -f "$OUT/sst2-$name/results.json" ]; then
        stage "SST-2: $name"
        # the twin once: the general and adapted models share a config and a tokenizer
        bertforge benchmark --suite glue --tasks SST-2 --model "${pair#*:}" --name "$name" \
            --baseline "$([ "$name" = dapt ] && echo false || echo true)" --seeds 1 \
            --lr 3e-4 --epochs "${SST2_EPOCHS:-1}" --num_threads "$THREADS" \
            --output "$OUT/sst2-$name"
    fi
done

stage "table: $OUT/dapt.md"
python - "$OUT" "$SEEDS" > "$OUT/dapt.md" <<'PY'
import json, statistics, sys
from pathlib import Path

out, seeds = Path(sys.argv[1]), int(sys.argv[2])

def imdb(folder, column):
    """IMDB test accuracy of ``column`` in each seed's downstream.json, in points."""
    runs = [json.loads((out / f"{folder}-s{s}" / "downstream.json").read_text()) for s in range(seeds)]
    return [100 * r[column]["accuracy"] for r in runs]

def sst2(name, column="model"):
    return 100 * json.loads((out / f"sst2-{name}" / "results.json").read_text())["tasks"]["SST-2"][column]["score"]

def cell(values):
    return f"{statistics.median(values):.1f}" + (f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else "")

rows = [
    ("general, unadapted", cell(imdb("downstream-dapt", "baseline")), f"{sst2('general'):.1f}"),
    ("general + 20 min on IMDB text (DAPT)", cell(imdb("downstream-dapt", "pretrained")), f"{sst2('dapt'):.1f}"),
    ("IMDB text only, 20 min", cell(imdb("downstream-imdb", "pretrained")), f"{sst2('imdb'):.1f}"),
    ("random twin (general vocabulary)", cell(imdb("downstream-dapt", "random_init")), f"{sst2('general', 'random_init'):.1f}"),
    ("random twin (IMDB vocabulary)", cell(imdb("downstream-imdb", "random_init")), f"{sst2('imdb', 'random_init'):.1f}"),
]
print("| model | IMDB test accuracy (5,000 reviews) | SST-2 dev accuracy |")
print("|---|---|---|")
for row in rows:
    print("| " + " | ".join(row) + " |")
plural = "s, median (range)" if seeds > 1 else ""
print(f"\nIMDB: {seeds} fine-tuning seed{plural}, 3 epochs, lr 3e-4; SST-2: benchmark --suite glue, lr 3e-4, the same epochs for every model.")
PY
cat "$OUT/dapt.md"
stage "done"
