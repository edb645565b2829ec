"""Data files both the studio and the workers read, shipped inside the package (package data).

    builtin_model/tiny-llama/   the built-in model `builtin:tiny-llama` (Hugging Face layout; PROVENANCE.md)
    builtin_model/text/         its calibration and validation text (the `builtin` calibration/validation text)
    recipes/                    the environment recipes (validated.txt, current.txt: pip constraints files)
    quantsim/                   HexStudio's AIMET QuantSim configurations (htp_llm_v73.json; README.md: sources)

Found through importlib.resources only, never through the repository root, so a checkout, a wheel
installed with pip or pipx, and the PyInstaller build find the same files. `data_path` (this package's
data) and `package_path` (any package's, e.g. the studio's shipped suites) give a real folder or file
(onnxruntime, tokenizers, shutil.copytree need one): the file itself when the package lies on disk, else
a copy that lives as long as this process (importlib.resources.as_file).
The tools that made the built-in model are in tools/builtin_model/ (not shipped).
"""

from __future__ import annotations

import atexit
import contextlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

BUILTIN_MODEL = ("builtin_model", "tiny-llama")
# every built-in model id -> its folder under builtin_model/ (tools/builtin_model/train_tiny_llama.py made them)
BUILTIN_MODELS = {
    "builtin:tiny-llama": "tiny-llama",
    "builtin:tiny-llama-draft": "tiny-llama-draft",
}  # 1 layer, the same tokenizer: spd's draft
BUILTIN_TEXT = ("builtin_model", "text")
RECIPES = ("recipes",)
QUANTSIM = ("quantsim",)

_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)
_paths: dict[tuple[str, ...], Path] = {}


def package_files(package: str, *parts: str) -> Traversable:
    """Package data of `package` at `parts` (relative to the package), as a Traversable."""
    node = resources.files(package)
    for part in parts:
        node = node.joinpath(part)
    return node


def package_path(package: str, *parts: str) -> Path:
    """A real filesystem path of `package`'s data at `parts`, valid for the life of this process: the file
    or folder itself when the package lies on disk (a checkout, a wheel, PyInstaller), else an extracted copy."""
    key = (package, *parts)
    if key not in _paths:
        node = package_files(package, *parts)
        _paths[key] = node if isinstance(node, Path) else _extracted.enter_context(resources.as_file(node))
    return _paths[key]


def data_path(*parts: str) -> Path:
    """A real filesystem path of the data shipped here (this package) at `parts`."""
    return package_path(__name__, *parts)


def builtin_model_dir(model_id: str = "builtin:tiny-llama") -> Path:
    """A built-in model's folder (config.json, model.safetensors, tokenizer.json, ...); KeyError for an unknown id."""
    return data_path(BUILTIN_MODEL[0], BUILTIN_MODELS[model_id])


def recipes_dir() -> Path:
    """The folder of the environment recipes (validated.txt, current.txt)."""
    return data_path(*RECIPES)


def quantsim_configs() -> dict[int, Path]:
    """HexStudio's LLM QuantSim configurations by Hexagon version (htp_llm_v73.json -> 73), as real files."""
    out = {}
    for node in package_files(__name__, *QUANTSIM).iterdir():
        stem = node.name.removesuffix(".json")
        if node.name.endswith(".json") and stem.startswith("htp_llm_v") and stem[9:].isdigit():
            out[int(stem[9:])] = data_path(*QUANTSIM, node.name)
    return out
