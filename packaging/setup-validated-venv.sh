#!/usr/bin/env bash
# The second test tier's environment: the validated recipe's pins (hexstudio/shared/data/recipes/validated.txt:
# aimet-onnx 2.26, onnx 1.18, transformers 4.45, ...) for everything but torch, on Python 3.10
# (aimet-onnx 2.26 ships a cp310 wheel only), with torch 2.13.0 and the CPU onnxruntime 1.23.2
# (the recipe's onnxruntime-gpu needs a GPU). The quantize, model and validate tests run in it
# (see `./dev test`).
#
# Usage: bash packaging/setup-validated-venv.sh [VENV]      (default .venv-validated)
# Exit status: 0 ready; 3 cannot be installed here (no Python 3.10, or the wheels cannot be had:
# offline with no local copy); anything else: a real failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv-validated}
# shellcheck source=packaging/venv_check.sh
. "$root/packaging/venv_check.sh"
refuse_non_venv "$venv"  # the folder is removed and made again below: never one that is not a venv
recipe="$root/hexstudio/shared/data/recipes/validated.txt"

find_python310() {
    local c
    for c in "${PYTHON310:-}" python3.10 "$(command -v pyenv >/dev/null 2>&1 && pyenv root 2>/dev/null)/versions/"3.10*/bin/python3.10 \
             /usr/bin/python3.10 /usr/local/bin/python3.10; do
        [ -n "$c" ] || continue
        # a pyenv shim exists but fails when 3.10 is not selected: run it to know
        # ensurepip too: Debian's python3.10 without python3.10-venv makes a venv without pip, and fails
        if "$c" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info[:2] == (3, 10) else 1)' >/dev/null 2>&1; then
            "$c" -c 'import sys; print(sys.executable)'; return 0
        fi
    done
    return 1
}

stamp="$venv/.hexstudio-validated.stamp"
want=$(cat "$recipe" "$0" | sha256sum | cut -c1-16)
# up to date: the same recipe and script, and the editable install still finds the package from outside the
# checkout (-I: not through the working directory; a layout change such as issue 30's move of app/ and workers/
# into hexstudio/ leaves a stale mapping behind)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ] \
    && "$venv/bin/python" -I -c 'import hexstudio.shared' >/dev/null 2>&1; then
    echo "==> validated-recipe environment up to date in $venv"
    exit 0
fi

py=$(find_python310) || { echo "cannot set up the validated-recipe tier: no Python 3.10 with venv found (install python3.10 and python3.10-venv, or set PYTHON310=/path/to/python3.10)" >&2; exit 3; }
echo "==> validated-recipe environment in $venv (Python: $py)"
rm -rf "$venv"
"$py" -m venv "$venv" || { echo "cannot set up the validated-recipe tier: $py could not make a venv (install python3.10-venv)" >&2; rm -rf "$venv"; exit 3; }
# pip's messages, to tell "the wheels cannot be had here" (a skip, exit 3) from a real failure (exit 1)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip=(pip_logged "$venv/bin/python" -m pip --disable-pip-version-check -q)
# the failing call's words alone: a retry warning of an earlier step that went well must not read as "offline"
pip_logged() { : > "$log"; "$@" 2>>"$log"; }

# the recipe's pins minus torch/torchvision (CUDA builds) and onnxruntime-gpu (a GPU), plus the CPU onnxruntime
cons="$venv/constraints.txt"
grep -v -E '^(torch|torchvision|onnxruntime-gpu)==' "$recipe" > "$cons"
echo "onnxruntime==1.23.2" >> "$cons"

t0=$(date +%s)
fail() {
    rm -rf "$venv"
    if grep -qiE "no matching distribution|could not find a version|failed to establish a new connection|name resolution|network is unreachable|connection refused|timed out" "$log"; then
        echo "cannot set up the validated-recipe tier: $1 (pip could not get the wheels: offline, or no local copy under pip's find-links/index); pip said:" >&2
        tail -n 3 "$log" >&2
        exit 3
    fi
    echo "error: setting up the validated-recipe tier failed at $1; pip said:" >&2
    tail -n 20 "$log" >&2
    exit 1
}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
echo "==> [1/3] torch 2.13.0 for CPU: a local wheel (pip's find-links), else PyTorch's CPU index"
if "$venv/bin/python" -m pip -q install --no-index --no-deps "torch==2.13.0" 2>/dev/null; then
    :
elif "$venv/bin/python" -m pip -q install --retries 1 --timeout 20 --no-deps --index-url "$TORCH_CPU_INDEX" "torch==2.13.0" 2>/dev/null; then
    :
else
    # PyPI's Linux torch is the CUDA build: it runs on the CPU without its ~3 GB of nvidia libraries when they are
    # not loadable... but it links them; lean first, then with its dependencies
    echo "    no local CPU wheel and PyTorch's CPU index cannot be reached: pip's configured index"
    if ! "${pip[@]}" install --no-deps "torch==2.13.0" || ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
        "${pip[@]}" install "torch==2.13.0" || fail "torch 2.13.0 for Python 3.10"
    fi
fi
"${pip[@]}" install filelock "typing-extensions>=4.10" sympy networkx jinja2 fsspec || fail "torch's dependencies"
echo "==> [2/3] aimet-onnx 2.26.0 without its onnx2torch/torchvision dependency, onnx 1.18, onnxruntime 1.23.2, transformers 4.45"
"${pip[@]}" install -c "$cons" --no-deps "aimet-onnx==2.26.0" || fail "aimet-onnx 2.26.0"
"${pip[@]}" install -c "$cons" "onnx==1.18.0" "onnxruntime==1.23.2" "transformers==4.45.0" \
    "onnx_ir>=0.1.16" "onnxscript>=0.4.0" PyYAML bokeh hvplot osqp pandas pybind11 scikit-learn scipy tqdm \
    jsonschema psutil safetensors || fail "the recipe's packages"
echo "==> [3/3] HexStudio (no dependencies) and what its quantize/model/validate tests import"
"${pip[@]}" install -c "$cons" pytest pytest-timeout keyring "keyrings.alt" paramiko jinja2 pyyaml || fail "test packages"
"${pip[@]}" install --no-deps -e "$root" || fail "HexStudio itself"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import aimet_onnx, onnx, onnxruntime, transformers, torch  # noqa: F401
print("    " + ", ".join(f"{d} {md.version(d)}" for d in ("aimet-onnx", "onnx", "onnxruntime", "transformers", "torch")))
EOF
echo "$want" > "$stamp"
echo "==> validated-recipe environment ready in $venv ($(( $(date +%s) - t0 )) s)"
