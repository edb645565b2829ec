"""A run on the built-in model through the board stage on the simulator board, for the Evaluate stage and
`hexstudio serve` (a private copy of the shared compiled run, docs/CONTRACTS.md §6)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def eval_workspace(compiled_sim_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from tests.support.sim_runs import copy_run

    ws = tmp_path_factory.mktemp("eval-ws")
    run_dir = copy_run(compiled_sim_run, ws)
    res = asyncio.run(Pipeline(Workspace(ws).open_run(run_dir.name)).run(only="board"))
    assert res.ok, res
    return ws, run_dir


@pytest.fixture(scope="session")
def twin_workspace(validated_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run compiled for the onnxruntime twin (compile_target "sim": stand-in context binaries) through the
    board stage on the simulator board. For `hexstudio serve`'s HTTP tests, which need replies of hundreds of
    tokens in seconds: Genie on the HTP simulator (eval_workspace) makes about one token a second here."""
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from tests.support.sim_runs import copy_run

    ws = tmp_path_factory.mktemp("twin-ws")
    run_dir = copy_run(validated_run, ws)
    m = Workspace(ws).open_run(run_dir.name)
    m.settings.update({"compile_target": "sim"})
    m.save()
    res = asyncio.run(Pipeline(Workspace(ws).open_run(run_dir.name)).run(only="compile"))
    assert res.ok, res
    res = asyncio.run(Pipeline(Workspace(ws).open_run(run_dir.name)).run(only="board"))
    assert res.ok, res
    return ws, run_dir
