"""Self-test worker: can this host run HexStudio workers, and how big is it?

Used to check a remote Linux host before sending it a heavy stage (the path for
users whose workstation is too small for the model), and by the job runner tests.
Reports Python, memory, free disk, CPU count and which ML packages import.
Hook (a key of the run's settings that is no run setting): "seconds" (optional) keeps it busy for that long, emitting progress.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import sys
import time
from typing import Any

from hexstudio.shared.protocol import Emitter
from hexstudio.workers.runtime import WorkerSpec, worker_main


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, rest = line.split(":", 1)
                if key in ("MemTotal", "MemAvailable", "SwapTotal"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    seconds = float(spec.hooks.get("seconds", 0) or 0)
    t0 = time.time()
    while seconds and time.time() - t0 < seconds:
        em.progress(min(0.99, (time.time() - t0) / seconds), "busy (self-test delay)")
        time.sleep(0.1)
    mem = _meminfo()
    disk = shutil.disk_usage(spec.out_dir)
    packages = {
        name: importlib.util.find_spec(name) is not None
        for name in ("torch", "aimet_onnx", "onnxruntime", "onnx", "transformers", "numpy")
    }
    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": mem.get("MemTotal"),
        "available_bytes": mem.get("MemAvailable"),
        "swap_bytes": mem.get("SwapTotal"),
        "disk_free_bytes": disk.free,
        "packages": packages,
        "pid": os.getpid(),
    }
    for key in ("memory_bytes", "swap_bytes", "disk_free_bytes", "cpu_count"):
        em.metric(key, report[key], unit="bytes" if key.endswith("bytes") else "")
    for name, ok in packages.items():
        if not ok and name in ("onnxruntime", "numpy"):
            em.warning(
                f"{name} is not importable on this host.",
                hint=f"Install it into the Python that runs workers here (pip install {name}).",
            )
    (spec.out_dir / "selftest.json").write_text(json.dumps(report, indent=2))
    em.artifact("selftest.json", kind="json", role="selftest")
    em.progress(1.0, "self-test complete")
    return report


if __name__ == "__main__":
    raise SystemExit(worker_main("selftest", run))
