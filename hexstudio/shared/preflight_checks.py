"""Preflight's knowledge of this machine: memory, disk, WSL, GPU and package checks against a model's needs.

`probe()` reads the machine into a plain dict (recordable as JSON); `run_checks(probe, needs)`
is pure, so tests feed recorded probes. Each check: id, status ok/warn/fail/skip, measured,
required, message, fix. The AIMET smoke test (a one-node QuantSim) and the GPU probe run in
subprocesses in parallel with the rest of the probe, so this module stays light: the Preflight
stage (hexstudio/workers/preflight.py) and `hexstudio preflight` (hexstudio.core.services.preflight) both use it.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.shared import modelinfo, recipes, wslconfig

GiB = 1024**3
PROBE_VERSION = 1
MEMORY_MARGIN = 1.15  # RAM + swap below 1.15x the estimated peak warns (the estimate is a planning figure)

# The smoke test makes the calls quantization makes (hexstudio/workers/quant/smoke.py: build_sim with LPBQ, int8 lm_head
# and 8-bit KV, calibration, the 1.0.0 encodings export, AIMET's quantized weights, the simulation graph):
# a stack that cannot quantize fails here, naming the step.
SMOKE_TEST = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
try:
    from hexstudio.workers.quant.smoke import run
    print(json.dumps(run()), flush=True)
except Exception as exc:
    print(json.dumps({{"ok": False, "seconds": 0.0, "step": "import", "error": f"{{type(exc).__name__}}: {{exc}}"}}))
"""

GPU_PROBE = r"""
import json
out = {"torch": None, "cuda": False, "cuda_version": None, "arch_list": [], "devices": []}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_version"] = getattr(torch.version, "cuda", None)
    out["cuda"] = bool(torch.cuda.is_available())
    out["arch_list"] = list(torch.cuda.get_arch_list()) if out["cuda"] else []
    for i in range(torch.cuda.device_count() if out["cuda"] else 0):
        p = torch.cuda.get_device_properties(i)
        out["devices"].append({"name": p.name, "memory_bytes": int(p.total_memory),
                               "compute_capability": f"{p.major}.{p.minor}"})
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"gpu": out}), flush=True)
"""

# One subprocess for both: aimet_onnx imports torch anyway, so the torch/CUDA view and the smoke test
# share one torch import (a second process importing torch beside it cost ~2.5 s of CPU on a 2-core box).
# The GPU line is printed (and flushed) first, so it survives a smoke test that crashes the process.
PROBE_AND_SMOKE = GPU_PROBE + SMOKE_TEST

