"""The Evaluate stage's journals: one JSON line per finished (leg, case key), fsynced, so a resumed run skips what
is done. Read by the studio (hexstudio.core.eval) and written by both the studio and the evaluate worker."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_journal(path: Path) -> dict[str, dict[str, Any]]:
    """ "leg\\0key" -> record; a torn last line (a crash mid-write) is skipped."""
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "key" in doc:
            out[f"{doc.get('leg')}\0{doc['key']}"] = doc
    return out


def done_keys(path: Path) -> set[tuple[str, str]]:
    """(leg, key) pairs already in the journal."""
    return {(str(d.get("leg")), str(d["key"])) for d in read_journal(path).values() if "leg" in d}


def append_journal(path: Path, doc: dict[str, Any]) -> None:
    """One record, on disk before this returns (a kill after it loses nothing), its folder made where needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, doc)


def append_line(path: Path, doc: dict[str, Any]) -> None:
    """One record, on disk before this returns. After a torn last line (a crash or a full disk mid-write) the record
    starts on a line of its own, so only the torn one is lost, never this one."""
    line = (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8")
    with open(path, "a+b") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = b"\n" + line
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
