"""The studio and the CLI show the same runs: both take the workspace from --workspace, else
$HEXSTUDIO_WORKSPACE, else settings.json's "workspace", else ~/hexstudio-workspace
(hexstudio.core.paths.default_workspace). The CLI used to ignore settings.json's "workspace", and
`hexstudio --workspace DIR COMMAND` opened the window instead of running the command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hexstudio.core.runs import Workspace
from tests.support.cli import python_m_hexstudio


def _listed(stdout: str) -> list[str]:
    return [r["run_id"] for r in json.loads(stdout)["runs"]]


def _settings(workspace: object) -> None:
    path = Path(os.environ["HEXSTUDIO_CONFIG_DIR"]) / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings_version": 0, "workspace": workspace}))


def test_the_cli_reads_the_studio_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = tmp_path / "chosen"
    run = Workspace(chosen).create_run("builtin:tiny-llama", "sim")
    _settings(str(chosen))
    monkeypatch.delenv("HEXSTUDIO_WORKSPACE")
    r = python_m_hexstudio("runs", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert _listed(r.stdout) == [run.run_id]


def test_the_environment_comes_before_the_setting(tmp_path: Path) -> None:
    Workspace(tmp_path / "chosen").create_run("builtin:tiny-llama", "sim")
    _settings(str(tmp_path / "chosen"))
    # conftest's HEXSTUDIO_WORKSPACE: an empty workspace
    r = python_m_hexstudio("runs", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert _listed(r.stdout) == []


def test_workspace_before_the_command(tmp_path: Path) -> None:
    run = Workspace(tmp_path / "other").create_run("builtin:tiny-llama", "sim")
    r = python_m_hexstudio("--workspace", str(tmp_path / "other"), "runs", "list", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    assert _listed(r.stdout) == [run.run_id]


def test_a_workspace_setting_that_is_no_path_is_named(tmp_path: Path) -> None:
    _settings(5)
    r = python_m_hexstudio("runs", "list")
    assert r.returncode == 1
    assert '"workspace" is 5, not a folder' in r.stderr and "Traceback" not in r.stderr


def test_the_simulator_board_lives_in_the_chosen_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hexstudio board probe/push sim` open the board with the settings alone: its home must be the one the
    studio and the run's Board stage use, under settings.json's "workspace", not ~/hexstudio-workspace."""
    import asyncio

    from hexstudio.core.device.board import open_board
    from hexstudio.core.device.fixes import _chosen_workspace
    from hexstudio.core.settings import Settings

    chosen = tmp_path / "chosen"
    _settings(str(chosen))
    monkeypatch.delenv("HEXSTUDIO_WORKSPACE")
    board = asyncio.run(open_board("sim", Settings.load()))
    assert Path(board.transport.root) == chosen / "sim-board" / "home"
    assert _chosen_workspace() == chosen  # the QAIRT payload cache's home
    # a workspace given (the run's own) still wins
    board = asyncio.run(open_board("sim", Settings.load(), tmp_path / "run-ws"))
    assert Path(board.transport.root) == tmp_path / "run-ws" / "sim-board" / "home"
