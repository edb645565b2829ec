"""Issue 32, the Chat page with the simulator board: Enter sends; Regenerate keeps the earlier reply (‹ 1/2 ›)
and the one chosen is what the conversation continues from; Esc stops a streaming reply. Then the same keys on
a real X server (Xvfb, xdotool) at 150 % scaling on a 1280x720 screen, where the chat folds its side panels
and stays usable: Tab through the settings changes nothing, Enter sends, Esc stops."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import keep_screenshot, push_to_board, wait_until, window_on_run

pytestmark = pytest.mark.slow


def test_enter_regenerate_versions_and_esc(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, compiled_sim_run: Path
) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from hexstudio.core.genie.chat_store import ChatStore

    c, w = window_on_run(qtbot, tmp_path, compiled_sim_run, (1280, 720))
    run = c.manifest.run_dir

    async def scenario() -> None:
        await push_to_board(c, w)
        assert c.status("board").key == "passed", c.last_result and c.last_result.message
        w.show_stage("chat")
        ch: Any = w.pages["chat"]
        ch.refresh()
        ch.max_tokens.setValue(12)
        ch.input.setFocus()
        QTest.keyClicks(ch.input, "What is the capital of France?")
        QTest.keyClick(ch.input, Qt.Key.Key_Return)  # Enter sends
        await wait_until(lambda: ch.busy_chat, 10, "the message to be sent")
        await wait_until(lambda: not ch.busy_chat, 120, "the reply")
        first = ch.conversation.turns[-1]
        assert first.state == "complete" and first.reply, first
        assert ch.input.toPlainText() == ""
        # Regenerate: a second reply; the first is kept (‹ 2/2 ›) and can be chosen again
        ch.sampler_combo.setCurrentIndex(ch.sampler_combo.findData("thinking"))  # a different reply
        ch.transcript.bubbles[-1].regen_button.click()
        await wait_until(lambda: ch.busy_chat, 10, "the regeneration")
        await wait_until(lambda: not ch.busy_chat, 120, "the regenerated reply")
        bubble = ch.transcript.bubbles[-1]
        assert len(ch.transcript.bubbles) == 2 and len(bubble.versions) == 2
        assert bubble.version_label.text() == "2/2" and bubble.prev_button.isEnabled()
        second = ch.conversation.turns[-1].reply
        bubble.prev_button.click()
        assert bubble.version_label.text() == "1/2" and ch.conversation.turns[-1].reply == first.reply
        stored = ChatStore(run).load(ch.record.id)
        assert (
            stored is not None
            and stored.turns[-1].reply == first.reply
            and len(stored.turns[-1].versions) == 2
        )
        assert stored.turns[-1].versions[1]["reply"] == second
        keep_screenshot(w, "chat-regenerate-versions", tmp_path)
        # Esc stops a reply while it streams; what came so far is kept
        ch.max_tokens.setValue(300)
        QTest.keyClicks(ch.input, "Tell me a long story about a dragon.")
        QTest.keyClick(ch.input, Qt.Key.Key_Return)
        await wait_until(lambda: ch.busy_chat and len(ch.streamed) > 0, 120, "the reply to start streaming")
        QTest.keyClick(ch.input, Qt.Key.Key_Escape)
        await wait_until(lambda: not ch.busy_chat, 60, "the reply to stop")
        assert ch.conversation.turns[-1].state == "aborted", ch.conversation.turns[-1]
        assert "(stopped)" in ch.transcript.bubbles[-1].rendered_text()
        await ch.close_session()

    gui_loop.run_until_complete(scenario())
    assert json.loads((run / "chats" / "settings.json").read_text())["max_tokens"] == 300


def test_chat_keys_at_150_percent_on_1280x720_real_display(tmp_path: Path, compiled_sim_run: Path) -> None:
    """On a real X server at 150 % (853x480 device-independent pixels): Tab through the chat's settings changes
    nothing; Enter sends; Esc stops a streaming reply; the chat stays usable (side panels folded, the job dock
    hidden with Ctrl+J). The screens are looked at (docs/screenshots/chat-150pct-*.png)."""
    import shutil

    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from tests.gui.test_real_display import (
        conversations,
        quit_studio,
        screenshot,
        start_studio,
        stop,
        xdo,
        xvfb,
    )
    from tests.support.sim_runs import copy_run

    if not all(shutil.which(t) for t in ("Xvfb", "xdotool", "import")):
        pytest.skip("needs Xvfb, xdotool and ImageMagick (apt-get install xvfb xdotool imagemagick)")
    ws = tmp_path / "ws"
    run = copy_run(compiled_sim_run, ws)
    m = Workspace(ws).open_run(run.name)
    assert asyncio.run(Pipeline(m).run(only="board")).ok
    (run / "chats").mkdir(exist_ok=True)
    (run / "chats" / "settings.json").write_text(
        json.dumps({"max_tokens": 300, "template": "auto", "system": ""})
    )
    xdg = tmp_path / "xdg"
    (xdg / "HexStudio").mkdir(parents=True)
    (xdg / "HexStudio" / "HexStudio.conf").write_text(f"[recent]\nrun={run.name}\n")
    env = {
        **os.environ,
        "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg"),
        "XDG_CONFIG_HOME": str(xdg),
        "QT_SCALE_FACTOR": "1.5",
    }
    out = tmp_path / "screens"
    out.mkdir()

    def turns() -> list[dict[str, Any]]:
        return [t for c in conversations(run) if c["origin"] == "chat page" for t in c["turns"]]  # type: ignore

    with xvfb(1280, 720) as display:
        proc, win = start_studio(display, ws, env)
        try:
            xdo(display, "windowfocus", "--sync", win)
            xdo(display, "key", "alt+7")  # the Chat page; the message box has the focus
            time.sleep(1.0)
            xdo(display, "key", "Tab", "Tab", "Tab")  # Send, (Stop is off), Chats, Settings
            xdo(display, "key", "space")  # open the folded settings
            time.sleep(0.5)
            screenshot(display, "chat-150pct-settings-open", out)
            for _ in range(9):  # through runtime, template, system prompt, ... unchanged
                xdo(display, "key", "Tab")
                time.sleep(0.15)
            xdo(display, "key", "Escape")  # back to the message box
            time.sleep(0.3)
            xdo(display, "type", "--delay", "20", "Tell me a long story about a dragon.")
            xdo(display, "key", "Return")  # Enter sends: the turn is kept as soon as it is sent
            deadline = time.monotonic() + 60
            while not turns():
                assert time.monotonic() < deadline, conversations(run)
                time.sleep(0.1)
            deadline = time.monotonic() + 120
            while turns()[-1].get("state") != "streaming":  # kept in the run as soon as the reply starts
                assert time.monotonic() < deadline and turns()[-1].get("state") == "pending", turns()
                time.sleep(0.05)
            xdo(display, "key", "Escape")  # Esc stops the reply; what came so far is kept
            screenshot(display, "chat-150pct-streaming", out)
            deadline = time.monotonic() + 60
            while turns()[-1].get("state") in ("pending", "streaming"):
                assert time.monotonic() < deadline, turns()
                time.sleep(0.3)
            time.sleep(0.8)
            screenshot(display, "chat-150pct-after-esc", out)
            xdo(display, "key", "ctrl+j")  # View → Job hides the job dock: the chat gets its room
            time.sleep(0.8)
            screenshot(display, "chat-150pct-dock-hidden", out)
            assert quit_studio(display, proc), "Ctrl+Q did not quit the studio"
        finally:
            stop(proc)
    t = turns()
    assert len(t) == 1 and t[0]["user"] == "Tell me a long story about a dragon."
    assert t[0]["state"] == "aborted" and t[0]["reply"], t[0]  # stopped mid-reply, the text so far kept
    assert len([c for c in conversations(run) if c["origin"] == "chat page"]) == 1  # Tab started no new chat
    kept = json.loads((run / "chats" / "settings.json").read_text())
    assert kept["system"] == "" and kept["max_tokens"] == 300
