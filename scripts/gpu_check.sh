#!/usr/bin/env bash
# One command for a GPU machine (docs/gpu.md): the GPU test suite (tests/gpu, marker `cuda`, and
# the device checks of tests/test_devices.py), then benchmarks/bench_gpu.py (ours vs
# transformers, tok/s and MFU, and the CLI run against its step). About 6-8 minutes on an
# H100/H200. Needs PyTorch with CUDA; downloads nothing. Dependencies the machine lacks
# (jsonargparse, the serve extra) are installed from .whl/ when it is there (made by
# scripts/gpu_wheels.sh where pip reaches PyPI, and carried along); without them the parts that
# need them are skipped and the summary says so.
#
#   bash scripts/gpu_check.sh                 # results in $OUT if set, else runs/gpu-check
#   GPU_CHECK_BENCH=quick bash scripts/gpu_check.sh   # fewer timed steps (about 2 minutes less)
#   GPU_CHECK_BENCH=none bash scripts/gpu_check.sh    # the tests only
#   GPU_CHECK_BENCH_ARGS="--compile 0 --profile" bash scripts/gpu_check.sh   # more for the bench
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

TESTS_RC=-1
if [[ $SUITE == 1 ]]; then
  say "GPU test suite (tests/gpu, tests/test_devices.py)"
  PER_TEST=()  # a test that hangs fails alone, when pytest-timeout is there
  "$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(--timeout 150)
  timeout 300 "$PY" -m pytest tests/gpu tests/test_devices.py \
    -p no:cacheprovider -o addopts="" -q -rfEs ${DESELECT[@]+"${DESELECT[@]}"} ${PER_TEST[@]+"${PER_TEST[@]}"} \
    --junitxml="$RESULTS/gpu_tests.xml"
  TESTS_RC=$?
  echo "pytest exit code: $TESTS_RC"
fi

BENCH_RC=-1
if [[ $BENCH != none ]]; then
  say "benchmark (benchmarks/bench_gpu.py, $BENCH)"
  ARGS=(--json "$RESULTS/bench_gpu.json" --markdown "$RESULTS/bench_gpu.md")
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

say "summary"
HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
case $TESTS_RC in
  0) [[ $HAS_CUDA == 1 ]] && echo "tests: PASSED" || echo "tests: PASSED on the CPU; the GPU tests were SKIPPED (no CUDA)" ;;
  -1) echo "tests: NOT RUN (missing: $MISSING)" ;;
  124) echo "tests: TIMED OUT (see $LOG)" ;;
  *) echo "tests: FAILED (pytest exit $TESTS_RC; see $LOG and gpu_tests.xml)" ;;
esac
case $BENCH_RC in
  0) echo "benchmark: done"; cat "$RESULTS/bench_gpu.md" 2>/dev/null ;;
  -1) echo "benchmark: not run" ;;
  124) echo "benchmark: TIMED OUT (partial rows in bench_gpu.json)" ;;
  *) echo "benchmark: FAILED (exit $BENCH_RC)" ;;
esac
echo "results: $RESULTS (took $((SECONDS - START)) s)"
[[ $TESTS_RC == 0 && ($BENCH_RC == 0 || $BENCH == none) ]]
