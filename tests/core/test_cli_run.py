"""The issue's acceptance: `hexstudio run --until preflight` on the built-in model, schema-valid run.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hexstudio.core.manifest import validate_manifest
from hexstudio.core.status import KINDS
from tests.support.cli import RUN_BUILTIN, hexstudio


def _hexstudio(*args: str) -> subprocess.CompletedProcess[str]:
    return hexstudio(*args, timeout=300)


def test_run_until_preflight_makes_a_valid_run(tmp_path: Path) -> None:
    proc = _hexstudio(*RUN_BUILTIN, "--until", "preflight", "--workspace", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] and out["ran"] == ["model", "preflight"]
    data = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    validate_manifest(data)
    assert data["stages"]["model"]["metrics"]["num_parameters"]["value"] > 3_000_000
    assert data["stages"]["preflight"]["metrics"]["checks_failed"]["value"] == 0
    assert data["stages"]["quantize"]["state"] == "pending"
    assert data["stages"]["preflight"]["peak_rss_bytes"] > 0
    # issue 32: the statuses `run --json` prints are the one status model's (hexstudio/core/status.py), the same as
    # `runs show --json` and `runs list --json` print
    words = {k.key: k.word for k in KINDS.values()}
    assert {s["key"] for s in out["statuses"].values()} <= set(words)
    assert all(s["word"] == words[s["key"]] for s in out["statuses"].values())
    assert out["statuses"]["model"]["word"] == "passed" and out["statuses"]["preflight"]["word"] == "passed"
    assert out["statuses"]["quantize"]["key"] == "pending"
    assert out["run_status"]["key"] == "in_progress" and out["run_status"]["word"].startswith("2/")
    show = _hexstudio("runs", "show", out["run_id"], "--workspace", str(tmp_path), "--json")
    shown = json.loads(show.stdout)
    assert shown["statuses"] == out["statuses"] and shown["run_status"] == out["run_status"]
    listed = _hexstudio("runs", "list", "--workspace", str(tmp_path), "--json")
    assert json.loads(listed.stdout)["runs"][0]["run_status"] == out["run_status"]
    # resume: nothing to do, both skipped
    again = _hexstudio(
        "run", "--resume", out["run_id"], "--until", "preflight", "--workspace", str(tmp_path), "--json"
    )
    assert json.loads(again.stdout)["skipped"] == ["model", "preflight"]
