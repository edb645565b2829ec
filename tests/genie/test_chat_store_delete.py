"""A deleted conversation stays deleted: the journal or the Run Chat benchmark reply it was imported from is
not imported again by the next listing (it came back at once: the only record of the import was in the file
that was deleted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.core.genie.chat_store import ChatStore


def test_a_deleted_imported_conversation_does_not_come_back(tmp_path: Path) -> None:
    bench = tmp_path / "artifacts" / "chat" / "chat.json"
    bench.parent.mkdir(parents=True)
    bench.write_text(json.dumps({"prompt": "Hello", "reply": "Hi there.", "state": "complete", "kpis": {}}))
    store = ChatStore(tmp_path)
    (rec,) = store.conversations()
    assert rec.origin == "Run Chat benchmark"
    mine = store.new(title="mine")
    store.save(mine)
    store.delete(rec.id)
    assert [r.id for r in store.conversations()] == [mine.id]
    assert [r.id for r in ChatStore(tmp_path).conversations()] == [mine.id]
    # a new benchmark reply (the Chat stage ran again) is another conversation, imported as usual
    bench.write_text(json.dumps({"prompt": "Hello", "reply": "Hello!", "state": "complete", "kpis": {}}))
    assert len(store.conversations()) == 2


def test_a_deleted_run_is_not_made_again_by_its_open_chat(tmp_path: Path) -> None:
    """`hexstudio runs delete R` while R's chat was open: the next turn's save made runs/R/chats/... again, a
    folder no run list shows and `runs delete` refuses ("No run"), holding the conversation's text."""
    import pytest

    run = tmp_path / "runs" / "R"
    run.mkdir(parents=True)
    store = ChatStore(run)
    rec = store.new(title="mine")
    store.save(rec)
    import shutil

    shutil.rmtree(run)  # the run deleted from a terminal
    with pytest.raises(FileNotFoundError, match="the run R was deleted"):
        store.save(rec)
    with pytest.raises(FileNotFoundError):
        store.save_settings({})
    assert not run.exists()


def test_journals_imported_already_are_not_read_again(tmp_path: Path, monkeypatch: Any) -> None:
    """The conversation list is read again at each message's start and end: every chat journal of the run was
    parsed each time, megabytes for a run chatted with a lot, though those imported already were then passed over."""
    from hexstudio.core.genie import journal

    run = tmp_path / "run"
    (run / "chats").mkdir(parents=True)
    (run / "chats" / "20261129-120000-1-0001.jsonl").write_text(
        json.dumps({"type": "session", "board": "sim"})
        + "\n"
        + json.dumps({"type": "turn", "user": "hi"})
        + "\n"
    )
    read: list[str] = []
    real = journal._lines
    monkeypatch.setattr(journal, "_lines", lambda p: (read.append(p.name), real(p))[1])
    store = ChatStore(run)
    assert [r.title for r in store.conversations()] == ["hi"] and read == ["20261129-120000-1-0001.jsonl"]
    read.clear()
    assert [r.title for r in store.conversations()] == ["hi"] and read == []


def test_a_terminal_chat_imported_early_shows_its_later_turns(tmp_path: Path, monkeypatch: Any) -> None:
    """The Chat page imported a `hexstudio chat` session's journal the first time it listed the run's chats, and
    never read it again: the session's later turns, written while it ran on in the terminal, never showed. The
    record now follows its journal (new turns added to its end, its own edits kept); a journal that did not grow is
    not read; a conversation deleted stays deleted; the studio's own session is still no second conversation."""
    from hexstudio.core.genie import journal

    run = tmp_path / "run"
    (run / "chats").mkdir(parents=True)
    path = run / "chats" / "20261129-120000-1-0001.jsonl"

    def turn(user: str) -> str:
        return json.dumps({"type": "turn", "user": user, "reply": f"re: {user}", "state": "complete"}) + "\n"

    path.write_text(json.dumps({"type": "session", "board": "sim"}) + "\n" + turn("hi"))
    store = ChatStore(run)
    (rec,) = store.conversations()
    rec.turns[0].reply, rec.turns[0].versions = (
        "edited",
        [{"reply": "re: hi", "kpis": {}, "state": "complete"}],
    )
    store.save(rec)
    with open(path, "a", encoding="utf-8") as f:  # the terminal's session goes on
        f.write(turn("more"))
    (rec,) = store.conversations()
    assert [t.user for t in rec.turns] == ["hi", "more"] and rec.turns[1].reply == "re: more"
    assert rec.turns[0].reply == "edited" and rec.turns[0].versions  # the record's own edit is kept
    assert [t.user for t in ChatStore(run).load(rec.id).turns] == ["hi", "more"]  # and kept in its file
    read: list[str] = []
    real = journal._lines
    monkeypatch.setattr(journal, "_lines", lambda p: (read.append(p.name), real(p))[1])
    assert len(store.conversations()[0].turns) == 2 and read == []  # it did not grow: not read
    # the studio's own session: its journal is the open record's, never a conversation of its own
    own = store.new(title="mine")
    own_journal = run / "chats" / "20261129-130000-2-0002.jsonl"
    own_journal.write_text(json.dumps({"type": "session"}) + "\n" + turn("from the studio"))
    own.journals.append(own_journal.stem)
    store.save(own)
    with open(own_journal, "a", encoding="utf-8") as f:
        f.write(turn("again"))
    assert sorted(r.title for r in store.conversations()) == ["hi", "mine"]
    assert next(r for r in store.conversations() if r.title == "mine").turns == []
    # a conversation deleted stays deleted, however its journal grows
    store.delete(rec.id)
    with open(path, "a", encoding="utf-8") as f:
        f.write(turn("after the delete"))
    assert [r.title for r in store.conversations()] == ["mine"]
