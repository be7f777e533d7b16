#!/usr/bin/env bash
# One command for a GPU machine (docs/gpu.md): the GPU test suite (tests/gpu, marker `cuda`, and
# the device checks of tests/test_devices.py), benchmarks/bench_gpu.py (ours vs transformers,
# tok/s and MFU, and the CLI run against its step), and, given its data, the general recipe
# pretrained on the GPU and judged on GLUE there. About 6-8 minutes on an H100/H200 for the
# suite and the benchmark. Needs PyTorch with CUDA; downloads nothing. Dependencies the machine
# lacks (jsonargparse, the serve extra) are installed from .whl/ when it is there (made by
# scripts/gpu_wheels.sh where pip reaches PyPI, and carried along); without them the parts that
# need them are skipped and the summary says so.
#
#   bash scripts/gpu_check.sh                 # results in $OUT if set, else runs/gpu-check
#   GPU_CHECK_BENCH=quick bash scripts/gpu_check.sh   # fewer timed steps (about 2 minutes less)
#   GPU_CHECK_BENCH=none bash scripts/gpu_check.sh    # no benchmark
#   GPU_CHECK_TESTS=0 bash scripts/gpu_check.sh       # no test suite
#   GPU_CHECK_BENCH_ARGS="--cases 0 --compile 0 --profile" bash scripts/gpu_check.sh   # bench options
#   GPU_CHECK_BENCH_ARGS="--cases 0 --cli_profile 10" ...   # also the CLI loop's own profile
#   GPU_CHECK_GENERAL=general.tar.xz bash scripts/gpu_check.sh   # and the general recipe:
#
# GPU_CHECK_GENERAL names the general recipe's data steps, done elsewhere (a GPU machine may have
# neither the corpus nor the time to prepare it): a folder holding heldout.txt, tokenizer-8192/,
# data-8192-128-nsp/ and wikitext2-8192/ (bertforge recipe general's first steps), or a .tar.xz
# holding such a folder as general/ and GLUE as data/glue/ (scripts/gpu_pack.sh makes one). The
# recipe pretrains on the GPU (its GPU settings: BERT-Medium, batch 256, compiled) for
# GPU_CHECK_GENERAL_TIME (default 3m) beside the test suite, then `bertforge benchmark --suite
# glue` fine-tunes it on the GPU (GPU_CHECK_GLUE_ARGS, default one learning rate, 20 s a task;
# GPU_CHECK_GENERAL_ARGS: more pretrain options).
# Its log is general.log, its results general-results.tar.gz. GPU_CHECK_DEADLINE (seconds, default
# 560) bounds the whole: the GLUE stage stops in time to pack what it finished.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS="${OUT:-$ROOT/runs/gpu-check}"
mkdir -p "$RESULTS"
LOG="$RESULTS/gpu_check.log"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
BENCH="${GPU_CHECK_BENCH:-full}"
START=$SECONDS
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"
export BERTFORGE_CACHE="${BERTFORGE_CACHE:-/tmp/bertforge-cache}"
export MPLBACKEND=Agg

say() { printf '\n== %s  (%ds)\n' "$*" $((SECONDS - START)); }

say "machine"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
"$PY" - <<'PY'
import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
else:
    print("CUDA is NOT available: the GPU tests will be skipped")
PY

