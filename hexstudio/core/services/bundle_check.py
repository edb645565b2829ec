"""`bundle check` as a service: HexStudio's contract checks plus Qualcomm's own, where they are installed.

Qualcomm's checks (Genie 1.21's config parser, QNN 2.51's context binary reader: hexstudio/workers/qnn/genie_check.py)
run in a child process with a time limit, so a malformed binary or a hung library cannot take the studio
or the CLI with it. Without onnxruntime-qnn the light checks still run, and the report says Qualcomm's did not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import python_env
from hexstudio.shared.bundle.check import ERROR, INFO, WARNING, Finding, check_bundle
from hexstudio.shared.bundle.qualcomm_run import MODULE as QUALCOMM_MODULE
from hexstudio.shared.bundle.qualcomm_run import run_qualcomm_checks
from hexstudio.shared.python_command import python_command

QUALCOMM_CHECK_TIMEOUT_S = 120.0


def qualcomm_checks(
    bundle_dir: Path, timeout: float = QUALCOMM_CHECK_TIMEOUT_S
) -> tuple[dict[str, Any] | None, Finding | None]:
    """(what Genie's parser and QNN's reader said, a finding about running them when that failed)."""
    run = run_qualcomm_checks(
        bundle_dir, python_command(QUALCOMM_MODULE), timeout_s=timeout, env={**os.environ, **python_env()}
    )
    if run.timed_out:
        return None, Finding(
            "qualcomm_check_timeout",
            WARNING,
            f"Qualcomm's checks (Genie's parser, QNN's reader) "
            f"did not finish within {timeout:.0f} s; only HexStudio's checks ran.",
            None,
            "Run `hexstudio bundle check` again; a context binary that hangs QNN's reader will "
            "not load on a board either.",
        )
    doc = run.doc
    if doc is None:
        return None, Finding(
            "qualcomm_check_failed",
            ERROR,
            f"Qualcomm's checks ended abnormally (exit {run.returncode}) on this bundle: {run.tail}",
            None,
            "A binary that crashes QNN's reader will not load on a board: compile that part again.",
        )
    if not doc.get("available"):
        return None, Finding(
            "qualcomm_checks_missing",
            INFO,
            "Qualcomm's own checks did not run: onnxruntime-qnn (libGenie, libQnnSystem) is not installed.",
            None,
            str(doc.get("hint") or ""),
        )
    return doc, None


# findings after which no file of the bundle is handed to a Qualcomm library (a path out of the bundle, a FIFO,
# an unreadable config)
BLOCKING = {"unsafe_path", "config_missing"}


def check(
    bundle_dir: Path, board_facts: dict[str, Any] | None = None, *, qualcomm: bool = True
) -> list[Finding]:
    light = check_bundle(bundle_dir, board_facts)
    if not qualcomm or any(f.code in BLOCKING for f in light):
        return light
    real, problem = qualcomm_checks(bundle_dir)
    findings = check_bundle(bundle_dir, board_facts, real) if real is not None else light
    return [problem, *findings] if problem is not None else findings
