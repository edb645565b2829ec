"""bundle.json, as every compile target writes it: the simulation bundle (hexstudio.workers.compile), the
local QNN bundle (hexstudio.workers.qnn.bundle) and the AI Hub bundle (hexstudio.workers.aihub). The document's
shape is hexstudio.shared.artifacts.BundleDoc."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexstudio.shared import bundle as gb


def write_bundle_json(
    bdir: Path,
    model_doc: dict[str, Any],
    q: dict[str, Any],
    *,
    device: dict[str, Any],
    qairt_version: str | None,
    simulated: bool = False,
    emulated: bool = False,
    target: dict[str, Any] | None = None,
    aihub_jobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """bundle.json, as every compile target writes it (hexstudio.shared.artifacts.BundleDoc): the model, what
    the bundle is (simulated, emulated), the device and QAIRT version, the target's own keys (`target`),
    quantize.json's context length, AR and parts, and the AI Hub jobs (none off AI Hub)."""
    return gb.write_manifest(
        bdir,
        {
            "model": model_doc["model"],
            "simulated": simulated,
            "emulated": emulated,
            "device": device,
            "qairt_version": qairt_version,
            **(target or {}),
            "context_length": q["context_length"],
            "ar_n": q["ar_n"],
            "parts": q["parts"],
            "aihub_jobs": aihub_jobs or [],
        },
    )
