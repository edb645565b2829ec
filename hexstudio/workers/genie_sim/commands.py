"""The chat helpers' command channel: one JSON object a line on stdin ({"op": "query" | "reset" | "sampler" |
"abort" | "quit", ...}), read on a thread so that "abort" reaches a reply while it is being generated, and the
events they answer with, one JSON object a line on stdout (`emit`).

Used by the simulator's helpers (session.py for Genie's dialog, geniex.py for GenieX). The board's helpers
(hexstudio/workers/board/*_session.py) keep their own copy: each is copied to the board alone and imports nothing of ours.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

Emit = Callable[[dict[str, Any]], None]
OnText = Callable[..., None]  # on_text(text, tokens=1): one "text" event of the query being answered

_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    """One event, a JSON line on stdout (whole, whichever thread writes it)."""
    line = json.dumps(obj, ensure_ascii=True) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def read_commands(
    emit: Emit,
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


def serve_commands(
    emit: Emit,
    reset: Callable[[], None],
    apply_sampler: Callable[[dict[str, Any]], Any],
    query: Callable[[dict[str, Any], OnText, Callable[[], bool]], dict[str, Any] | None],
) -> int:
    """Answer the commands on stdin until "quit" or the end of input (returns 0): "reset" and "sampler" on the
    loaded dialog, "query" through `query(msg, on_text, aborted)`, which streams the reply with on_text and
    returns the rest of its "end" event (None: it has answered otherwise, e.g. with an error event)."""
    ops, abort = read_commands(emit)
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
            emit({"event": "error", "code": "bad_request", "message": f"unknown op {op!r}"})
