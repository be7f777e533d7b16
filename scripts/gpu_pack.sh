#!/usr/bin/env bash
# Pack, HERE (where ../shared/data is), what the general recipe needs on a lent GPU machine that
# has neither the corpus nor the minutes to prepare it: one .tar.xz for
# `GPU_CHECK_GENERAL=... bash scripts/gpu_check.sh` (docs/gpu.md).
#
#   bash scripts/gpu_pack.sh RECIPE_OUT [ARCHIVE]     # default .gpu/gpu-general.tar.xz
#
# RECIPE_OUT is a folder where `bertforge recipe general` (or scripts/pretrain_general.sh) ran
# its data steps: its held-out text, its tokenizer and its WikiText-2 evaluation set are reused.
# The training pairs are prepared again from part of the corpus, since the whole (171M tokens,
# 371 MB) does not travel (a device call carries 64 MiB): wikipedia-00 and the first quarter of
# gutenberg-00's lines (to a document's end), about 42M tokens, with the same tokenizer, held-out
# documents and settings. GLUE (data/glue) goes along for the benchmark. About 2-3 minutes on 2
# cores; the archive is about 36 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/bertforge ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python

SOURCE="${1:?usage: bash scripts/gpu_pack.sh RECIPE_OUT [ARCHIVE]}"
ARCHIVE="${2:-.gpu/gpu-general.tar.xz}"
DATA="${BERTFORGE_SHARED_DATA:-../shared/data}"
for need in heldout.txt tokenizer-8192/vocab.txt wikitext2-8192/meta.json; do
    [ -e "$SOURCE/$need" ] || { echo "gpu_pack: $SOURCE/$need not found; give a folder where the general recipe ran its data steps (bash scripts/pretrain_general.sh $SOURCE)" >&2; exit 1; }
done
for need in general/wikipedia-00.txt.bz2 general/gutenberg-00.txt.bz2 glue; do
    [ -e "$DATA/$need" ] || { echo "gpu_pack: $DATA/$need not found; set BERTFORGE_SHARED_DATA to the folder holding general/ and glue/" >&2; exit 1; }
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/pack/general" "$WORK/pack/data"
# the first quarter of gutenberg-00's lines, ending where a document ends
"$PY" - "$DATA/general/gutenberg-00.txt.bz2" "$WORK/gutenberg-00-part.txt" <<'PY'
import bz2
import sys

with bz2.open(sys.argv[1], "rt", encoding="utf-8") as f:
    lines = f.readlines()
cut = len(lines) // 4
while cut < len(lines) and lines[cut].strip():
    cut += 1
with open(sys.argv[2], "w", encoding="utf-8") as out:
    out.writelines(lines[:cut])
PY
bertforge prepare --tokenizer "$SOURCE/tokenizer-8192" \
    --input "$DATA/general/wikipedia-00.txt.bz2" "$WORK/gutenberg-00-part.txt" --format text \
    --validation "$SOURCE/heldout.txt" --output "$WORK/pack/general/data-8192-128-nsp" \
    --max_seq_length 128 --mode nsp --workers 2 --progress false
cp -a "$SOURCE/heldout.txt" "$SOURCE/tokenizer-8192" "$SOURCE/wikitext2-8192" "$WORK/pack/general/"
cp -a "$DATA/glue" "$WORK/pack/data/"
mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$WORK/pack" -cf - general data | xz -T2 -6 >"$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
echo "packed $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
