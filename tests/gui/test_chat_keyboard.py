"""Issue 32, the Chat page's keyboard and state without a board (offscreen): Tab through the settings changes
nothing; a real change of the template or system prompt asks first when the chat has messages (and No puts
the old value back); Enter sends and Shift+Enter is a new line (shown in the placeholder, and switchable);
Copy says it copied; the context meter counts the model's context and never passes 100 %; the chat settings
are kept per run; a narrow window folds the side panels away behind two buttons. The same on a real X
server with a board: tests/gui/test_chat_real_keys.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from tests.gui.conftest import keep_screenshot


def _page(tmp_path: Path, qtbot: Any, turns: int = 0, words: int = 4) -> Any:
    from hexstudio.core.genie.chat_store import ChatStore, ChatTurn
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.pages.chat import ChatPage

    c = RunController(Workspace(tmp_path / "ws"))
    m = c.new_run("builtin:tiny-llama")
    if turns:
        store = ChatStore(m.run_dir)
        rec = store.new(template="auto", system="")
        rec.turns = [
            ChatTurn(
                user=f"question {i} " + "word " * words,
                reply="answer " + "word " * words,
                state="complete",
                kpis={"gen_tok_s": 30.0, "source": "simulated"},
            )
            for i in range(turns)
        ]
        store.save(rec)
    page = ChatPage(c)
    qtbot.addWidget(page)
    page.resize(1100, 650)
    page.show()
    page.refresh()
    return c, page


def _answer_question(button: str) -> list[str]:
    """Answer the page's "Start a new chat?" question when it comes up; returns what it said."""
    seen: list[str] = []

    def answer() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(50, answer)
            return
        seen.append(box.text())
        next(b for b in box.buttons() if b.text() == button).click()

    QTimer.singleShot(50, answer)
    return seen


def test_tab_through_the_settings_changes_nothing(qtbot: Any, tmp_path: Path) -> None:
    from PySide6.QtTest import QTest

    _c, page = _page(tmp_path, qtbot, turns=2)
    assert len(page.conversation.turns) == 2 and len(page.transcript.bubbles) == 4
    page.system_edit.setFocus()
    qtbot.waitUntil(page.system_edit.hasFocus, timeout=3000)
    for _ in range(6):  # Tab out of the empty system prompt and on through the settings
        focused = QApplication.focusWidget()
        assert focused is not None
        QTest.keyClick(focused, Qt.Key.Key_Tab)
    page.system_edit.editingFinished.emit()
    page.thinking_box.toggled.emit(False)
    assert len(page.conversation.turns) == 2 and len(page.transcript.bubbles) == 4
    assert "changed" not in page.chat_message.text()
    assert QApplication.activeModalWidget() is None


def test_a_real_change_asks_first_and_no_keeps_the_chat(qtbot: Any, tmp_path: Path) -> None:
    _c, page = _page(tmp_path, qtbot, turns=2)
    seen = _answer_question("Keep this chat")
    page.system_edit.setText("You are terse.")
    page.system_edit.editingFinished.emit()
    assert seen and "new chat" in seen[0]
    assert page.system_edit.text() == "" and len(page.transcript.bubbles) == 4  # the old value is back
    assert "Kept this chat" in page.chat_message.text()
    seen = _answer_question("New chat")
    page.template_combo.setCurrentText("plain")
    assert seen and not page.transcript.bubbles and not page.conversation.turns
    assert page.template_combo.currentText() == "plain" and "new chat started" in page.chat_message.text()
    # with no messages a change needs no question
    page.system_edit.setText("Be brief.")
    page.system_edit.editingFinished.emit()
    assert QApplication.activeModalWidget() is None and page.chat.applied.system == "Be brief."


