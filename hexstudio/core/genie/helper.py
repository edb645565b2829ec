"""The chat helper as the studio sees it: where it is copied on a board, and the running process.

The helper (hexstudio/workers/board/genie_session.py, or geniex_session.py) and the modules it imports are
copied to <home>/hexstudio/bin/<digest>/, a folder named by their content, and run from the bundle folder; it
answers JSON lines on stdout (the protocol is in genie_session.py's docstring). ChatSession
(hexstudio.core.genie.session) decides when to start, query, reset and stop it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import posixpath
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hexstudio.core.device.board import Board
from hexstudio.core.genie.run import ensure_dir, remove_quietly

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # 3.11; annotations only (the studio runs on 3.10 too)

genie_log = logging.getLogger("hexstudio.genie.log")  # Genie's own log lines


def helper_dir(home: str, contents: Sequence[tuple[str, bytes]]) -> str:
    """<home>/hexstudio/bin/<digest>/: where a helper and its companions are copied on a board, one folder per
    content. Two studios (or two HexStudio versions) using one board then never replace a helper that the other
    is about to run, and a session whose helper is already there copies nothing."""
    h = hashlib.sha256()
    for name, data in contents:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return posixpath.join(home, "hexstudio", "bin", h.hexdigest()[:16])


async def push_helper(board: Board, files: Sequence[Traversable]) -> str:
    """Copy the helper program (files[0]) and the modules it imports to the board, unless they are there
    already; returns the program's path there. Raises OSError when the board refuses a folder or a file."""
    t = board.transport
    contents = [(src.name, src.read_bytes()) for src in files]
    bin_dir = helper_dir(await t.home(), contents)
    present = [await t.exists(posixpath.join(bin_dir, name)) for name, _ in contents]
    if not all(present):  # each file is written whole (then renamed): present means complete
        await ensure_dir(board, bin_dir)
        for name, data in contents:  # the program and the modules it imports, side by side
            await t.write_bytes(posixpath.join(bin_dir, name), data, 0o755)
        await _remove_old_helpers(board, bin_dir)
    return posixpath.join(bin_dir, contents[0][0])


HELPERS_KEPT_DAYS = 30


async def _remove_old_helpers(board: Board, bin_dir: str) -> None:
    """A new helper folder is a new HexStudio version (or helper set) on this board: the folders of others made
    over HELPERS_KEPT_DAYS days ago are removed then, or each version would leave its own for good. A version
    still in use copies its helper again the next time it finds the folder gone (kilobytes, once)."""
    root, own = posixpath.split(bin_dir)
    argv = ["find", "-H", root, "-mindepth", "1", "-maxdepth", "1", "-type", "d", "!", "-name", own]
    argv += ["-mtime", f"+{HELPERS_KEPT_DAYS}", "-exec", "rm", "-rf", "{}", "+"]
    await remove_quietly(board, argv, "old helper folders")


class HelperProcess:
    """The running helper: its JSON-lines events (Genie's own log lines kept apart), its stderr's tail, and a
    close that asks it to quit before it is terminated."""

    def __init__(self, proc: Any, on_log: Callable[[str, str], None] | None = None) -> None:
        self.proc = proc
        self.on_log = on_log
        self.log_lines: collections.deque[str] = collections.deque(maxlen=400)  # Genie's own log lines
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stderr = bytearray()
        self.alive = True
        self.queries = 0
        self._tasks = [asyncio.ensure_future(self._read_out()), asyncio.ensure_future(self._read_err())]

    async def _read_out(self) -> None:
        buf = b""
        try:
            while data := await self.proc.read_stdout():
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        ev = {"event": "noise", "line": line.decode("utf-8", "replace")}
                    # Genie's log (GenieLog): kept and shown, not a protocol event
                    if ev.get("event") == "log":
                        level, text = str(ev.get("level", "info")), str(ev.get("message", ""))
                        self.log_lines.append(f"[{level.upper()}] {text}")
                        genie_log.debug("%s: %s", level, text)
                        if self.on_log is not None:
                            self.on_log(level, text)
                        continue
                    self.events.put_nowait(ev)
        except Exception as exc:  # the connection dropped
            self.events.put_nowait({"event": "error", "code": "connection_lost", "message": str(exc)})
        self.alive = False
        self.events.put_nowait({"event": "eof"})

    async def _read_err(self) -> None:
        with contextlib.suppress(Exception):
            while data := await self.proc.read_stderr():
                self.stderr += data
                del self.stderr[:-8000]

    async def send(self, msg: dict[str, Any]) -> None:
        await self.proc.write_stdin((json.dumps(msg, ensure_ascii=True) + "\n").encode("ascii"))

    async def next_event(self, timeout: float | None) -> dict[str, Any]:
        return await asyncio.wait_for(self.events.get(), timeout)

    def stderr_tail(self) -> str:
        return bytes(self.stderr).decode("utf-8", "replace").strip()[-1500:]

    async def close(self, graceful: bool = True) -> None:
        if graceful and self.alive:
            with contextlib.suppress(Exception):
                await self.send({"op": "quit"})
                await self.proc.close_stdin()
                await asyncio.wait_for(self.proc.wait(), 5)
        if self.alive or not graceful:
            with contextlib.suppress(Exception):
                await self.proc.terminate()
        self.alive = False
        for t in self._tasks:
            t.cancel()
