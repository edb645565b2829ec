"""Small faults a review found on the pages, each with the steps that showed it: a doctor whose link drops, board
buttons that ignored a running stage, a run reopened under the pipeline, raw words in the history, an empty suite
choice, a value typed but not recorded before Ctrl+R, a damaged bundle.json, and a chat session left open at quit."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import (
    board_page_with_evk,
    select_board,
    studio_window,
    wait_until,
    window_on_gate_failed_run,
)


def _busy(c: Any, busy: bool) -> None:
    """The controller as a running stage leaves it (busy), without running one."""
    c._busy = busy
    c.busyChanged.emit(busy)


def test_a_doctor_whose_link_or_keyring_fails_says_so(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    """The doctor re-raises ConnectionLost and the keyring raises SecretStoreError: neither is a BoardError, and
    the probe task died without a word."""
    from hexstudio.core.device.transport import ConnectionLost
    from hexstudio.core.secrets import SecretStoreError

    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    page = w.pages["board"]
    for exc in (
        SecretStoreError("The keyring could not be read.", "Unlock it."),
        ConnectionLost("The connection to the board dropped.", "Check the cable."),
    ):

        async def fails(exc: Exception = exc) -> Any:
            raise exc

        page.open_selected = fails
        assert gui_loop.run_until_complete(page.probe()) == []
        assert str(exc.args[0]) in page.conn_label.text() and page.probe_button.isEnabled()
        assert f"FAILED: {exc.args[0]}" in page.console.toPlainText()


def test_board_buttons_follow_a_running_stage(qtbot: Any, tmp_path: Path) -> None:
    """Edit and Remove stayed greyed after a run ended (and enabled when it started with the board selected);
    Connect and Fix stayed enabled while the Board stage could be pushing to the board."""
    c, _w, page = board_page_with_evk(qtbot, tmp_path)
    select_board(page, "evk")
    page.show_doctor([{"id": "fastrpc_group", "title": "group", "status": "fail", "fix": "group_add"}])
    buttons = [page.edit_button, page.remove_button, page.probe_button, page.fix_buttons["group_add"]]
    assert all(b.isEnabled() for b in buttons)
    _busy(c, True)
    page.show_doctor([{"id": "fastrpc_group", "title": "group", "status": "fail", "fix": "group_add"}])
    buttons[-1] = page.fix_buttons["group_add"]
    assert not any(b.isEnabled() for b in buttons), [b.objectName() for b in buttons if b.isEnabled()]
    _busy(c, False)
    assert all(b.isEnabled() for b in buttons)


def test_the_working_run_is_not_reopened_from_the_runs_dialog(qtbot: Any, tmp_path: Path) -> None:
    """A double-click on the working run went around the disabled Open button, and open_run put a new manifest in
    place of the one the pipeline updates."""
    from hexstudio.ui.dialogs.runs import RunsDialog

    m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    before = c.manifest
    _busy(c, True)
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    d.table.selectRow(0)
    assert not d.open_button.isEnabled()
    d.table.doubleClicked.emit(d.table.model().index(0, 0))
    assert d.result() == 0 and d.isVisible() is False  # not accepted
    assert c.open_run(m.run_id) is before  # the same manifest: the pipeline's
    _busy(c, False)


def test_the_history_says_the_words_every_face_says(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.ui.dialogs.history import HistoryDialog

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    d = HistoryDialog(c, w)
    qtbot.addWidget(d)
    rows = {d.table.item(r, 1).text(): d.table.item(r, 2).text() for r in range(d.table.rowCount())}
    assert rows["stage evaluate"].startswith(c.status("evaluate").word), rows["stage evaluate"]
    assert c.status("evaluate").word == "gate failed"
    assert all("None" not in v and not v.startswith("done ") for v in rows.values()), rows


def test_unticking_the_last_suite_is_refused(qtbot: Any, tmp_path: Path) -> None:
    """An empty list was saved, the page showed the default suites ticked, and Evaluate went stale for nothing."""
    from PySide6.QtCore import Qt

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    page = w.pages["evaluate"]

    def ticked() -> list[str]:  # the list is rebuilt on every change: read it afresh
        items = [page.suite_list.item(i) for i in range(page.suite_list.count())]
        return [i.data(Qt.ItemDataRole.UserRole) for i in items if i.checkState() == Qt.CheckState.Checked]

    def untick(name: str) -> None:
        for i in range(page.suite_list.count()):
            if page.suite_list.item(i).data(Qt.ItemDataRole.UserRole) == name:
                page.suite_list.item(i).setCheckState(Qt.CheckState.Unchecked)
                return

    *others, left = ticked()
    for name in others:
        untick(name)
    assert c.manifest.settings["eval_suites"] == [left] == ticked()
    untick(left)
    assert c.manifest.settings["eval_suites"] == [left] == ticked()  # kept, and shown so
    assert "at least one suite" in page.add_message.text()


def test_a_value_typed_before_ctrl_r_is_the_runs(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field records its value when editing ends; Ctrl+R does not end it, so the run started with the old one."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QSpinBox

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path, "validate")
    w.show()
    w.show_stage("quantize")
    page = w.pages["quantize"]
    box = page._setting_widgets["calibration_samples"]
    assert isinstance(box, QSpinBox)
    started: list[str] = []
    monkeypatch.setattr(c, "start", lambda until, **_kw: started.append(until))
    box.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is box)
    old = c.manifest.settings["calibration_samples"]
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, str(old + 3))
    assert c.manifest.settings["calibration_samples"] == old  # not recorded yet: editing goes on
    qtbot.keyClick(w, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyRelease(w, Qt.Key.Key_Control)  # Ctrl let go: Qt would hold it down for the tests after this one
    assert started and c.manifest.settings["calibration_samples"] == old + 3
    assert QApplication.focusWidget() is box  # the focus stays where the user was


def test_a_damaged_bundle_json_does_not_stop_the_refresh(qtbot: Any, tmp_path: Path) -> None:
    """A bare json.loads raised inside MainWindow.refresh: the pages after Compile and the gate bar stayed as they
    were."""
    from tests.support.gate_runs import finish_stage, gate_failed_run

    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    finish_stage(m, "compile", {})
    bundle = m.run_dir / "artifacts" / "compile" / "bundle"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "bundle.json").write_text('{"files": [')
    (m.run_dir / "artifacts" / "board").mkdir(parents=True, exist_ok=True)
    (m.run_dir / "artifacts" / "board" / "board.json").write_text("{")
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)  # refreshes every page
    assert not w.pages["compile"].open_bundle_button.isEnabled()
    assert w.pages["board"].push_label.text() == ""


def test_quitting_closes_the_chat_session_first(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    """closeEvent looked only at a running stage: the model's session on the board was left open."""
    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    chat = w.pages["chat"]
    closed: list[bool] = []

    async def close_session() -> None:
        await asyncio.sleep(0.05)
        closed.append(True)
        chat.chat.session = None

    chat.chat.session = object()  # a session is open
    chat.close_session = close_session
    w.show()

    async def quit_() -> None:
        w.close()
        assert w.isVisible() and not closed  # not yet: the session closes first
        await wait_until(lambda: not w.isVisible(), 10, "the window closing after the session")

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    app.setQuitOnLastWindowClosed(False)  # the test's loop goes on after the window closes
    try:
        gui_loop.run_until_complete(quit_())
    finally:
        app.setQuitOnLastWindowClosed(True)
    assert closed == [True]  # closed once, before the window went


