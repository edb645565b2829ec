"""The JSON documents stages hand each other, typed (docs/CONTRACTS.md §1-§3).

Each stage's declared `outputs` (hexstudio/core/stages.py) name these files; the writers build them as these
TypedDicts and the readers can load them as such (`load_json(path, ModelDoc)`). The nested parts that
only one side reads in depth (model info, estimates, graph lists) stay `dict[str, Any]`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TypedDict, TypeVar

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

from hexstudio.shared.run_settings import ResolvedSettings


class ResolvedShape(TypedDict):
    """model.json "resolved": the deployment shape the later stages build (no "auto" left)."""

    context_length: int
    ar_n: int
    parts: int


class ModelDoc(TypedDict):
    """artifacts/model/model.json (written by hexstudio/workers/model.py)."""

    model: str  # what was asked for: builtin:tiny-llama, an HF id or a folder
    source: str  # "builtin" | "local" | "huggingface"
    revision: str | None  # the commit the files came from (a download)
    requested_revision: str | None  # what --revision asked for (None: the default branch)
    hf_dir: str  # the model folder, relative to model.json when inside the stage folder
    info: dict[str, Any]  # hexstudio.shared.modelinfo.inspect_folder
    weights: dict[str, Any]  # the weight files' check
    resolved: ResolvedShape
    part_plan: dict[str, Any]  # hexstudio.shared.modelinfo.part_plan (parts and why)
    estimates: dict[str, Any]  # hexstudio.shared.modelinfo.estimate


class QuantizeDoc(TypedDict):
    """artifacts/quantize/quantize.json (written by hexstudio/workers/quantize.py)."""

    context_length: int
    ar_n: int
    parts: int
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    precision: dict[str, str]  # weights, activations, kv_cache, lm_head, embeddings
    calibration: dict[str, Any]  # text, samples, seq_len, blocks, unit, quantsim_config, method
    weight_sharing: dict[str, Any]
    storage: dict[str, Any]
    positional_encoding: dict[str, Any]
    encodings_version: str
    tool: dict[str, str | None]  # aimet_onnx, onnxruntime versions
    graphs: list[dict[str, Any]]  # name, kind, part, layers, onnx, encodings, stats


class BundleFile(TypedDict):
    path: str
    sha256: str
    size: int


class BundleDoc(TypedDict):
    """artifacts/compile/bundle/bundle.json (hexstudio.shared.bundle.write_manifest, from hexstudio/workers/compile.py for the
    simulator board and hexstudio/workers/aihub.py for AI Hub)."""

    bundle_version: int
    model: str
    simulated: bool
    emulated: bool
    device: dict[str, Any]  # name, soc_model, dsp_arch, attributes
    qairt_version: str | None  # None for the simulation bundle
    context_length: int
    ar_n: int
    parts: int
    aihub_jobs: list[dict[str, Any]]
    files: list[BundleFile]
    qairt_full_version: NotRequired[str | None]  # AI Hub bundles
    precision: NotRequired[str]  # AI Hub bundles: qai-hub-models' precision name, e.g. "w4a16"


def required_keys(doc_type: type) -> frozenset[str]:
    """The keys a document of this TypedDict must have."""
    return frozenset(getattr(doc_type, "__required_keys__", frozenset()))


D = TypeVar("D")


def load_json(path: Path, doc_type: type[D]) -> D:
    """Read a stage's JSON document as `doc_type` (a TypedDict); ValueError naming the missing keys."""
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = sorted(required_keys(doc_type) - set(data)) if isinstance(data, dict) else ["(not an object)"]
    if missing:
        raise ValueError(f"{path} is not a {doc_type.__name__}: missing {', '.join(missing)}")
    doc: D = data
    return doc


__all__ = [
    "BundleDoc",
    "BundleFile",
    "ModelDoc",
    "QuantizeDoc",
    "ResolvedSettings",
    "ResolvedShape",
    "load_json",
    "required_keys",
]
