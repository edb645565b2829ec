"""Preflight checks are pure functions over a recorded probe; plus the live probe and its schema."""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hexstudio.core.services.preflight import preflight_report
from hexstudio.shared import modelinfo
from hexstudio.shared.data import builtin_model_dir
from hexstudio.shared.preflight_checks import MEMORY_MARGIN, parse_nvidia_smi, run_checks
from tests.support.configs import LLAMA_31_8B as LLAMA_8B

GiB = 1024**3
SCHEMA = Path(__file__).resolve().parents[2] / "hexstudio" / "core" / "schemas" / "preflight.schema.json"


BASE_PROBE: dict[str, Any] = {
    "probe_version": 1,
    "os": "Linux",
    "wsl": False,
    "mem_total_bytes": 256 * GiB,
    "swap_total_bytes": 0,
    "mem_available_bytes": 250 * GiB,
    "cpu_count": 32,
    "workspace": {"path": "/home/dev/hexstudio-workspace", "free_bytes": 2000 * GiB},
    "hf_cache": {"path": "/home/dev/.cache/huggingface", "free_bytes": 2000 * GiB},
    "python": "3.10.20",
    "libpython": "libpython3.10.so.1.0",
    "libpython_name": "libpython3.10.so.1.0",
    "packages": {
        "aimet-onnx": "2.26.0",
        "onnxruntime": None,
        "onnxruntime-gpu": "1.23.2",
        "torch": "2.7.1+cu128",
    },
    "gpu": {
        "torch": "2.7.1+cu128",
        "cuda": True,
        "arch_list": ["sm_90", "sm_100", "sm_120"],
        "devices": [
            {"name": "NVIDIA GeForce RTX 5090", "memory_bytes": 32 * GiB, "compute_capability": "12.0"}
        ],
    },
    "aimet_smoke": {"ok": True, "seconds": 9.1},
    "wslconfig": None,
}


def needs_8b(cl: int = 4096) -> dict[str, Any]:
    return modelinfo.estimate(modelinfo.inspect_config(LLAMA_8B), cl)


def by_id(checks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in checks}


def probe(**changes: Any) -> dict[str, Any]:
    p = copy.deepcopy(BASE_PROBE)
    p.update(changes)
    return p


def on_disks(workspace: str, ws_free: int, hf_free: int, devices: tuple[int, int]) -> dict[str, Any]:
    """The probe with the workspace at `workspace` and the Hugging Face cache (~/.cache/huggingface) with so
    many bytes free, on the filesystems `devices` (workspace, cache): the same number is one filesystem."""
    return probe(
        workspace={"path": workspace, "free_bytes": ws_free, "device": devices[0]},
        hf_cache={"path": "/home/dev/.cache/huggingface", "free_bytes": hf_free, "device": devices[1]},
    )


def test_healthy_workstation_passes_for_8b() -> None:
    checks = run_checks(probe(), needs_8b())
    assert [c["id"] for c in checks if c["status"] == "fail"] == []


