"""Preflight says what a local QNN compile of the model needs (RAM, time, disk: measured at 8B shapes, issue 28)
and what the AI Hub compile uploads instead; a warning where the RAM is short, a failure only where this run
compiles locally."""

from __future__ import annotations

from typing import Any

import pytest

from hexstudio.shared.preflight_checks import run_checks
from tests.preflight.test_checks import BASE_PROBE, needs_8b

GiB = 1024**3


def _needs_8b() -> dict[str, Any]:
    return needs_8b(4096)


def test_an_8b_local_compile_and_upload_are_in_the_model_needs() -> None:
    needs = _needs_8b()
    # the upload: 2 graphs per part, weights as their integers (bench/llama8b_shapes.py at 32 layers: 19.8 GB of
    # directories, 11.2 GB sent)
    assert 19e9 < needs["aihub_upload_bytes"] < 20.5e9
    assert 10.5e9 < needs["aihub_upload_zipped_bytes"] < 12e9
    assert 1 * GiB < needs["local_compile_peak_rss_bytes"] < 64 * GiB
    assert needs["local_compile_seconds"] > 600 and needs["local_compile_disk_bytes"] > 4e9


def test_the_preflight_row_warns_where_the_ram_is_short_for_a_run_that_compiles_elsewhere() -> None:
    needs = _needs_8b()
    ok = {c["id"]: c for c in run_checks(dict(BASE_PROBE), needs)}["local_compile"]
    assert ok["status"] == "ok" and "local QNN compile" in ok["message"] and "AI Hub" in ok["message"]
    assert ok["required"]["ram_bytes"] == needs["local_compile_peak_rss_bytes"]
    small = {
        **BASE_PROBE,
        "mem_total_bytes": needs["local_compile_peak_rss_bytes"] // 2,
        "swap_total_bytes": 0,
    }
    warn = {c["id"]: c for c in run_checks(small, needs)}["local_compile"]
    assert warn["status"] == "warn" and "compile_target aihub" in (warn["fix"] or "")


def test_a_run_that_compiles_locally_fails_where_the_compile_would_be_killed() -> None:
    """The default flow (the simulator board, compile_target auto) compiles on this machine: a machine short of the
    local compile's memory passed preflight and was killed at Compile, after quantize and validate; its disk need
    was not counted either."""
    needs = {**_needs_8b(), "compile_local": True}
    small = {
        **BASE_PROBE,
        "mem_total_bytes": needs["local_compile_peak_rss_bytes"] // 2,
        "swap_total_bytes": 0,
    }
    by = {c["id"]: c for c in run_checks(small, needs)}
    assert by["local_compile"]["status"] == "fail" and "compiles locally" in by["local_compile"]["message"]
    assert "compile_target sim" in (by["local_compile"]["fix"] or "")
    assert by["disk_workspace"]["required"] >= needs["disk_bytes"] + needs["local_compile_disk_bytes"]
    plenty = {c["id"]: c for c in run_checks(dict(BASE_PROBE), needs)}
    assert plenty["local_compile"]["status"] == "ok"


def test_the_preflight_stage_knows_whether_the_run_compiles_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    from hexstudio.workers import preflight
    from hexstudio.workers.qnn import libs

    assert preflight.compiles_locally("local", "evk") and not preflight.compiles_locally("aihub", "sim")
    monkeypatch.setattr(libs, "find_qnn_libs", lambda: object())
    assert preflight.compiles_locally("auto", "sim") and not preflight.compiles_locally("auto", "evk")
    monkeypatch.setattr(libs, "find_qnn_libs", lambda: None)  # the twin's bundle then: nothing compiled here
    assert not preflight.compiles_locally("auto", "sim")
