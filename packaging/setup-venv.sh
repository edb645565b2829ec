#!/usr/bin/env bash
# Creates/updates the CPU development environment in a virtual environment.
# Usage: PYTHON=python3.11 bash packaging/setup-venv.sh [.venv]
# For a GPU workstation use packaging/install-workstation.sh instead.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cons="$root/packaging/constraints/dev.txt"
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
# shellcheck source=packaging/venv_check.sh
. "$root/packaging/venv_check.sh"
refuse_non_venv "$venv"  # what follows may remove the folder: never one that is not a venv
# a venv whose creation failed half-way (no python3.X-venv: ensurepip missing) has bin/python but no pip;
# made again, not reused, once the missing package is installed
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "==> $venv has no pip (an earlier creation failed half-way): making it again"
    rm -rf "$venv"
fi
# a venv that does not run from where it is: its Python is gone (upgraded, removed), or the folder was moved (its
# scripts still name the old place and exit 127); made again, never trusted
if [ -e "$venv" ] && ! venv_runs_here "$venv" pip; then
    echo "==> $venv does not run from here (its Python is gone or the folder was moved): making it again"
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
# a local CPU wheel where pip's find-links has one (PIP_FIND_LINKS); else PyTorch's CPU index: PyPI's Linux torch
# is the CUDA build, with about 3 GB of nvidia packages
if "${pip[@]}" install --no-index --no-deps "torch==2.13.0" 2>/dev/null; then
    "${pip[@]}" install "torch==2.13.0"  # its dependencies, from pip's configured index
elif echo "    no local torch 2.13.0 wheel: from PyTorch's CPU index ($TORCH_CPU_INDEX)" \
    && "${pip[@]}" install --retries 1 --timeout 20 --index-url "$TORCH_CPU_INDEX" "torch==2.13.0"; then
    :
else
    echo "warning: PyTorch's CPU index cannot be reached: torch 2.13.0 from pip's configured index (PyPI's Linux" >&2
    echo "  build is the CUDA one, with about 3 GB of nvidia packages; it runs on the CPU too)" >&2
    "${pip[@]}" install "torch==2.13.0"
fi
echo "==> [2/3] aimet-onnx 2.42.0 without its onnx2torch/torchvision dependency"
"${pip[@]}" install --no-deps "aimet-onnx==2.42.0"
echo "==> [3/3] HexStudio and its pinned dependencies"
"${pip[@]}" install -c "$cons" -e "$root[ml,dev]"
if "$venv/bin/python" -m pip show onnxruntime-gpu >/dev/null 2>&1 && "$venv/bin/python" -m pip show onnxruntime >/dev/null 2>&1; then
    echo "warning: both onnxruntime and onnxruntime-gpu are installed; they overwrite each other's files." >&2
fi
echo "==> environment ready in $venv"
