"""Every kind of child process the studio starts (hexstudio.core.jobs) behaves the same from a frozen build as from
Python: the CLI (the report export, the AI Hub device list), a worker, the simulator's commands (genie_sim
t2t, session, geniex) and a `-c` snippet.

A frozen build's sys.executable is hexstudio itself, dispatched by hexstudio/__main__.py. Here a stand-in for it
(`hexstudio`, a script running hexstudio.__main__.main with sys.frozen set) takes sys.executable's place, so the
commands are the ones a PyInstaller build would run, through the real dispatch; test_worker_dispatch.py runs
a real build when HEXSTUDIO_FROZEN_BIN names one."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.board import python_env, sim_board
from hexstudio.core.genie.runtime import board_runtime
from hexstudio.core.jobs import ChildResult, JobRunner, cli_command, code_command, run_child
from hexstudio.core.paths import REPO_ROOT

FROZEN_MAIN = (
    "import sys; sys.frozen = True; sys.argv[0] = 'hexstudio'; "
    "from hexstudio.__main__ import main; raise SystemExit(main(sys.argv[1:]))"
)


@pytest.fixture
def frozen_exe(tmp_path: Path) -> Path:
    exe = tmp_path / "dist" / "hexstudio"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{FROZEN_MAIN}" "$@"\n')
    exe.chmod(0o755)
    return exe


def both(
    monkeypatch: pytest.MonkeyPatch, exe: Path, build: Any, **kw: Any
) -> tuple[ChildResult, ChildResult]:
    """Run the command `build()` makes, as Python runs it and as the frozen build runs it."""
    env = {**os.environ, **python_env()}
    direct_argv = build()
    assert direct_argv[0] == sys.executable
    with monkeypatch.context() as m:
        m.setattr(sys, "frozen", True, raising=False)
        m.setattr(sys, "executable", str(exe))
        frozen_argv = build()
    assert frozen_argv[0] == str(exe) and "-m" not in frozen_argv[:2]
    direct = asyncio.run(run_child(direct_argv, what="direct", cwd=REPO_ROOT, env=env, timeout=120, **kw))
    frozen = asyncio.run(run_child(frozen_argv, what="frozen", cwd=REPO_ROOT, env=env, timeout=120, **kw))
    return direct, frozen


@pytest.mark.parametrize(
    "args",
    [
        ("explain", "Failed to create device: 14001", "--json"),  # any CLI command
        ("report", "--help"),  # the report export
        ("bundle", "devices", "--help"),
    ],
)  # the AI Hub list
def test_cli_commands(monkeypatch: pytest.MonkeyPatch, frozen_exe: Path, args: tuple[str, ...]) -> None:
    direct, frozen = both(monkeypatch, frozen_exe, lambda: cli_command(*args))
    assert direct.returncode == frozen.returncode == 0, frozen.stderr
    assert direct.stdout == frozen.stdout and direct.stdout
    if args[0] == "explain":
        assert json.loads(frozen.stdout)["recognised"] is True


def test_a_failing_cli_command_fails_the_same(
    monkeypatch: pytest.MonkeyPatch, frozen_exe: Path, tmp_path: Path
) -> None:
    direct, frozen = both(
        monkeypatch,
        frozen_exe,
        lambda: cli_command(
            "report", str(tmp_path / "no-run"), "--format", "json", "--out", str(tmp_path / "r.json")
        ),
    )
    assert direct.returncode == frozen.returncode != 0
    assert direct.stderr == frozen.stderr and direct.stderr


def test_simulator_commands(monkeypatch: pytest.MonkeyPatch, frozen_exe: Path, tmp_path: Path) -> None:
    """The simulator board's genie-t2t-run and the session helpers of the runtimes that run on this machine (real
    Genie on the HTP simulator, the onnxruntime twin, GenieX's twin)."""
    board = sim_board(tmp_path / "ws")
    direct, frozen = both(
        monkeypatch, frozen_exe, lambda: [*sim_board(tmp_path / "ws").genie_command, "--help"]
    )
    assert direct.returncode == frozen.returncode == 0, frozen.stderr
    assert direct.stdout == frozen.stdout and "--profile" in direct.stdout
    for name in ("genie-htp-sim", "ort-twin", "geniex"):
        rt = board_runtime(name)
        direct, frozen = both(
            monkeypatch, frozen_exe, lambda rt=rt: [*rt.helper_argv(board, None, None, ".")[0], "--help"]
        )
        assert direct.returncode == frozen.returncode == 0, (name, frozen.stderr)
        assert direct.stdout == frozen.stdout and direct.stdout, name


def test_code_snippets(monkeypatch: pytest.MonkeyPatch, frozen_exe: Path) -> None:
    code = "import json, sys; print(json.dumps([__name__, *sys.argv])); raise SystemExit(int(sys.argv[2]))"
    direct, frozen = both(monkeypatch, frozen_exe, lambda: code_command(code, "a b", "4"))
    assert direct.returncode == frozen.returncode == 4
    assert json.loads(direct.stdout) == json.loads(frozen.stdout) == ["__main__", "-c", "a b", "4"]


def test_workers(monkeypatch: pytest.MonkeyPatch, frozen_exe: Path, tmp_path: Path) -> None:
    """A stage's worker through the job runner (JobRunner.start_local): the same events and outcome."""

    def spec(name: str) -> Path:
        p = tmp_path / f"{name}.json"
        p.write_text(
            json.dumps(
                {
                    "schema": 1,
                    "stage": "selftest",
                    "run_dir": str(tmp_path),
                    "out_dir": str(tmp_path / name),
                    "settings": {},
                    "upstream": {},
                    "inputs": {},
                }
            )
        )
        return p

    async def go(name: str) -> tuple[Any, list[str]]:
        events: list[dict[str, Any]] = []
        job = await JobRunner().start_local(
            "hexstudio.workers.selftest", spec(name), on_event=events.append, cwd=REPO_ROOT
        )
        assert (job.argv[1] == "--worker") == (name == "frozen")
        return await job.wait(), [e["type"] for e in events]

    direct = asyncio.run(go("direct"))
    with monkeypatch.context() as m:
        m.setattr(sys, "frozen", True, raising=False)
        m.setattr(sys, "executable", str(frozen_exe))
        frozen = asyncio.run(go("frozen"))
    assert direct[0].ok and frozen[0].ok, (frozen[0].message, frozen[0].stderr_tail)
    assert direct[1] == frozen[1] and direct[1][-1] == "done"
    assert (tmp_path / "frozen" / "selftest.json").is_file()
