"""Where Qualcomm's x86_64 libraries are: the onnxruntime-qnn wheel's package folder.

Found without importing onnxruntime (importlib's spec only), so the studio process can ask cheaply.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "onnxruntime_qnn"
INSTALL_HINT = ("Install Qualcomm's x86 runtime: `.venv/bin/pip install onnxruntime-qnn==2.7.0` (Linux x86_64, "
                "Python 3.11-3.13; `./dev setup` does it).")


@dataclass(frozen=True)
class QnnLibs:
    folder: Path
    qnn_version: str          # e.g. "2.51.0", from the wheel's build_and_package_info
    wheel_version: str        # onnxruntime-qnn's own version, e.g. "2.7.0"

    @property
    def genie(self) -> Path:
        return self.folder / "libGenie.so"

    @property
    def htp(self) -> Path:
        return self.folder / "libQnnHtp.so"

    @property
    def system(self) -> Path:
        return self.folder / "libQnnSystem.so"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose LD_LIBRARY_PATH finds the wheel's libraries first (libGenie dlopens libQnnHtp)."""
        env = dict(os.environ if base is None else base)
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = str(self.folder) + (f":{old}" if old else "")
        return env


def find_qnn_libs() -> QnnLibs | None:
    """The wheel's libraries, or None when onnxruntime-qnn is not installed (or lacks libGenie/libQnnHtp)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not all((folder / n).is_file() for n in ("libGenie.so", "libQnnHtp.so", "libQnnSystem.so")):
        return None
    info = folder / "build_and_package_info.py"
    text = info.read_text(encoding="utf-8", errors="replace") if info.is_file() else ""
    qnn = re.search(r"qnn_version\s*=\s*['\"]([^'\"]+)", text)
    ver = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    return QnnLibs(folder=folder, qnn_version=qnn.group(1) if qnn else "unknown",
                   wheel_version=ver.group(1) if ver else "unknown")


# The simulator board runs Genie on an x86 workstation, not on the board's 8 Kryo cores: one thread and no
# polling are fastest there (facts: ~3x slower with 3 threads and polling on 2 cores), and the board's cpu-mask
# 0xe0 names cores a PC may lack. Merged into dialog.engine when the dialog is created; the bundle's own
# genie_config.json is not changed.
def x86_engine_overrides(cpus: int) -> dict[str, object]:
    n = max(1, min(int(cpus), 16))
    return {"n-threads": 1, "backend": {"QnnHtp": {"poll": False, "cpu-mask": hex((1 << n) - 1)}}}
