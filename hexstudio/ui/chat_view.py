"""The chat transcript: message bubbles with Markdown, code blocks with their own Copy button, a folded
thinking section (Nemotron/Qwen `<think>…</think>`), and per-message KPIs, Copy and Regenerate.

A reply is re-rendered as it streams; only the bubble being written changes, at most 20 times a second."""

from __future__ import annotations

import contextlib
import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.genie.chat_store import ChatRecord
from hexstudio.core.services.chat import kpi_line, shown_reply

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_FENCE = re.compile(r"^```[ \t]*([\w+#.-]*)[ \t]*$", re.M)


@dataclass
class Reply:
    thinking: str | None  # None: no thinking section
    thinking_done: bool
    answer: str


def split_thinking(text: str) -> Reply:
    """`<think>…</think>answer` (Nemotron, Qwen3, DeepSeek-R1); a reply whose template opened the thinking
    block itself starts inside it and holds only `…</think>answer`."""
    s = text.lstrip()
    if s.startswith(THINK_OPEN):
        body = s[len(THINK_OPEN) :]
        if THINK_CLOSE in body:
            thought, answer = body.split(THINK_CLOSE, 1)
            return Reply(thought.strip(), True, answer.lstrip())
        return Reply(body.strip(), False, "")
    if THINK_CLOSE in s and THINK_OPEN not in s.split(THINK_CLOSE, 1)[0]:
        thought, answer = s.split(THINK_CLOSE, 1)
        return Reply(thought.strip(), True, answer.lstrip())
    return Reply(None, True, text)


def segments(text: str) -> list[tuple[str, str, str]]:
    """("text", markdown, "") and ("code", source, language) pieces; an unclosed fence (still streaming) is
    code up to the end."""
    out: list[tuple[str, str, str]] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            break
        before = text[pos : m.start()]
        if before.strip():
            out.append(("text", before.strip("\n"), ""))
        end = _FENCE.search(text, m.end())
        while end is not None and end.group(1):  # a closing fence has no language
            end = _FENCE.search(text, end.end())
        code_start = m.end() + 1 if text[m.end() : m.end() + 1] == "\n" else m.end()
        if end is None:
            out.append(("code", text[code_start:].rstrip("\n"), m.group(1)))
            return out
        out.append(("code", text[code_start : end.start()].rstrip("\n"), m.group(1)))
        pos = end.end()
    rest = text[pos:]
    if rest.strip() or not out:
        out.append(("text", rest.strip("\n"), ""))
    return out


def _wrap_label(text: str = "", fmt: Qt.TextFormat = Qt.TextFormat.MarkdownText) -> QLabel:
    lab = QLabel()
    lab.setTextFormat(fmt)
    lab.setText(text)
    lab.setWordWrap(True)
    lab.setTextInteractionFlags(
        Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse
    )
    lab.setOpenExternalLinks(True)
    lab.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
    return lab


def _tool(text: str, tip: str, name: str) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setToolTip(tip)
    b.setObjectName(name)
    b.setAutoRaise(True)
    b.setFocusPolicy(Qt.FocusPolicy.TabFocus)
    return b


def flash(button: QToolButton | QPushButton, text: str = "Copied ✓", ms: int = 1500) -> None:
    """Feedback on a button that does something invisible (Copy): its text says it happened, for a moment."""
    original = button.property("idle_text") or button.text()
    button.setProperty("idle_text", original)
    button.setText(text)

    def back() -> None:
        with contextlib.suppress(RuntimeError):  # the button was deleted meanwhile (a new chat)
            button.setText(str(button.property("idle_text")))

    QTimer.singleShot(ms, back)


class CodeBlock(QFrame):
    """A fenced code block: the language, a Copy button, the code in a monospaced font (never wrapped
    into the next line silently: long lines wrap anywhere)."""

    def __init__(self, code: str, lang: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("code_block")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(
            "QFrame#code_block { background: palette(base); border: 1px solid palette(mid); "
            "border-radius: 6px; }"
        )
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 2, 4, 6)
        lay.setSpacing(2)
        head = QHBoxLayout()
        self.lang = QLabel(lang or "code")
        self.lang.setStyleSheet("color: palette(placeholder-text);")
        head.addWidget(self.lang)
        head.addStretch(1)
        self.copy_button = _tool("Copy code", "Copy this code block", "copy_code")
        self.code: str = ""
        self.copy_button.clicked.connect(self.copy)
        head.addWidget(self.copy_button)
        lay.addLayout(head)
        self.body = _wrap_label("", Qt.TextFormat.PlainText)
        self.body.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.body.setWordWrap(True)
        lay.addWidget(self.body)
        self.set_code(code, lang)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        flash(self.copy_button)

    def set_code(self, code: str, lang: str) -> None:
        if code != self.code:
            self.code = code
            self.body.setText(code)
        self.lang.setText(lang or "code")


