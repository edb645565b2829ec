"""The Chat page's conversations, kept in the run: `<run>/chats/conversations/<id>.json`, one file per
conversation (title, template, system prompt, sampler, runtime, and every turn with its KPIs), written
atomically after each turn so reopening the run (or the studio) shows them again.

Chats the page did not make are listed too: the Chat stage's benchmark reply (artifacts/chat/chat.json) and
sessions of `hexstudio chat` found in the run's chat journals (hexstudio.core.genie.journal). They are turned into
conversation files the first time the list is read, so they can be read and continued like any other.

No Qt here: the page, its controller (hexstudio.core.services.chat) and the tests read the same records.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import write_text_atomic
from hexstudio.core.genie.journal import CHATS_DIR, read_journal, read_journals

FOLDER = "conversations"
DISMISSED_FILE = "dismissed.json"  # journals of deleted conversations: not imported again
SETTINGS_FILE = "settings.json"
TITLE_CHARS = 48
# the chat's settings kept per run (<run>/chats/settings.json), restored when the run is opened again
SETTING_KEYS = (
    "runtime",
    "dialog",
    "template",
    "thinking",
    "system",
    "max_tokens",
    "sampler_preset",
    "sampler",
    "enter_sends",
)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


@dataclass
class ChatTurn:
    user: str
    reply: str = ""
    state: str = "pending"  # pending | streaming | complete | aborted | failed
    kpis: dict[str, Any] = field(default_factory=dict)
    t: str = ""
    note: str | None = None
    error: str | None = None
    # earlier replies to the same message (Regenerate keeps them): [{"reply", "kpis", "state"}], oldest first;
    # the turn's own reply/kpis are the version shown (and the one the conversation continues from)
    versions: list[dict[str, Any]] = field(default_factory=list)
    version: int = 0  # which of versions the turn shows (== len(versions)-1 when present)


@dataclass
class ChatRecord:
    id: str
    title: str = "New chat"
    created: str = ""
    updated: str = ""
    origin: str = "chat page"  # chat page | Run Chat benchmark | hexstudio chat
    template: str = "auto"
    system: str = ""
    thinking: bool | None = None
    sampler: dict[str, Any] | None = None
    runtime: str | None = None
    dialog: str = "basic"  # Genie's dialog type the replies came from (basic, lade, spd)
    source: str | None = None  # simulated | device (of the replies)
    journals: list[str] = field(default_factory=list)
    # a `hexstudio chat` session's journal this record was imported from, and how much of it the record holds:
    # {stem: {"size": bytes, "turns": n}}; the session's later turns are added as it writes them
    followed: dict[str, dict[str, int]] = field(default_factory=dict)
    turns: list[ChatTurn] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ChatRecord:
        turns = [
            ChatTurn(**{k: v for k, v in t.items() if k in ChatTurn.__dataclass_fields__})
            for t in doc.get("turns") or []
            if isinstance(t, dict) and "user" in t
        ]
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__ and k != "turns"}
        return cls(**known, turns=turns)

    def retitle(self) -> None:
        if self.title in ("", "New chat") and self.turns:
            first = " ".join(self.turns[0].user.split())
            self.title = first if len(first) <= TITLE_CHARS else first[: TITLE_CHARS - 1] + "…"


def _chat_turn(t: dict[str, Any]) -> ChatTurn:
    """A journal's turn as a conversation holds it."""
    return ChatTurn(
        user=str(t.get("user") or ""),
        reply=str(t.get("reply") or ""),
        state=str(t.get("state") or "complete"),
        kpis=dict(t.get("kpis") or {}),
        t=str(t.get("t") or ""),
        note=t.get("note"),
        error=t.get("error"),
    )