def test_quitting_stops_a_board_fix_first(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """closeEvent looked at a running stage and the chat only: a Board-page fix under way (a QAIRT upload, a sudo
    step) was left pending when the loop stopped, and the studio stayed alive without a window until its thread
    ended. It is asked about and stopped first now."""
    from PySide6.QtWidgets import QApplication, QMessageBox

    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    asked: list[str] = []

    def question(_parent: Any, _title: str, text: str, *_a: Any) -> QMessageBox.StandardButton:
        asked.append(text)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", question)
    w.show()

    async def quit_() -> asyncio.Future[Any]:
        fix = asyncio.ensure_future(asyncio.sleep(3600))  # the upload under way
        w.pages["board"]._task = fix
        w.close()
        assert w.isVisible()  # not yet: the fix stops first
        await wait_until(lambda: not w.isVisible(), 10, "the window closing after the fix stopped")
        return fix

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    app.setQuitOnLastWindowClosed(False)
    try:
        fix = gui_loop.run_until_complete(quit_())
    finally:
        app.setQuitOnLastWindowClosed(True)
    assert fix.cancelled()
    assert asked and "A board check or fix is still working" in asked[0]


def test_an_unticked_box_is_seen_in_the_dark_theme(qtbot: Any) -> None:
    """Fusion outlines a check box in the window colour darkened: on a dark list's base an unticked suite showed no
    box at all (docs/screenshots/evaluate-last-suite-kept-dark.png)."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor, QPalette
    from PySide6.QtWidgets import QApplication, QListWidget, QListWidgetItem

    from hexstudio.ui import theme

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    theme.install(app)
    before = QPalette(app.palette())
    app.setPalette(theme.dark_palette())
    try:
        lw = QListWidget()
        qtbot.addWidget(lw)
        lw.resize(300, 80)
        item = QListWidgetItem("Perplexity on held-out text")
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Unchecked)
        lw.addItem(item)
        lw.show()
        img = lw.grab().toImage()
        rect = lw.visualItemRect(item)
        mid = theme.dark_palette().color(QPalette.ColorRole.Mid)
        box = [
            QColor(img.pixel(x, y))
            for x in range(rect.left(), rect.left() + 24)
            for y in range(rect.top(), rect.bottom())
        ]
        assert any(abs(c.lightness() - mid.lightness()) <= 12 and c.lightness() > 60 for c in box)
    finally:
        app.setPalette(before)


def test_quitting_while_the_model_loads_cancels_the_turn(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop ends token generation only: a turn still loading the model (minutes) went on, and the session it
    opened afterwards stayed open on the board when the studio had quit. Sent and quit as a person does."""
    from PySide6.QtWidgets import QApplication, QMessageBox

    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    chat = w.pages["chat"]
    events: list[str] = []

    async def loading(_user: str, _req: Any, _hooks: Any) -> Any:
        try:
            await asyncio.sleep(60)  # the model loading on the board
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def close_session() -> None:
        events.append("closed")

    monkeypatch.setattr(chat, "board_doc", lambda: {"remote_bundle": "/b", "board": "sim"})
    monkeypatch.setattr(chat, "_request", lambda _doc: None)
    monkeypatch.setattr(chat.chat, "run_turn", loading)
    monkeypatch.setattr(chat, "close_session", close_session)
    monkeypatch.setattr(QMessageBox, "question", lambda *_a, **_k: QMessageBox.StandardButton.Yes)
    chat.quit_grace_s = 0.2
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    app.setQuitOnLastWindowClosed(False)
    w.show()

    async def go() -> None:
        sending = asyncio.ensure_future(chat.send("hello"))
        await wait_until(lambda: chat.busy_chat, 5, "the turn to start")
        w.close()  # a reply is coming: asked, then the turn cancelled and the session closed
        await wait_until(lambda: not w.isVisible(), 10, "the window closing")
        with contextlib.suppress(asyncio.CancelledError):
            await sending

    try:
        gui_loop.run_until_complete(go())
    finally:
        app.setQuitOnLastWindowClosed(True)
    assert events == ["cancelled", "closed"] and not chat.busy_chat


def test_the_report_preview_is_laid_out_once_per_report(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every page refreshes at each stage's start and end (twice at the end), hidden ones too: the Report page read
    and laid out its report (up to a megabyte with every chat turn) each time, on the window's thread."""
    import time

    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    m = c.new_run("builtin:tiny-llama")
    w.open_run(m.run_id)
    page: Any = w.pages["report"]
    laid: list[int] = []
    real = page.preview.setHtml
    monkeypatch.setattr(page.preview, "setHtml", lambda h: (laid.append(1), real(h)))
    monkeypatch.setattr(page, "html_path", lambda: tmp_path / "report.html")
    (tmp_path / "report.html").write_text("<h1>tiny-llama report</h1>")
    page.refresh_results()
    page.refresh_results()
    page.refresh_results()
    assert len(laid) == 1 and "tiny-llama report" in page.preview.toPlainText()
    time.sleep(0.01)
    (tmp_path / "report.html").write_text("<h1>tiny-llama report, again</h1>")  # a new report: shown
    page.refresh_results()
    assert len(laid) == 2 and "again" in page.preview.toPlainText()
