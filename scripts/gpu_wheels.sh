#!/usr/bin/env bash
# Download, HERE (where pip reaches PyPI), the wheels of bertforge's dependencies that the lent
# GPU machines' image lacks (docs/gpu.md): jsonargparse for the CLI and the serve extra's
# FastAPI stack. They go into .whl/ (ignored by git); a device run carries them
# (carry: [".whl"]) and scripts/gpu_check.sh installs them there without a network.
# The image's python is 3.12 on x86-64: the wheels are chosen for it, whatever runs this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION="${GPU_PYTHON_VERSION:-3.12}"
DEST="${1:-.whl}"
# name==version: the versions this project tests with, and what they need beyond the image
PACKAGES=(
  "jsonargparse==4.53.0" "docstring-parser==0.18.0" "typeshed-client==2.15.0"
  "fastapi==0.165.0" "starlette==1.10.0" "pydantic==2.14.4" "pydantic-core==2.50.5"
  "annotated-types==0.8.0" "typing-inspection==0.4.5" "opentelemetry-api==1.45.2"
  "uvicorn==0.54.0" "orjson==3.13.0" "swagger-ui-bundle==1.1.0"
)
PLATFORMS=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux1_x86_64 any; do
  PLATFORMS+=(--platform "$p")
done
mkdir -p "$DEST"
for spec in "${PACKAGES[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$spec" \
    || python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
      -d "$DEST" "$spec"
done
echo "wheels in $DEST ($(du -sh "$DEST" | cut -f1)):"
ls "$DEST"
