"""Preflight stage: this machine's memory, disk, WSL, GPU and packages against the model's needs
(the probe and the checks: hexstudio/shared/preflight_checks.py), written to preflight.json."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hexstudio.shared.preflight_checks import probe, run_checks
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.run_settings import RunSettings, resolve_settings
from hexstudio.workers.model import stage_estimate
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main


def needs_now(model_doc: dict[str, Any], settings: RunSettings, board: str | None) -> dict[str, Any]:
    """What the model needs under the run's settings as they are now. Calibration samples and length are this
    stage's inputs, not the Model stage's, so model.json's estimate may be for other ones (`hexstudio preflight`
    computes from the settings of now too)."""
    info = model_doc["info"]
    r, _plan = resolve_settings(
        info, settings, builtin=model_doc.get("source") == "builtin", board_name=board
    )
    return stage_estimate(info, settings, r)


def compiles_locally(target: str, board: str) -> bool:
    """Whether the Compile stage will compile on this machine: its own choice for "auto"."""
    from hexstudio.workers.compile import auto_target

    return (auto_target(board) if target == "auto" else target) == "local"


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    t0 = time.time()
    model_dir = spec.upstream.get("model")
    if model_dir is None:
        raise WorkerError(
            "missing_upstream", "Preflight needs the Model stage's result.", "Run the Model stage first."
        )
    doc = json.loads((model_dir / "model.json").read_text())
    # a model.json without the model's info (written by hand, or damaged) has only the Model stage's figures
    needs = needs_now(doc, spec.settings, spec.inputs.board) if "info" in doc else dict(doc["estimates"])
    # the Model stage has run: a Hugging Face model is in the cache now, a folder or the built-in one never downloads
    needs["hf_downloaded"] = True
    # whether the Compile stage will compile on this machine (its "auto": local for the simulator board where
    # Qualcomm's QNN libraries are installed): its memory and disk are then this run's to find here
    needs["compile_local"] = compiles_locally(spec.settings.compile_target, spec.inputs.board or "sim")
    em.progress(0.1, "probing this machine (AIMET smoke test runs in parallel)")
    workspace = spec.run_dir.parent.parent
    from huggingface_hub import constants as hf_constants

    # where downloads land, as huggingface_hub computes it (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)
    smoke = spec.settings.aimet_smoke
    p = probe(workspace, Path(hf_constants.HF_HUB_CACHE), smoke=smoke)
    checks = run_checks(p, needs)
    failed = sum(c["status"] == "fail" for c in checks)
    warned = sum(c["status"] == "warn" for c in checks)
    doc = {
        "model": doc["model"],
        "context_length": doc["resolved"]["context_length"],
        "needs": needs,
        "probe": p,
        "checks": checks,
        "checks_failed": failed,
        "checks_warned": warned,
        "seconds": round(time.time() - t0, 2),
    }
    (spec.out_dir / "preflight.json").write_text(json.dumps(doc, indent=2))
    em.artifact("preflight.json", kind="json", role="preflight")
    for c in checks:
        if c["status"] in ("fail", "warn"):
            em.warning(f"{c['id']}: {c['message']}", hint=c.get("fix"), code=c["id"])
    em.metric("checks_failed", failed)
    em.metric("checks_warned", warned)
    em.metric("preflight_seconds", round(time.time() - t0, 2), unit="s")
    em.progress(1.0, f"{len(checks)} checks: {failed} failed, {warned} warnings")
    return {"failed": failed, "warned": warned}


if __name__ == "__main__":
    raise SystemExit(worker_main("preflight", run))
