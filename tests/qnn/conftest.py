"""Qualcomm's real runtime on this machine (onnxruntime-qnn: QNN 2.51, Genie 1.21): a validated run compiled
locally, shared by the tests of this folder. Skipped, saying why, where the wheel is not installed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hexstudio.workers.qnn.libs import INSTALL_HINT, find_qnn_libs

needs_qnn = pytest.mark.skipif(
    find_qnn_libs() is None, reason=f"onnxruntime-qnn is not installed: {INSTALL_HINT}"
)


def genie_on_simulator(config: str, log_level: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the board's Genie helper (genie_session) run here with Qualcomm's libGenie on
    the HTP simulator, two threads, Genie's log at `log_level`; run it in the bundle folder."""
    import json
    import sys

    from hexstudio.workers.qnn.libs import x86_engine_overrides

    libs = find_qnn_libs()
    assert libs is not None
    argv = [
        sys.executable,
        "-m",
        "hexstudio.workers.board.genie_session",
        "--config",
        config,
        "--lib",
        str(libs.genie),
        "--log-level",
        log_level,
        "--htp-simulator",
        "--engine",
        json.dumps(x86_engine_overrides(2)),
    ]
    return argv, libs.env()


def genie_session(
    bundle: Path, config: str, log_level: str, msgs: list[dict[str, Any]], timeout: float
) -> tuple[list[dict[str, Any]], str]:
    """Run the board's Genie helper (genie_on_simulator) in the bundle folder with the commands `msgs` on its stdin
    until they end: (its JSON events, in order; its stderr)."""
    import json
    import subprocess

    argv, env = genie_on_simulator(config, log_level)
    p = subprocess.run(
        argv,
        input="".join(json.dumps(m) + "\n" for m in msgs),
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")], p.stderr


@pytest.fixture(scope="session")
def local_run(validated_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in model's validated run, compiled locally for the simulator board (compile_target local:
    real context binaries, one per graph) and pushed to it."""
    if find_qnn_libs() is None:
        pytest.skip(f"onnxruntime-qnn is not installed: {INSTALL_HINT}")
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from tests.support.sim_runs import copy_run

    ws = tmp_path_factory.mktemp("local-ws")
    dest = copy_run(validated_run, ws)
    m = Workspace(ws).open_run(dest.name)
    m.settings.update({"compile_target": "local"})
    m.save()
    for stage in ("compile", "board"):
        res = asyncio.run(Pipeline(m).run(only=stage))
        assert res.ok, f"{stage}: {res.message} ({res.hint})"
    return dest
