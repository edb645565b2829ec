"""Programs that run on the board (or beside it, for the simulator board): the chat helpers HexStudio copies
to a board and runs there (hexstudio.core.genie.session, runtime.py):

    genie_session    keeps one GenieDialog open through libGenie's C API (ctypes)
    geniex_session   the same JSON-lines protocol over the `geniex` Python package (qairt plugin)

Each runs on the board with the board's python3, standard library only, beside its companion modules: the
JSON-lines channel (helper_io) and, for genie_session, genie_config.json's path rules
(hexstudio.shared.genie_paths). Those import nothing of HexStudio's, so the board needs only the files
`helper_files` names. The studio never imports the helpers; it reads each file as package data
(importlib.resources) and writes them all to <home>/hexstudio/bin/<digest>/ on the board (a folder named by
their content: hexstudio.core.genie.helper.helper_dir), so an installed wheel carries them. On this machine
the same genie_session.py drives Qualcomm's x86 libGenie over the HTP simulator (hexstudio.workers.qnn), so the
board and the simulator board run one Genie driver.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

# each helper: the modules it imports, copied beside it (each module imports nothing of HexStudio's)
HELPERS: dict[str, tuple[str, ...]] = {
    "genie_session": ("hexstudio.workers.board.helper_io", "hexstudio.shared.genie_paths"),
    "geniex_session": ("hexstudio.workers.board.helper_io",),
}


def _module_file(module: str) -> Traversable:
    package, _, name = module.rpartition(".")
    return resources.files(package).joinpath(f"{name}.py")


def helper_files(name: str) -> tuple[Traversable, ...]:
    """The helper program `name` first (the one to run), then its companion modules: all written to one folder
    on the board (each one's .name and .read_bytes() are what a push needs)."""
    if name not in HELPERS:
        raise ValueError(f"no board helper named {name!r} (known: {', '.join(HELPERS)})")
    return tuple(_module_file(m) for m in (f"{__name__}.{name}", *HELPERS[name]))
