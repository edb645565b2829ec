"""What the run was made on: host, OS/WSL, Python, GPUs, package versions (cheap to collect)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import psutil

import hexstudio

# Packages whose versions matter for the recipe (facts/workstation.md).
TRACKED_PACKAGES = (
    "hexstudio",
    "torch",
    "aimet-onnx",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "transformers",
    "qai-hub",
    "numpy",
    "PySide6-Essentials",
    "paramiko",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
)


def package_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    out = {name: package_version(name) for name in TRACKED_PACKAGES}
    out["hexstudio"] = hexstudio.__version__
    return out


def is_wsl() -> bool:
    if os.environ.get("WSL_DISTRO_NAME"):
        return True
    try:
        return "microsoft" in Path("/proc/version").read_text().lower()
    except OSError:
        return False


def gpu_summary() -> list[dict[str, Any]]:
    """NVIDIA GPUs through NVML; [] when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    gpus = []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(
                {
                    "index": i,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "driver": driver,
                    "compute_capability": f"{major}.{minor}",
                }
            )
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus


def collect_environment(include_host: bool = True) -> dict[str, Any]:
    vm = psutil.virtual_memory()
    return {
        "host": socket.gethostname() if include_host else "redacted",
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "wsl": is_wsl(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": int(vm.total),
        "swap_bytes": int(psutil.swap_memory().total),
        "gpus": gpu_summary(),
    }
