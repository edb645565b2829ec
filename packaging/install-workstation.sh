#!/usr/bin/env bash
# HexStudio workstation installer: Linux or WSL2 Ubuntu, with an NVIDIA GPU or CPU-only.
#
#   bash packaging/install-workstation.sh --dry-run   # print the plan and the exact commands
#   bash packaging/install-workstation.sh             # do it (safe to run again: finished steps are skipped)
#
# What it does, in this order (each step says what it found and what it ran):
#   1. a virtual environment (.venv by default) with the recipe's Python (3.10 for the validated GPU recipe)
#   2. torch for the detected GPU: a CUDA build with kernels for its compute capability
#      (sm_75 .. sm_120, e.g. RTX 5090 = sm_120 -> torch 2.7.1+cu128); CPU-only -> torch 2.13.0
#   3. HexStudio and its dependencies, pinned by hexstudio/shared/data/recipes/{validated,current}.txt
#   4. aimet-onnx (CUDA build, --no-deps) and then onnxruntime-gpu LAST, removing the CPU onnxruntime
#      first (both provide the module `onnxruntime`; whichever is installed last silently replaces the other)
#   5. the libpython LD_LIBRARY_PATH activation hook (AIMET's "Unable to run function PtrToInt64")
#      and bin/hexstudio-launch, which sets it for the Start-menu entry and the Windows shortcut
#   6. the WSLg Start-menu entry (~/.local/share/applications/hexstudio.desktop)
#   7. the AIMET smoke test (a one-node QuantSim) and, with a GPU, torch's kernels for it
#
# Options:
#   --dry-run          print what would run; change nothing
#   --venv DIR         environment folder (default: <repo>/.venv)
#   --python PY        the Python to create it with (default: python3.10 for a GPU, else 3.11/3.12/3.10)
#   --cpu              install the CPU stack even when a GPU is present
#   --dev              also install the test tools (pytest, ruff, mypy, ...)
#   --no-desktop       do not install the Start-menu entry
#   --no-smoke-test    skip the final AIMET smoke test
# Environment (for tests and unusual machines):
#   HEXSTUDIO_GPU_INFO   a recorded `nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version
#                        --format=csv,noheader` line, or "none" for a CPU-only machine
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
dry=0; force_cpu=0; dev=0; desktop=1; smoke=1; python=${PYTHON:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --venv) venv=${2:?--venv needs a folder}; shift ;;
        --venv=*) venv=${1#--venv=} ;;
        --python) python=${2:?--python needs an interpreter}; shift ;;
        --cpu) force_cpu=1 ;;
        --dev) dev=1 ;;
        --no-desktop) desktop=0 ;;
        --no-smoke-test) smoke=0 ;;
        -h|--help) sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$venv" in /*) ;; *) venv="$(pwd)/$venv" ;; esac

recipes="$root/hexstudio/shared/data/recipes"
did=()          # what this run changed, for the summary
say() { echo "==> $*"; }
note() { echo "    $*"; }
die() { echo "error: $*" >&2; exit 1; }
q() { local out="" a; for a in "$@"; do out+="$(printf '%q' "$a") "; done; echo "${out% }"; }
run() {  # print the command; run it unless --dry-run
    echo "+ $(q "$@")"
    [ "$dry" = 1 ] || "$@"
}
write_file() {  # write_file PATH MODE < content
    local path=$1 mode=$2 content
    content=$(cat)
    if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then
        note "$path is up to date"; return 0
    fi
    echo "+ write $path"
    if [ "$dry" = 1 ]; then sed 's/^/|   /' <<<"$content"; return 0; fi
    mkdir -p "$(dirname "$path")"
    printf '%s\n' "$content" > "$path.tmp.$$" && chmod "$mode" "$path.tmp.$$" && mv -f "$path.tmp.$$" "$path"
    did+=("wrote $path")
}
pin() {  # pin RECIPE PACKAGE -> version
    sed -n "s/^$2==\([^ #]*\).*/\1/p" "$recipes/$1.txt" | head -1
}
directive() {  # directive RECIPE KEY -> value
    sed -n "s/^# $2: *//p" "$recipes/$1.txt" | head -1
}
[ -f "$recipes/validated.txt" ] && [ -f "$recipes/current.txt" ] || die "hexstudio/shared/data/recipes/ is missing (run this from a HexStudio checkout)."

