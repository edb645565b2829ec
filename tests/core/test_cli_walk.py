"""Issue 32's newcomer's CLI walk: what a CLI user is told points to the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_probe_of_an_unknown_board_points_to_board_add(tmp_path: Path) -> None:
    """Issue 32's CLI walk: `board probe NAME` for an unknown board sent a CLI user to the GUI."""
    import os

    r = subprocess.run(
        [sys.executable, "-m", "hexstudio", "board", "probe", "nosuch"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg")},
    )
    assert r.returncode != 0 and "hexstudio board add nosuch --host" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_gui() -> None:
    """`hexstudio --help` named every command but the window's."""
    r = subprocess.run(
        [sys.executable, "-m", "hexstudio", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0 and "\n    gui " in r.stdout and "studio window" in r.stdout, r.stdout


def test_report_compare_takes_a_baseline_tolerances_and_csv(tmp_path: Path) -> None:
    """Compare from the CLI as in the studio: a chosen baseline, stated tolerances, CSV."""
    import csv
    import io
    import json

    from hexstudio.core.runs import Workspace
    from tests.support.gate_runs import PASSING, finish_stage

    ws = tmp_path / "ws"
    runs = []
    for compile_s in (10.0, 20.0):
        m = Workspace(ws).create_run("builtin:tiny-llama", "sim", {})
        for name in ("model", "preflight", "quantize", "validate", "compile"):
            finish_stage(m, name, PASSING[name], duration_s=compile_s if name == "compile" else 1.0)
        runs.append(m.run_id)

    def compare(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hexstudio", "report", "compare", *runs, "--workspace", str(ws), *extra],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )

    r = compare("--format", "json", "--baseline", runs[1])
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert c["baseline"] == runs[1] and c["runs"][0]["run_id"] == runs[1]
    row = next(x for x in c["rows"] if x["label"] == "Compile duration")
    assert row["judgement"] == ["better"]
    r = compare("--format", "csv", "--timing-tolerance", "150")
    lines = list(csv.reader(io.StringIO(r.stdout)))
    assert r.returncode == 0 and lines[0][3] == f"{runs[0]} (baseline)"
    assert "same" in next(x for x in lines if x[1] == "Compile duration")  # within a stated 150 %
    r = compare("--baseline", "nosuch-run")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    # the comparison's flags on a one-run report were ignored without a word: refused, saying where they belong
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexstudio",
            "report",
            runs[0],
            "--workspace",
            str(ws),
            "--timing-tolerance",
            "5",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2 and "--timing-tolerance is for comparisons" in r.stderr, r.stderr
    assert "hexstudio report compare RUN_A RUN_B ... --timing-tolerance" in r.stderr