class MessageBubble(QFrame):
    """One message. The user's own in a tinted bubble on the right; the model's on the left with its
    thinking folded, its answer rendered from Markdown and a footer: KPIs, Copy, Regenerate."""

    regenerateRequested = Signal()
    versionChosen = Signal(int)  # Regenerate keeps the earlier replies: ‹ 1/2 › picks one

    def __init__(self, role: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.setObjectName(f"bubble_{role}")
        if role == "user":
            self.setStyleSheet(
                "QFrame#bubble_user { background: palette(highlight); border-radius: 10px; } "
                "QFrame#bubble_user QLabel { color: palette(highlighted-text); }"
            )
        else:
            self.setStyleSheet(
                "QFrame#bubble_assistant { background: palette(alternate-base); "
                "border: 1px solid palette(midlight); border-radius: 10px; }"
            )
        self.lay = QVBoxLayout(self)
        self.lay.setContentsMargins(12, 8, 12, 6)
        self.lay.setSpacing(4)
        self.text = ""
        self.streaming = False
        self.think_button: QToolButton | None = None
        self.think_label: QLabel | None = None
        self._parts: list[QWidget] = []
        self._kinds: list[str] = []
        self.content = QVBoxLayout()
        self.content.setSpacing(6)
        if role == "assistant":
            self.think_button = QToolButton()
            self.think_button.setObjectName("thinking_toggle")
            self.think_button.setCheckable(True)
            self.think_button.setAutoRaise(True)
            self.think_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            self.think_button.setArrowType(Qt.ArrowType.RightArrow)
            self.think_button.toggled.connect(self._fold)
            self.think_button.setVisible(False)
            self.lay.addWidget(self.think_button)
            self.think_label = _wrap_label("", Qt.TextFormat.PlainText)
            self.think_label.setObjectName("thinking_text")
            self.think_label.setStyleSheet("color: palette(placeholder-text); font-style: italic;")
            self.think_label.setVisible(False)
            self.lay.addWidget(self.think_label)
        self.lay.addLayout(self.content)
        self.footer = QHBoxLayout()
        self.footer.setSpacing(2)
        self.kpi_label = QLabel("")
        self.kpi_label.setObjectName("message_kpis")
        self.kpi_label.setTextFormat(Qt.TextFormat.PlainText)
        self.kpi_label.setWordWrap(True)
        self.kpi_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.kpi_label.setStyleSheet("color: palette(placeholder-text); font-size: 11px;")
        self.footer.addWidget(self.kpi_label, 1)
        self.copy_button = _tool("Copy", "Copy this message (Markdown)", "copy_message")
        self.copy_button.clicked.connect(self.copy)
        self.footer.addWidget(self.copy_button)
        self.regen_button: QToolButton | None = None
        self.versions: list[dict[str, Any]] = []  # {"reply", "kpis", "state"}; more than one after Regenerate
        self.version = 0
        self.prev_button = _tool("‹", "The earlier reply", "previous_version")
        self.next_button = _tool("›", "The later reply", "next_version")
        self.version_label = QLabel("")
        self.version_label.setObjectName("version_label")
        self.prev_button.clicked.connect(lambda: self._step(-1))
        self.next_button.clicked.connect(lambda: self._step(1))
        for w in (self.prev_button, self.version_label, self.next_button):
            w.setVisible(False)
            self.footer.addWidget(w)
        if role == "assistant":
            self.regen_button = _tool(
                "Regenerate", "Ask again: a new reply; the earlier ones are kept (‹ 1/2 ›)", "regenerate"
            )
            self.regen_button.clicked.connect(self.regenerateRequested.emit)
            self.footer.addWidget(self.regen_button)
        self.lay.addLayout(self.footer)
        self.set_text("")

    # -- content --------------------------------------------------------------------------------
    def answer(self) -> str:
        return split_thinking(self.text).answer if self.role == "assistant" else self.text

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.answer().strip())
        flash(self.copy_button)

    # -- versions (Regenerate keeps the earlier replies) ----------------------------------------------
    def set_versions(self, versions: list[dict[str, Any]], index: int, navigable: bool = True) -> None:
        self.versions = list(versions)
        self.version = max(0, min(index, len(self.versions) - 1))
        self._show_nav(navigable)

    def _show_nav(self, navigable: bool = True) -> None:
        many = len(self.versions) > 1
        for w in (self.prev_button, self.version_label, self.next_button):
            w.setVisible(many)
        self.version_label.setText(f"{self.version + 1}/{len(self.versions)}")
        self.prev_button.setEnabled(navigable and self.version > 0 and not self.streaming)
        self.next_button.setEnabled(
            navigable and self.version < len(self.versions) - 1 and not self.streaming
        )

    def _step(self, d: int) -> None:
        i = self.version + d
        if 0 <= i < len(self.versions):
            self.version = i
            v = self.versions[i]
            self.set_text(str(v.get("reply") or ""))
            self.set_kpis(str(v.get("kpi_line") or ""))
            self._show_nav()
            self.versionChosen.emit(i)

    def _fold(self, open_: bool) -> None:
        assert self.think_button is not None and self.think_label is not None
        self.think_button.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        self.think_label.setVisible(open_)

    def set_text(self, text: str, streaming: bool = False) -> None:
        self.text = text
        self.streaming = streaming
        if self.role == "user":
            pieces = [("plain", text, "")]
        else:
            r = split_thinking(text)
            assert self.think_button is not None and self.think_label is not None
            if r.thinking is not None:
                words = len(r.thinking.split())
                self.think_button.setText(
                    f"Thought ({words} words)" if r.thinking_done else f"Thinking… ({words} words)"
                )
                self.think_button.setVisible(True)
                self.think_label.setText(r.thinking)
            else:
                self.think_button.setVisible(False)
                self.think_label.setVisible(False)
            body = r.answer
            if not body.strip():
                body = "…" if streaming else ("" if r.thinking else "*(no reply)*")
            pieces = segments(body)
        kinds = [p[0] for p in pieces]
        if kinds != self._kinds:
            for w in self._parts:
                self.content.removeWidget(w)
                w.deleteLater()
            self._parts = []
            for kind, src, lang in pieces:
                part: QWidget
                if kind == "code":
                    part = CodeBlock(src, lang)
                else:
                    part = _wrap_label(
                        src, Qt.TextFormat.PlainText if kind == "plain" else Qt.TextFormat.MarkdownText
                    )
                    part.setObjectName("message_text")
                self.content.addWidget(part)
                self._parts.append(part)
            self._kinds = kinds
        else:
            for w, (_kind, src, lang) in zip(self._parts, pieces, strict=True):
                if isinstance(w, CodeBlock):
                    w.set_code(src, lang)
                elif isinstance(w, QLabel) and w.text() != src:
                    w.setText(src)
        if self.regen_button is not None:
            self.regen_button.setEnabled(not streaming)
        self.copy_button.setEnabled(not streaming)

    def set_kpis(self, text: str) -> None:
        self.kpi_label.setText(text)

    def rendered_text(self) -> str:
        """What the bubble shows (for tests): the labels' displayed text, thinking excluded."""
        out = []
        for w in self._parts:
            if isinstance(w, CodeBlock):
                out.append(w.code)
            elif isinstance(w, QLabel):
                out.append(_plain(w))
        return "\n".join(out)


