"""Helpers shared by CLI commands: JSON output, errors a person can act on, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.core.runs import Workspace

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    def __init__(self, message: str, hint: str | None = None, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_workspace_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", type=Path, default=None,
                   help="workspace folder (default: $HEXSTUDIO_WORKSPACE or ~/hexstudio-workspace)")


def workspace_from(args: argparse.Namespace) -> Workspace:
    return Workspace(getattr(args, "workspace", None))


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def eprint(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)