NVIDIA_SMI_QUERY = [
    "--query-gpu=name,memory.total,driver_version,compute_cap",
    "--format=csv,noheader,nounits",
]


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader,nounits`
    lines -> [{name, memory_bytes, driver_version, compute_capability}] (memory.total is in MiB)."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0]:
            continue
        try:
            mem = int(float(cells[1])) * 1024**2
        except ValueError:
            mem = None
        cc = cells[3] if len(cells) > 3 and cells[3] not in ("", "[N/A]", "N/A") else None
        gpus.append(
            {
                "name": cells[0],
                "memory_bytes": mem,
                "driver_version": cells[2] or None,
                "compute_capability": cc,
            }
        )
    return gpus


def _nvml_gpus() -> dict[str, Any]:
    """NVIDIA GPUs and driver through NVML (nvidia-ml-py), when nvidia-smi is not on PATH."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return {
            "source": None,
            "gpus": [],
            "driver_version": None,
            "error": "neither nvidia-smi nor NVML found",
        }
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded
        return {"source": "nvml", "gpus": [], "driver_version": None, "error": f"NVML: {exc}"}
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        drv = drv.decode() if isinstance(drv, bytes) else str(drv)
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(
                {
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "driver_version": drv,
                    "compute_capability": f"{major}.{minor}",
                }
            )
        return {"source": "nvml", "gpus": gpus, "driver_version": drv, "error": None}
    except Exception as exc:
        return {"source": "nvml", "gpus": [], "driver_version": None, "error": f"NVML: {exc}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _dist(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, SwapTotal, ...); {} where there is none."""
    return _meminfo()


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def _wslconfig() -> dict[str, Any] | None:
    """The Windows user's .wslconfig seen from inside WSL (None when it cannot be located)."""
    path = wslconfig.locate()
    if path is None:
        return None
    try:
        exists = path.is_file()
        text = wslconfig.Text.decode(path.read_bytes()).text if exists else ""
    except OSError as exc:
        return {"path": str(path), "exists": False, "text": "", "limits": {}, "error": str(exc)}
    return {"path": str(path), "exists": exists, "text": text, "limits": wslconfig.read_limits(text)}


BASE_PACKAGES = ("aimet-onnx", "onnxruntime", "onnxruntime-gpu", "torch", "onnx", "transformers", "qai-hub")


def _aimet_build() -> dict[str, Any] | None:
    """CUDA or CPU build of the installed aimet-onnx: by its local version tag (+cpu, +cu121) or, for
    the untagged PyPI wheel, by its native libraries (the CUDA build carries ~100 MB of kernels each)."""
    try:
        dist = md.distribution("aimet-onnx")
    except md.PackageNotFoundError:
        return None
    local = dist.version.partition("+")[2]
    if local:
        return {"build": "cpu" if local == "cpu" else "cuda", "evidence": f"version tag +{local}"}
    libs = [Path(str(f.locate())) for f in (dist.files or []) if f.name.startswith("libaimet_onnxrt_ops")]
    sizes = [lib.stat().st_size for lib in libs if lib.is_file()]
    if not sizes:
        return {"build": None, "evidence": "no libaimet_onnxrt_ops library found"}
    big = max(sizes)
    return {
        "build": "cuda" if big > 20 * 1024**2 else "cpu",
        "evidence": f"libaimet_onnxrt_ops is {big / 1024**2:.0f} MiB",
    }


def _recipes() -> dict[str, Any]:
    try:
        return recipes.load_recipes()
    except recipes.RecipeError as exc:
        return {"error": str(exc)}


def _libpython() -> str | None:
    libname = f"libpython{sys.version_info.major}.{sys.version_info.minor}"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    for cand in (
        ctypes.util.find_library(libname.replace("lib", "", 1)),
        f"{libname}.so.1.0",
        f"{libname}.so",
    ):
        if not cand:
            continue
        for path in (cand, os.path.join(libdir, cand)):
            try:
                ctypes.CDLL(path)
                return path
            except OSError:
                continue
    return None


def _disk(p: Path) -> dict[str, Any]:
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    return {"path": str(p), "free_bytes": shutil.disk_usage(q).free, "device": os.stat(q).st_dev}


def _last_json(text: str, key: str | None = None) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and (key is None or key in doc):
            return doc
    return None


def probe(workspace: Path, hf_cache: Path, smoke: bool = True) -> dict[str, Any]:
    """Read this machine. The torch/CUDA probe and the AIMET smoke test share one subprocess (one torch
    import), nvidia-smi another; both run while this process reads the rest."""
    t0 = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", PROBE_AND_SMOKE if smoke else GPU_PROBE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    smi_path = shutil.which("nvidia-smi")
    smi = (
        subprocess.Popen(
            [smi_path, *NVIDIA_SMI_QUERY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        if smi_path
        else None
    )
    mem = _meminfo()
    version = Path("/proc/version").read_text().lower() if Path("/proc/version").exists() else ""
    wsl = "microsoft" in version or bool(os.environ.get("WSL_DISTRO_NAME"))
    rec = _recipes()
    venv = sys.prefix if sys.prefix != sys.base_prefix else None
    p: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "os": platform.platform(),
        "wsl": wsl,
        "mem_total_bytes": mem.get("MemTotal", 0),
        "swap_total_bytes": mem.get("SwapTotal", 0),
        "mem_available_bytes": mem.get("MemAvailable", 0),
        "cpu_count": os.cpu_count() or 1,
        "workspace": _disk(workspace),
        "hf_cache": _disk(hf_cache),
        "python": platform.python_version(),
        "libpython": _libpython(),
        "libpython_name": f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0",
        "libpython_dir": sysconfig.get_config_var("LIBDIR") or None,
        "venv": venv,
        "conda_prefix": os.environ.get("CONDA_PREFIX") or None,
        "packages": {
            n: _dist(n)
            for n in (
                *BASE_PACKAGES,
                *recipes.pinned_names({k: v for k, v in rec.items() if isinstance(v, dict)}),
            )
        },
        "aimet_build": _aimet_build(),
        "recipes": rec,
        "wslconfig": _wslconfig() if wsl else None,
    }
    if smi is not None:
        try:
            out, err = smi.communicate(timeout=30)
            gpus = parse_nvidia_smi(out) if smi.returncode == 0 else []
            p["nvidia"] = {
                "source": "nvidia-smi",
                "gpus": gpus,
                "driver_version": next((g["driver_version"] for g in gpus if g["driver_version"]), None),
                "error": None
                if smi.returncode == 0
                else f"nvidia-smi exited {smi.returncode}: {(err or out).strip()[-300:]}",
            }
        except subprocess.TimeoutExpired:
            smi.kill()
            smi.communicate()
            p["nvidia"] = {
                "source": "nvidia-smi",
                "gpus": [],
                "driver_version": None,
                "error": "nvidia-smi did not answer in 30 s (a hung driver?)",
            }
    else:
        p["nvidia"] = _nvml_gpus()
    p["nvidia_smi"] = smi is not None
    try:
        out, err = child.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        err = "the probe did not finish in 300 s and was killed. " + (err or "")
    wall = round(time.monotonic() - t0, 2)
    died = (
        f"the probe process died with signal {-child.returncode}"
        if child.returncode and child.returncode < 0
        else None
    )
    tail = (err or "").strip()[-500:] or None
    gpu = _last_json(out, "gpu")
    p["gpu"] = (
        gpu["gpu"]
        if gpu
        else {
            "torch": None,
            "cuda": False,
            "arch_list": [],
            "devices": [],
            "error": died or f"the torch probe printed nothing: {tail}",
        }
    )
    if smoke:
        res = _last_json(out, "ok")
        if res is None:
            res = {
                "ok": False,
                "seconds": wall,
                "error": (died or "the smoke test printed nothing") + (f" (stderr: {tail})" if tail else ""),
            }
        res["process_seconds"] = wall
        p["aimet_smoke"] = res
    return p


def _check(
    cid: str, status: str, measured: Any, required: Any, message: str, fix: str | None = None
) -> dict[str, Any]:
    return {
        "id": cid,
        "status": status,
        "measured": measured,
        "required": required,
        "message": message,
        "fix": fix,
    }


def _space_check(cid: str, free: int, need: int, message: str, fix: Callable[[str], str]) -> dict[str, Any]:
    """A free-space check: it fails when `free` is short of `need`; `fix` is told by how much (as _gib writes it)."""
    ok = free >= need
    return _check(cid, "ok" if ok else "fail", free, need, message, None if ok else fix(_gib(need - free)))


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def run_checks(p: dict[str, Any], needs: dict[str, Any]) -> list[dict[str, Any]]:
    """Pure: a recorded probe + the model's estimates -> checks."""
    checks = []
    have = int(p["mem_total_bytes"]) + int(p["swap_total_bytes"])
    # the larger of the quantize and validate peaks (both stages run on this machine)
    need = max(int(needs.get("quantize_peak_rss_bytes", 0)), int(needs.get("validate_peak_rss_bytes", 0)))
    ref = int(str(modelinfo.REFERENCE["quantize_peak_rss_bytes"]))
    if have >= need * MEMORY_MARGIN:
        checks.append(
            _check(
                "memory",
                "ok",
                have,
                need,
                f"RAM + swap {_gib(have)} covers the estimated "
                f"peak of {_gib(need)} (part-wise quantization and unit-wise validation; reference recipe, whole model: "
                f"{_gib(ref)}).",
            )
        )
    else:
        fix = (
            "Raise the WSL memory limit in .wslconfig (the Fix button writes it) and run `wsl --shutdown`."
            if p.get("wsl")
            else "Add swap or RAM, close other programs, or use more parts."
        )
        checks.append(
            _check(
                "memory",
                "fail" if have < need else "warn",
                have,
                need,
                f"RAM + swap is {_gib(have)}; quantization and validation need about {_gib(need)} "
                f"(the reference whole-model recipe peaked at {_gib(ref)}).",
                fix,
            )
        )
    checks.append(_local_compile_check(have, needs))
    if p.get("wsl"):
        cfg = p.get("wslconfig") or {}
        limits = cfg.get("limits") or {}
        now = (
            f"{cfg['path']} sets memory={limits.get('memory') or '(default: half the Windows RAM)'}, "
            f"swap={limits.get('swap') or '(default)'}"
            if cfg.get("path")
            else ".wslconfig not found"
        )
        if have < need * MEMORY_MARGIN:  # the memory check's margin: when it is not ok, the fix is here
            target, swap = wslconfig.target_limits(need)
            checks.append(
                _check(
                    "wsl",
                    "fail" if have < need else "warn",
                    {
                        "mem_total_bytes": p["mem_total_bytes"],
                        "swap_total_bytes": p["swap_total_bytes"],
                        "wslconfig": cfg.get("path"),
                        "limits": limits or None,
                    },
                    f"memory >= {target}GB",
                    f"WSL2 caps Linux memory below the Windows RAM, and this model needs "
                    f"{'more' if have < need else 'about all of it'} "
                    f"(Linux sees {_gib(p['mem_total_bytes'])} RAM + {_gib(p['swap_total_bytes'])} "
                    f"swap; {now}).",
                    f"wslconfig:memory={target}GB,swap={swap}GB",
                )
            )
        else:
            checks.append(
                _check("wsl", "ok", p["mem_total_bytes"], None, f"WSL2 memory limit is high enough ({now}).")
            )
    else:
        checks.append(_check("wsl", "skip", None, None, "Not running under WSL."))
    checks.extend(_disk_checks(p, needs))
    checks.append(_gpu_check(p, needs))
    py = tuple(int(x) for x in str(p["python"]).split(".")[:2])
    checks.append(
        _check(
            "python",
            "ok" if (3, 10) <= py <= (3, 12) else "fail",
            p["python"],
            "3.10–3.12",
            f"Python {p['python']}.",
            None
            if (3, 10) <= py <= (3, 12)
            else "aimet-onnx ships wheels for CPython 3.10+ (the validated recipe uses 3.10).",
        )
    )
    pk = p.get("packages") or {}
    if pk.get("onnxruntime") and pk.get("onnxruntime-gpu"):
        checks.append(
            _check(
                "onnxruntime_conflict",
                "fail",
                "onnxruntime + onnxruntime-gpu",
                "exactly one",
                "Both onnxruntime and onnxruntime-gpu are installed: they provide the same module "
                "and whichever was installed last silently replaced the other.",
                "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu",
            )
        )
    elif not (pk.get("onnxruntime") or pk.get("onnxruntime-gpu")):
        checks.append(
            _check(
                "onnxruntime_conflict",
                "fail",
                None,
                "onnxruntime",
                "onnxruntime is not installed.",
                "pip install onnxruntime (CPU) or onnxruntime-gpu (NVIDIA), never both.",
            )
        )
    else:
        checks.append(
            _check(
                "onnxruntime_conflict",
                "ok",
                pk.get("onnxruntime") or pk.get("onnxruntime-gpu"),
                "exactly one",
                "One onnxruntime package installed.",
            )
        )
    if p.get("libpython"):
        checks.append(_check("libpython", "ok", p["libpython"], p["libpython_name"], "libpython loads."))
    else:
        checks.append(
            _check(
                "libpython",
                "fail",
                None,
                p["libpython_name"],
                f"{p['libpython_name']} cannot be loaded: AIMET fails with 'Unable to run function "
                "PtrToInt64'.",
                libpython_fix(p),
            )
        )
    if not pk.get("aimet-onnx"):
        checks.append(
            _check(
                "aimet",
                "fail",
                None,
                "aimet-onnx",
                "aimet-onnx is not installed.",
                "Install it: bash packaging/install-workstation.sh",
            )
        )
    checks.extend(_aimet_build_check(p))
    checks.extend(_recipe_checks(p, needs))
    checks.extend(_known_bad_check(p))
    smoke = p.get("aimet_smoke")
    if smoke is None:
        checks.append(_check("aimet_smoke", "skip", None, None, "AIMET smoke test not run."))
    elif smoke.get("ok"):
        checks.append(
            _check(
                "aimet_smoke",
                "ok",
                f"{smoke['seconds']:.1f} s",
                None,
                "A miniature calibration unit quantized as the stage quantizes (LPBQ int4 weights, "
                "int8 lm_head, 8-bit KV, 1.0.0 encodings, simulation graph): "
                f"{smoke['seconds']:.1f} s"
                + (
                    f" ({smoke['process_seconds']:.1f} s for the whole probe process, torch included)."
                    if smoke.get("process_seconds")
                    else "."
                ),
            )
        )
    else:
        step = f" at step '{smoke['step']}'" if smoke.get("step") else ""
        checks.append(
            _check(
                "aimet_smoke",
                "fail",
                smoke.get("error"),
                "a calibration unit quantizes",
                f"The AIMET smoke test failed{step}: {smoke.get('error')}. This stack cannot quantize.",
                (smoke.get("fix") or "") + " Fix the AIMET install before spending an hour on the "
                "model (see the libpython and onnxruntime checks).",
            )
        )
    return checks


def _local_compile_check(have: int, needs: dict[str, Any]) -> dict[str, Any]:
    """What a local QNN compile of this model needs (compile_target local; measured at 8B shapes, scaled by
    parameters) and what the AI Hub compile uploads instead: a warning where memory is short, a failure only where
    this run will compile locally (`compile_local`: the Preflight stage knows the board and the target) and would
    be killed there, after quantize and validate have run."""
    ram = int(needs.get("local_compile_peak_rss_bytes", 0))
    secs = float(needs.get("local_compile_seconds", 0))
    disk = int(needs.get("local_compile_disk_bytes", 0))
    up, upz = int(needs.get("aihub_upload_bytes", 0)), int(needs.get("aihub_upload_zipped_bytes", 0))
    when = f"{secs / 3600:.1f} h" if secs >= 5400 else f"{secs / 60:.0f} min"
    text = (
        f"A local QNN compile of this model needs about {_gib(ram)} RAM (its largest part), {when} on 2 cores "
        f"and {disk / 1e9:.1f} GB of disk (measured at Llama-3.1-8B shapes, scaled to this model); compiling on "
        f"AI Hub instead uploads {up / 1e9:.1f} GB ({upz / 1e9:.1f} GB zipped as the client sends it)."
    )
    required = {"ram_bytes": ram, "seconds": int(secs), "disk_bytes": disk, "aihub_upload_bytes": up}
    if have >= ram:
        return _check("local_compile", "ok", have, required, text)
    if needs.get("compile_local"):
        return _check(
            "local_compile",
            "fail",
            have,
            required,
            text
            + f" This run compiles locally (the simulator board's target), and this machine has {_gib(have)}: "
            "the compile would run out of memory after quantization.",
            "Run on a machine with more memory (or raise the WSL memory limit), use compile_target sim (the "
            "onnxruntime twin's labeled stand-in bundle), or deploy to a real board, which compiles on AI Hub.",
        )
    return _check(
        "local_compile",
        "warn",
        have,
        required,
        text + f" This machine has {_gib(have)}.",
        "Compile on AI Hub (compile_target aihub), or on a machine with more memory.",
    )


def _disk_checks(p: dict[str, Any], needs: dict[str, Any]) -> list[dict[str, Any]]:
    """Free space where the workspace and the Hugging Face cache live. On one filesystem (same st_dev, or
    the same path on a probe that did not record it) both needs come out of the same free space."""
    ws, hf = p["workspace"], p["hf_cache"]
    # a run that compiles locally also writes the rewritten graphs and the context binaries in the workspace
    ws_need = int(needs.get("disk_bytes", 0)) + (
        int(needs.get("local_compile_disk_bytes", 0)) if needs.get("compile_local") else 0
    )
    # the Preflight stage runs after the Model stage: what was to be downloaded is in the cache (or a folder) now
    downloaded = bool(needs.get("hf_downloaded"))
    # a download that stopped part-way resumes: what is in the cache already is not needed again
    have = int(needs.get("hf_cached_bytes") or 0)
    hf_need = 0 if downloaded else max(0, int(needs.get("hf_download_bytes", 0)) - have)
    shared = ws.get("device") is not None and ws.get("device") == hf.get("device")
    out = []
    if shared and downloaded:
        out.append(
            _space_check(
                "disk_workspace",
                ws["free_bytes"],
                ws_need,
                f"{_gib(ws['free_bytes'])} free at {ws['path']} (the model's weights are already on this disk); "
                f"this model needs about {_gib(ws_need)} more.",
                lambda short: (
                    f"Free {short} there, or choose a workspace on a bigger disk (--workspace DIR)."
                ),
            )
        )
    elif shared:
        need = ws_need + hf_need
        both = (
            f"the workspace ({ws['path']}, about {_gib(ws_need)}) and the Hugging Face cache ({hf['path']}, "
            f"about {_gib(hf_need)}) are on the same filesystem"
        )
        # one filesystem, one problem: one row (two FAILs for one full disk read as two problems)
        out.append(
            _space_check(
                "disk_workspace",
                ws["free_bytes"],
                need,
                f"{_gib(ws['free_bytes'])} free; {both}: {_gib(need)} together.",
                lambda short: (
                    f"Free {short} on that disk, or move the "
                    "workspace (--workspace) or the Hugging Face cache (HF_HOME) to a bigger disk."
                ),
            )
        )
    else:
        out.append(
            _space_check(
                "disk_workspace",
                ws["free_bytes"],
                ws_need,
                f"{_gib(ws['free_bytes'])} free at {ws['path']}; this model needs about {_gib(ws_need)}.",
                lambda short: (
                    f"Free {short} there, or choose a workspace on a bigger disk (--workspace DIR)."
                ),
            )
        )
        out.append(
            _space_check(
                "disk_hf_cache",
                hf["free_bytes"],
                hf_need,
                f"{_gib(hf['free_bytes'])} free for the Hugging Face cache ({hf['path']}); "
                + (
                    "the model is already there (or was never downloaded)."
                    if downloaded
                    else f"the download is about {_gib(hf_need)}"
                    + (f" more ({_gib(have)} of it is there already)." if have else ".")
                ),
                lambda short: (
                    f"Free {short} there, or point HF_HOME at a "
                    "bigger disk before the download (export HF_HOME=/path/on/big/disk)."
                ),
            )
        )
    path = str(ws["path"])
    parts = Path(path).parts
    if path.startswith("/mnt/") and len(parts) > 2 and len(parts[2]) == 1:
        out.append(
            _check(
                "workspace_location",
                "warn",
                path,
                "inside the WSL filesystem",
                "The workspace is on a Windows drive (/mnt/<drive>): cross-filesystem I/O is many "
                "times slower and this flow reads and writes hundreds of GB.",
                "Use a workspace under your Linux home, e.g. ~/hexstudio-workspace.",
            )
        )
    return out


INSTALLER_FIX = (
    "bash packaging/install-workstation.sh (it detects the GPU and installs the matching CUDA torch)"
)


def _torch_runs_on(capability: str, arches: list[str]) -> bool:
    """Whether torch's kernels (torch.cuda.get_arch_list()) run on a GPU of this compute capability ("8.9"): a
    cubin runs on the same major architecture at the same or a later minor (sm_86 on an RTX 4090's 8.9, as torch's
    own _check_cubins allows a major's later GPUs), PTX (compute_XY) on any later GPU through the driver's JIT.
    sm_120 (RTX 50xx) needs an sm_12x cubin: torch 2.4's sm_50..sm_90 does not run there."""
    try:
        major, minor = (int(x) for x in capability.split(".")[:2])
    except ValueError:
        return False
    for a in arches:
        kind, _, num = a.partition("_")
        if not num.isdigit() or len(num) < 2:
            continue
        a_major, a_minor = int(num[:-1]), int(num[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _gpu_check(p: dict[str, Any], needs: dict[str, Any]) -> dict[str, Any]:
    """torch's view (devices, arch list) beside the driver's (nvidia-smi / NVML): the sm_120 trap, a CPU-only
    torch on an NVIDIA machine, VRAM against this model's guidance, the driver version."""
    gpu = p.get("gpu") or {}
    nv = p.get("nvidia") or {}
    nv_gpus = nv.get("gpus") or []
    driver = nv.get("driver_version")
    drv = f", driver {driver}" if driver else ", driver not read"
    n = int(needs.get("num_parameters", 0))
    small = n <= 500_000_000
    vram_need = needs.get("quantize_peak_vram_bytes")
    if gpu.get("devices"):
        d = gpu["devices"][0]
        cc = d["compute_capability"].replace(".", "")
        arches = gpu.get("arch_list") or []
        measured = f"{d['name']} {_gib(d['memory_bytes'])} sm_{cc}{drv}"
        if not _torch_runs_on(d["compute_capability"], arches):
            return _check(
                "gpu",
                "fail",
                measured,
                f"torch built with sm_{cc}",
                f"torch {gpu.get('torch')} has no kernels for {d['name']} (sm_{cc}); it only has "
                f"{', '.join(arches) or 'none'}. It recognises the GPU but cannot run on it.",
                "Install a torch build with kernels for this GPU: "
                "bash packaging/install-workstation.sh (e.g. torch 2.7.1+cu128 for sm_120).",
            )
        if vram_need and int(d["memory_bytes"]) < int(vram_need):
            return _check(
                "gpu",
                "warn",
                measured,
                f"{_gib(int(vram_need))} VRAM",
                f"{d['name']} has {_gib(d['memory_bytes'])} of VRAM; calibrating this model holds about "
                f"{_gib(int(vram_need))} on it (an estimate){drv}. CUDA may run out of memory during calibration.",
                "Use more parts (smaller parts need less VRAM), a bigger GPU, or a remote worker host.",
            )
        return _check(
            "gpu",
            "ok",
            measured,
            f"{_gib(int(vram_need))} VRAM" if vram_need else None,
            f"{d['name']} with {_gib(d['memory_bytes'])}, supported by torch {gpu.get('torch')}{drv}.",
        )
    if nv_gpus:
        g = nv_gpus[0]
        mem = f" {_gib(g['memory_bytes'])}" if g.get("memory_bytes") else ""
        measured = f"{g['name']}{mem}{drv}; torch {gpu.get('torch') or 'missing'} without CUDA"
        torch_v = str(gpu.get("torch") or "")
        if not torch_v:
            why = "torch is not installed"
        elif "+cpu" in torch_v or (not gpu.get("cuda_version") and "+cu" not in torch_v):
            why = f"torch {torch_v} is the CPU-only build"
        else:
            why = (
                f"torch {torch_v} is a CUDA build but cannot use the GPU (torch.cuda.is_available() is False: "
                f"{gpu.get('error') or 'the driver is too old for its CUDA, or the GPU is not visible'})"
            )
        return _check(
            "gpu",
            "warn" if small else "fail",
            measured,
            "a CUDA torch for this GPU",
            f"An NVIDIA {g['name']} is present{drv}, but {why}: everything would run on the CPU"
            + (
                ", which is fine but slower for this small model."
                if small
                else ", which takes days for a model this size."
            ),
            f"Install the CUDA stack: {INSTALLER_FIX}.",
        )
    # nvidia-smi is installed but cannot talk to a driver (on WSL2: the Windows driver is missing or old)
    smi_err = nv.get("error") if nv.get("source") == "nvidia-smi" else None
    broken = f" nvidia-smi is installed but failed: {smi_err}" if smi_err else ""
    driver_fix = (
        " Install or update the NVIDIA driver (on WSL2: the Windows driver, not one inside Linux), "
        "then check with nvidia-smi."
        if smi_err
        else ""
    )
    if small:
        mins = max(1, round(n / 4e6 * 0.5 / 60 + 1))
        return _check(
            "gpu",
            "warn" if smi_err else "ok",
            "CPU only",
            None,
            f"No CUDA GPU: fine for this small model (about {mins} min of quantization on the CPU).{broken}",
            driver_fix.strip() or None,
        )
    return _check(
        "gpu",
        "fail",
        "CPU only",
        "a CUDA GPU (8B: ~80 GB VRAM guidance)",
        f"No usable CUDA GPU: quantizing a model this size on the CPU would take days.{broken}",
        "Run on a workstation with an NVIDIA GPU, or use a remote worker host." + driver_fix,
    )


def libpython_fix(p: dict[str, Any]) -> str:
    """The LD_LIBRARY_PATH hook for this environment: the venv's bin/hexstudio-env.sh, sourced by
    bin/activate, as packaging/install-workstation.sh writes it; conda's activate.d under conda."""
    libdir = p.get("libpython_dir") or "<the folder holding " + str(p.get("libpython_name")) + ">"
    venv = p.get("venv")
    if venv:
        return (
            f"Run: bash packaging/install-workstation.sh --venv {venv} (it writes {venv}/bin/hexstudio-env.sh, "
            f"which puts {libdir} on LD_LIBRARY_PATH, and sources it from {venv}/bin/activate). "
            f'Or by hand: export LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}". '
            f"If {p.get('libpython_name')} is not on the machine at all, install it first "
            f"(Ubuntu: sudo apt-get install lib{str(p.get('libpython_name')).split('.so')[0]})."
        )
    if p.get("conda_prefix"):
        cp = p["conda_prefix"]
        return (
            f'export LD_LIBRARY_PATH="{cp}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
            f"(persist it in {cp}/etc/conda/activate.d/)"
        )
    return (
        f'export LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"; if '
        f"{p.get('libpython_name')} is missing, install it "
        f"(Ubuntu: sudo apt-get install lib{str(p.get('libpython_name')).split('.so')[0]})."
    )


def _aimet_build_check(p: dict[str, Any]) -> list[dict[str, Any]]:
    ver = (p.get("packages") or {}).get("aimet-onnx")
    info = p.get("aimet_build")
    if not ver or info is None:
        return []
    build = info.get("build")
    has_gpu = bool((p.get("gpu") or {}).get("devices"))
    if build == "cpu" and has_gpu:
        public = str(ver).partition("+")[0]
        return [
            _check(
                "aimet_build",
                "fail",
                f"aimet-onnx {ver} (CPU build)",
                "the CUDA build on a CUDA machine",
                "The CPU build of aimet-onnx is installed on a machine with a CUDA GPU: with the CUDA "
                "runtime it fails with \"No opset import for domain 'aimet.customop.cuda'\".",
                f"pip uninstall -y aimet-onnx && pip install --no-deps aimet-onnx=={public} "
                "(the PyPI wheel without +cpu is the CUDA build)",
            )
        ]
    return [
        _check(
            "aimet_build",
            "ok",
            f"aimet-onnx {ver} ({build or 'unknown'} build)",
            None,
            f"aimet-onnx {ver}, {build or 'unknown'} build ({info.get('evidence')})"
            + (" — fine on a CPU-only machine." if build == "cuda" and not has_gpu else "."),
        )
    ]


# Stacks known to fail silently (facts/workstation.md): version prefixes, all of which must match.
KNOWN_BAD = [
    {
        "python": "3.12",
        "aimet-onnx": "2.33",
        "onnxruntime-gpu": "1.22",
        "what": 'quantization printed "completed successfully" and the calibration graph even gave a correct '
        "first token, but both deployment graphs produced multilingual token salad",
    },
]


def _prefix(version: str | None, want: str) -> bool:
    return version is not None and (version == want or version.startswith(want + "."))


def _known_bad_check(p: dict[str, Any]) -> list[dict[str, Any]]:
    pk = p.get("packages") or {}
    for bad in KNOWN_BAD:
        pins = {k: v for k, v in bad.items() if k != "what"}
        have = {k: (str(p.get("python", "")) if k == "python" else pk.get(k)) for k in pins}
        if all(_prefix(have[k], v) for k, v in pins.items()):
            listed = ", ".join(f"{k} {have[k]}" for k in pins)
            return [
                _check(
                    "known_bad_stack",
                    "fail",
                    have,
                    "not this combination",
                    f"This is a stack known to fail silently ({listed}): {bad['what']}.",
                    "Install the validated recipe: bash packaging/install-workstation.sh "
                    "(Python 3.10, aimet-onnx 2.26, onnxruntime-gpu 1.23.2).",
                )
            ]
    return []


# From this size on the validated recipe matters: it is the only stack proven on an 8B-class model.
BIG_MODEL_PARAMS = 3_000_000_000


def _recipe_checks(p: dict[str, Any], needs: dict[str, Any]) -> list[dict[str, Any]]:
    """The live versions against the recipes (hexstudio/shared/data/recipes/{validated,current}.txt): ok, or warn with the table."""
    recs = p.get("recipes")
    if recs is None:
        return [_check("recipe_validated", "skip", None, None, "This probe did not record the recipes.")]
    if "error" in recs:
        return [
            _check(
                "recipe_validated",
                "warn",
                None,
                None,
                f"The recipe files cannot be read: {recs['error']}",
                "Reinstall HexStudio (its package data hexstudio/shared/data/recipes/ holds them).",
            )
        ]
    out = []
    texts = {
        "current": (
            "the stack the README installs (./dev setup) and HexStudio's test suite runs with",
            "Untested combinations may break; the CPU stack: ./dev setup, a GPU workstation: "
            "bash packaging/install-workstation.sh",
        ),
        "validated": (
            "the validated recipe (the stack known to give coherent 8B deployment graphs on an RTX 5090)",
            "Other versions can work, but only the validate stage's deployment-pair gate proves it; "
            "to install the validated stack on an NVIDIA workstation: bash packaging/install-workstation.sh",
        ),
    }
    readme_install = False  # the live stack is the README's (packaging/constraints/dev.txt = current.txt)
    for name, (what, fix) in texts.items():
        rec = recs.get(name)
        cid = f"recipe_{name}"
        if not rec:
            out.append(
                _check(
                    cid,
                    "skip",
                    None,
                    None,
                    f"The recipe {name}.txt (hexstudio/shared/data/recipes/) is not installed.",
                )
            )
            continue
        rows = recipes.compare(rec, str(p.get("python", "")), p.get("packages") or {})
        table = {r["package"]: r["installed"] for r in rows}
        pinned = {r["package"]: r["pinned"] for r in rows}
        diff = [r for r in rows if not r["match"]]
        if not diff:
            readme_install = readme_install or name == "current"
            out.append(_check(cid, "ok", table, pinned, f"Matches {what}: {len(rows)} pins."))
            continue
        listed = ", ".join(
            f"{r['package']} {r['installed'] or 'missing'} (recipe {r['pinned']})" for r in diff
        )
        status, says = "warn", f"{len(diff)} of {len(rows)} pins differ from {what}: {listed}."
        hint: str | None = fix
        if name == "validated" and readme_install:
            # The README's own install is not the 8B GPU recipe, by design: say so, and warn only where it matters
            if int(needs.get("num_parameters", 0)) >= BIG_MODEL_PARAMS:
                says = (
                    "This is the README's install (HexStudio's tested stack), not the validated "
                    f"recipe, the only stack proven on an 8B-class model; it differs in {listed}."
                )
            else:
                key_pins = ", ".join(
                    f"{'Python' if r['package'] == 'python' else r['package']} {r['pinned']}"
                    for r in rows
                    if r["package"] in ("python", "torch", "aimet-onnx", "onnxruntime-gpu")
                )
                status, hint = "ok", None
                says = (
                    "This is the README's install (HexStudio's tested stack): right for this model. The "
                    f"validated recipe ({key_pins}) matters for 8B-class models on an NVIDIA GPU: bash "
                    "packaging/install-workstation.sh."
                )
        out.append(_check(cid, status, table, pinned, says, hint))
    return out
