"""packaging/setup-venv.sh (what `./dev setup` and `./dev studio` run) after a venv creation that failed
half-way: on Debian/Ubuntu without python3.X-venv, `python -m venv` leaves bin/python without pip."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_a_venv_left_without_pip_is_made_again_and_a_failed_creation_says_what_to_install(
    tmp_path: Path,
) -> None:
    """The venv was skipped because bin/python existed, and every later run failed with "No module named pip",
    with nothing saying to delete it."""
    venv = tmp_path / ".venv"
    _fake(venv / "bin" / "python", 'echo "No module named pip" >&2; exit 1')
    # a Python whose venv module fails as it does without python3.X-venv
    py = tmp_path / "python3"
    _fake(
        py,
        'echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1',
    )
    r = subprocess.run(
        ["bash", str(ROOT / "packaging" / "setup-venv.sh"), str(venv)],
        env={**os.environ, "PYTHON": str(py)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "has no pip" in r.stdout and "apt-get install python3-venv" in r.stderr, (r.stdout, r.stderr)
    assert not venv.exists()  # the next run starts clean
