"""DESIGN.md's layering rules, enforced with import-linter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    declared = (REPO / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    m = re.search(r"Contracts: (\d+) kept, (\d+) broken", proc.stdout)
    assert m is not None, proc.stdout
    assert (int(m.group(1)), int(m.group(2))) == (declared, 0), proc.stdout