def _plain(label: QLabel) -> str:
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument()
    if label.textFormat() == Qt.TextFormat.MarkdownText:
        doc.setMarkdown(label.text())
    else:
        doc.setPlainText(label.text())
    return doc.toPlainText()


class TranscriptView(QScrollArea):
    """The conversation as a column of bubbles; follows the newest text while it streams unless the
    person scrolled up to read."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        inner = QWidget()
        inner.setObjectName("transcript_body")
        self.col = QVBoxLayout(inner)
        self.col.setContentsMargins(10, 10, 10, 10)
        self.col.setSpacing(10)
        self.placeholder = QLabel("")
        self.placeholder.setObjectName("transcript_placeholder")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setStyleSheet("color: palette(placeholder-text);")
        self.col.addWidget(self.placeholder)
        self.col.addStretch(1)
        self.setWidget(inner)
        self.bubbles: list[MessageBubble] = []
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        self._pending: tuple[MessageBubble, str] | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(50)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._flush)

    def changeEvent(self, ev: QEvent) -> None:
        # style sheets read palette(...) when they are set: set them again in the new light or dark palette
        if ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            for w in self.widget().findChildren(QWidget):
                sheet = w.styleSheet()
                if sheet:
                    w.setStyleSheet("")
                    w.setStyleSheet(sheet)
        super().changeEvent(ev)

    def _scrolled(self, v: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = v >= bar.maximum() - 24

    def _range_changed(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)

    def set_placeholder(self, text: str) -> None:
        self.placeholder.setText(text)
        self.placeholder.setVisible(bool(text) and not self.bubbles)

    def clear(self) -> None:
        for b in self.bubbles:
            self.col.removeWidget(b.parentWidget() or b)
            (b.parentWidget() or b).deleteLater()
        self.bubbles = []
        self._pending = None
        self.placeholder.setVisible(bool(self.placeholder.text()))

    def add(
        self, role: str, text: str = "", on_regenerate: Callable[[], None] | None = None
    ) -> MessageBubble:
        b = MessageBubble(role)
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        if role == "user":
            rl.addStretch(1)
            rl.addWidget(b, 4)
        else:
            rl.addWidget(b, 12)
            rl.addStretch(1)
        if on_regenerate is not None:
            b.regenerateRequested.connect(on_regenerate)
        self.col.insertWidget(self.col.count() - 1, row)
        self.bubbles.append(b)
        self.placeholder.setVisible(False)
        b.set_text(text)
        self._follow = True
        return b

    def begin_reply(
        self, user: str, on_regenerate: Callable[[], None], on_version: Callable[[int], None]
    ) -> MessageBubble:
        """The message sent and under it the reply's bubble, streaming; the earlier replies' versions are fixed once
        the chat goes on."""
        self.add("user", user)
        for b in self.bubbles:
            if b.versions:
                b.set_versions(b.versions, b.version, navigable=False)
        bubble = self.add("assistant", "", on_regenerate=on_regenerate)
        bubble.versionChosen.connect(on_version)
        bubble.set_text("", streaming=True)
        return bubble

    def show_record(
        self, rec: ChatRecord, on_regenerate: Callable[[], None], on_version: Callable[[int], None]
    ) -> None:
        """A stored conversation: each reply as it ended, its KPIs, and its versions (‹ › on the last one)."""
        self.clear()
        for t in rec.turns:
            self.add("user", t.user)
            b = self.add("assistant", "", on_regenerate=on_regenerate)
            b.set_text(shown_reply(t))
            if t.versions:
                b.set_versions(t.versions, t.version, navigable=t is rec.turns[-1])
                b.versionChosen.connect(on_version)
            if t.kpis:
                b.set_kpis(kpi_line(t.kpis))

    def remove_last(self) -> None:
        if self.bubbles:
            b = self.bubbles.pop()
            row = b.parentWidget()
            if row is not None:
                self.col.removeWidget(row)
                row.deleteLater()

    def stream(self, bubble: MessageBubble, text: str) -> None:
        """The streamed text so far; drawn at most every 50 ms."""
        self._pending = (bubble, text)
        if not self._timer.isActive():
            self._timer.start()

    def _flush(self) -> None:
        if self._pending is not None:
            b, text = self._pending
            self._pending = None
            b.set_text(text, streaming=True)

    def finish(self, bubble: MessageBubble, text: str) -> None:
        self._timer.stop()
        self._pending = None
        bubble.set_text(text, streaming=False)

    def plain_text(self) -> str:
        out = []
        for b in self.bubbles:
            who = "You" if b.role == "user" else "Model"
            out.append(f"{who}: {b.rendered_text()}")
        return "\n".join(out)


def escape(text: str) -> str:
    return html.escape(text, quote=False)
