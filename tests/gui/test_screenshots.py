"""The pages issue 24 changed, after real replies on the simulator board, at 1280x720 and 1600x1000 and in a
dark palette (docs/screenshots: HEXSTUDIO_SCREENSHOTS=docs/screenshots keeps them). Each screen is also
checked: the chat's message box, Send and Stop in view; the dark theme really dark."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import keep_screenshot, push_to_board, wait_until, window_on_run
from tests.gui.test_flow import assert_in_view

pytestmark = pytest.mark.slow


async def _keep(widget: Any, name: str, tmp: Path) -> Path:
    """Grab `widget` once the layouts have settled. The settling is an await, never processEvents(): under
    qasync that would run asyncio callbacks inside the running task ("Cannot enter into task"), and a chat
    helper's reader could lose its wake-up and the reply never end."""
    for _ in range(3):
        await asyncio.sleep(0.05)
    return keep_screenshot(widget, name, tmp)


def test_changed_pages_at_two_sizes_and_dark(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, compiled_sim_run: Path
) -> None:
    from hexstudio.ui import theme
    from hexstudio.ui.dialogs.about import AboutDialog
    from hexstudio.ui.dialogs.runs import RunsDialog

    c, w = window_on_run(qtbot, tmp_path, compiled_sim_run, (1280, 720))

    async def scenario() -> None:
        await push_to_board(c, w)
        ch: Any = w.pages["chat"]
        w.show_stage("chat")
        ch.max_tokens.setValue(32)
        for size, question in (
            ((1280, 720), "What is the capital of France?"),
            ((1600, 1000), "And the capital of Italy?"),
        ):
            w.resize(*size)
            ch.input.setPlainText(question)
            task = asyncio.ensure_future(ch.send())
            await wait_until(lambda: ch.busy_chat and len(ch.streamed) > 8, 120, "the reply to stream")
            assert_in_view(w, ch.input, ch.send_button, ch.stop_button)
            await _keep(w, f"chat-{size[0]}x{size[1]}-streaming", tmp_path)
            await asyncio.wait_for(task, 180)  # a reply that never ends is a failure, not a hang
            assert_in_view(w, ch.input, ch.send_button, ch.stop_button)
            await _keep(w, f"chat-{size[0]}x{size[1]}", tmp_path)
        try:
            w.set_theme("dark")
            assert theme.is_dark()
            for size in ((1600, 1000), (1280, 720)):
                w.resize(*size)
                await _keep(w, f"chat-{size[0]}x{size[1]}-dark", tmp_path)
            w.resize(1600, 1000)
            w.show_stage("compile")
            await _keep(w, "compile-1600x1000-dark", tmp_path)
            w.show_stage("report")
            # the report runs what it needs first (chat, evaluate on the twin); one suite, as a user may keep:
            # the default suites' Evaluate is tested by tests/e2e and tests/eval
            assert c.set_setting("eval_suites", ["greedy_parity"])
            w.pages["report"].run_button.click()
            await wait_until(lambda: not c.busy, 420, "the report stage")
            await _keep(w, "report-1600x1000-dark", tmp_path)
            d = RunsDialog(c, w)
            qtbot.addWidget(d)
            d.show()
            await _keep(d, "10-runs-dashboard-dark", tmp_path)
        finally:
            w.set_theme("light")
        d = RunsDialog(c, w)
        qtbot.addWidget(d)
        d.show()
        await _keep(d, "10-runs-dashboard", tmp_path)
        a = AboutDialog(c, w)
        qtbot.addWidget(a)
        a.show()
        await _keep(a, "11-about", tmp_path)
        await ch.close_session()
        w.set_theme("system")

    gui_loop.run_until_complete(scenario())
