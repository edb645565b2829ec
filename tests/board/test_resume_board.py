"""`hexstudio run --resume` through the Board stage (issue 27 #7): a Board stage that is current is not believed
on its record alone. Before the run goes past it, the bundle it pushed is checked again by content (every sha256
computed on the board, verify_pushed); a bundle changed on the board makes the Board stage run again, which sends
the files that differ, so chat and evaluate never run on a tampered bundle. On the simulator board (the same
verify_pushed runs over SSH on a real board: tests/board/test_board_trust.py, test_evk_flow.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hexstudio.core.pipeline import Pipeline
from hexstudio.core.runs import Workspace
from hexstudio.core.stage_api import StageContext
from hexstudio.core.stages import Stage, _verdict_done, get_stage
from tests.board.test_crafted_bundle import _flip, sim_bundle


async def _compile_stub(ctx: StageContext) -> dict[str, Any]:
    """A Compile stage that writes a small simulation bundle (the real one needs a quantized model)."""
    sim_bundle(ctx.out_dir / "bundle")
    return {"bundle": "bundle"}


COMPILE = Stage(
    name="compile",
    title="Compile",
    summary="a small bundle",
    needs=(),
    inputs=(),
    outputs=("bundle/bundle.json",),
    gate_text="-",
    verdict=_verdict_done,
    action="tests.board.test_resume_board:_compile_stub",
)
STAGES = (COMPILE, get_stage("board"))


def _run(ws: Path, run_id: str) -> Any:
    m = Workspace(ws).open_run(run_id)
    return asyncio.run(Pipeline(m, stages=STAGES).run(until="board"))


def _remote(ws: Path, run_id: str) -> Path:
    import json

    doc = json.loads((Workspace(ws).run_dir(run_id) / "artifacts" / "board" / "board.json").read_text())
    return Path(doc["remote_bundle"])


def _events(ws: Path, run_id: str) -> list[dict[str, Any]]:
    return [e for e in Workspace(ws).open_run(run_id).data.get("events", []) if e.get("kind") == "recheck"]


def test_resume_rechecks_the_pushed_bundle_and_pushes_again_when_it_changed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    run_id = Workspace(ws).create_run("builtin:tiny-llama", "sim").run_id
    first = _run(ws, run_id)
    assert first.ok and first.ran == ["compile", "board"], first
    remote = _remote(ws, run_id)
    local = Workspace(ws).run_dir(run_id) / "artifacts" / "compile" / "bundle"

    again = _run(ws, run_id)  # unchanged on the board: checked, then skipped as current
    assert again.ok and again.skipped == ["compile", "board"] and again.ran == [], again
    assert _events(ws, run_id)[-1]["passed"] is True

    _flip(remote / "sim" / "a.onnx")  # changed on the board after the push, size kept
    resumed = _run(ws, run_id)
    assert resumed.ok and resumed.ran == ["board"] and resumed.skipped == ["compile"], resumed
    ev = _events(ws, run_id)[-1]
    assert ev["passed"] is False and "sim/a.onnx" in ev["message"] and "sha256" in ev["message"], ev
    assert (remote / "sim" / "a.onnx").read_bytes() == (local / "sim" / "a.onnx").read_bytes()
    m = Workspace(ws).open_run(run_id)
    assert (
        m.stage("board").metric_value("push_resent_files") == 1
    )  # the Board stage found it and sent it again

    (remote / "tokenizer.json").unlink()  # a file gone from the board
    assert _run(ws, run_id).ran == ["board"]
    assert (remote / "tokenizer.json").read_bytes() == (local / "tokenizer.json").read_bytes()


def test_resume_is_refused_past_a_board_with_a_symlink_in_the_bundle(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    run_id = Workspace(ws).create_run("builtin:tiny-llama", "sim").run_id
    assert _run(ws, run_id).ok
    remote = _remote(ws, run_id)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (remote / "tokenizer.json").unlink()
    (remote / "tokenizer.json").symlink_to(outside)
    res = _run(ws, run_id)
    assert not res.ok and res.stopped_at == "board", res  # the re-run push refuses it, nothing sent
    assert "symbolic link" in _events(ws, run_id)[-1]["message"]
    assert outside.read_text() == "{}"
