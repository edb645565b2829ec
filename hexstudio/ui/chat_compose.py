"""The chat's middle column: the Chats and Settings toggles (shown on a narrow window), the board the chat runs on
(SIMULATED where it is), the transcript, the page's message line, and the message box with Send and Stop pinned
under it. In the message box Enter sends and Shift+Enter starts a new line (or, with "Enter sends" off, Enter is a
new line); Ctrl+Enter always sends. What sending means is the page's (`sendRequested`)."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.services.chat import kpi_line
from hexstudio.core.services.chat_controller import LiveSession, Notice, TurnOutcome
from hexstudio.ui.chat_view import MessageBubble, TranscriptView
from hexstudio.ui.errors import refused_html
from hexstudio.ui.widgets import STATE_COLORS, button, note, rich


def _toggle(text: str, name: str, tip: str) -> QPushButton:
    b = button(text, name, tip)
    b.setCheckable(True)
    return b


class ChatColumn(QWidget):
    sendRequested = Signal()  # Enter (as "Enter sends" says) or Ctrl+Enter in the message box

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chat_center")
        cl = QVBoxLayout(self)
        cl.setContentsMargins(4, 0, 4, 0)
        cl.setSpacing(4)
        self.board_label = rich(note(""))
        self.board_label.setObjectName("chat_board_label")
        head = QHBoxLayout()
        head.setSpacing(4)
        self.convs_toggle = _toggle(
            "Chats",
            "show_conversations",
            "Show or hide the conversations (the window is narrow, so they fold away)",
        )
        self.side_toggle = _toggle(
            "Settings",
            "show_chat_settings",
            "Show or hide the chat settings, context and rates (folded on a narrow window)",
        )
        head.addWidget(self.convs_toggle)
        head.addStretch(1)
        head.addWidget(self.side_toggle)
        cl.addLayout(head)
        cl.addWidget(self.board_label)
        self.transcript = TranscriptView()
        self.transcript.setMinimumHeight(90)
        cl.addWidget(self.transcript, 1)
        self.chat_message = rich(note(""))
        self.chat_message.setObjectName("chat_message")
        cl.addWidget(self.chat_message)
        cl.addLayout(self._message_row())
        self._enter_sends = True
        self.reply: MessageBubble | None = None  # the reply being written

    def _message_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.input = QPlainTextEdit()
        self.input.setObjectName("chat_input")
        self.input.installEventFilter(self)
        self.input.setMinimumHeight(52)
        self.input.setMaximumHeight(96)
        self.input.setTabChangesFocus(True)
        self.input.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.input.setFixedHeight(64)
        buttons = QVBoxLayout()
        buttons.setSpacing(4)
        self.send_button = button("Send", "send_button", "Send the message (Enter, or Ctrl+Enter)")
        self.send_button.setDefault(False)
        self.stop_button = button("Stop", "stop_button", "Stop the reply now (Esc; what came so far is kept)")
        self.stop_button.setEnabled(False)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        return row

    def tab_order(self) -> list[QWidget]:
        return [self.input, self.send_button, self.stop_button, self.convs_toggle, self.side_toggle]

    def set_enter_sends(self, enter: bool) -> None:
        """Whether Enter sends (Shift+Enter a new line) or is a new line (Ctrl+Enter sends); the placeholder says
        which."""
        self._enter_sends = enter
        self.input.setPlaceholderText(
            "Ask something… (Enter sends · Shift+Enter new line)"
            if enter
            else "Ask something… (Ctrl+Enter sends · Enter new line)"
        )

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:
        if (
            obj is self.input
            and ev.type() == QEvent.Type.KeyPress
            and isinstance(ev, QKeyEvent)
            and ev.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        ):
            mods = ev.modifiers()
            if mods & Qt.KeyboardModifier.ShiftModifier:
                self.input.insertPlainText("\n")
                return True
            if mods & Qt.KeyboardModifier.ControlModifier or self._enter_sends:
                self.sendRequested.emit()
                return True
        return super().eventFilter(obj, ev)

    def show_no_board(self, run_open: bool) -> None:
        self.board_label.setText(
            "Run the Board stage first: it pushes the bundle that chat runs."
            if run_open
            else "No run is open: create one on the Model page or open one (Ctrl+O)."
        )
        self.transcript.set_placeholder(
            ""
            if self.transcript.bubbles
            else "The Board stage pushes the bundle to the board; then ask here."
        )

    def show_board(self, doc: dict[str, Any], session: LiveSession | None) -> None:
        """The board the chat runs on; SIMULATED where the board record or what the runner itself reported says so
        (a simulator installed on an SSH board)."""
        simulated = bool(doc.get("simulated") or (session is not None and session.simulated))
        runner = session.runtime.title if session is not None else "the simulator board"
        label = str(doc.get("label"))
        badge = (
            f"<span style='color:{STATE_COLORS['stale']}'><b>SIMULATED</b> — {html.escape(runner)} on this "
            "CPU; its rates are not device results.</span>"
            if simulated
            else "<b>device</b>"
        )
        short = label if len(label) <= 48 else label[:22] + "…" + label[-22:]
        self.board_label.setText(f"Board <b>{html.escape(short)}</b> · {badge}")
        self.board_label.setToolTip(label)
        self.transcript.set_placeholder(
            "Ask something: the reply streams in here, with its token rate and KPIs."
        )

    def set_busy(self, busy: bool, can_send: bool) -> None:
        self.send_button.setEnabled(not busy and can_send)
        self.stop_button.setEnabled(busy)

    def say(self, notice: Notice) -> None:
        self.chat_message.setText(
            refused_html(notice.text, notice.hint) if notice.failed else html.escape(notice.text)
        )

    def begin_reply(
        self, user: str, on_regenerate: Callable[[], None], on_version: Callable[[int], None]
    ) -> MessageBubble:
        """The message sent, and under it the reply's bubble, streaming."""
        self.reply = self.transcript.begin_reply(user, on_regenerate, on_version)
        self.input.setFocus()
        return self.reply

    def stream(self, text: str) -> None:
        if self.reply is not None:
            self.transcript.stream(self.reply, text)

    def finish(self, out: TurnOutcome) -> None:
        """The reply as it ended, its KPIs under it, and what happened to it in the message line."""
        if self.reply is not None:
            self.transcript.finish(self.reply, out.shown)
            if out.kpis is not None:
                self.reply.set_kpis(kpi_line(out.kpis))
        if out.notice is not None:
            self.say(out.notice)

    def end_reply(self, versions: list[dict[str, Any]] | None) -> None:
        """The reply is settled: Regenerate's versions (the new one last) where it was one."""
        if versions and self.reply is not None:
            self.reply.set_versions(versions, len(versions) - 1)
        self.reply = None
