"""A board helper as the studio pushes it (hexstudio.core.genie.session `_start_helper`): the program and its
companion modules alone in one folder, run by a python that has only its standard library, as on a board."""

from __future__ import annotations

import sys
from pathlib import Path

from hexstudio.workers.board import helper_files


def push_helper(name: str, folder: Path) -> Path:
    """Copy helper_files(name) into `folder` (made here); returns the program's path."""
    folder.mkdir(parents=True)
    files = helper_files(name)
    for f in files:
        (folder / f.name).write_bytes(f.read_bytes())
    return folder / files[0].name


def board_python(script: Path, *args: str) -> list[str]:
    """The command line that runs `script` without PYTHONPATH (-E) or site-packages (-S): HexStudio is not
    importable, as on a board; the script's own folder is sys.path[0]."""
    return [sys.executable, "-E", "-S", str(script), *args]


def board_python_program(folder: Path) -> Path:
    """A python3 for a test board's "python" setting that, like board_python, has only its standard library:
    the pushed helpers then import their companions from <home>/hexstudio/bin/, as on a real board."""
    folder.mkdir(parents=True, exist_ok=True)
    prog = folder / "python3-stdlib"
    prog.write_text(f'#!/bin/sh\nexec "{sys.executable}" -E -S "$@"\n')
    prog.chmod(0o755)
    return prog
