"""The chat helpers' JSON-lines channel: commands on stdin ({"op": "query" | "reset" | "sampler" | "abort" |
"quit", ...}), one JSON object a line, read on a thread so that "abort" reaches a reply while it is being
generated; events on stdout (`emit`), one JSON object a line, whole whichever thread writes it.

Standard library only, importing nothing of HexStudio's: it is copied to the board beside the helpers that use
it (genie_session.py, geniex_session.py: hexstudio.workers.board.helper_files), and the simulator's helpers
(hexstudio.workers.genie_sim.commands) use it too.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    """One event, a JSON line on stdout."""
    line = json.dumps(obj, ensure_ascii=True) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def bad_request(message: str) -> None:
    """The error event for a command the helper cannot take."""
    emit({"event": "error", "code": "bad_request", "message": message})


def read_commands(on_abort: Callable[[], None]) -> queue.Queue[dict[str, Any] | None]:
    """Start reading stdin on a thread: "abort" calls `on_abort` at once, every other command is queued in
    order, and None is queued at the end of input. A line that is not a JSON object is answered with
    bad_request."""
    ops: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def reader() -> None:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                bad_request("not a JSON line")
                continue
            if not isinstance(msg, dict):
                bad_request("not a JSON object")
            elif msg.get("op") == "abort":
                on_abort()
            else:
                ops.put(msg)
        ops.put(None)

    threading.Thread(target=reader, daemon=True).start()
    return ops
