"""Boards by name: `sim` (the built-in simulator board) or one configured in settings."""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hexstudio.core.device.errors import BoardError
from hexstudio.core.device.transport import LocalTransport
from hexstudio.core.paths import WORKERS_ROOT, default_workspace
from hexstudio.shared.python_command import python_command

if TYPE_CHECKING:
    from typing import Unpack  # 3.11; annotations only (the studio runs on 3.10 too)

    from hexstudio.core.device.connect import SshAsks

log = logging.getLogger("hexstudio.board")

__all__ = ["Board", "BoardError", "open_board", "python_env", "sim_board"]


@dataclass
class Board:
    name: str
    transport: Any
    simulated: bool
    genie_command: list[str] = field(default_factory=list)  # genie-t2t-run, or the simulator
    env_script: str | None = None  # QAIRT environment script on the board
    config: dict[str, Any] = field(default_factory=dict)  # the board's settings entry
    state: str = "ready"  # connecting | ready | failed

    async def reconnect(self, timeout: float = 300.0, interval: float = 2.0) -> None:
        """After a reboot: wait for sshd to come back and log in again (same host-key checks)."""
        import asyncio
        import time

        from hexstudio.core.device.connect import connect_ssh

        if self.simulated:
            return
        with contextlib.suppress(Exception):
            await self.transport.close()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.transport = await connect_ssh(self.name, self.config, timeout=10)
                self.state = "ready"
                return
            except BoardError as exc:
                if "host key" in exc.message.lower():
                    raise
                last = exc
            await asyncio.sleep(interval)
        self.state = "failed"
        raise BoardError(
            f"Board '{self.name}' did not come back within {int(timeout)} s.",
            f"Check its power and network. Last error: {getattr(last, 'message', last)}",
        )

    @property
    def label(self) -> str:
        return str(self.transport.label)


def sim_board(workspace: Path | None = None) -> Board:
    root = (workspace or default_workspace()) / "sim-board" / "home"
    return Board(
        "sim", LocalTransport(root), True, genie_command=python_command("hexstudio.workers.genie_sim.t2t")
    )


async def open_board(
    name: str,
    settings: Any = None,
    workspace: Path | None = None,
    *,
    on_state: Callable[[str, str], None] | None = None,
    **asks: Unpack[SshAsks],
) -> Board:
    """`asks` (hexstudio.core.device.connect.SshAsks) answer what connecting needs from the person: without
    `trust` an unknown host key raises HostKeyUnknown (a BoardError with .fingerprint)."""
    boards = getattr(settings, "boards", {}) if settings is not None else {}
    if name == "sim":
        # without a workspace, the one the studio and the run stages use: settings.json's "workspace" counts
        configured = getattr(settings, "data", {}).get("workspace") if settings is not None else None
        b = sim_board(workspace or default_workspace(configured))
        runtime = (boards.get("sim") or {}).get("runtime")  # the simulator board speaks genie and geniex
        if runtime:
            b.config = {"runtime": str(runtime)}
        return b
    if name not in boards:
        raise BoardError(
            f"No board named '{name}'.",
            f"Add it: `hexstudio board add {name} --host HOST --user USER --key ~/.ssh/id_ed25519` (or --auth "
            "agent, or --auth password), or the studio's Board page; or use the simulator board 'sim'.",
        )
    from hexstudio.core.device.connect import connect_ssh

    cfg = dict(boards[name])
    runner = cfg.get("runner") or "genie"  # "simulator": HexStudio's simulator installed on this board
    if runner not in ("genie", "simulator"):
        raise BoardError(
            f"Board '{name}' has runner '{runner}', which HexStudio does not know.",
            "Set the board's runner to 'genie' (Qualcomm's genie-t2t-run) or 'simulator'.",
        )
    where = f"{cfg.get('user') or '?'}@{cfg.get('host') or name}:{cfg.get('port') or 22}"
    log.info("board %s: connecting to %s (auth %s)", name, where, cfg.get("auth") or "default")
    try:
        t = await connect_ssh(name, cfg, on_state=on_state, **asks)
    except BoardError as exc:
        log.warning("board %s: connection to %s failed: %s: %s", name, where, exc.code, exc.message)
        raise
    log.info("board %s: connected (%s)", name, where)
    home = await t.home()
    if runner == "simulator":
        genie = cfg.get("genie_command") or [
            str(cfg.get("python") or "python3"),
            "-m",
            "hexstudio.workers.genie_sim.t2t",
        ]
        return Board(name, t, True, genie_command=_argv(genie), config=cfg)
    genie = cfg.get("genie_command") or ["genie-t2t-run"]
    return Board(name, t, False, genie_command=_argv(genie), env_script=f"{home}/qairt-env.sh", config=cfg)


def _argv(command: Any) -> list[str]:
    """A board's genie_command as settings.json holds it: a list of words, or one command line (split as a shell
    splits it; list() of a string made a command of its letters)."""
    return shlex.split(command) if isinstance(command, str) else [str(w) for w in command]


def on_this_machine(board: Board) -> bool:
    """Whether the board's programs run here (the studio's own simulator board), not over SSH."""
    return isinstance(board.transport, LocalTransport)


def python_env() -> dict[str, str]:
    """Make `python -m hexstudio.workers...` importable for the simulator board."""
    return {"PYTHONPATH": str(WORKERS_ROOT)}
