"""A fault no stage expects (a full disk while a stage writes, a bug in an action) ends the stage failed with what
happened: never left "running" by the live process that ran it (the studio would show it working until it
restarts, and every later stage would say it has not completed), its error only in the log."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from hexstudio.core.manifest import RunManifest
from hexstudio.core.pipeline import Pipeline
from hexstudio.core.runs import Workspace
from hexstudio.core.stage_api import StageContext
from hexstudio.core.stages import STAGES


async def disk_full(ctx: StageContext) -> dict[str, Any]:
    (ctx.out_dir / "half.json").write_text("{")
    raise OSError(28, "No space left on device", str(ctx.out_dir / "half.json"))


def test_an_unexpected_error_fails_the_stage_with_its_message(tmp_path: Path) -> None:
    model = dataclasses.replace(
        STAGES[0], worker=None, action=f"{__name__}:disk_full", outputs=(), recheck=None
    )
    m = Workspace(tmp_path).create_run("builtin:tiny-llama", "sim")
    res = asyncio.run(Pipeline(m, stages=(model,)).run(until="model"))
    assert not res.ok and res.stopped_at == "model"
    st = RunManifest.load(m.run_dir).stage("model")
    assert st.state == "failed", st.data
    out = st.data["outcome"]
    assert out["code"] == "unexpected_error" and "No space left on device" in out["message"], out
    assert "full disk" in (out["hint"] or "")
    assert st.data.get("owner") is None
    assert not (m.run_dir / "artifacts" / "model.partial").exists()
    assert not (m.run_dir / "artifacts" / "model").exists()