def test_enter_sends_shift_enter_is_a_new_line(qtbot: Any, tmp_path: Path) -> None:
    from PySide6.QtTest import QTest

    _c, page = _page(tmp_path, qtbot)
    assert (
        "Enter sends" in page.input.placeholderText()
        and "Shift+Enter new line" in page.input.placeholderText()
    )
    sent: list[str] = []
    page.send_button.setEnabled(True)
    page.send_button.clicked.disconnect()
    page.send_button.clicked.connect(lambda: sent.append(page.input.toPlainText()))
    page.input.setFocus()
    QTest.keyClicks(page.input, "line one")
    QTest.keyClick(page.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(page.input, "line two")
    assert page.input.toPlainText() == "line one\nline two" and sent == []
    QTest.keyClick(page.input, Qt.Key.Key_Return)
    assert sent == ["line one\nline two"]
    # switched off: Enter is a new line and Ctrl+Enter sends; the placeholder says so
    page.enter_sends_box.setChecked(False)
    assert "Ctrl+Enter sends" in page.input.placeholderText()
    page.input.clear()
    QTest.keyClicks(page.input, "a")
    QTest.keyClick(page.input, Qt.Key.Key_Return)
    assert page.input.toPlainText() == "a\n" and len(sent) == 1


def test_copy_says_it_copied(qtbot: Any, tmp_path: Path) -> None:
    from PySide6.QtGui import QGuiApplication

    _c, page = _page(tmp_path, qtbot, turns=1)
    bubble = page.transcript.bubbles[-1]
    bubble.copy_button.click()
    assert bubble.copy_button.text() == "Copied ✓" and QGuiApplication.clipboard().text().startswith("answer")
    qtbot.waitUntil(lambda: bubble.copy_button.text() == "Copy", timeout=3000)
    page.copy_button.click()
    assert (
        page.copy_button.text() == "Copied ✓"
        and "Copied the conversation (1 reply)" in page.chat_message.text()
    )


def test_context_meter_counts_the_models_context_and_never_passes_100(qtbot: Any, tmp_path: Path) -> None:
    _c, page = _page(tmp_path, qtbot, turns=12, words=60)  # far more than the 512-token built-in model holds
    meter = page.context_meter
    assert meter.maximum() == 512, meter.format()
    assert meter.value() <= meter.maximum()
    pct = int(meter.format().split("(")[1].split("%")[0])
    assert pct <= 100
    assert "Full:" in page.context_label.text() and "left out" in page.context_label.text()
    page.new_chat()
    assert meter.maximum() == 512 and meter.format().startswith("0 / 512")  # a new chat: the model's context


def test_chat_settings_are_kept_per_run(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.ui.pages.chat import ChatPage

    c, page = _page(tmp_path, qtbot)
    page.max_tokens.setValue(99)
    page.max_tokens.editingFinished.emit()
    page.sampler_combo.setCurrentIndex(page.sampler_combo.findData("thinking"))
    page.system_edit.setText("Answer in French.")
    page.system_edit.editingFinished.emit()
    page.enter_sends_box.setChecked(False)
    again = ChatPage(c)
    qtbot.addWidget(again)
    again.refresh()
    assert again.max_tokens.value() == 99 and again.sampler_preset() == "thinking"
    assert again.system_edit.text() == "Answer in French." and not again.enter_sends_box.isChecked()
    assert (c.manifest.run_dir / "chats" / "settings.json").is_file()


def test_a_narrow_window_folds_the_side_panels(qtbot: Any, tmp_path: Path) -> None:
    _c, page = _page(tmp_path, qtbot, turns=2)
    assert page.convs_panel.isVisible() and page.side_panel.isVisible() and not page.side_toggle.isVisible()
    page.resize(820, 420)  # 1280x720 at 150 %, less the stage list
    qtbot.waitUntil(lambda: page.compact, timeout=3000)
    assert not page.convs_panel.isVisible() and not page.side_panel.isVisible()
    assert page.side_toggle.isVisible() and page.convs_toggle.isVisible()
    qtbot.waitUntil(lambda: page.transcript.width() > 500 and page.input.width() > 400, timeout=3000)
    page.side_toggle.click()
    assert page.side_panel.isVisible() and not page.convs_panel.isVisible()
    page.convs_toggle.click()
    assert page.convs_panel.isVisible() and not page.side_panel.isVisible()
    page.convs_toggle.click()
    keep_screenshot(page, "chat-narrow-folded", tmp_path)
