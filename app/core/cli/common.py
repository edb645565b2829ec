"""Helpers shared by CLI commands: JSON output, errors a person can act on, exit codes."""

from __future__ import annotations

import argparse
import getpass
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


def read_token(what: str, page: str, command: str, from_stdin: bool) -> str:
    """An API token from a hidden prompt, or the first line of standard input; checked for the obvious slips."""
    if from_stdin:
        token = sys.stdin.readline()
    else:
        if not sys.stdin.isatty():
            raise CliError("No terminal to ask the token on.",
                           f"Pipe it in instead: `{command} --stdin < token.txt`.")
        token = getpass.getpass(f"{what} (from {page}; not shown): ")
    token = token.strip()
    if not token:
        raise CliError("No token was given.", f"Copy your token from {page} and run `{command}` again.")
    if any(c.isspace() for c in token):
        article = "an" if what[:1] in "AEIOU" else "a"
        raise CliError(f"That does not look like {article} {what} (it contains spaces or line breaks).",
                       f"Copy just the token from {page} (one line), then run `{command}` again.")
    return token
