"""The Report stage needs no stage, but reads them all: it must be written again when any result it reads
changed (a resume after Evaluate ran again with other suites used to skip it as current and keep the old
numbers)."""

from __future__ import annotations

from pathlib import Path

from hexstudio.core.runs import Workspace
from hexstudio.core.stage_state import input_hash
from hexstudio.core.stages import STAGE_NAMES, get_stage


def test_the_report_reads_every_other_stage() -> None:
    assert get_stage("report").reads == tuple(n for n in STAGE_NAMES if n != "report")


def test_a_changed_result_makes_the_report_stale(tmp_path: Path) -> None:
    m = Workspace(tmp_path).create_run("builtin:tiny-llama", "sim")
    report = get_stage("report")
    m.stage("evaluate").data.update({"state": "done", "output_digest": "a" * 64})
    before = input_hash(m, report)
    assert input_hash(m, report) == before
    m.stage("evaluate").data["output_digest"] = "b" * 64
    after = input_hash(m, report)
    assert after != before
    m.stage("chat").data["state"] = "failed"
    assert input_hash(m, report) != after
    # a stage that reads nothing beyond what it needs keeps its hash: no other stage is made stale
    quantize = get_stage("quantize")
    q = input_hash(m, quantize)
    m.stage("evaluate").data["output_digest"] = "c" * 64
    assert input_hash(m, quantize) == q
