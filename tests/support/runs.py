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


CLI_RECORD = "cli-run.json"  # beside the validated run's workspace: what the acceptance command printed


def build_validated_run(workspace_root: Path) -> Path:
    """The acceptance command, `hexstudio run --model builtin:tiny-llama --board sim --until validate --json`,
    with FAST_QUANTIZE_SETTINGS: real aimet-onnx end to end in a child process, as a user runs it. Its exit code
    and JSON are kept in `<workspace>/cli-run.json` for test_cli_run_until_validate, which checks them instead of
    running the same command a second time (~28 s in each test tier)."""
    import json
    import os
    import subprocess
    import sys

    from tests.support.cli import RUN_BUILTIN

    root = Path(workspace_root)
    sets = [x for k, v in FAST_QUANTIZE_SETTINGS.items() for x in ("--set", f"{k}={v}")]
    cmd = [
        str(Path(sys.executable).parent / "hexstudio"),
        *RUN_BUILTIN,
        "--until",
        "validate",
        "--json",
        *sets,
    ]
    p = subprocess.run(
        cmd,
        env={**os.environ, "HEXSTUDIO_WORKSPACE": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        out = json.loads(p.stdout)
    except ValueError:
        out = {}
    (root / CLI_RECORD).write_text(
        json.dumps({"cmd": cmd, "returncode": p.returncode, "out": out, "stderr_tail": p.stderr[-3000:]})
    )
    if p.returncode != 0 or not out.get("ok") or not out.get("run_dir"):
        raise RuntimeError(
            f"could not prepare the validated run ({' '.join(cmd)}): exit {p.returncode}, "
            f"{out.get('message') or p.stdout[-1000:]} {p.stderr[-2000:]}"
        )
    return Path(out["run_dir"])
