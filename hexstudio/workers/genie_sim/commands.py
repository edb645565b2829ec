"""The simulator's chat helpers' command loop (session.py for Genie's dialog, geniex.py for GenieX): the commands
on stdin ({"op": "query" | "reset" | "sampler" | "abort" | "quit", ...}) answered with events on stdout, over
the JSON-lines channel the board's helpers use too (hexstudio.workers.board.helper_io: `emit`, the stdin
reader).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hexstudio.workers.board.helper_io import bad_request, emit, read_commands

OnText = Callable[..., None]  # on_text(text, tokens=1): one "text" event of the query being answered


def serve_commands(
    reset: Callable[[], None],
    apply_sampler: Callable[[dict[str, Any]], Any],
    query: Callable[[dict[str, Any], OnText, Callable[[], bool]], dict[str, Any] | None],
) -> int:
    """Answer the commands on stdin until "quit" or the end of input (returns 0): "reset" and "sampler" on the
    loaded dialog, "query" through `query(msg, on_text, aborted)`, which streams the reply with on_text and
    returns the rest of its "end" event (None: it has answered otherwise, e.g. with an error event)."""
    abort = threading.Event()
    ops = read_commands(abort.set)
    while True:
        msg = ops.get()
        if msg is None or msg.get("op") == "quit":
            return 0
        op = msg.get("op")
        if op == "reset":
            reset()
            emit({"event": "reset"})
        elif op == "sampler":  # per-request sampler values on the loaded dialog (no reload)
            given = msg.get("sampler")
            emit(
                {
                    "event": "sampler",
                    "applied": True,
                    "sampler": apply_sampler(given if isinstance(given, dict) else {}),
                }
            )
        elif op == "query":
            qid = msg.get("id")
            abort.clear()

            def on_text(text: str, tokens: int = 1, qid: Any = qid) -> None:
                emit({"event": "text", "id": qid, "text": text, "tokens": tokens, "mono": time.monotonic()})

            end = query(msg, on_text, abort.is_set)
            if end is not None:
                emit({"event": "end", "id": qid, **end})
        else:
            bad_request(f"unknown op {op!r}")
