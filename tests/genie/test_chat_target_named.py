"""Issue 32: `chat`, `bench` and `serve` used the latest run's bundle, even one that failed its gate, without
naming it. All three find their bundle through hexstudio.cli.target.board_and_bundle, which now says which run's bundle on which
board (and why that run), and warns when that run did not pass a gate."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import pytest

from hexstudio.cli import bench_cmd, serve_cmd
from hexstudio.cli.target import target_lines
from tests.genie.conftest import SimWorkspace


def test_chat_names_the_run_and_bundle_it_uses(
    sim_workspace: SimWorkspace, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = sim_workspace.cli("chat", "--prompt", "Hi", "--max-tokens", "4", "--json")
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    run = sim_workspace.run_dir.name
    assert f"Using run {run}'s bundle (the latest run with a bundle; --run RUN chooses another)" in cap.err
    assert sim_workspace.remote_bundle in cap.err and "warning:" not in cap.err
    json.loads(cap.out)  # the JSON on stdout stays clean


def test_a_run_whose_gate_failed_is_named_with_a_warning(sim_workspace: SimWorkspace, tmp_path: Path) -> None:
    from tests.support.sim_runs import copy_run

    run_dir = copy_run(sim_workspace.run_dir, tmp_path / "ws")
    doc = json.loads((run_dir / "run.json").read_text())
    doc["stages"]["validate"]["metrics"]["verdict"]["value"] = "fail"
    (run_dir / "run.json").write_text(json.dumps(doc))
    lines = target_lines(
        argparse.Namespace(run=run_dir.name, bundle=None), run_dir, "/remote/b", "simulator board"
    )
    assert lines[0] == f"Using run {run_dir.name}'s bundle (--run): /remote/b on simulator board."
    warn = [x for x in lines if x.startswith("warning:")]
    assert len(warn) == 1 and "Validate stage gate failed" in warn[0] and "verdict is 'fail'" in warn[0]
    assert f"hexstudio runs show {run_dir.name}" in warn[0]


def test_a_bundle_folder_is_named_as_such() -> None:
    lines = target_lines(argparse.Namespace(run=None, bundle="/tmp/b"), None, "/home/u/b", "evk")
    assert lines == ["Using the bundle /tmp/b on evk (not from a run)."]


def test_bench_and_serve_find_their_bundle_through_the_same_target() -> None:
    for fn in (bench_cmd._bench, serve_cmd):
        assert "await board_and_bundle(args)" in inspect.getsource(fn)
