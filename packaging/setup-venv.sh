#!/usr/bin/env bash
# Creates/updates the CPU development environment in a virtual environment.
# Usage: PYTHON=python3.11 bash packaging/setup-venv.sh [.venv]
# For a GPU workstation use packaging/install-workstation.sh instead.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cons="$root/packaging/constraints/dev.txt"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
echo "==> [1/3] torch 2.13.0 (CPU) first, so nothing pulls a CUDA build"
"${pip[@]}" install "torch==2.13.0"
echo "==> [2/3] aimet-onnx 2.42.0 without its onnx2torch/torchvision dependency"
"${pip[@]}" install --no-deps "aimet-onnx==2.42.0"
echo "==> [3/3] HexStudio and its pinned dependencies"
"${pip[@]}" install -c "$cons" -e "$root[ml,dev]"
if "$venv/bin/python" -m pip show onnxruntime-gpu >/dev/null 2>&1 && "$venv/bin/python" -m pip show onnxruntime >/dev/null 2>&1; then
    echo "warning: both onnxruntime and onnxruntime-gpu are installed; they overwrite each other's files." >&2
fi
echo "==> environment ready in $venv"