def test_wsl_capped_at_64_gb_for_8b_follows_the_estimate() -> None:
    """A 64 GB WSL VM with no swap (MemTotal a little under the cap, as Linux reports it): the expected
    status comes from the estimate, whatever the estimate is; the fix asks for at least what is needed."""
    needs = needs_8b()
    need = max(int(needs["quantize_peak_rss_bytes"]), int(needs["validate_peak_rss_bytes"]))
    have = 64 * 10**9 - 10**9
    c = by_id(run_checks(probe(wsl=True, mem_total_bytes=have, swap_total_bytes=0), needs))
    expected = "ok" if have >= need * MEMORY_MARGIN else "fail" if have < need else "warn"
    assert c["memory"]["status"] == expected
    assert c["wsl"]["status"] == expected
    assert c["memory"]["required"] == need and c["memory"]["measured"] == have
    if expected != "ok":
        _assert_wslconfig_fix(c, need)
    # the same 64 GB cap against a need above it (as the whole-model recipe's 173.6 GiB) must fail
    big = dict(
        needs,
        quantize_peak_rss_bytes=modelinfo.REFERENCE["quantize_peak_rss_bytes"],
        validate_peak_rss_bytes=0,
    )
    c = by_id(run_checks(probe(wsl=True, mem_total_bytes=have, swap_total_bytes=0), big))
    assert c["memory"]["status"] == "fail" and c["wsl"]["status"] == "fail"
    _assert_wslconfig_fix(c, int(str(big["quantize_peak_rss_bytes"])))
    small = by_id(run_checks(probe(wsl=True, mem_total_bytes=need // 4, swap_total_bytes=0), needs))
    assert small["memory"]["status"] == "fail" and small["wsl"]["status"] == "fail"
    _assert_wslconfig_fix(small, need)


def _assert_wslconfig_fix(c: dict[str, dict[str, Any]], need: int) -> None:
    m = re.fullmatch(r"wslconfig:memory=(\d+)GB,swap=(\d+)GB", c["wsl"]["fix"])
    assert m, c["wsl"]["fix"]
    assert int(m.group(1)) * GiB >= need  # WSL reads "GB" as GiB
    assert "wsl --shutdown" in c["memory"]["fix"]


def test_8b_on_a_16_gib_100_gb_machine() -> None:
    """Issue 20: for an 8B (Llama-3.1 shapes, context 4096, 5 parts) part-wise quantization and unit-wise validation
    both fit 16 GiB, and the run folder plus the download fit 100 GB, even on one filesystem: the preflight passes.
    The estimates sit above what bench/llama8b_shapes.py measured at the true layer shapes (quantize 5.42 GiB,
    validate 3.04 GiB, both flat from 2 to 4 layers; docs/PERFORMANCE.md) and under the 8 GiB target."""
    needs = needs_8b()
    assert needs["peak_rss_bytes"] == max(needs["quantize_peak_rss_bytes"], needs["validate_peak_rss_bytes"])
    assert 5.42 * GiB < needs["quantize_peak_rss_bytes"] < 8 * GiB
    assert 3.04 * GiB < needs["validate_peak_rss_bytes"] < 8 * GiB
    assert needs["disk_bytes"] + needs["hf_download_bytes"] <= 100 * 10**9
    disk = {"free_bytes": 100 * 10**9, "device": 2049}
    p = probe(
        mem_total_bytes=16 * GiB,
        swap_total_bytes=0,
        mem_available_bytes=15 * GiB,
        workspace={"path": "/home/dev/hexstudio-workspace", **disk},
        hf_cache={"path": "/home/dev/.cache/huggingface", **disk},
    )
    checks = by_id(run_checks(p, needs))
    assert [c["id"] for c in checks.values() if c["status"] == "fail"] == []
    assert checks["memory"]["status"] == "ok" and checks["memory"]["required"] == needs["peak_rss_bytes"]
    # a 4 GiB machine is refused on memory
    small = by_id(
        run_checks(
            probe(
                mem_total_bytes=4 * GiB,
                swap_total_bytes=0,
                mem_available_bytes=3 * GiB,
                workspace={"path": "/home/dev/hexstudio-workspace", **disk},
                hf_cache={"path": "/home/dev/.cache/huggingface", **disk},
            ),
            needs,
        )
    )
    assert [c["id"] for c in small.values() if c["status"] == "fail"] == ["memory"]


def test_a_part_per_quantsim_is_planned_for_not_a_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """calibration_unit=part holds a whole part in one QuantSim; the estimate stayed the per-layer one (6.5 GiB
    for an 8B), so a 16 GiB machine passed the memory check and the stage was killed mid-quantize."""
    from hexstudio.core.services import preflight as service

    part = modelinfo.estimate(modelinfo.inspect_config(LLAMA_8B), 4096, calibration_unit="part")
    layer = needs_8b()
    largest = part["largest_part_parameters"]
    assert (
        part["quantize_peak_rss_bytes"]
        > modelinfo.WHOLE_QUANTSIM_BYTES_PER_PARAM * largest
        > 4 * layer["quantize_peak_rss_bytes"]
    )
    disk = {"free_bytes": 100 * 10**9, "device": 2049}
    p = probe(
        mem_total_bytes=16 * GiB,
        mem_available_bytes=15 * GiB,
        workspace={"path": "/w", **disk},
        hf_cache={"path": "/h", **disk},
    )
    assert by_id(run_checks(p, part))["memory"]["status"] == "fail"
    # the command line and the studio's Preflight page read the setting too
    monkeypatch.setattr(service, "model_config", lambda model, revision=None: LLAMA_8B)
    needs, _r = service.model_needs("meta-llama/Llama-3.1-8B-Instruct", {"calibration_unit": "part"})
    assert needs["quantize_peak_rss_bytes"] == part["quantize_peak_rss_bytes"]


def test_preflight_reads_the_runs_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run at `--revision R` was checked against main's config.json and main's cache: with main cached and R
    not, preflight said the weights were on the disk already."""
    from hexstudio.core.services import preflight as service

    asked: list[tuple[str, str | None]] = []

    def config(model: str, revision: str | None = None) -> dict[str, Any]:
        asked.append(("config", revision))
        return LLAMA_8B

    def cached(model: str, revision: str | None = None) -> bool:
        asked.append(("cached", revision))
        return revision is None  # main is in the cache, dev is not

    monkeypatch.setattr(service, "model_config", config)
    monkeypatch.setattr(service, "weights_cached", cached)
    monkeypatch.setattr(service, "cached_blob_bytes", lambda model: 0)
    monkeypatch.setattr(service, "probe", lambda ws, cache, smoke=True: probe())
    rep = service.preflight_report(
        "meta-llama/Llama-3.1-8B-Instruct", tmp_path, smoke=False, settings={"revision": "dev"}
    )
    assert asked == [("config", "dev"), ("cached", "dev")] and rep["needs"]["hf_downloaded"] is False


def test_wsl_with_enough_memory_is_ok() -> None:
    needs = needs_8b()
    have = int(int(needs["peak_rss_bytes"]) * 2)
    cfg = {
        "path": "/mnt/c/Users/dev/.wslconfig",
        "exists": True,
        "text": "[wsl2]\nmemory=176GB\n",
        "limits": {"memory": "176GB", "swap": None},
    }
    c = by_id(run_checks(probe(wsl=True, mem_total_bytes=have, swap_total_bytes=0, wslconfig=cfg), needs))
    assert c["wsl"]["status"] == "ok" and c["memory"]["status"] == "ok"
    assert "memory=176GB" in c["wsl"]["message"] and c["wsl"]["fix"] is None


def test_both_onnxruntime_packages_is_a_conflict_with_pip_commands() -> None:
    p = probe(packages={**BASE_PROBE["packages"], "onnxruntime": "1.23.2"})
    c = by_id(run_checks(p, needs_8b()))["onnxruntime_conflict"]
    assert c["status"] == "fail"
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in c["fix"]


def test_sm120_gpu_with_torch_lacking_sm120() -> None:
    gpu = copy.deepcopy(BASE_PROBE["gpu"])
    gpu["torch"] = "2.4.1+cu121"
    gpu["arch_list"] = ["sm_50", "sm_80", "sm_90"]
    c = by_id(run_checks(probe(gpu=gpu), needs_8b()))["gpu"]
    assert c["status"] == "fail" and "sm_120" in c["message"] and "install-workstation.sh" in c["fix"]


@pytest.mark.parametrize(
    ("capability", "arches", "runs"),
    [
        ("8.9", ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], True),  # RTX 4090, L4, L40S
        ("6.1", ["sm_50", "sm_60", "sm_70"], True),  # GTX 10xx, P40: sm_60's cubins
        ("8.0", ["sm_86", "sm_90"], False),  # an 8.6 cubin does not run on 8.0
        ("12.0", ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], False),  # the RTX 5090 trap
        ("12.0", ["sm_90", "compute_90"], True),  # PTX: the driver compiles it for the newer GPU
        ("12.0", ["sm_100", "sm_120"], True),
    ],
)
def test_torch_kernels_run_on_a_gpu_of_the_same_major_at_a_later_minor(
    capability: str, arches: list[str], runs: bool
) -> None:
    """An RTX 4090 (8.9) with a stock torch (sm_86, sm_90: no sm_89) failed the gpu check, though sm_86's kernels
    run there."""
    gpu = copy.deepcopy(BASE_PROBE["gpu"])
    gpu["arch_list"] = arches
    gpu["devices"][0]["compute_capability"] = capability
    c = by_id(run_checks(probe(gpu=gpu), needs_8b()))["gpu"]
    assert (c["status"] != "fail") is runs, c


def test_workspace_on_windows_drive_warns() -> None:
    p = probe(workspace={"path": "/mnt/c/Users/dev/hexstudio", "free_bytes": 2000 * GiB})
    c = by_id(run_checks(p, needs_8b()))["workspace_location"]
    assert c["status"] == "warn" and "/mnt/" in c["message"]


def test_missing_libpython_explains_ptrtoint64() -> None:
    c = by_id(run_checks(probe(libpython=None), needs_8b()))["libpython"]
    assert c["status"] == "fail" and "PtrToInt64" in c["message"] and "LD_LIBRARY_PATH" in c["fix"]


def test_cpu_only_machine_passes_for_the_tiny_model() -> None:
    info = modelinfo.inspect_folder(builtin_model_dir())
    needs = modelinfo.estimate(info, 512)
    p = probe(
        mem_total_bytes=24 * GiB,
        gpu={"torch": "2.13.0+cpu", "cuda": False, "arch_list": [], "devices": []},
        packages={**BASE_PROBE["packages"], "onnxruntime": "1.32.0", "onnxruntime-gpu": None},
    )
    checks = run_checks(p, needs)
    assert [c["id"] for c in checks if c["status"] == "fail"] == []
    assert by_id(checks)["gpu"]["measured"] == "CPU only"


def test_cpu_only_machine_fails_for_8b() -> None:
    p = probe(gpu={"torch": "2.13.0+cpu", "cuda": False, "arch_list": [], "devices": []})
    assert by_id(run_checks(p, needs_8b()))["gpu"]["status"] == "fail"


@pytest.mark.slow
def test_live_probe_matches_schema_and_is_fast(tmp_path: Path) -> None:
    import resource

    def cpu_s() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    t0, c0 = time.time(), cpu_s()
    rep = preflight_report("builtin:tiny-llama", tmp_path)
    elapsed, cpu = time.time() - t0, cpu_s() - c0
    jsonschema.validate(json.loads(json.dumps(rep)), json.loads(SCHEMA.read_text()))
    smoke = by_id(rep["checks"])["aimet_smoke"]
    assert smoke["status"] == "ok", smoke
    assert rep["checks_failed"] == 0, [c for c in rep["checks"] if c["status"] == "fail"]
    assert rep["probe"]["gpu"]["torch"], "the torch probe ran in the smoke test's process"
    # The < 10 s target (bench/preflight.py, docs/PERFORMANCE.md): the CPU time of preflight and its probe
    # process is what an idle machine's wall time approaches; the wall time on a shared CI box also
    # measures the other load, so it only gets a loose bound.
    assert cpu < 10, f"preflight used {cpu:.1f} s of CPU"
    assert elapsed < 60


# -- GPU: driver, VRAM guidance, an NVIDIA GPU with a CPU-only torch --------------------------------

NVIDIA_5090 = {
    "source": "nvidia-smi",
    "driver_version": "576.02",
    "error": None,
    "gpus": [
        {
            "name": "NVIDIA GeForce RTX 5090",
            "memory_bytes": 32607 * 1024**2,
            "driver_version": "576.02",
            "compute_capability": "12.0",
        }
    ],
}
CPU_TORCH = {"torch": "2.13.0+cpu", "cuda": False, "cuda_version": None, "arch_list": [], "devices": []}


def test_nvidia_smi_output_is_parsed() -> None:
    text = "NVIDIA GeForce RTX 5090, 32607, 576.02, 12.0\nNVIDIA RTX A6000, 49140, 576.02, [N/A]\n"
    gpus = parse_nvidia_smi(text)
    assert gpus[0] == {
        "name": "NVIDIA GeForce RTX 5090",
        "memory_bytes": 32607 * 1024**2,
        "driver_version": "576.02",
        "compute_capability": "12.0",
    }
    assert gpus[1]["compute_capability"] is None and gpus[1]["memory_bytes"] == 49140 * 1024**2


def test_gpu_check_shows_the_driver_version() -> None:
    c = by_id(run_checks(probe(nvidia=NVIDIA_5090), needs_8b()))["gpu"]
    assert c["status"] == "ok" and "driver 576.02" in c["message"] and "576.02" in c["measured"]


def test_gpu_vram_below_the_models_need_warns() -> None:
    """The check read keys the estimate never wrote: it could not warn, whatever the GPU."""
    needs = needs_8b()
    assert 4 * GiB < needs["quantize_peak_vram_bytes"] < needs["quantize_peak_rss_bytes"]
    laptop = {
        "torch": "2.7.1+cu128",
        "cuda": True,
        "arch_list": ["sm_89"],
        "devices": [{"name": "RTX 4050 Laptop", "memory_bytes": 6 * GiB, "compute_capability": "8.9"}],
    }
    c = by_id(run_checks(probe(gpu=laptop), needs))["gpu"]
    assert c["status"] == "warn" and "6.0 GiB" in c["message"] and "parts" in c["fix"]
    # calibrating a whole part at once needs more than a 32 GiB card
    part = modelinfo.estimate(modelinfo.inspect_config(LLAMA_8B), 4096, calibration_unit="part")
    assert by_id(run_checks(probe(), part))["gpu"]["status"] == "warn"
    assert by_id(run_checks(probe(), needs))["gpu"]["status"] == "ok"  # the 5090, a layer at a time


def test_nvidia_gpu_with_cpu_only_torch_warns_for_the_tiny_model_and_fails_for_8b() -> None:
    info = modelinfo.inspect_folder(builtin_model_dir())
    p = probe(gpu=CPU_TORCH, nvidia=NVIDIA_5090)
    tiny = by_id(run_checks(p, modelinfo.estimate(info, 512)))["gpu"]
    assert tiny["status"] == "warn"
    assert "CPU-only" in tiny["message"] and "RTX 5090" in tiny["message"] and "576.02" in tiny["message"]
    assert "No CUDA GPU" not in tiny["message"]
    assert "install-workstation.sh" in tiny["fix"]
    big = by_id(run_checks(p, needs_8b()))["gpu"]
    assert big["status"] == "fail" and "install-workstation.sh" in big["fix"]


def test_nvidia_gpu_with_a_cuda_torch_that_cannot_see_it() -> None:
    gpu = {"torch": "2.7.1+cu128", "cuda": False, "cuda_version": "12.8", "arch_list": [], "devices": []}
    c = by_id(run_checks(probe(gpu=gpu, nvidia=NVIDIA_5090), needs_8b()))["gpu"]
    assert c["status"] == "fail" and "is_available() is False" in c["message"]


# -- libpython: the venv hook that packaging/install-workstation.sh writes ---------------------------


def test_missing_libpython_in_a_venv_points_at_the_installers_hook() -> None:
    p = probe(libpython=None, venv="/home/dev/hexstudio/.venv", conda_prefix=None, libpython_dir="/usr/lib")
    c = by_id(run_checks(p, needs_8b()))["libpython"]
    assert c["status"] == "fail"
    assert "/home/dev/hexstudio/.venv/bin/hexstudio-env.sh" in c["fix"]
    assert "/home/dev/hexstudio/.venv/bin/activate" in c["fix"]
    assert "install-workstation.sh --venv /home/dev/hexstudio/.venv" in c["fix"]
    assert 'LD_LIBRARY_PATH="/usr/lib' in c["fix"] and "CONDA_PREFIX" not in c["fix"]


def test_the_hook_the_fix_names_is_the_one_the_installer_writes() -> None:
    script = (Path(__file__).resolve().parents[2] / "packaging" / "install-workstation.sh").read_text()
    assert 'write_file "$venv/bin/hexstudio-env.sh"' in script
    assert '. "$VIRTUAL_ENV/bin/hexstudio-env.sh"' in script and '"$venv/bin/activate"' in script
    assert "--venv)" in script


def test_missing_libpython_under_conda_uses_activate_d() -> None:
    p = probe(libpython=None, venv=None, conda_prefix="/opt/conda/envs/q")
    c = by_id(run_checks(p, needs_8b()))["libpython"]
    assert "/opt/conda/envs/q/etc/conda/activate.d/" in c["fix"]


# -- disk, Python, packages, smoke test ------------------------------------------------------------


def test_workspace_disk_too_small_fails_with_the_amount_to_free() -> None:
    needs = needs_8b()
    p = on_disks("/data/ws", 20 * GiB, 2000 * GiB, devices=(1, 2))
    c = by_id(run_checks(p, needs))
    assert c["disk_workspace"]["status"] == "fail" and c["disk_workspace"]["required"] == needs["disk_bytes"]
    assert "--workspace" in c["disk_workspace"]["fix"]
    assert c["disk_hf_cache"]["status"] == "ok"


def test_hf_cache_disk_too_small_fails_with_hf_home() -> None:
    needs = needs_8b()
    p = on_disks("/data/ws", 2000 * GiB, 5 * GiB, devices=(1, 2))
    c = by_id(run_checks(p, needs))
    assert (
        c["disk_hf_cache"]["status"] == "fail"
        and c["disk_hf_cache"]["required"] == needs["hf_download_bytes"]
    )
    assert "HF_HOME" in c["disk_hf_cache"]["fix"]
    assert c["disk_workspace"]["status"] == "ok"
    # a download that stopped part-way on that full disk (the disk_full hint sends the user here): what is in the
    # cache already is not asked for again; it was, and the check failed by the whole model's size
    have = needs["hf_download_bytes"] - 4 * GiB
    c = by_id(run_checks(p, {**needs, "hf_cached_bytes": have}))
    assert c["disk_hf_cache"]["status"] == "ok" and c["disk_hf_cache"]["required"] == 4 * GiB
    assert f"({have / GiB:.1f} GiB of it is there already)" in c["disk_hf_cache"]["message"], c[
        "disk_hf_cache"
    ]


def test_workspace_and_hf_cache_on_one_filesystem_add_up() -> None:
    needs = needs_8b()
    ws_need, hf_need = int(needs["disk_bytes"]), int(needs["hf_download_bytes"])
    free = ws_need + hf_need // 2  # enough for either alone, not for both
    shared = on_disks("/home/dev/ws", free, free, devices=(7, 7))
    checks = run_checks(shared, needs)
    c = by_id(checks)
    # one disk, one problem: one FAIL row (issue 32: it showed as two), naming both needs
    assert [x["id"] for x in checks if x["id"].startswith("disk_")] == ["disk_workspace"]
    assert c["disk_workspace"]["status"] == "fail" and c["disk_workspace"]["required"] == ws_need + hf_need
    assert "same filesystem" in c["disk_workspace"]["message"] and "HF_HOME" in c["disk_workspace"]["fix"]
    assert sum(x["status"] == "fail" for x in checks if "disk" in x["id"]) == 1
    apart = on_disks("/data/ws", free, free, devices=(7, 8))
    c = by_id(run_checks(apart, needs))
    assert c["disk_workspace"]["status"] == "ok" and c["disk_hf_cache"]["status"] == "ok"


def test_the_preflight_stage_does_not_count_the_download_it_follows() -> None:
    """The Preflight stage runs after the Model stage: the weights are in the cache already. Counting their
    download again failed an 8B run on a disk with room for everything still to come."""
    needs = {**needs_8b(), "hf_downloaded": True}
    ws_need = int(needs["disk_bytes"])
    free = ws_need + 2**30  # room for the workspace, not for a second download
    c = by_id(run_checks(on_disks("/home/dev/ws", free, free, devices=(7, 7)), needs))
    assert c["disk_workspace"]["status"] == "ok" and c["disk_workspace"]["required"] == ws_need
    assert "already on this disk" in c["disk_workspace"]["message"]
    c = by_id(run_checks(on_disks("/data/ws", free, 2**30, devices=(7, 8)), needs))
    assert c["disk_hf_cache"]["status"] == "ok" and "already there" in c["disk_hf_cache"]["message"]


@pytest.mark.parametrize("version", ["3.8.18", "3.9.19", "3.13.1"])
def test_unsupported_python_fails(version: str) -> None:
    c = by_id(run_checks(probe(python=version), needs_8b()))["python"]
    assert c["status"] == "fail" and c["measured"] == version and "3.10" in c["fix"]


def test_aimet_missing_fails_with_the_installer() -> None:
    p = probe(
        packages={**BASE_PROBE["packages"], "aimet-onnx": None},
        aimet_build=None,
        aimet_smoke={
            "ok": False,
            "seconds": 0.2,
            "error": "ModuleNotFoundError: No module named 'aimet_onnx'",
        },
    )
    c = by_id(run_checks(p, needs_8b()))
    assert c["aimet"]["status"] == "fail" and "install-workstation.sh" in c["aimet"]["fix"]
    assert c["aimet_smoke"]["status"] == "fail" and "aimet_onnx" in c["aimet_smoke"]["message"]


def test_aimet_smoke_failure_is_reported_with_its_error() -> None:
    err = "RuntimeError: Unable to run function PtrToInt64"
    c = by_id(run_checks(probe(aimet_smoke={"ok": False, "seconds": 3.0, "error": err}), needs_8b()))[
        "aimet_smoke"
    ]
    assert c["status"] == "fail" and c["measured"] == err and "PtrToInt64" in c["message"] and c["fix"]


def test_no_onnxruntime_at_all_fails() -> None:
    p = probe(packages={**BASE_PROBE["packages"], "onnxruntime": None, "onnxruntime-gpu": None})
    c = by_id(run_checks(p, needs_8b()))["onnxruntime_conflict"]
    assert c["status"] == "fail" and "pip install onnxruntime" in c["fix"] and "never both" in c["fix"]


# -- the CLI estimates with the settings a run would use -------------------------------------------


def test_cli_uses_the_run_default_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hexstudio.core.services import preflight as preflight_cmd
    from hexstudio.core.settings import DEFAULT_RUN_SETTINGS
    from hexstudio.core.stages import get_stage

    seen: dict[str, Any] = {}

    def fake_probe(workspace: Path, hf_cache: Path, smoke: bool = True) -> dict[str, Any]:
        return probe()

    real_estimate = modelinfo.estimate

    def spy(info: dict[str, Any], *a: Any, **k: Any) -> dict[str, Any]:
        seen["args"] = a
        return real_estimate(info, *a, **k)

    monkeypatch.setattr(preflight_cmd, "probe", fake_probe)
    monkeypatch.setattr(modelinfo, "estimate", spy)
    rep = preflight_cmd.preflight_report("builtin:tiny-llama", tmp_path, smoke=False)
    # the estimate inputs are settings the Preflight stage declares (or the Model stage resolves)
    declared = set(get_stage("preflight").inputs) | set(get_stage("model").inputs)
    assert set(rep["settings"]) <= declared
    assert rep["settings"]["calibration_samples"] == DEFAULT_RUN_SETTINGS["calibration_samples"]
    assert rep["settings"]["calibration_seq_len"] == DEFAULT_RUN_SETTINGS["calibration_seq_len"]
    assert rep["settings"]["ar_n"] == DEFAULT_RUN_SETTINGS["ar_n"]
    assert seen["args"][3:] == (
        DEFAULT_RUN_SETTINGS["calibration_samples"],
        DEFAULT_RUN_SETTINGS["calibration_seq_len"],
    )
    info = modelinfo.inspect_folder(builtin_model_dir())
    assert rep["needs"] == {
        **real_estimate(
            info,
            512,
            128,
            modelinfo.default_parts(info),
            DEFAULT_RUN_SETTINGS["calibration_samples"],
            DEFAULT_RUN_SETTINGS["calibration_seq_len"],
        ),
        "hf_downloaded": True,  # the built-in model downloads nothing
    }
    # the command line's values win
    rep = preflight_cmd.preflight_report(
        "builtin:tiny-llama",
        tmp_path,
        smoke=False,
        settings={"context_length": 384, "calibration_samples": 3},
    )
    assert rep["settings"]["context_length"] == 384 and rep["settings"]["calibration_samples"] == 3


def test_nvidia_smi_without_a_driver_says_so() -> None:
    nv: dict[str, Any] = {
        "source": "nvidia-smi",
        "gpus": [],
        "driver_version": None,
        "error": "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    }
    big = by_id(run_checks(probe(gpu=CPU_TORCH, nvidia=nv), needs_8b()))["gpu"]
    assert (
        big["status"] == "fail"
        and "couldn't communicate" in big["message"]
        and "Windows driver" in big["fix"]
    )
    info = modelinfo.inspect_folder(builtin_model_dir())
    tiny = by_id(run_checks(probe(gpu=CPU_TORCH, nvidia=nv), modelinfo.estimate(info, 512)))["gpu"]
    assert tiny["status"] == "warn" and "NVIDIA driver" in tiny["fix"]
    # no nvidia-smi at all (NVML library missing) is just a CPU-only machine
    none: dict[str, Any] = {
        "source": "nvml",
        "gpus": [],
        "driver_version": None,
        "error": "NVML: NVML Shared Library Not Found",
    }
    assert (
        by_id(run_checks(probe(gpu=CPU_TORCH, nvidia=none), modelinfo.estimate(info, 512)))["gpu"]["status"]
        == "ok"
    )


def test_the_cli_counts_no_download_for_a_local_folder_or_cached_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hexstudio preflight --model /data/Llama-3.1-8B` (or an id already in the cache) wanted 15 GiB free in
    the Hugging Face cache for a download that would never happen, and failed on a disk with room."""
    import shutil

    from hexstudio.core import hf
    from hexstudio.core.services import preflight as service

    small_cache = {"path": "/h", "free_bytes": 1024, "device": 2}  # less than even the built-in model
    monkeypatch.setattr(
        service,
        "probe",
        lambda ws, cache, smoke=True: probe(
            hf_cache=small_cache, workspace={"path": "/w", "free_bytes": 2000 * GiB, "device": 1}
        ),
    )
    local = tmp_path / "local-model"
    shutil.copytree(builtin_model_dir(), local)
    rep = service.preflight_report(str(local), tmp_path, smoke=False)
    assert rep["needs"]["hf_downloaded"] is True
    assert by_id(rep["checks"]).get("disk_hf_cache", {}).get("status") != "fail"
    # a repository id: downloaded when its weights are in the cache, to be downloaded otherwise
    cache = tmp_path / "hub"
    monkeypatch.setattr(hf, "hub_cache", lambda: cache)
    assert hf.weights_cached("org/model") is False
    snap = cache / "models--org--model" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (cache / "models--org--model" / "refs").mkdir()
    (cache / "models--org--model" / "refs" / "main").write_text("a" * 40)
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "m-1.safetensors"}}))
    assert hf.weights_cached("org/model") is False  # the index without its shard
    (snap / "m-1.safetensors").write_bytes(b"x")
    assert hf.weights_cached("org/model") is True
    # the bytes a stopped download left in the cache, finished or not, are counted
    blobs = cache / "models--org--model" / "blobs"
    blobs.mkdir()
    (blobs / "aaa").write_bytes(b"x" * 10)
    (blobs / "bbb.incomplete").write_bytes(b"x" * 5)
    assert hf.cached_blob_bytes("org/model") == 15 and hf.cached_blob_bytes("org/other") == 0
