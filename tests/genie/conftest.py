"""Genie test fixtures: the test-only libGenie (C, built with cc) and a fake board around it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.sshd import ssh_server  # noqa: F401  (session fixture: a real sshd on 127.0.0.1)

FAKE_SRC = Path(__file__).parent / "fake_genie"


@dataclass
class FakeGenie:
    lib: Path  # the test libGenie.so
    t2t: Path  # a genie-t2t-run linked against it

    def bundle(
        self,
        folder: Path,
        *,
        init_ms: int = 1500,
        token_ms: int = 20,
        tokens: int = 12,
        context: int = 4096,
        fail_create: bool = False,
        creates_ok: int = 0,
        dialog_type: str = "basic",
        ignore_limit: bool = False,
        ignore_abort: bool = False,
        echo: Path | None = None,
        fail_reset: bool = False,
    ) -> Path:
        """A 'bundle' folder for the fake runtime: a genie_config.json carrying the fake's knobs."""
        folder.mkdir(parents=True, exist_ok=True)
        dialog: dict[str, Any] = {
            "version": 1,
            "type": dialog_type,
            "context": {"size": context},
            "sampler": {"seed": 1, "temp": 0.8, "top-k": 40, "top-p": 0.9},
            "fake-init-ms": init_ms,
            "fake-token-ms": token_ms,
            "fake-tokens": tokens,
            "fake-fail-create": int(fail_create),
            "fake-creates-ok": creates_ok,
            "fake-ignore-limit": int(ignore_limit),
            "fake-ignore-abort": int(ignore_abort),
            "fake-fail-reset": int(fail_reset),
        }
        if echo is not None:
            dialog["fake-echo-file"] = str(echo)
        (folder / "genie_config.json").write_text(json.dumps({"dialog": dialog}, indent=2))
        return folder

    def board_config(self, **extra: Any) -> dict[str, Any]:
        return {"python": sys.executable, "genie_lib": str(self.lib), **extra}


@pytest.fixture(scope="session")
def fake_genie(tmp_path_factory: pytest.TempPathFactory) -> FakeGenie:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the test libGenie: apt-get install -y gcc")
    out = tmp_path_factory.mktemp("fake-genie")
    lib = out / "libGenie.so"
    t2t = out / "genie-t2t-run"
    subprocess.run(
        [
            cc,
            "-O1",
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
            "-o",
            str(lib),
            str(FAKE_SRC / "fake_libgenie.c"),
        ],
        check=True,
    )
    subprocess.run(
        [
            cc,
            "-O1",
            "-Wall",
            "-o",
            str(t2t),
            str(FAKE_SRC / "genie_t2t_run.c"),
            f"-L{out}",
            "-lGenie",
            f"-Wl,-rpath,{out}",
        ],
        check=True,
    )
    return FakeGenie(lib, t2t)


@dataclass
class SimWorkspace:
    root: Path  # a workspace holding one run completed through the board stage (simulator board)
    run_dir: Path
    remote_bundle: str  # the bundle on the simulator board

    def cli(self, *argv: str) -> int:
        """`hexstudio ARGV --workspace ROOT`: the CLI's exit status, on this workspace."""
        from hexstudio.cli.main import main

        return main([*argv, "--workspace", str(self.root)])


@pytest.fixture(scope="session")
def sim_workspace(compiled_sim_run: Path, tmp_path_factory: pytest.TempPathFactory) -> SimWorkspace:
    import asyncio

    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from tests.support.sim_runs import copy_run

    ws = tmp_path_factory.mktemp("genie-ws")
    run_dir = copy_run(compiled_sim_run, ws)
    res = asyncio.run(Pipeline(Workspace(ws).open_run(run_dir.name)).run(only="board"))
    assert res.ok, res
    doc = json.loads((run_dir / "artifacts" / "board" / "board.json").read_text())
    return SimWorkspace(ws, run_dir, str(doc["remote_bundle"]))


def assert_streamed(chunks: list[Any], gen_time_ms: float | None, generated: int | None) -> None:
    """The reply was streamed as it was generated, not delivered at the end: the first chunk arrived before
    the last by a good part of the runner's own generation time (at least 3 token intervals and half the
    generation time, measured by the runner itself), which a buffered reply cannot do."""
    assert gen_time_ms and generated and generated >= 4, (gen_time_ms, generated)
    assert len(chunks) >= 3, f"only {len(chunks)} chunks: the reply was not streamed"
    interval_s = gen_time_ms / 1000 / (generated - 1)
    spread_s = chunks[-1].t - chunks[0].t
    assert spread_s >= max(3 * interval_s, 0.5 * gen_time_ms / 1000), (
        f"first chunk only {spread_s * 1000:.0f} ms before the last; generation took {gen_time_ms:.0f} ms"
    )
