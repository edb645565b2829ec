"""The chat journal: every turn of an interactive chat on a run's bundle, kept in the run for its report.

One JSON-lines file per chat session, `<run>/chats/<session>.jsonl`: a `session` line (board, mode, template,
sampler, simulated) and then one `turn` line per reply (state, KPIs with their source, time to the first
chunk, the texts). Lines are appended and flushed as turns end, so a killed studio loses at most the turn
in flight; a torn last line is skipped when read.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hexstudio.core.manifest import now_iso
from hexstudio.shared.journal import append_line

if TYPE_CHECKING:
    from hexstudio.core.genie.session import ChatSession, TurnResult

CHATS_DIR = "chats"
log = logging.getLogger("hexstudio.chat")


class ChatJournal:
    def __init__(self, run_dir: Path, session: ChatSession, board_label: str) -> None:
        folder = run_dir / CHATS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.path = folder / f"{stamp}-{os.getpid()}-{id(session) % 10_000:04d}.jsonl"
        self.session = session
        self.board_label = board_label
        self.turns = 0
        self._wrote_header = False
        self.failed = False  # a write failed: the journal misses turns (logged once)

    def _append(self, doc: dict[str, Any]) -> None:
        try:  # never in a folder made again: a run deleted meanwhile keeps no chat
            append_line(self.path, doc)
        except (
            OSError
        ) as exc:  # the disk filled or the folder went: the reply stands, the journal says it once
            if not self.failed:
                log.warning("chat journal %s not written: %s", self.path, exc)
            self.failed = True

    def record(self, r: TurnResult) -> None:
        s = self.session
        if not self._wrote_header:
            self._append(
                {
                    "type": "session",
                    "started": now_iso(),
                    "board": s.board.name,
                    "board_label": self.board_label,
                    "mode": s.mode,
                    "template": s.conversation.template,
                    "sampler": s.sampler,
                    "sampler_values": s.sampler_values,
                    "fallback_reason": s.fallback_reason,
                }
            )
            self._wrote_header = True
        self.turns += 1
        self._append(
            {
                "type": "turn",
                "n": self.turns,
                "t": now_iso(),
                "state": r.state,
                "mode": r.mode,
                "source": "simulated" if r.simulated else "device",
                "kpis": r.kpis.as_json() if r.kpis else None,
                "first_chunk_ms": r.first_chunk_ms,
                "wall_ms": round(r.wall_ms, 1),
                "note": r.note,
                "error": r.error,
                "user": r.turn.user,
                "reply": r.text,
            }
        )


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a torn last line after a crash
        if isinstance(doc, dict):
            yield doc


def read_journals(run_dir: Path, skip: Collection[str] = ()) -> list[dict[str, Any]]:
    """Every chat session of a run, oldest first: {"session": {...}, "turns": [...]}; sessions with no turn
    are left out, and those named in `skip` are not read at all."""
    out = []
    folder = run_dir / CHATS_DIR
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        if path.stem in skip:
            continue
        j = read_journal(path)
        if j is not None and j["turns"]:
            out.append(j)
    return out


def read_journal(path: Path) -> dict[str, Any] | None:
    """One chat session: {"id", "session", "turns", "size"} ("size": the file's bytes before it was read, so a turn
    written meanwhile shows as more to read); None when it cannot be read."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    header: dict[str, Any] = {}
    turns = []
    for doc in _lines(path):
        if doc.get("type") == "session":
            header = doc
        elif doc.get("type") == "turn":
            turns.append(doc)
    return {"id": path.stem, "session": header, "turns": turns, "size": size}
