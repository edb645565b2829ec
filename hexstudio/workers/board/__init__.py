"""Programs that run on the board (or beside it, for the simulator board): the chat helpers HexStudio copies
to a board and runs there (hexstudio.core.genie.session, runtime.py):

    genie_session    keeps one GenieDialog open through libGenie's C API (ctypes)
    geniex_session   the same JSON-lines protocol over the `geniex` Python package (qairt plugin)

Each runs alone on the board with the board's python3: standard library only, importing nothing of
HexStudio's. The studio never imports them; it reads each file as package data (importlib.resources) and
writes it to <home>/hexstudio/bin/ on the board, so an installed wheel carries them. On this machine the
same genie_session.py drives Qualcomm's x86 libGenie over the HTP simulator (hexstudio.workers.qnn), so the board
and the simulator board run one Genie driver.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

HELPERS = ("genie_session", "geniex_session")


def helper_file(name: str) -> Traversable:
    """The helper program `name` (its .name and .read_bytes() are what a push needs)."""
    if name not in HELPERS:
        raise ValueError(f"no board helper named {name!r} (known: {', '.join(HELPERS)})")
    return resources.files(__name__).joinpath(f"{name}.py")