# ---------------------------------------------------------------------------------------------
say "[1/7] this machine"
gpu_line=${HEXSTUDIO_GPU_INFO-}
if [ -z "$gpu_line" ]; then
    smi=$(command -v nvidia-smi || true)
    [ -z "$smi" ] && [ -x /usr/lib/wsl/lib/nvidia-smi ] && smi=/usr/lib/wsl/lib/nvidia-smi
    if [ -n "$smi" ]; then
        gpu_line=$("$smi" --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
    fi
fi
[ "$gpu_line" = none ] && gpu_line=""
gpu_name=""; cc=""; sm=""
if [ -n "$gpu_line" ]; then
    IFS=',' read -r gpu_name cc gpu_mem gpu_driver <<<"$gpu_line"
    gpu_name=$(echo "$gpu_name" | xargs); cc=$(echo "$cc" | xargs)
    [[ "$cc" =~ ^[0-9]+\.[0-9]+$ ]] || die "cannot read the GPU's compute capability from nvidia-smi ('$gpu_line'). Update the NVIDIA driver (on WSL2: the Windows driver), or use --cpu."
    sm="sm_${cc/./}"
    note "GPU: $gpu_name, compute capability $cc ($sm),$(echo "$gpu_mem" | sed 's/^ */ /'), driver$(echo "$gpu_driver" | sed 's/^ */ /')"
else
    note "no NVIDIA GPU found (nvidia-smi missing or shows none)"
fi
if grep -qi microsoft /proc/version 2>/dev/null; then note "WSL2: yes"; fi

cc_num=0
if [ -n "$cc" ]; then cc_num=$(( ${cc%%.*} * 10 + ${cc##*.} )); fi
torch_index=""; torch_pkgs=(); want_python=""
if [ -z "$cc" ] || [ "$force_cpu" = 1 ]; then
    mode=cpu; recipe=current
    torch_pkgs=("torch==$(pin current torch)")
    note "plan: the CPU stack (recipe hexstudio/shared/data/recipes/current.txt): fine for the built-in and other small models"
elif [ "$cc_num" -ge 75 ]; then
    mode=cuda; recipe=validated
    torch_index=$(directive validated torch-index)
    torch_pkgs=("torch==$(pin validated torch)" "torchvision==$(pin validated torchvision)")
    want_python=$(directive validated python)
    note "plan: the validated CUDA recipe (hexstudio/shared/data/recipes/validated.txt): torch $(pin validated torch) has $sm kernels"
elif [ "$cc_num" -ge 50 ]; then
    mode=cuda; recipe=validated
    torch_index=${torch_index:-https://download.pytorch.org/whl/cu126}
    tv=$(pin validated torch); tv=${tv%%+*}; vv=$(pin validated torchvision); vv=${vv%%+*}
    torch_pkgs=("torch==$tv+cu126" "torchvision==$vv+cu126")
    want_python=$(directive validated python)
    note "plan: torch $tv+cu126 (the cu128 build has no kernels for $sm); otherwise the validated recipe"
else
    die "$gpu_name ($sm) is older than any current torch build supports (sm_50). Use --cpu for small models."
fi

# ---------------------------------------------------------------------------------------------
say "[2/7] Python environment: $venv"
py_ok() {  # py_ok INTERPRETER -> is it a Python this mode can use?
    local want=$want_python
    if [ -n "$want" ]; then
        "$1" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$want' else 1)" 2>/dev/null
    else
        # the CPU stack's pins (numpy, scipy, onnxruntime, transformers...) need 3.11; aimet-onnx has no wheel past 3.12
        "$1" -c 'import sys; sys.exit(0 if (3,11) <= sys.version_info[:2] <= (3,12) else 1)' 2>/dev/null
    fi
}
vpy="$venv/bin/python"
if [ -x "$vpy" ]; then
    py_ok "$vpy" || die "$venv exists with Python $("$vpy" -c 'import platform; print(platform.python_version())'), but this recipe needs Python ${want_python:-3.11 or 3.12}. Remove it (rm -rf $(q "$venv")) or choose another folder with --venv."
    note "exists ($("$vpy" -c 'import platform; print(platform.python_version())'))"
    if [ -f "$venv/.hexstudio-workstation" ] && ! grep -q "^mode=$mode\$" "$venv/.hexstudio-workstation"; then
        note "it was set up for $(sed -n 's/^mode=//p' "$venv/.hexstudio-workstation"); switching it to $mode"
    fi
else
    if [ -z "$python" ]; then
        if [ -n "$want_python" ]; then cands=("python$want_python"); else cands=(python3.11 python3.12 python3); fi
        for c in "${cands[@]}"; do
            if command -v "$c" >/dev/null 2>&1 && py_ok "$c"; then python=$c; break; fi
        done
    fi
    if [ -z "$python" ] || ! command -v "$python" >/dev/null 2>&1 || ! py_ok "$python"; then
        msg="no Python ${want_python:-3.11 or 3.12} found${python:+ ($python is not one)}. On Ubuntu 24.04: sudo add-apt-repository ppa:deadsnakes/ppa && sudo apt-get install python${want_python:-3.11}-venv libpython${want_python:-3.11}; or give one with --python."
        [ "$dry" = 1 ] || die "$msg"
        note "warning: $msg"
        python=${python:-python${want_python:-3}}
    fi
    run "$python" -m venv "$venv"
    did+=("created $venv with $python")
fi
pip=("$vpy" -m pip --disable-pip-version-check)
have() {  # have DIST -> installed version (empty when absent or no venv yet)
    [ -x "$vpy" ] || return 0
    "$vpy" - "$1" <<'EOF' 2>/dev/null || true
import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass
EOF
}

# ---------------------------------------------------------------------------------------------
say "[3/7] torch for ${sm:-the CPU}"
need_torch=()
for spec in "${torch_pkgs[@]}"; do
    name=${spec%%==*}; want=${spec#*==}; got=$(have "$name")
    if [ "$mode" = cpu ]; then ok=$([ "${got%%+*}" = "$want" ] && echo 1 || echo 0)
    else ok=$([ "$got" = "$want" ] && echo 1 || echo 0); fi
    if [ "$ok" = 1 ]; then note "$name $got already installed"; else need_torch+=("$spec"); fi
done
if [ ${#need_torch[@]} -gt 0 ]; then
    if [ "$mode" = cpu ] && [ "$dry" != 1 ] && "${pip[@]}" install -q --no-index --no-deps "${need_torch[@]}" 2>/dev/null; then
        run "${pip[@]}" install "${need_torch[@]}"  # a local CPU wheel (pip's find-links); its dependencies
    elif [ "$mode" = cpu ]; then
        # PyPI's Linux torch is the CUDA build, with about 3 GB of nvidia packages: PyTorch's CPU index
        run "${pip[@]}" install --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" "${need_torch[@]}"
    elif [ -n "$torch_index" ] && [ "$torch_index" != pypi ]; then
        run "${pip[@]}" install --index-url "$torch_index" "${need_torch[@]}"
    else
        run "${pip[@]}" install "${need_torch[@]}"
    fi
    did+=("installed ${need_torch[*]}")
fi

# ---------------------------------------------------------------------------------------------
say "[4/7] HexStudio and its dependencies (recipe: $recipe)"
# The [ml] extra of pyproject.toml minus torch and onnxruntime, which steps 3 and 5 own on a GPU, and
# onnxruntime-qnn, which step 4b puts where it can go (tests/packaging keeps this list in step with
# pyproject.toml). mmh3 stays: the compile worker, in this venv, orders the HTP graphs by onnxruntime's hash.
ML_DEPS=(numpy "onnx>=1.16" "onnx_ir>=0.1.16" "onnxscript>=0.4.0" "transformers>=4.45" safetensors tokenizers
         "mmh3>=4" PyYAML "bokeh>=3.3.0" "hvplot>=0.10.0" osqp pandas pybind11 scikit-learn scipy tqdm)
stamp="$venv/.hexstudio-install.stamp"
want_stamp="$mode $dev $(cat "$root/pyproject.toml" "$recipes/$recipe.txt" "$root/packaging/constraints/dev.txt" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] && [ -x "$venv/bin/hexstudio" ]; then
    note "already installed for this pyproject.toml and recipe"
else
    extras=""
    if [ "$mode" = cpu ]; then
        extras="ml"; [ "$dev" = 1 ] && extras="ml,dev"
        run "${pip[@]}" install -c "$root/packaging/constraints/dev.txt" -e "$root[$extras]"
    else
        [ "$dev" = 1 ] && extras="[dev]"
        run "${pip[@]}" install -c "$recipes/validated.txt" -e "$root$extras" "${ML_DEPS[@]}"
    fi
    [ "$dry" = 1 ] || echo "$want_stamp" > "$stamp"
    did+=("installed HexStudio ($recipe recipe)")
fi

# ---------------------------------------------------------------------------------------------
# Qualcomm's x86 runtime: onnxruntime-qnn 2.7.0 (libGenie 1.21, QNN 2.51: local compile and real Genie on the
# HTP simulator) needs Python 3.11+ and onnxruntime >= 1.24.2, so beside the validated GPU recipe (Python 3.10,
# onnxruntime-gpu) it goes into a side environment that <venv>/.hexstudio-qnn names (hexstudio/workers/qnn/libs.py).
QNN_DEPS=("onnxruntime-qnn==2.7.0" "mmh3>=4")
say "[4b/7] Qualcomm's x86 runtime (onnxruntime-qnn: local compile, real Genie on the HTP simulator)"
if [ "$mode" = cpu ] && [ -x "$vpy" ] && "$vpy" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)' 2>/dev/null; then
    if [ "$(have onnxruntime-qnn)" = 2.7.0 ] && [ -n "$(have mmh3)" ]; then
        note "onnxruntime-qnn 2.7.0 already installed"
    else
        run "${pip[@]}" install -c "$root/packaging/constraints/dev.txt" "${QNN_DEPS[@]}"
        did+=("installed onnxruntime-qnn in $venv")
    fi
else
    side="${venv}-qnn"; qpy=""
    for c in python3.12 python3.11 python3.13; do command -v "$c" >/dev/null 2>&1 && { qpy=$c; break; }; done
    if [ -z "$qpy" ]; then
        note "warning: no Python 3.11+ for Qualcomm's runtime: local compile and real Genie on the simulator board"
        note "are unavailable (the onnxruntime twin stands in, labeled). Install python3.11-venv and run this again."
    elif [ -x "$side/bin/python" ] && "$side/bin/python" -c 'import onnxruntime_qnn, mmh3, onnx, tokenizers' 2>/dev/null \
            && [ "$(cat "$venv/.hexstudio-qnn" 2>/dev/null)" = "$side/bin/python" ]; then
        note "onnxruntime-qnn already installed in the side environment $side"
    else
        [ -x "$side/bin/python" ] || run "$qpy" -m venv "$side"
        run "$side/bin/python" -m pip --disable-pip-version-check -q install -c "$root/packaging/constraints/dev.txt" \
            "${QNN_DEPS[@]}" numpy "onnx>=1.16" tokenizers
        [ "$dry" = 1 ] || echo "$side/bin/python" > "$venv/.hexstudio-qnn"
        did+=("installed onnxruntime-qnn in the side environment $side")
    fi
fi

# ---------------------------------------------------------------------------------------------
say "[5/7] aimet-onnx, then onnxruntime$([ "$mode" = cuda ] && echo -gpu) last"
aimet=$(pin "$recipe" aimet-onnx); got=$(have aimet-onnx)
if [ "${got%%+*}" = "$aimet" ] && { [ "$mode" = cpu ] || [[ "$got" != *+cpu ]]; }; then
    note "aimet-onnx $got already installed"
else
    # the CPU build under the CUDA runtime fails with "No opset import for domain 'aimet.customop.cuda'"
    if [ "$mode" = cuda ] && [[ "$got" == *+cpu ]]; then run "${pip[@]}" uninstall -y aimet-onnx; fi
    # --no-deps: its onnx2torch dependency pulls a torchvision/torch that would replace step 3's build.
    # The PyPI wheel (no +cpu tag) is the CUDA build; it also runs on CPU-only machines.
    run "${pip[@]}" install --no-deps "aimet-onnx==$aimet"
    did+=("installed aimet-onnx $aimet")
fi
if [ "$mode" = cuda ]; then keep=onnxruntime-gpu; drop=onnxruntime; else keep=onnxruntime; drop=onnxruntime-gpu; fi
ort=$(pin "$recipe" "$keep"); got_keep=$(have "$keep"); got_drop=$(have "$drop")
if [ -n "$got_drop" ]; then
    # Both packages write the same files: remove both, then install the one we keep.
    note "$drop $got_drop is installed and would shadow $keep: removing both"
    run "${pip[@]}" uninstall -y "$drop" "$keep"
    did+=("removed $drop $got_drop")
    got_keep=""
fi
if [ "$got_keep" = "$ort" ]; then
    note "$keep $ort already installed (and $drop is not)"
else
    [ -n "$got_keep" ] && run "${pip[@]}" uninstall -y "$keep"
    run "${pip[@]}" install -c "$recipes/$recipe.txt" "$keep==$ort"
    did+=("installed $keep $ort last")
fi
if [ "$dry" = 0 ] && [ -n "$(have "$drop")" ]; then
    die "$drop came back beside $keep (a dependency pulled it in). Run: $(q "${pip[@]}") uninstall -y $drop $keep && $(q "${pip[@]}") install $keep==$ort"
fi

# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
say "[6/7] libpython hook, launcher and Start-menu entry"
if [ -x "$vpy" ]; then pyx=$vpy; else pyx=$python; fi
if "$pyx" -c '' 2>/dev/null; then
    libdir=$("$pyx" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
    soname=$("$pyx" -c 'import sysconfig; print(sysconfig.get_config_var("INSTSONAME") or "")')
else  # dry run without that Python on this machine
    libdir="<LIBDIR of $pyx>"; soname="libpython${want_python:-3}.so.1.0"
fi
if [ "$dry" = 0 ] && [ -n "$soname" ] && [ ! -e "$libdir/$soname" ] && ! ldconfig -p 2>/dev/null | grep -q "$soname"; then
    note "warning: $soname is not on this machine: AIMET will fail with 'Unable to run function PtrToInt64'. Install it (Ubuntu: sudo apt-get install lib${soname%%.so*}) and run this again."
fi
write_file "$venv/bin/hexstudio-env.sh" 644 <<EOF
# HexStudio (packaging/install-workstation.sh): make $soname loadable for AIMET-ONNX, whose native
# ops otherwise fail with "RuntimeError: Unable to run function PtrToInt64". Sourced by bin/activate
# and bin/hexstudio-launch.
case ":\${LD_LIBRARY_PATH-}:" in
    *":$libdir:"*) ;;
    *) export LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" ;;
esac
EOF
hook_line='[ -f "$VIRTUAL_ENV/bin/hexstudio-env.sh" ] && . "$VIRTUAL_ENV/bin/hexstudio-env.sh"  # hexstudio libpython hook'
if [ -f "$venv/bin/activate" ] && grep -qF "# hexstudio libpython hook" "$venv/bin/activate"; then
    note "bin/activate already sources the hook"
else
    echo "+ append the hook to $venv/bin/activate: $hook_line"
    [ "$dry" = 1 ] || { printf '\n%s\n' "$hook_line" >> "$venv/bin/activate"; did+=("added the libpython hook to bin/activate"); }
fi
write_file "$venv/bin/hexstudio-launch" 755 <<'EOF'
#!/bin/sh
# Starts HexStudio with the libpython hook set (used by the Start-menu entry and HexStudio.cmd).
# The studio started without a terminal (the Start menu) or with HEXSTUDIO_LOG_OUTPUT=1 (HexStudio.cmd) keeps
# its output in <config>/logs/launch.log, beside the studio's own log: a crash before that log opens (a missing
# Qt library, a broken install) is kept there. HEXSTUDIO_LOG_OUTPUT=0 leaves the output where it was.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/hexstudio-env.sh"
if [ "${HEXSTUDIO_LOG_OUTPUT:-}" = 1 ] || { [ $# -eq 0 ] && [ "${HEXSTUDIO_LOG_OUTPUT:-}" != 0 ] && [ ! -t 1 ] && [ ! -t 2 ]; }; then
    logs="${HEXSTUDIO_CONFIG_DIR:-${XDG_CONFIG_HOME:-$HOME/.config}/hexstudio}/logs"
    if mkdir -p "$logs" 2>/dev/null && : >>"$logs/launch.log" 2>/dev/null; then
        if [ "$(wc -c <"$logs/launch.log")" -gt 2000000 ]; then mv -f "$logs/launch.log" "$logs/launch.log.1"; fi
        printf '\n=== %s hexstudio-launch %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >>"$logs/launch.log"
        exec >>"$logs/launch.log" 2>&1 </dev/null
    fi
fi
exec "$here/hexstudio" "$@"
EOF
write_file "$venv/.hexstudio-workstation" 644 <<EOF
mode=$mode
recipe=$recipe
gpu=${gpu_name:-none}
compute_capability=${cc:-none}
EOF
if [ "$desktop" = 1 ]; then
    run "$venv/bin/hexstudio-launch" install-desktop --launcher "$venv/bin/hexstudio-launch"
else
    note "skipped (--no-desktop)"
fi

# ---------------------------------------------------------------------------------------------
say "[7/7] verify"
if [ "$dry" = 1 ]; then
    echo "+ $(q "$venv/bin/python") -c 'from hexstudio.shared.preflight_checks import SMOKE_TEST; exec(SMOKE_TEST)'   # AIMET smoke test"
    [ "$mode" = cuda ] && echo "+ $(q "$venv/bin/python") -c 'import torch; ...'   # torch.cuda.get_arch_list() has $sm; aimet-onnx is the CUDA build"
elif [ "$smoke" = 1 ]; then
    if [ "$mode" = cuda ]; then
        # shellcheck disable=SC1091
        arches=$(. "$venv/bin/hexstudio-env.sh"; "$vpy" -c 'import torch; print(" ".join(torch.cuda.get_arch_list()) if torch.cuda.is_available() else "no-cuda")')
        case " $arches " in
            *" $sm "*) note "torch has $sm kernels ($arches)" ;;
            *" no-cuda "*) die "torch cannot see the GPU (torch.cuda.is_available() is False): check the NVIDIA driver (on WSL2, the Windows driver) with nvidia-smi." ;;
            *) die "torch $(have torch) has no $sm kernels (it has: $arches). It would recognise the GPU but cannot run on it." ;;
        esac
        build=$(cd "$root" && "$vpy" -c 'from hexstudio.shared.preflight_checks import _aimet_build; print((_aimet_build() or {}).get("build"))')
        [ "$build" = cuda ] || die "aimet-onnx $(have aimet-onnx) is not the CUDA build ($build): under the CUDA runtime it fails with \"No opset import for domain 'aimet.customop.cuda'\". Install the CUDA wheel: $(q "${pip[@]}") install --no-deps --force-reinstall aimet-onnx==$aimet"
        note "aimet-onnx $(have aimet-onnx) is the CUDA build"
    fi
    # shellcheck disable=SC1091
    res=$(. "$venv/bin/hexstudio-env.sh"; cd "$root" && "$vpy" -c 'from hexstudio.shared.preflight_checks import SMOKE_TEST; exec(SMOKE_TEST)' 2>/dev/null | tail -1)
    if "$vpy" -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1]).get("ok") else 1)' "$res" 2>/dev/null; then
        note "AIMET smoke test passed: $res"
    else
        die "the AIMET smoke test failed: ${res:-it printed nothing}. Run '$venv/bin/hexstudio-launch preflight' for the reason (libpython, onnxruntime, aimet build)."
    fi
else
    note "skipped (--no-smoke-test)"
fi

echo
if [ "$dry" = 1 ]; then
    say "dry run: nothing was changed. Run without --dry-run to do the above."
elif [ ${#did[@]} -eq 0 ]; then
    say "nothing to do: $venv already has the $recipe stack ($mode)."
else
    say "done ($mode, recipe $recipe):"
    for d in "${did[@]}"; do note "- $d"; done
fi
[ "$dry" = 1 ] || note "start it: $venv/bin/hexstudio-launch   (or 'HexStudio' in the Windows Start menu)"
[ "$dry" = 1 ] || note "check the machine: $venv/bin/hexstudio-launch preflight --model <model>"
