"""StageAttempt: what run.json keeps of one attempt of a stage, and the output folder put in place only on success."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.core.jobs import JobResult
from hexstudio.core.manifest import RunManifest
from hexstudio.core.runs import Workspace
from hexstudio.core.sampler import ResourceSample
from hexstudio.core.stage_record import StageAttempt
from hexstudio.core.stages import get_stage


def _attempt(m: RunManifest, seen: list[dict[str, Any]]) -> StageAttempt:
    a = StageAttempt(m, get_stage("quantize"), on_event=seen.append)
    partial = a.begin()
    (partial / "quantize.json").write_text("{}")
    return a


def test_a_success_replaces_the_output_and_a_failure_keeps_the_last_good_one(tmp_path: Path) -> None:
    m = Workspace(tmp_path).create_run("builtin:tiny-llama", "sim")
    seen: list[dict[str, Any]] = []
    a = _attempt(m, seen)
    assert m.stage("quantize").data["state"] == "running"
    a.handle({"type": "metric", "name": "aihub_job", "value": "j1", "scope": "job"})
    on_disk = json.loads(m.path.read_text())["stages"]["quantize"]["metrics"]  # a job id is saved at once
    assert on_disk["aihub_job"]["value"] == "j1"
    a.handle({"type": "warning", "message": "slow disk", "code": "disk_slow"})
    a.handle({"type": "artifact", "path": "quantize.json", "kind": "document"})
    a.sample(ResourceSample(t=0.5, rss_bytes=1 << 20, vram_bytes=None, processes=1))
    assert a.finish(JobResult("ok", 0, None, "done", summary={"graphs": 2}, peak_rss_bytes=5 << 20)) == "done"
    st = m.stage("quantize").data
    final = tmp_path / "runs" / m.run_id / "artifacts" / "quantize"
    assert final.is_dir() and not final.with_name("quantize.partial").exists()
    assert st["warnings"][0]["code"] == "disk_slow" and st["summary"] == {"graphs": 2} and st["output_digest"]
    assert [ev["type"] for ev in seen] == ["metric", "warning", "artifact"]  # every event handed on
    assert (m.run_dir / "logs" / "quantize.resources.jsonl").read_text().count("\n") == 1

    b = _attempt(m, [])
    assert b.finish(JobResult("cancelled", None, "SIGTERM", "cancelled")) == "cancelled"
    assert final.is_dir() and not final.with_name("quantize.partial").exists()  # the last good output stays
    assert m.stage("quantize").data["input_hash"] is None  # so it is not taken as current
    c = _attempt(m, [])
    assert c.finish(JobResult("killed", None, "SIGKILL", "the studio stopped")) == "interrupted"


def test_a_failed_attempts_logs_are_kept_where_its_error_says(tmp_path: Path) -> None:
    """A failed compile's hint named its QNN log inside artifacts/compile.partial/, which the failed attempt's end
    deleted: the full log the person was sent to read was gone. Log files are kept (logs/<stage>-failed/) and the
    error names them there."""
    m = Workspace(tmp_path).create_run("builtin:tiny-llama", "sim")
    a = StageAttempt(m, get_stage("compile"))
    partial = a.begin()
    log = partial / "htp" / "ctx" / "part_1" / "compile.log"
    log.parent.mkdir(parents=True)
    log.write_text("qnn: the whole story\n")
    (partial / "bundle.bin").write_bytes(b"x" * 10)
    msg = f"QNN could not compile part_1: see {log} (bundle: {partial / 'bundle.bin'})"
    result = JobResult("failed", 1, None, msg, code="local_compile_failed", hint=f"The full log is {log}.")
    assert a.finish(result) == "failed"
    kept = m.run_dir / "logs" / "compile-failed" / "htp" / "ctx" / "part_1" / "compile.log"
    assert kept.read_text() == "qnn: the whole story\n" and not partial.exists()
    out = m.stage("compile").data["outcome"]
    assert str(kept) in out["message"] and out["hint"] == f"The full log is {kept}.", out
    # what `hexstudio run` and the studio show is the result itself: it names the kept log too
    assert result.hint == f"The full log is {kept}." and str(kept) in result.message
    # only the logs' own paths are rewritten: another file of the folder is not said to be among them
    assert str(partial / "bundle.bin") in result.message