class ChatStore:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.folder = run_dir / CHATS_DIR / FOLDER

    def path(self, cid: str) -> Path:
        return self.folder / f"{cid}.json"

    def new(self, **kw: Any) -> ChatRecord:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
        rec = ChatRecord(id=f"{stamp}-{uuid.uuid4().hex[:6]}", created=now(), updated=now(), **kw)
        return rec

    def _folder_of_a_live_run(self, folder: Path) -> None:
        """`folder` made where needed, inside a run that still exists: a run deleted meanwhile (`hexstudio runs delete`
        while its chat is open) gets no folder made again, which no run list would show and no delete could remove,
        holding the conversation's text."""
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"the run {self.run_dir.name} was deleted; the conversation is not saved")
        folder.mkdir(parents=True, exist_ok=True)

    def save(self, rec: ChatRecord) -> None:
        rec.updated = now()
        rec.retitle()
        self._folder_of_a_live_run(self.folder)
        # the conversation's text is the user's own: readable by them alone
        write_text_atomic(
            self.path(rec.id), json.dumps(rec.as_json(), indent=1, ensure_ascii=False), private=True
        )

    def load_settings(self) -> dict[str, Any]:
        """The chat settings last used in this run ({} when none were saved)."""
        try:
            doc = json.loads((self.run_dir / CHATS_DIR / SETTINGS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in doc.items() if k in SETTING_KEYS} if isinstance(doc, dict) else {}

    def save_settings(self, values: dict[str, Any]) -> None:
        folder = self.run_dir / CHATS_DIR
        self._folder_of_a_live_run(folder)
        write_text_atomic(
            folder / SETTINGS_FILE,
            json.dumps({k: values.get(k) for k in SETTING_KEYS}, indent=1, ensure_ascii=False),
            private=True,  # the system prompt is the user's own text
        )

    def delete(self, cid: str) -> None:
        """The conversation removed for good: the journals and benchmark reply it was made from are noted as
        dismissed, or the next listing would import them again as a conversation."""
        rec = self.load(cid)
        if rec is not None and rec.journals:
            dismissed = sorted(self._dismissed() | set(rec.journals))
            folder = self.run_dir / CHATS_DIR
            folder.mkdir(parents=True, exist_ok=True)
            write_text_atomic(folder / DISMISSED_FILE, json.dumps(dismissed, indent=1))
        self.path(cid).unlink(missing_ok=True)

    def _dismissed(self) -> set[str]:
        try:
            doc = json.loads((self.run_dir / CHATS_DIR / DISMISSED_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return set()
        return {str(x) for x in doc} if isinstance(doc, list) else set()

    def load(self, cid: str) -> ChatRecord | None:
        try:
            doc = json.loads(self.path(cid).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return ChatRecord.from_json(doc) if isinstance(doc, dict) else None

    def _records(self) -> list[ChatRecord]:
        out = []
        for p in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            rec = self.load(p.stem)
            if rec is not None:
                out.append(rec)
        return out

    def conversations(self) -> list[ChatRecord]:
        """Every conversation of the run, the most recently updated first (imports chats made elsewhere, and the
        turns a `hexstudio chat` session still running has written since its import)."""
        recs = self._records()
        self._follow(recs)
        known = {j for r in recs for j in r.journals} | self._dismissed()
        try:
            for rec in self._imports(known):
                self.save(rec)
                recs.append(rec)
        except OSError:  # a read-only run folder: list what is there
            pass
        return sorted(recs, key=lambda r: (r.updated, r.created), reverse=True)

    def _follow(self, recs: list[ChatRecord]) -> None:
        """Each imported journal that grew since: its new turns added to the end of the record (the record's own
        turns, edits and versions, are kept); a journal whose size is the same is not read."""
        for rec in recs:
            grew = False
            for stem, held in rec.followed.items():
                path = self.run_dir / CHATS_DIR / f"{stem}.jsonl"
                try:
                    if path.stat().st_size == held.get("size"):
                        continue
                except OSError:  # the journal was removed: the record stays as it is
                    continue
                j = read_journal(path)
                if j is None:
                    continue
                new = j["turns"][int(held.get("turns", 0)) :]
                rec.turns += [_chat_turn(t) for t in new]
                rec.followed[stem] = {
                    "size": j["size"],
                    "turns": max(int(held.get("turns", 0)), len(j["turns"])),
                }
                grew = True
            if grew:
                try:
                    self.save(rec)
                except OSError:  # a read-only run folder: listed from memory
                    pass

    def _imports(self, known: set[str]) -> list[ChatRecord]:
        out: list[ChatRecord] = []
        bench = self.run_dir / "artifacts" / "chat" / "chat.json"
        if bench.is_file():
            try:
                doc = json.loads(bench.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                doc = None
            if isinstance(doc, dict):
                digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:10]
                key = f"chat-stage:{digest}"
                if key not in known:
                    user = self._benchmark_prompt() or str(doc.get("prompt") or "")
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(bench.stat().st_mtime))
                    out.append(
                        ChatRecord(
                            id=f"run-chat-{digest}",
                            title=f"Run Chat: {user}"[: TITLE_CHARS + 10],
                            created=stamp,
                            updated=stamp,
                            origin="Run Chat benchmark",
                            source=doc.get("source"),
                            runtime=doc.get("runtime"),
                            journals=[key],
                            turns=[
                                ChatTurn(
                                    user=user,
                                    reply=str(doc.get("reply") or ""),
                                    state=str(doc.get("state") or "complete"),
                                    kpis=dict(doc.get("kpis") or {}),
                                    t=stamp,
                                )
                            ],
                        )
                    )
        for j in read_journals(self.run_dir, skip=known):  # those imported already are not parsed again
            head = j.get("session") or {}
            turns = [_chat_turn(t) for t in j["turns"]]
            stamp = str(head.get("started") or (turns[0].t if turns else now()))
            out.append(
                ChatRecord(
                    id=f"journal-{j['id']}",
                    created=stamp,
                    updated=stamp,
                    origin="hexstudio chat",
                    template=str(head.get("template") or "auto"),
                    sampler=head.get("sampler_values"),
                    source=next((t.get("source") for t in j["turns"] if t.get("source")), None),
                    journals=[j["id"]],
                    followed={j["id"]: {"size": j["size"], "turns": len(j["turns"])}},
                    turns=turns,
                )
            )
        return out

    def _benchmark_prompt(self) -> str | None:
        try:
            doc = json.loads((self.run_dir / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        v = ((doc.get("inputs") or {}).get("settings") or {}).get("benchmark_prompt")
        return str(v) if v else None
