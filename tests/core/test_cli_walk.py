"""Issue 32's newcomer's CLI walk: what a CLI user is told points to the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_probe_of_an_unknown_board_points_to_board_add(tmp_path: Path) -> None:
    """Issue 32's CLI walk: `board probe NAME` for an unknown board sent a CLI user to the GUI."""
    import os

    r = subprocess.run([sys.executable, "-m", "app", "board", "probe", "nosuch"], capture_output=True, text=True,
                       cwd=REPO, timeout=120, env={**os.environ, "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg")})
    assert r.returncode != 0 and "hexstudio board add nosuch --host" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_gui() -> None:
    """`hexstudio --help` named every command but the window's."""
    r = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and "\n    gui " in r.stdout and "studio window" in r.stdout, r.stdout
