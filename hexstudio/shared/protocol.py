"""The worker protocol: one JSON object per line on stdout.

This module is the single definition of the protocol. Workers use `Emitter`
to write events; the studio's job runner uses `parse_event` to read them.
It must stay dependency-free (stdlib only): workers are copied to remote
hosts and run there with a bare Python.

Schema version 1. Every event carries:
    "v":    protocol version (int, currently 1)
    "type": one of EVENT_TYPES
    "t":    seconds since the epoch when the worker wrote it (float)
Per type (required fields first, then optional):
    progress  fraction (0..1 float), message (str), [part (int), parts (int)]
    log       message (str), [level: "debug"|"info"|"warn"|"error"]
    metric    name (str), value (number|str|bool|null), [unit (str), scope (str)]
    artifact  path (str, relative to the stage's output folder), [kind (str), role (str)]
    warning   message (str), [code (str), hint (str)]
    error     code (str), message (str), [hint (str)]
    done      ok (bool), [summary (object)]
A worker ends with exactly one `done`. A worker that exits without `done`
has failed, whatever its exit status.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import Any, TextIO

from hexstudio.shared.errors import ActionableError, error_fields

PROTOCOL_VERSION = 1

# How a worker knows its starter is alive (hexstudio/workers/runtime.py acts on them; hexstudio/core/jobs.py and the remote
# job set them): the environment variables the starter passes
PARENT_ENV = "HEXSTUDIO_PARENT_PID"  # the studio's pid: the worker dies with it (Linux parent-death signal)
LIVENESS_ENV = (
    "HEXSTUDIO_LIVENESS"  # "stdin": the starter holds our stdin open while it lives (a pipe locally,
)
# the SSH channel remotely); its end means the starter is gone

EVENT_TYPES = ("progress", "log", "metric", "artifact", "warning", "error", "done")

_REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "progress": {"fraction": (int, float), "message": (str,)},
    "log": {"message": (str,)},
    "metric": {"name": (str,), "value": (int, float, str, bool, type(None))},
    "artifact": {"path": (str,)},
    "warning": {"message": (str,)},
    "error": {"code": (str,), "message": (str,)},
    "done": {"ok": (bool,)},
}

LOG_LEVELS = ("debug", "info", "warn", "error")


class ProtocolError(ActionableError, ValueError):
    """A line from a worker that is not a valid event."""

    code = "protocol_error"


def parse_event(line: str | bytes) -> dict[str, Any]:
    """Parse and validate one protocol line. Raises ProtocolError with a reason."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"not UTF-8: {exc}") from None
    line = line.strip()
    if not line:
        raise ProtocolError("empty line")
    if line[0] != "{":
        raise ProtocolError("not a JSON object")
    try:
        ev = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"bad JSON: {exc.msg}") from None
    if not isinstance(ev, dict):
        raise ProtocolError("not a JSON object")
    v = ev.get("v")
    if v != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {v!r} (expected {PROTOCOL_VERSION})")
    etype = ev.get("type")
    req = _REQUIRED.get(etype) if isinstance(etype, str) else None
    if req is None:
        raise ProtocolError(f"unknown event type {etype!r}")
    for key, types in req.items():
        if key not in ev:
            raise ProtocolError(f"{etype} event lacks '{key}'")
        val = ev[key]
        # bool is an int subclass: keep fraction numeric-but-not-bool
        if isinstance(val, bool) and bool not in types:
            raise ProtocolError(f"{etype}.{key} has the wrong type")
        if not isinstance(val, types):
            raise ProtocolError(f"{etype}.{key} has the wrong type")
    if etype == "progress":
        f = float(ev["fraction"])
        if math.isnan(f) or f < 0.0 or f > 1.0:
            raise ProtocolError("progress.fraction must be within 0..1")
    return ev


class Emitter:
    """Writes protocol events to a stream (stdout by default). Thread-safe."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()

    def emit(self, etype: str, **fields: Any) -> None:
        ev: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": etype, "t": round(time.time(), 6)}
        ev.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(ev, ensure_ascii=False, separators=(",", ":"), default=str)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def progress(self, fraction: float, message: str = "", **extra: Any) -> None:
        self.emit("progress", fraction=min(1.0, max(0.0, float(fraction))), message=message, **extra)

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", message=message, level=level)

    def metric(self, name: str, value: Any, unit: str | None = None, scope: str | None = None) -> None:
        self.emit("metric", name=name, value=value, unit=unit, scope=scope)

    def artifact(self, path: str, kind: str | None = None, role: str | None = None) -> None:
        self.emit("artifact", path=path, kind=kind, role=role)

    def warning(self, message: str, hint: str | None = None, code: str | None = None) -> None:
        self.emit("warning", message=message, hint=hint, code=code)

    def error(self, code: str, message: str, hint: str | None = None) -> None:
        """The one error shape (hexstudio/shared/errors.py): the CLI's --json error carries the same fields."""
        self.emit("error", **error_fields(code, message, hint))

    def done(self, ok: bool, summary: dict[str, Any] | None = None) -> None:
        self.emit("done", ok=ok, summary=summary)


def event_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of one event, for documentation and tests."""
    base = {"v": {"const": PROTOCOL_VERSION}, "t": {"type": "number"}}
    variants = []
    props: dict[str, dict[str, Any]] = {
        "progress": {
            "fraction": {"type": "number", "minimum": 0, "maximum": 1},
            "message": {"type": "string"},
            "part": {"type": "integer"},
            "parts": {"type": "integer"},
        },
        "log": {"message": {"type": "string"}, "level": {"enum": list(LOG_LEVELS)}},
        "metric": {
            "name": {"type": "string"},
            "value": {"type": ["number", "string", "boolean", "null"]},
            "unit": {"type": "string"},
            "scope": {"type": "string"},
        },
        "artifact": {"path": {"type": "string"}, "kind": {"type": "string"}, "role": {"type": "string"}},
        "warning": {"message": {"type": "string"}, "code": {"type": "string"}, "hint": {"type": "string"}},
        "error": {"code": {"type": "string"}, "message": {"type": "string"}, "hint": {"type": "string"}},
        "done": {"ok": {"type": "boolean"}, "summary": {"type": "object"}},
    }
    for etype, p in props.items():
        variants.append(
            {
                "type": "object",
                "properties": {**base, "type": {"const": etype}, **p},
                "required": ["v", "type", *_REQUIRED[etype].keys()],
            }
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "HexStudio worker event",
        "oneOf": variants,
    }
