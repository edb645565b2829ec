"""The one status model (hexstudio.core.status) and the faces of it that need no display: the report, Compare and
`hexstudio runs show` say the same words for the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.core.manifest import RunManifest
from hexstudio.core.pipeline import Pipeline
from hexstudio.core.reports.collect import build_report
from hexstudio.core.reports.render import to_html, validate_report
from hexstudio.core.status import KINDS, run_status, stage_status, stage_statuses
from tests.support.gate_runs import PASSING, end_stage, finish_stage, gate_failed_run

REPO = Path(__file__).resolve().parents[2]


def _runs_show(ws: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hexstudio", "runs", "show", run_id, "--workspace", str(ws), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_failed_gate_is_gate_failed_everywhere_never_passed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    st = stage_status(m, "evaluate")
    assert st.key == "gate_failed" and st.word == "gate failed" and st.symbol == "!"
    assert "greedy parity 248/256" in st.detail and st.overridable
    assert stage_status(m, "chat").key == "passed"
    rs = run_status(stage_statuses(m))
    assert rs.key == "gate_failed" and rs.word == "gate failed at Evaluate" and rs.stage == "evaluate"
    # the report: the stage row and the run say the same words; why, what to do and a next step
    rep = build_report(m.run_dir)
    validate_report(rep)
    row = next(s for s in rep["stages"] if s["name"] == "evaluate")
    assert row["status"]["key"] == "gate_failed" and row["status"]["word"] == "gate failed"
    assert rep["run"]["status"] == "failed" and rep["run"]["status_word"] == "gate failed at Evaluate"
    fail = rep["run"]["failure"]
    assert "248/256" in fail["message"] and "--override-gate evaluate" in fail["hint"] and fail["next_step"]
    html = to_html(rep)
    assert "gate failed at Evaluate" in html and "! gate failed" in html
    assert "<b>Next step:</b> <" not in html and "Next step:</b> \n" not in html
    # the CLI: the same word and symbol, the reason and the override command
    r = _runs_show(ws, m.run_id)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("evaluate"))
    assert "! gate failed" in line and "done" not in line
    assert "greedy parity 248/256" in r.stdout and "--override-gate evaluate" in r.stdout
    assert "(gate failed at Evaluate)" in r.stdout.splitlines()[0]
    js = json.loads(_runs_show(ws, m.run_id, "--json").stdout)
    assert js["statuses"]["evaluate"]["key"] == "gate_failed"
    assert js["run_status"]["word"] == "gate failed at Evaluate"


def test_override_records_who_and_when_and_every_face_says_overridden(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    Pipeline(m).override_gate("evaluate", "known simulator divergence at token 57")
    m = RunManifest.load(m.run_dir)
    st = stage_status(m, "evaluate")
    assert st.key == "overridden" and st.symbol == "⚑" and st.override is not None
    assert st.override["by"] and st.override["by"] != "unknown" and st.override["t"]
    assert "overridden by " in st.detail and "token 57" in st.detail
    finish_stage(m, "report", {})
    rs = run_status(stage_statuses(m))
    assert rs.key == "complete" and rs.word == "complete (1 gate overridden)"
    rep = build_report(m.run_dir)
    assert rep["run"]["status"] == "complete" and rep["run"]["failure"] is None
    row = next(s for s in rep["stages"] if s["name"] == "evaluate")
    assert row["status"]["word"] == "overridden" and row["gate"]["override"]["by"] == st.override["by"]
    assert f"overridden by {st.override['by']}" in to_html(rep)
    r = _runs_show(ws, m.run_id)
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("evaluate"))
    assert "⚑ overridden" in line and f"overridden by {st.override['by']}" in r.stdout


def test_every_ending_has_its_own_word(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "validate")
    assert stage_status(m, "validate").key == "gate_failed"
    end_stage(m, "compile", "cancelled", "The Compile stage was cancelled.")
    assert stage_status(m, "compile").key == "cancelled"
    m.stage("compile").data["state"] = "interrupted"
    assert stage_status(m, "compile").key == "interrupted"
    m.stage("compile").data["state"] = "failed"
    assert stage_status(m, "compile").key == "failed"
    assert stage_status(m, "board").key == "pending"
    assert stage_status(m, "board", running=True).key == "running"
    # stale: a completed stage whose inputs changed
    finish_stage(m, "validate", PASSING["validate"])
    assert stage_status(m, "validate").key == "passed"
    m.settings["calibration_samples"] = 99
    assert stage_status(m, "quantize").key == "stale"
    # every key has its own word and symbol
    assert len({k.word for k in KINDS.values()}) == len(KINDS) == len({k.symbol for k in KINDS.values()})


@pytest.mark.slow
def test_an_unchanged_board_rerun_leaves_chat_passed(tmp_path: Path, compiled_sim_run: Path) -> None:
    """Issue 32: running the Board stage again, unchanged (the same bundle to the same board), marked Chat and
    Evaluate stale: board.json records times and rates, so its bytes differ on every push."""
    import asyncio

    from hexstudio.core.runs import Workspace
    from tests.support.sim_runs import copy_run

    run = copy_run(compiled_sim_run, tmp_path / "ws")
    m = Workspace(tmp_path / "ws").open_run(run.name)
    assert asyncio.run(Pipeline(m).run(only="board")).ok
    assert asyncio.run(Pipeline(m).run(only="chat")).ok
    assert stage_status(m, "chat").key == "passed"
    first = m.stage("board").data["output_digest"]
    assert asyncio.run(Pipeline(m).run(only="board", force=True)).ok  # pushed again, nothing changed
    m = RunManifest.load(m.run_dir)
    assert m.stage("board").data["output_digest"] == first
    assert stage_status(m, "chat").key == "passed", stage_status(m, "chat")
    # a real change still makes it stale: another board
    m.inputs["board"] = "evk"
    assert stage_status(m, "board").key == "stale"
