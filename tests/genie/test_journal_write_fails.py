"""A chat journal that cannot be written (the disk filled, the run folder went) loses its own lines, not the reply:
record raised inside send(), so a reply that completed was shown as failed, and a journal that could not be made
left a loaded session neither stored nor closed."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hexstudio.core.genie.journal import ChatJournal


def _journal(run: Path) -> ChatJournal:
    """A chat journal of a session on the simulator board, in `run`."""
    session = SimpleNamespace(
        board=SimpleNamespace(name="sim"),
        mode="persistent",
        conversation=SimpleNamespace(template="plain"),
        sampler="deterministic",
        sampler_values=None,
        fallback_reason=None,
    )
    return ChatJournal(run, session, "sim")  # type: ignore[arg-type]


def _turn(user: str) -> SimpleNamespace:
    """A complete turn as ChatSession.send returns it."""
    return SimpleNamespace(
        state="complete",
        mode="persistent",
        simulated=True,
        kpis=None,
        first_chunk_ms=1.0,
        wall_ms=2.0,
        note=None,
        error=None,
        turn=SimpleNamespace(user=user),
        text="hello",
    )


def test_a_journal_write_that_fails_is_logged_once_and_the_turn_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    j = _journal(tmp_path / "run")
    turn = _turn("hi")
    j.record(turn)  # type: ignore[arg-type]
    assert j.path.is_file() and not j.failed
    shutil.rmtree(tmp_path / "run")  # the run folder went
    j.record(turn)  # type: ignore[arg-type]
    j.record(turn)  # type: ignore[arg-type]
    assert j.failed and j.turns == 3
    assert sum("chat journal" in r.getMessage() for r in caplog.records) == 1


def test_a_turn_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    """A full disk mid-line left a torn line; once there was room again the next turn was glued onto it, and the
    reader skipped both: that turn vanished from the conversation. It starts on a line of its own now."""
    from hexstudio.core.genie.journal import read_journals

    j = _journal(tmp_path / "run")
    j.record(_turn("first"))  # type: ignore[arg-type]
    with open(j.path, "a", encoding="utf-8") as f:
        f.write('{"type": "turn", "user": "torn')  # the disk filled here
    j.record(_turn("after"))  # type: ignore[arg-type]
    (session_doc,) = read_journals(tmp_path / "run")
    assert [t["user"] for t in session_doc["turns"]] == ["first", "after"]
