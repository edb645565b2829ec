#!/usr/bin/env bash
# Creates/updates the CPU development environment in a virtual environment.
# Usage: PYTHON=python3.11 bash packaging/setup-venv.sh [.venv]
# For a GPU workstation use packaging/install-workstation.sh instead.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cons="$root/packaging/constraints/dev.txt"
# a venv whose creation failed half-way (no python3.X-venv: ensurepip missing) has bin/python but no pip;
# made again, not reused, once the missing package is installed
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "==> $venv has no pip (an earlier creation failed half-way): making it again"
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv" || {
        echo "error: could not create the virtual environment $venv with $py." >&2
        echo "  what to do: on Debian/Ubuntu: sudo apt-get install python3-venv (or python3.X-venv for your" >&2
        echo "  Python), then run this again." >&2
        rm -rf "$venv"
        exit 1
    }
fi
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
