"""Run Qualcomm's own checks of a bundle (hexstudio/workers/qnn/genie_check.py: Genie's config parser, QNN's context binary
reader) in a child process and read its one JSON document back.

One runner for both callers, the Compile worker's last step and `bundle check` (hexstudio/core/services/bundle_check.py):
a library that crashes or hangs on a malformed binary takes the child with it, never the caller. The caller says
how to start Python (a frozen build starts it differently) and with which environment."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULE = "hexstudio.workers.qnn.genie_check"


@dataclass(frozen=True)
class QualcommRun:
    doc: dict[str, Any] | None  # the child's JSON document; None when it timed out or ended abnormally
    returncode: int | None  # None: timed out
    tail: str  # the end of what the child printed, for a finding when it failed
    timeout_s: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            return doc if isinstance(doc, dict) else None
    return None


def run_qualcomm_checks(
    bundle_dir: Path, python_argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
) -> QualcommRun:
    """`python_argv` is how to run `python -m hexstudio.workers.qnn.genie_check BUNDLE` (e.g. [sys.executable, "-m", MODULE])."""
    try:
        proc = subprocess.run(
            [*python_argv, os.fspath(bundle_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
        )
    except subprocess.TimeoutExpired:
        return QualcommRun(None, None, "", timeout_s)
    doc = last_json_line(proc.stdout) if proc.returncode == 0 else None
    return QualcommRun(doc, proc.returncode, (proc.stderr or proc.stdout).strip()[-400:], timeout_s)
