"""The Chat page when things go wrong around a reply (the Chat page's review): another run opened while a
Regenerate waits for the old session to close, an export to a folder that cannot be written."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.core.test_chat_controller import Board, FakeSession


class SlowCloseBoard(Board):
    """Sessions whose close waits until `closed_may` is set; `closing` is set when one starts closing. Records the
    context length and run each session was opened with."""

    def __init__(self) -> None:
        super().__init__()
        self.closing, self.closed_may = asyncio.Event(), asyncio.Event()
        self.opened_with: list[tuple[int, Path | None]] = []

    async def connect(self, conversation: Any, mode: str, req: Any) -> Any:
        self.opened_with.append((conversation.context_length, req.run_dir))
        opened = await super().connect(conversation, mode, req)
        session: FakeSession = opened.session
        board = self

        async def slow_close() -> None:
            board.closing.set()
            await board.closed_may.wait()
            session.closed = True

        session.close = slow_close  # type: ignore[method-assign]
        return opened


def _page_on(qtbot: Any, tmp_path: Path) -> tuple[Any, Any]:
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.pages.chat import ChatPage

    c = RunController(Workspace(tmp_path / "ws"))
    c.new_run("builtin:tiny-llama", overrides={"context_length": 512})
    page = ChatPage(c)
    qtbot.addWidget(page)
    page.refresh()
    page.board_doc = lambda: {"board": "sim", "remote_bundle": "/b"}
    return c, page


def test_another_run_opened_while_regenerate_waits_keeps_the_reply_on_its_own_run(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """Regenerate waits for the old session to close. Opening run B then (or changing Max tokens) set the
    conversation up from run B: its context length went into a session on run A's board and journal."""
    c, page = _page_on(qtbot, tmp_path)
    run_a = c.manifest.run_dir
    board = SlowCloseBoard()
    page.chat.connect = board.connect

    async def scenario() -> None:
        board.closed_may.set()
        await page.send("first")
        board.closed_may.clear()
        page.regenerate()
        await board.closing.wait()  # the new reply waits for the old session to close
        c.new_run("builtin:tiny-llama", overrides={"context_length": 2048})
        page.refresh()
        assert "shows it when this reply ends" in page.chat_message.text()
        page.max_tokens.setValue(page.max_tokens.value() + 8)  # the context meter renders again meanwhile
        assert page.conversation.context_length == 512
        board.closed_may.set()
        await page._regen
        await page.chat.wait_closed()

    gui_loop.run_until_complete(scenario())
    assert board.opened_with == [(512, run_a), (512, run_a)]
    # the reply was kept in run A; the page shows run B now
    from hexstudio.core.genie.chat_store import ChatStore

    (rec,) = ChatStore(run_a).conversations()
    assert [t.user for t in rec.turns] == ["first"] and len(rec.turns[0].versions) == 2
    assert page.chat.run_dir == c.manifest.run_dir != run_a and page.conversation.context_length == 2048


def test_a_message_asked_for_before_another_run_opened_is_not_sent_into_it(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """Regenerate schedules its message; a run opened before it goes out must not receive it."""
    c, page = _page_on(qtbot, tmp_path)
    run_a = c.manifest.run_dir
    board = Board()
    page.chat.connect = board.connect

    async def scenario() -> None:
        await page.send("first")
        page.regenerate()
        c.new_run("builtin:tiny-llama")
        await page._regen
        await page.chat.wait_closed()

    gui_loop.run_until_complete(scenario())
    assert "message was not sent" in page.chat_message.text()
    assert len(board.opened) == 1 and page.chat.run_dir == c.manifest.run_dir != run_a
    assert page.conversation.turns == [] and page.chat.conversations() == []
    from hexstudio.core.genie.chat_store import ChatStore

    (rec,) = ChatStore(run_a).conversations()
    assert [t.user for t in rec.turns] == ["first"]  # run A keeps its exchange


def test_export_says_where_it_wrote_and_why_it_could_not(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    _c, page = _page_on(qtbot, tmp_path)
    page.chat.connect = Board().connect
    gui_loop.run_until_complete(page.send("first"))
    not_a_folder = tmp_path / "notes.txt"  # a file where the folder should be: no one can write under it
    not_a_folder.write_text("x")
    target = [not_a_folder / "conversation.md"]
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *_a, **_k: (str(target[0]), ""))
    try:
        page.export_dialog()  # raised OSError inside the slot: nobody was told
        text = page.chat_message.text()
        assert "could not be written" in text and "File exists" in text and "export again" in text
        target[0] = tmp_path / "conversation.md"
        page.export_dialog()
        assert "Exported the conversation (1 reply) to" in page.chat_message.text()
        assert "echo: first" in target[0].read_text()
    finally:
        gui_loop.run_until_complete(page.chat.wait_closed())
