"""No test over a minute without a written reason (issue 30): the run's summary names each one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_summary_names_a_slow_test_without_a_reason_and_not_one_with_a_reason() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/support/slow_probe.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HEXSTUDIO_SLOW_TEST_S": "0.2"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    summary = proc.stdout.split("tests over 0.2 s without a written reason", 1)
    assert len(summary) == 2, proc.stdout[-2000:]
    assert "test_slow_without_a_reason: make it cheaper" in summary[1]
    assert "test_slow_with_a_reason" not in summary[1]
