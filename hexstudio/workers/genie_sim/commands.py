"""The chat helpers' command channel: one JSON object a line on stdin ({"op": "query" | "reset" | "sampler" |
"abort" | "quit", ...}), read on a thread so that "abort" reaches a reply while it is being generated.

Used by the simulator's helpers (session.py for Genie's dialog, geniex.py for GenieX). The board's helpers
(hexstudio/workers/board/*_session.py) keep their own copy: each is copied to the board alone and imports nothing of ours.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any


def read_commands(
    emit: Callable[[dict[str, Any]], None],
) -> tuple[queue.Queue[dict[str, Any] | None], threading.Event]:
    """Start reading stdin: "abort" sets the returned event at once, every other command is queued in order, and
    None is queued at the end of input. A line that is not JSON is answered with a bad_request error event."""
    ops: queue.Queue[dict[str, Any] | None] = queue.Queue()
    abort = threading.Event()

    def reader() -> None:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                emit({"event": "error", "code": "bad_request", "message": "not a JSON line"})
                continue
            if msg.get("op") == "abort":
                abort.set()
            else:
                ops.put(msg)
        ops.put(None)

    threading.Thread(target=reader, daemon=True).start()
    return ops, abort
