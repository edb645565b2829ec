"""Boards by name: `sim` (the built-in simulator board) or one configured in settings."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.device.transport import LocalTransport
from app.core.paths import REPO_ROOT, default_workspace


class BoardError(Exception):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass
class Board:
    name: str
    transport: Any
    simulated: bool
    genie_command: list[str] = field(default_factory=list)   # genie-t2t-run, or the simulator
    env_script: str | None = None                            # QAIRT environment script on the board

    @property
    def label(self) -> str:
        return str(self.transport.label)


def sim_board(workspace: Path | None = None) -> Board:
    root = (workspace or default_workspace()) / "sim-board" / "home"
    return Board("sim", LocalTransport(root), True,
                 genie_command=[sys.executable, "-m", "workers.genie_sim.t2t"])


async def open_board(name: str, settings: Any = None, workspace: Path | None = None) -> Board:
    if name == "sim":
        return sim_board(workspace)
    boards = getattr(settings, "boards", {}) if settings is not None else {}
    if name not in boards:
        raise BoardError(f"No board named '{name}'.",
                         "Add it on the Board page (host, user, key), or use the simulator board 'sim'.")
    raise BoardError(f"Connecting to '{name}' over SSH is not available in this build.",
                     "Use the simulator board 'sim' for now.")


def python_env() -> dict[str, str]:
    """Make `python -m workers...` importable for the simulator board."""
    return {"PYTHONPATH": str(REPO_ROOT)}
