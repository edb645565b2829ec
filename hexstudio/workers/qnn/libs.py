"""Where Qualcomm's x86_64 libraries are: the onnxruntime-qnn wheel's package folder.

Found without importing onnxruntime (importlib's spec only), so the studio process can ask cheaply. Either
in this environment, or in a side environment the workstation installer makes when this one cannot hold the
wheel (the validated GPU recipe is Python 3.10 with onnxruntime-gpu 1.23; onnxruntime-qnn 2.7.0 needs
Python 3.11+ and onnxruntime >= 1.24.2): `<sys.prefix>/.hexstudio-qnn` then names that environment's Python.
The local compile's children run under `QnnLibs.python`; the Genie helper and the binary reader need only the
library folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "onnxruntime_qnn"
INSTALL_HINT = (
    "Install Qualcomm's x86 runtime: `.venv/bin/pip install onnxruntime-qnn==2.7.0` (Linux x86_64, "
    "Python 3.11-3.13; `./dev setup` does it)."
)


SIDE_ENV_MARKER = ".hexstudio-qnn"


@dataclass(frozen=True)
class QnnLibs:
    folder: Path
    qnn_version: str  # e.g. "2.51.0", from the wheel's build_and_package_info
    wheel_version: str  # onnxruntime-qnn's own version, e.g. "2.7.0"
    python: str = sys.executable  # an interpreter that imports onnxruntime_qnn (this one, or the side env's)

    @property
    def in_process(self) -> bool:
        """onnxruntime-qnn imports in this process (the HTP legs run in-process only then)."""
        return self.python == sys.executable

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


def with_workers_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with the folder holding `hexstudio` first on PYTHONPATH: for a child of another interpreter (the side
    environment's) that runs `python -m hexstudio.workers...`."""
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _folder_in_this_env() -> Path | None:
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _side_env() -> tuple[Path, str] | None:
    """(the package folder, the python) of the side environment named by <sys.prefix>/.hexstudio-qnn."""
    marker = Path(sys.prefix) / SIDE_ENV_MARKER
    try:
        py = marker.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not py or not Path(py).is_file():
        return None
    # the venv's own folder: its bin/python is a link to the base interpreter, which resolving would follow
    env_root = Path(os.path.abspath(py)).parent.parent
    for folder in sorted(env_root.glob(f"lib/python3.*/site-packages/{PACKAGE}")):
        return folder, py
    return None


def find_qnn_libs() -> QnnLibs | None:
    """The wheel's libraries, or None when onnxruntime-qnn is not installed (or lacks libGenie/libQnnHtp)."""
    python = sys.executable
    folder = _folder_in_this_env()
    if folder is None and (side := _side_env()) is not None:
        folder, python = side
    if folder is None:
        return None
    if not all((folder / n).is_file() for n in ("libGenie.so", "libQnnHtp.so", "libQnnSystem.so")):
        return None
    info = folder / "build_and_package_info.py"
    text = info.read_text(encoding="utf-8", errors="replace") if info.is_file() else ""
    qnn = re.search(r"qnn_version\s*=\s*['\"]([^'\"]+)", text)
    ver = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    return QnnLibs(
        folder=folder,
        qnn_version=qnn.group(1) if qnn else "unknown",
        wheel_version=ver.group(1) if ver else "unknown",
        python=python,
    )


# The simulator board runs Genie on an x86 workstation, not on the board's 8 Kryo cores: one thread and no
# polling are fastest there (facts: ~3x slower with 3 threads and polling on 2 cores), and the board's cpu-mask
# 0xe0 names cores a PC may lack. Merged into dialog.engine when the dialog is created; the bundle's own
# genie_config.json is not changed.
def x86_engine_overrides(cpus: int) -> dict[str, object]:
    n = max(1, min(int(cpus), 16))
    return {"n-threads": 1, "backend": {"QnnHtp": {"poll": False, "cpu-mask": hex((1 << n) - 1)}}}
