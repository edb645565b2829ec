"""Prepared runs shared by every area (docs/CONTRACTS.md §6), built once per pytest process.

Copy a returned folder (shutil.copytree) before changing it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# quantize area: a run of builtin:tiny-llama on the simulator board completed through validate
# ---------------------------------------------------------------------------------------------

# Small calibration for speed; the precision recipe is the real one (W4A16 LPBQ, int8 KV). The onnxruntime twin's
# bundle (compile_target sim) keeps the many tests about stage mechanics, pages and reports fast: Qualcomm's HTP
# simulator runs ~1 s a token. The real path (local compile, real Genie on the HTP simulator) and the default
# settings a user gets have their own tests (tests/qnn, tests/e2e).
FAST_QUANTIZE_SETTINGS: dict[str, Any] = {
    "calibration_samples": 4,
    "calibration_seq_len": 128,
    "compile_target": "sim",
}


def run_stages(
    workspace_root: Path,
    stages: tuple[str, ...],
    settings: dict[str, Any] | None = None,
    model: str = "builtin:tiny-llama",
    board: str = "sim",
) -> Any:
    """Create a run and run the given stages in order (each with `only=`, so a machine-dependent
    preflight verdict cannot block the fixture). Returns (manifest, last PipelineResult)."""
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace

    ws = Workspace(workspace_root)
    m = ws.create_run(model, board, {**FAST_QUANTIZE_SETTINGS, **(settings or {})})
    pipe = Pipeline(m)
    res = None
    for st in stages:
        res = asyncio.run(pipe.run(only=st))
        if not res.ok:
            break
    return m, res


def build_validated_run(workspace_root: Path) -> Path:
    m, res = run_stages(Path(workspace_root), ("model", "quantize", "validate"))
    if m.stage("validate").state != "done":
        raise RuntimeError(
            f"could not prepare the validated run in {m.run_dir}: {res.message if res else '?'} "
            f"({res.hint if res else ''})"
        )
    return Path(m.run_dir)