say "dependencies"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/bertforge-site .whl/*.whl && echo "installed $(ls .whl | wc -l) wheels from .whl/"
  export PYTHONPATH="$ROOT/src:/tmp/bertforge-site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
MISSING=$("$PY" - <<'PY'
import importlib.util
need = ["torch", "numpy", "tokenizers", "safetensors", "yaml", "tqdm", "matplotlib", "jsonargparse",
        "pytest", "transformers", "fastapi", "uvicorn", "orjson", "swagger_ui_bundle"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
echo "missing: ${MISSING:-none}"
DESELECT=()
SUITE=1
for core in torch numpy tokenizers safetensors yaml jsonargparse pytest; do
  if [[ " $MISSING " == *" $core "* ]]; then
    SUITE=0
    echo "!! $core is missing: the test suite cannot run (run scripts/gpu_wheels.sh where pip"
    echo "!! reaches PyPI and carry .whl along)"
  fi
done
if [[ " $MISSING " == *" fastapi "* || " $MISSING " == *" uvicorn "* || " $MISSING " == *" orjson "* ]]; then
  DESELECT=(-k "not serve")
  echo "!! the serve extra is missing: the serve test is left out"
fi

BENCH_RC=-1
if [[ $BENCH != none ]]; then
  say "benchmark (benchmarks/bench_gpu.py, $BENCH)"
  ARGS=(--json "$RESULTS/bench_gpu.json" --markdown "$RESULTS/bench_gpu.md")
  ARGS+=(--profile_dir "$RESULTS/profiles")  # written with --profile or --cli_profile N
  [[ $BENCH == quick ]] && ARGS+=(--steps 10 --cli_seconds 25)
  read -r -a EXTRA <<<"${GPU_CHECK_BENCH_ARGS:-}"
  ARGS+=(${EXTRA[@]+"${EXTRA[@]}"})
  "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || ARGS+=(--smoke)
  [[ " $MISSING " == *" transformers "* ]] && ARGS+=(--no-reference)
  [[ " $MISSING " == *" jsonargparse "* ]] && ARGS+=(--no-cli)
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-260}" "$PY" benchmarks/bench_gpu.py "${ARGS[@]}"
  BENCH_RC=$?
  echo "bench_gpu exit code: $BENCH_RC"
fi

GENERAL_PID=
GENERAL_RC=-1
if [[ -n "${GPU_CHECK_GENERAL:-}" ]]; then
  say "general recipe on the GPU (in the background: general.log)"
  if [[ -f "$GPU_CHECK_GENERAL" ]]; then
    UNPACKED="$ROOT/runs/gpu-general"
    mkdir -p "$UNPACKED" && tar -xJf "$GPU_CHECK_GENERAL" -C "$UNPACKED"
    GENERAL_DIR="$UNPACKED/general"
    GLUE_DIR="$UNPACKED/data/glue"
  else
    GENERAL_DIR="$GPU_CHECK_GENERAL"
    GLUE_DIR="${BERTFORGE_SHARED_DATA:-$ROOT/../shared/data}/glue"
  fi
  read -r -a GLUE_ARGS <<<"${GPU_CHECK_GLUE_ARGS:---lr 1e-4 --task_budget 20s}"
  (
    set -o pipefail
    "$PY" -m bertforge.cli recipe general --output "$GENERAL_DIR" \
      -- --train.max_time "${GPU_CHECK_GENERAL_TIME:-3m}" ${GPU_CHECK_GENERAL_ARGS:-} || exit 1
    echo "== pretrained; GLUE-5 on the GPU ($((SECONDS - START)) s into the check)"
    LEFT=$(( ${GPU_CHECK_DEADLINE:-560} - (SECONDS - START) - 25 ))
    (( LEFT > 30 )) || { echo "no time left for GLUE"; exit 2; }
    timeout "$LEFT" "$PY" -m bertforge.cli benchmark --model "$GENERAL_DIR/run/model" \
      --output "$GENERAL_DIR/glue" --name "general recipe, GPU ${GPU_CHECK_GENERAL_TIME:-3m}" \
      --suite glue --baseline false --data_dir "$GLUE_DIR" --progress false "${GLUE_ARGS[@]}"
  ) >"$RESULTS/general.log" 2>&1 &
  GENERAL_PID=$!
fi

TESTS_RC=-1
if [[ $SUITE == 1 && ${GPU_CHECK_TESTS:-1} != 0 ]]; then
  say "GPU test suite (tests/gpu, tests/test_devices.py)"
  PER_TEST=()  # a test that hangs fails alone, when pytest-timeout is there
  "$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(--timeout 150)
  timeout 300 "$PY" -m pytest tests/gpu tests/test_devices.py \
    -p no:cacheprovider -o addopts="" -q -rfEs ${DESELECT[@]+"${DESELECT[@]}"} ${PER_TEST[@]+"${PER_TEST[@]}"} \
    --junitxml="$RESULTS/gpu_tests.xml"
  TESTS_RC=$?
  echo "pytest exit code: $TESTS_RC"
fi

if [[ -n "$GENERAL_PID" ]]; then
  say "waiting for the general recipe"
  wait "$GENERAL_PID"
  GENERAL_RC=$?
  tail -n 25 "$RESULTS/general.log"
  ( cd "$GENERAL_DIR" && tar -czf "$RESULTS/general-results.tar.gz" --ignore-failed-read \
      run/results.json run/metrics.jsonl run/pretrain_config.yaml run/model/config.json \
      $(ls run/*.png glue/results.* glue/benchmark_config.json 2>/dev/null) ) \
    && echo "packed: general-results.tar.gz"
fi

say "summary"
HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
case $TESTS_RC in
  0) [[ $HAS_CUDA == 1 ]] && echo "tests: PASSED" || echo "tests: PASSED on the CPU; the GPU tests were SKIPPED (no CUDA)" ;;
  -1) [[ ${GPU_CHECK_TESTS:-1} == 0 ]] && echo "tests: not run (GPU_CHECK_TESTS=0)" \
       || echo "tests: NOT RUN (missing: $MISSING)" ;;
  124) echo "tests: TIMED OUT (see $LOG)" ;;
  *) echo "tests: FAILED (pytest exit $TESTS_RC; see $LOG and gpu_tests.xml)" ;;
esac
case $BENCH_RC in
  0) echo "benchmark: done"; cat "$RESULTS/bench_gpu.md" 2>/dev/null ;;
  -1) echo "benchmark: not run" ;;
  124) echo "benchmark: TIMED OUT (partial rows in bench_gpu.json)" ;;
  *) echo "benchmark: FAILED (exit $BENCH_RC)" ;;
esac
case $GENERAL_RC in
  -1) ;;
  0) echo "general recipe: pretrained and benchmarked on GLUE (general.log)"; \
     cat "$GENERAL_DIR/glue/results.md" 2>/dev/null | head -n 20 ;;
  *) echo "general recipe: FAILED or cut short (exit $GENERAL_RC; see general.log)" ;;
esac
echo "results: $RESULTS (took $((SECONDS - START)) s)"
[[ ($TESTS_RC == 0 || ${GPU_CHECK_TESTS:-1} == 0) && ($BENCH_RC == 0 || $BENCH == none) \
   && ($GENERAL_RC == 0 || $GENERAL_RC == -1) ]]
