"""Chat page, laid out as LM Studio and Jan are: the run's conversations on the left, the transcript in the
middle (message bubbles, Markdown, code blocks with Copy, the thinking folded, per-message KPIs, Copy and
Regenerate) with the message box and Send/Stop pinned under it, and the settings on the right (runtime,
template and thinking, system prompt, sampler, the context in use, the token-rate plots, the stage).

Replies stream in as tokens arrive; every conversation is kept in the run and shown again when the run is opened
later. The page lays out and wires its parts; each part has one job in its own module:
- hexstudio.core.services.chat: the Qt-free controller (the run's conversations, the session on the board and when it
  must load again, the context accounting),
- hexstudio.ui.chat_settings, chat_context, chat_kpis, chat_conversations: the side panels,
- hexstudio.ui.chat_view: the transcript."""

from __future__ import annotations

import asyncio
import html
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QGuiApplication, QKeyEvent, QKeySequence, QResizeEvent, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.genie.chat_store import ChatRecord, ChatStore, ChatTurn
from hexstudio.core.genie.conversation import Conversation, Turn
from hexstudio.core.genie.prompts import chat_format_for, template_for
from hexstudio.core.services.chat import (
    DIALOG_LABELS,
    ChatController,
    SessionSetup,
    bundle_dialogs,
    context_use,
    kpi_line,
    run_bundle_dir,
)
from hexstudio.ui.chat_context import ContextPanel
from hexstudio.ui.chat_conversations import ConversationsPanel
from hexstudio.ui.chat_kpis import PerformancePanel
from hexstudio.ui.chat_settings import SAMPLER_PRESETS, ChatSettingsPanel, Chosen
from hexstudio.ui.chat_view import MessageBubble, TranscriptView, flash
from hexstudio.ui.controller import RunController
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.widgets import STATE_COLORS, note, rich

__all__ = ["SAMPLER_PRESETS", "ChatPage", "kpi_line"]


class ChatPage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("chat", controller, parent, scroll=False)
        self.chat = ChatController()
        self._loading_settings = False
        self.body.setContentsMargins(12, 8, 12, 8)
        self.body.setSpacing(6)
        # the stage's own parts (inputs, gate, results) go to the side panel; the page is the chat
        self.summary_label.setVisible(False)
        self.inputs_box.setVisible(False)
        stretch = self.body.takeAt(self.body.count() - 1)
        del stretch
        self.body.removeWidget(self.gate_box)
        self.body.removeWidget(self.results_box)

        # -- settings, context, performance, the stage (right) ------------------------------------------
        self.settings_panel = ChatSettingsPanel()
        self.context_panel = ContextPanel()
        self.performance = PerformancePanel()
        s, cx, perf = self.settings_panel, self.context_panel, self.performance
        self.runtime_combo, self.template_combo, self.thinking_box = (
            s.runtime_combo,
            s.template_combo,
            s.thinking_box,
        )
        self.dialog_combo = s.dialog_combo
        self.template_in_use, self.system_edit, self.enter_sends_box = (
            s.template_in_use,
            s.system_edit,
            s.enter_sends_box,
        )
        self.max_tokens, self.sampler_combo = s.max_tokens, s.sampler_combo
        self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin = (
            s.temp_spin,
            s.topk_spin,
            s.topp_spin,
            s.seed_spin,
        )
        self.context_meter, self.context_label = cx.context_meter, cx.context_label
        self.kpi_label, self.mode_label = perf.kpi_label, perf.mode_label
        self.rate_plot, self.history_plot = perf.rate_plot, perf.history_plot
        side = QWidget()
        side.setObjectName("chat_settings")
        sl = QVBoxLayout(side)
        sl.setContentsMargins(4, 0, 4, 0)
        sl.addWidget(self.settings_panel)
        sl.addWidget(self.context_panel)
        sl.addWidget(self.performance)
        self.gate_box.setTitle("Stage gate")
        self.results_box.setTitle("Run Chat (the stage's benchmark reply)")
        sl.addWidget(self.gate_box)
        sl.addWidget(self.results_box)
        sl.addStretch(1)
        side_scroll = QScrollArea()
        side_scroll.setObjectName("chat_side")
        side_scroll.setWidgetResizable(True)
        side_scroll.setFrameShape(QFrame.Shape.NoFrame)
        side_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        side_scroll.setWidget(side)
        side_scroll.setMinimumWidth(220)

        # -- conversations (left) -------------------------------------------------------------------
        convs = self.conversations_panel = ConversationsPanel()
        self.new_button, self.conv_list = convs.new_button, convs.conv_list
        self.copy_button, self.export_button, self.delete_button = (
            convs.copy_button,
            convs.export_button,
            convs.delete_button,
        )
        self.new_button.clicked.connect(self.new_chat)
        self.conv_list.itemClicked.connect(self._conversation_clicked)
        self.conv_list.itemActivated.connect(self._conversation_clicked)
        self.copy_button.clicked.connect(self.copy_conversation)
        self.export_button.clicked.connect(self.export_dialog)
        self.delete_button.clicked.connect(self.delete_conversation)

        # -- the conversation (middle) ----------------------------------------------------------------
        center = QWidget()
        center.setObjectName("chat_center")
        cl = QVBoxLayout(center)
        cl.setContentsMargins(4, 0, 4, 0)
        cl.setSpacing(4)
        self.board_label = rich(note(""))
        self.board_label.setObjectName("chat_board_label")
        head = QHBoxLayout()
        head.setSpacing(4)
        self.convs_toggle = QPushButton("Chats")
        self.convs_toggle.setObjectName("show_conversations")
        self.convs_toggle.setCheckable(True)
        self.convs_toggle.setToolTip(
            "Show or hide the conversations (the window is narrow, so they fold away)"
        )
        self.side_toggle = QPushButton("Settings")
        self.side_toggle.setObjectName("show_chat_settings")
        self.side_toggle.setCheckable(True)
        self.side_toggle.setToolTip(
            "Show or hide the chat settings, context and rates (folded on a narrow window)"
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
        self.transient_labels.append(self.chat_message)
        cl.addWidget(self.chat_message)
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
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("send_button")
        self.send_button.setDefault(False)
        self.send_button.setToolTip("Send the message (Enter, or Ctrl+Enter)")
        self.send_button.clicked.connect(lambda: asyncio.ensure_future(self.send()))
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stop_button")
        self.stop_button.setEnabled(False)
        self.stop_button.setToolTip("Stop the reply now (Esc; what came so far is kept)")
        self.stop_button.clicked.connect(self.stop)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        cl.addLayout(row)
        for seq in ("Ctrl+Return", "Ctrl+Enter"):
            sc = QShortcut(QKeySequence(seq), self)
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            sc.activated.connect(self._send_shortcut)
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        esc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        esc.activated.connect(self._escape)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.setObjectName("chat_splitter")
        split.setChildrenCollapsible(False)
        split.addWidget(convs)
        split.addWidget(center)
        split.addWidget(side_scroll)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setStretchFactor(2, 0)
        split.setSizes([180, 560, 300])
        self.splitter = split
        self.body.addWidget(split, 1)
        self.convs_panel, self.side_panel = convs, side_scroll
        self.compact = False
        self.convs_toggle.toggled.connect(lambda on: self._show_panel(self.convs_panel, on))
        self.side_toggle.toggled.connect(lambda on: self._show_panel(self.side_panel, on))
        self._set_compact(False)

        self.template_combo.currentTextChanged.connect(lambda _t: self._settings_changed())
        self.system_edit.editingFinished.connect(self._settings_changed)
        self.thinking_box.toggled.connect(lambda _on: self._settings_changed())
        self.max_tokens.valueChanged.connect(lambda _v: self.update_context_meter())
        self.enter_sends_box.toggled.connect(lambda _on: self._enter_mode_changed())
        for w in (self.runtime_combo, self.sampler_combo):
            w.currentIndexChanged.connect(lambda _i: self.save_chat_settings())
        self.dialog_combo.currentIndexChanged.connect(lambda _i: self._dialog_changed())
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin, self.max_tokens):
            spin.editingFinished.connect(self.save_chat_settings)
        self._enter_mode_changed()

        self.streamed = ""
        self._stop: asyncio.Event | None = None
        self.busy_chat = False
        self._loaded_run: Path | None = None
        self._bench_stamp: float | None = None
        self._reply_bubble: MessageBubble | None = None
        self._rec_turn: ChatTurn | None = None
        # what the open conversation was started with: a change asks first, and only a real change counts
        self._applied: Chosen = self._chosen()
        self._asking = False
        self._prior_versions: list[dict[str, Any]] | None = None

    # -- what the controller holds, under the names the page has always shown ----------------------------
    @property
    def conversation(self) -> Conversation:
        return self.chat.conversation

    @conversation.setter
    def conversation(self, conv: Conversation) -> None:
        self.chat.conversation = conv

    @property
    def record(self) -> ChatRecord | None:
        return self.chat.record

    @property
    def store(self) -> ChatStore | None:
        return self.chat.store

    @property
    def session(self) -> Any:
        return self.chat.session

    @property
    def session_mode(self) -> str:
        """auto | persistent | per_turn (ChatSession modes) for the next session."""
        return self.chat.mode

    @session_mode.setter
    def session_mode(self, mode: str) -> None:
        self.chat.mode = mode

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.send_button.isEnabled() or self.busy_chat:  # as chat apps do: ready to type
            self.input.setFocus(Qt.FocusReason.OtherFocusReason)

    def _send_shortcut(self) -> None:
        if self.send_button.isEnabled():
            self.send_button.click()

    # -- keyboard -------------------------------------------------------------------------------
    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:
        """The message box: Enter sends and Shift+Enter starts a new line (or, with "Enter sends" off, Enter is
        a new line); Ctrl+Enter always sends (the page's shortcut)."""
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
            if mods & Qt.KeyboardModifier.ControlModifier:
                self._send_shortcut()
                return True
            if self.enter_sends_box.isChecked():
                self._send_shortcut()
                return True
        return super().eventFilter(obj, ev)

    def _escape(self) -> None:
        """Esc stops a streaming reply (what came so far is kept); otherwise it takes you back to the message box."""
        if self.busy_chat:
            self.stop()
            self.chat_message.setText("Stopping the reply (Esc)…")
        else:
            self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def _enter_mode_changed(self) -> None:
        enter = self.enter_sends_box.isChecked()
        self.input.setPlaceholderText(
            "Ask something… (Enter sends · Shift+Enter new line)"
            if enter
            else "Ask something… (Ctrl+Enter sends · Enter new line)"
        )
        self.save_chat_settings()

    # -- a narrow window (1280x720 at 150 %): the side panels fold away behind two buttons -------------
    COMPACT_BELOW = 900

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        compact = self.width() < self.COMPACT_BELOW
        if compact != self.compact:
            self._set_compact(compact)

    def _set_compact(self, compact: bool) -> None:
        self.compact = compact
        for toggle, panel in ((self.convs_toggle, self.convs_panel), (self.side_toggle, self.side_panel)):
            toggle.setVisible(compact)
            toggle.blockSignals(True)
            toggle.setChecked(False)
            toggle.blockSignals(False)
            panel.setVisible(not compact)
        self.convs_panel.setMinimumWidth(120 if compact else 150)
        self.side_panel.setMinimumWidth(200 if compact else 220)

    def _show_panel(self, panel: QWidget, on: bool) -> None:
        panel.setVisible(on or not self.compact)
        if on and self.compact:  # one side panel at a time on a narrow window, so the chat keeps its room
            other, toggle = (
                (self.side_panel, self.side_toggle)
                if panel is self.convs_panel
                else (self.convs_panel, self.convs_toggle)
            )
            toggle.setChecked(False)
            other.setVisible(False)

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        # the message, Send and Stop first; then the chat's settings; then the conversations and the stage
        inputs: list[QWidget] = [
            self.input,
            self.send_button,
            self.stop_button,
            self.convs_toggle,
            self.side_toggle,
            *self.settings_panel.tab_order(),
        ]
        actions: list[QWidget] = [
            self.new_button,
            self.conv_list,
            self.copy_button,
            self.export_button,
            self.delete_button,
            self.run_button,
            self.rerun_button,
            self.override_button,
        ]
        return inputs, actions, [self.transcript, self.metrics]

    # -- settings -------------------------------------------------------------------------------
    def sampler_preset(self) -> str:
        return self.settings_panel.sampler_preset()

    def sampler_settings(self) -> dict[str, Any] | None:
        """The sampler this chat runs with (Genie's keys), or None for the bundle's own."""
        return self.settings_panel.sampler_settings()

    def runtime(self) -> str | None:
        return self.settings_panel.runtime()

    def dialog(self) -> str:
        """Genie's dialog type the next message runs with (basic, or one of the bundle's speculative ones)."""
        return self.settings_panel.dialog()

    def session_setup(self) -> SessionSetup:
        """What the next message's session must be loaded with."""
        return SessionSetup(runtime=self.runtime(), sampler=self.sampler_settings(), dialog=self.dialog())

    def _dialog_changed(self) -> None:
        """Another dialog: the loaded model goes (the next message loads it again with the conversation kept)."""
        self.save_chat_settings()
        if self.busy_chat:
            return  # the reply goes on with the dialog it started with; the next message takes the new one
        self.chat_message.setText(
            f"Dialog: {html.escape(DIALOG_LABELS.get(self.dialog(), self.dialog()))}; the "
            "next message loads the model with it (the conversation is kept)."
        )

    def show_dialogs(self, doc: dict[str, Any] | None) -> None:
        """List the dialogs the open run's bundle carries (genie_config.<type>.json beside genie_config.json)."""
        m = self.c.manifest
        bundle = run_bundle_dir(m.run_dir, doc) if m is not None else None
        self.settings_panel.set_dialogs(bundle_dialogs(bundle))

    # -- run context ----------------------------------------------------------------------------
    def board_doc(self) -> dict[str, Any] | None:
        from hexstudio.core.services.chat_target import board_doc

        return board_doc(self.c.stage_dir("board"))

    def model_dir(self) -> Path | None:
        return self.c.stage_dir("model")

    def refresh_results(self) -> None:
        self._sync_run()
        doc = self.board_doc()
        self.show_dialogs(doc)
        if doc is None:
            self.board_label.setText(
                "Run the Board stage first: it pushes the bundle that chat runs."
                if self.c.manifest is not None
                else "No run is open: create one on the Model page or open one (Ctrl+O)."
            )
            self.send_button.setEnabled(False)
            self.transcript.set_placeholder(
                ""
                if self.transcript.bubbles
                else "The Board stage pushes the bundle to the board; then ask here."
            )
            return
        # the board record, or what the runner itself reported (a simulator installed on an SSH board)
        session = self.session
        sim = doc.get("simulated") or (session is not None and session.simulated)
        runner = session.runtime.title if session is not None else "the simulator board"
        badge = (
            f"<span style='color:{STATE_COLORS['stale']}'><b>SIMULATED</b> — {html.escape(runner)} on this "
            "CPU; its rates are not device results.</span>"
            if sim
            else "<b>device</b>"
        )
        label = str(doc.get("label"))
        short = label if len(label) <= 48 else label[:22] + "…" + label[-22:]
        self.board_label.setText(f"Board <b>{html.escape(short)}</b> · {badge}")
        self.board_label.setToolTip(label)
        self.send_button.setEnabled(not self.busy_chat)
        self.transcript.set_placeholder(
            "Ask something: the reply streams in here, with its token rate and KPIs."
        )
        self._show_template()

    def _show_template(self, t: str | None = None) -> tuple[Any, bool | None]:
        """Show which template is in use and enable the thinking switch where the chat template has one;
        returns the model's chat format and the thinking setting."""
        if t is None:
            t = self.template_combo.currentText()
            t = template_for(self.model_dir()) if t == "auto" else t
        fmt = chat_format_for(self.model_dir())
        return fmt, self.settings_panel.show_template(t, fmt)

    def _conversation_settings(self) -> None:
        """The open conversation takes the template, system prompt, reply room and context length shown now."""
        t = self.template_combo.currentText()
        if t == "auto":
            auto = template_for(self.model_dir())
            t = {"nemotron": "nemotron-reasoning-off"}.get(auto, auto)
        conv = self.conversation
        conv.template = t
        conv.chat_format, conv.thinking = self._show_template(t)
        conv.system = self.system_edit.text()
        conv.max_reply_tokens = self.max_tokens.value()
        cl = self.context_length()
        if cl is not None:  # every conversation, new ones too: the model's context, never the 4,096 default
            conv.context_length = cl
        if self.c.manifest is not None and self.session is None:
            counter = self.chat.token_counter(self.model_dir())
            if counter is not None:
                conv.count_tokens = counter

    def context_length(self) -> int | None:
        """The bundle's context length (hexstudio.core.services.chat.run_context_length)."""
        return self.chat.context_length(self.c.manifest)

    def update_context_meter(self) -> None:
        if self.c.manifest is None:
            self.context_panel.show_no_run()
            return
        try:
            self._conversation_settings()
            use = context_use(self.conversation, self.max_tokens.value())
        except Exception as exc:  # a broken chat template: say so, never break the page
            self.context_panel.show_error(exc)
            return
        self.context_panel.show_use(use)

    # -- the run's conversations ------------------------------------------------------------------
    def _sync_run(self) -> None:
        """Load the run's conversations when another run is opened, and list a new Run Chat reply."""
        m = self.c.manifest
        run = m.run_dir if m is not None else None
        bench = run / "artifacts" / "chat" / "chat.json" if run is not None else None
        stamp = bench.stat().st_mtime if bench is not None and bench.is_file() else None
        if run != self._loaded_run:
            self._loaded_run = run
            self._bench_stamp = stamp
            self._switch_run()
        elif stamp != self._bench_stamp and not self.busy_chat:
            self._bench_stamp = stamp
            self.reload_conversations(select_newest=not self.conversation.turns)

    def _close_later(self) -> None:
        """Close the open session without waiting (the next message loads the model again)."""
        if self.session is not None:
            self._closing = asyncio.ensure_future(self.close_session())

    def _switch_run(self) -> None:
        self._close_later()
        m = self.c.manifest
        self.chat.open_run(m.run_dir if m is not None else None)
        self.load_chat_settings()
        self._applied = self._chosen()
        self.transcript.clear()
        self.history_plot.reset()
        self.kpi_label.setText("")
        self.chat_message.setText("")
        self.reload_conversations(select_newest=True)

    def reload_conversations(self, select_newest: bool = False) -> None:
        records = self.chat.conversations()
        self.conversations_panel.fill(records)
        if select_newest and records:
            self.show_conversation(records[0])
        else:
            self._mark_current()

    def _mark_current(self) -> None:
        self.conversations_panel.mark(self.record.id if self.record is not None else None)

    def _conversation_clicked(self, item: QListWidgetItem) -> None:
        if self.busy_chat or self.store is None:
            self._mark_current()
            return
        rec = self.store.load(str(item.data(Qt.ItemDataRole.UserRole)))
        if rec is not None and (self.record is None or rec.id != self.record.id):
            self.show_conversation(rec)

    def show_conversation(self, rec: ChatRecord) -> None:
        """Show a stored conversation; the next message continues it (the model loads it again)."""
        self._close_later()
        self.chat.show_record(rec)
        self.settings_panel.show_chosen(Chosen(rec.template, rec.system, rec.thinking))
        self._show_template()
        self._applied = self._chosen()
        self.transcript.clear()
        for t in rec.turns:
            self.transcript.add("user", t.user)
            b = self.transcript.add("assistant", "", on_regenerate=self.regenerate)
            b.set_text(
                t.reply
                + (
                    ""
                    if t.state == "complete"
                    else "\n\n*(stopped)*"
                    if t.state == "aborted"
                    else "\n\n*(interrupted: the studio stopped during this reply)*"
                    if t.state in ("pending", "streaming")
                    else f"\n\n*(failed: {t.error or t.state})*"
                )
            )
            if t.versions:
                b.set_versions(t.versions, t.version, navigable=t is rec.turns[-1])
                b.versionChosen.connect(self._version_chosen)
            if t.kpis:
                b.set_kpis(kpi_line(t.kpis))
        self.performance.show_replies([t.kpis for t in rec.turns if t.kpis])
        self.chat_message.setText(f"From {html.escape(rec.origin)}." if rec.origin != "chat page" else "")
        self._mark_current()
        self.update_context_meter()

    def _save_record(self) -> None:
        try:
            self.chat.save_record(
                template=self.template_combo.currentText(),
                system=self.system_edit.text(),
                thinking=self.settings_panel.thinking(),
                sampler=self.sampler_settings(),
                runtime=self.runtime(),
                dialog=self.dialog(),
            )
        except OSError as exc:
            self.chat_message.setText(
                f"<span style='color:{STATE_COLORS['failed']}'>The conversation could not "
                f"be saved in the run: {html.escape(str(exc))}</span>"
            )

    # -- chat -------------------------------------------------------------------------------------
    async def open_session(self) -> Any:
        """Connect to the run's board and open a chat session on its bundle: the model stays loaded
        between turns where the board allows it (else one genie-t2t-run per turn)."""
        doc = self.board_doc()
        assert doc is not None
        self._conversation_settings()
        m = self.c.manifest
        mode = await self.chat.open_session(
            doc,
            self.c.settings,
            self.c.workspace.root,
            self.session_setup(),
            max_tokens=self.max_tokens.value(),
            run_dir=m.run_dir if m is not None else None,
            on_status=lambda text: self.chat_message.setText(html.escape(text)),
            on_genie_log=self.c.runtimeLog.emit,
        )
        self.refresh_results()  # the runner may have reported itself as the simulator
        self.mode_label.setText(self.chat.mode_text(mode))
        return self.session

    def _set_busy(self, busy: bool) -> None:
        self.busy_chat = busy
        self.send_button.setEnabled(not busy and self.board_doc() is not None)
        self.stop_button.setEnabled(busy)
        self.conversations_panel.set_busy(busy)

    async def send(self, text: str | None = None) -> Turn | None:
        from hexstudio.core.device.errors import BoardError
        from hexstudio.core.genie.run import Chunk
        from hexstudio.core.genie.session import SessionError

        user = (text if text is not None else self.input.toPlainText()).strip()
        if not user or self.board_doc() is None or self.busy_chat:
            return None
        self._set_busy(True)
        self.save_chat_settings()  # what this message is sent with is what the run keeps
        self.chat_message.setText("")
        self.streamed = ""
        self._stop = asyncio.Event()
        if text is None:
            self.input.clear()
        record = self.chat.ensure_record(self.template_combo.currentText(), self.system_edit.text())
        rec_turn = ChatTurn(user=user, t=time.strftime("%Y-%m-%dT%H:%M:%S"))
        self._rec_turn = rec_turn
        if record is not None:
            record.turns.append(rec_turn)
            self._save_record()
            self.reload_conversations()
        self.transcript.add("user", user)
        for b in self.transcript.bubbles:  # earlier replies' versions are fixed once the chat goes on
            if b.versions:
                b.set_versions(b.versions, b.version, navigable=False)
        bubble = self.transcript.add("assistant", "", on_regenerate=self.regenerate)
        bubble.versionChosen.connect(self._version_chosen)
        bubble.set_text("", streaming=True)
        self._reply_bubble = bubble
        prior, self._prior_versions = self._prior_versions, None
        self.input.setFocus()
        turn: Turn | None = None
        try:
            why = self.chat.reopen_reason(self.session_setup())
            if why is not None:
                # the sampler is fixed when the model loads: load it again with the new one (history is kept)
                await self.close_session()
                self.chat_message.setText(why)
            if self.session is None:
                await self.open_session()
            assert self.session is not None
            self.session.max_tokens = self.max_tokens.value()
            self.rate_plot.begin_reply()

            def on_chunk(c: Chunk) -> None:
                self.show_chunk(c.t, c.text, c.tokens)

            res = await self.session.send(user, on_chunk=on_chunk, stop=self._stop)
            turn = res.turn
            rec_turn.reply, rec_turn.state = res.text, res.state
            rec_turn.note, rec_turn.error = res.note, res.error
            self.transcript.finish(bubble, res.text + ("\n\n*(stopped)*" if res.state == "aborted" else ""))
            if res.kpis is not None:
                turn.kpis = res.kpis.as_json()
                rec_turn.kpis = dict(turn.kpis)
                self.performance.show_reply(turn.kpis)
                bubble.set_kpis(kpi_line(turn.kpis))
            if self.record is not None:
                self.record.source = "simulated" if res.simulated else "device"
            if res.state == "aborted":
                self.chat_message.setText("Reply stopped; what came so far is kept.")
            if res.note:
                self.chat_message.setText(html.escape(res.note))
            if res.error and res.state == "failed":
                self.chat_message.setText(
                    f"<span style='color:{STATE_COLORS['failed']}'>Genie failed: "
                    f"{html.escape(res.error)}</span>"
                )
        except ValueError as exc:  # the message alone does not fit in the context
            rec_turn.state, rec_turn.error = "failed", str(exc)
            self.transcript.finish(bubble, f"*(not sent: {exc})*")
            self.chat_message.setText(
                f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(str(exc))}</span>"
            )
        except (BoardError, SessionError) as exc:
            rec_turn.state, rec_turn.error = "failed", exc.message
            self.transcript.finish(bubble, f"*(failed: {exc.message})*")
            self.chat_message.setText(
                f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(exc.message)}</span>"
                + (f"<br><b>What to do:</b> {html.escape(exc.hint)}" if exc.hint else "")
            )
            await self.close_session()
        finally:
            self._reply_bubble = None
            if rec_turn.state in ("pending", "streaming"):
                rec_turn.state = "failed"
            self._rec_turn = None
            if prior:
                versions = [
                    *prior,
                    {
                        "reply": rec_turn.reply,
                        "kpis": dict(rec_turn.kpis),
                        "state": rec_turn.state,
                        "kpi_line": kpi_line(rec_turn.kpis) if rec_turn.kpis else "",
                    },
                ]
                bubble.set_versions(versions, len(versions) - 1)
                rec_turn.versions, rec_turn.version = versions, len(versions) - 1
            self._set_busy(False)
            self._save_record()
            self.reload_conversations()
            self.update_context_meter()
        return turn

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the model loads the conversation without it)."""
        if self.busy_chat or not self.conversation.turns or len(self.transcript.bubbles) < 2:
            return
        sender = self.sender()
        if isinstance(sender, MessageBubble) and sender is not self.transcript.bubbles[-1]:
            self.chat_message.setText("Only the last reply can be generated again.")
            return
        last = self.conversation.turns.pop()
        old_bubble = self.transcript.bubbles[-1]
        # the earlier replies are kept: the new one becomes version n+1 (‹ n+1/n+1 ›)
        prior = [dict(v) for v in old_bubble.versions] or [
            {
                "reply": last.reply,
                "kpis": dict(last.kpis),
                "state": last.state,
                "kpi_line": kpi_line(last.kpis) if last.kpis else "",
            }
        ]
        if self.record is not None and self.record.turns:
            self.record.turns.pop()
        self.transcript.remove_last()
        self.transcript.remove_last()
        self._prior_versions = prior
        self._regen = asyncio.ensure_future(self._regenerate(last.user))

    def _version_chosen(self, index: int) -> None:
        """‹ › on the last reply: that version becomes the reply the conversation continues from."""
        bubble = self.sender()
        if (
            self.busy_chat
            or not isinstance(bubble, MessageBubble)
            or not self.transcript.bubbles
            or bubble is not self.transcript.bubbles[-1]
            or not self.conversation.turns
        ):
            return
        v = bubble.versions[index]
        turn = self.conversation.turns[-1]
        turn.reply, turn.kpis, turn.state = (
            str(v.get("reply") or ""),
            dict(v.get("kpis") or {}),
            str(v.get("state") or "complete"),
        )
        if self.record is not None and self.record.turns:
            rt = self.record.turns[-1]
            rt.reply, rt.kpis, rt.state, rt.version = turn.reply, dict(turn.kpis), turn.state, index
            self._save_record()
        # the loaded dialog's KV cache holds the other reply: the next message loads the conversation again
        self._closing = asyncio.ensure_future(self.close_session())
        self.update_context_meter()

    async def _regenerate(self, user: str) -> Turn | None:
        await self.close_session()  # the loaded dialog's KV cache still holds the old reply
        return await self.send(user)

    def show_chunk(self, t: float, text: str, tokens: int | None = None) -> None:
        """A piece of the reply arrived `t` seconds after the prompt was sent, holding `tokens` tokens (from the
        runner, or counted with the bundle's tokenizer). Unknown: the plot counts chunks and says so."""
        first = not self.streamed
        self.streamed += text
        if self._reply_bubble is not None:
            self.transcript.stream(self._reply_bubble, self.streamed)
        rec_turn = self._rec_turn
        if first and rec_turn is not None and self.busy_chat:
            # the reply has started: kept in the run at once (a crash mid-reply still leaves its start), once
            rec_turn.reply, rec_turn.state = self.streamed, "streaming"
            self._save_record()
        self.performance.add_chunk(t, tokens)

    async def close_session(self) -> None:
        try:
            await self.chat.close_session()
        finally:
            self.mode_label.setText("")

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _chosen(self) -> Chosen:
        """The template, system prompt and thinking switch as the controls show them now."""
        return self.settings_panel.chosen()

    def _show_chosen(self, chosen: Chosen) -> None:
        self.settings_panel.show_chosen(chosen)
        self._show_template()

    def _settings_changed(self) -> None:
        """The template, system prompt or thinking switch was edited. Nothing happens unless the value really
        changed (Tab through the fields changes nothing); with messages in the chat, ask before starting a
        new one (No puts the old value back)."""
        chosen = self._chosen()
        if chosen == self._applied or self._asking:
            self.update_context_meter()
            return
        if self.busy_chat:
            self._show_chosen(self._applied)
            self.chat_message.setText(
                "Wait for the reply to end (or stop it with Esc) before changing the "
                "template or system prompt."
            )
            return
        if self.conversation.turns:
            self._asking = True
            try:
                box = QMessageBox(
                    QMessageBox.Icon.Question,
                    "Start a new chat?",
                    "The template or system prompt changed. The model reads the conversation with "
                    "them, so a new chat starts with the new ones.\n\nThis conversation stays in the "
                    "list.",
                    QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                    self,
                )
                box.setObjectName("new_chat_question")
                box.button(QMessageBox.StandardButton.Yes).setText("New chat")
                box.button(QMessageBox.StandardButton.No).setText("Keep this chat")
                box.setDefaultButton(QMessageBox.StandardButton.No)
                answer = box.exec()
            finally:
                self._asking = False
            if answer != QMessageBox.StandardButton.Yes:
                self._show_chosen(self._applied)
                self.chat_message.setText("Kept this chat and its template and system prompt.")
                return
            self.new_chat()
            self.chat_message.setText(
                "The template or system prompt changed: a new chat started (the last one is "
                "kept in the list)."
            )
        else:  # no messages yet: the model loads again with them at the next send
            self._close_later()
        self._applied = self._chosen()
        self.save_chat_settings()
        self.update_context_meter()

    # -- settings kept per run (<run>/chats/settings.json) ----------------------------------------------
    def chat_settings(self) -> dict[str, Any]:
        return self.settings_panel.values()

    def save_chat_settings(self) -> None:
        if self._loading_settings or self.store is None:
            return
        try:
            self.store.save_settings(self.chat_settings())
        except OSError:  # a read-only run folder: the settings still apply to this session
            pass

    def load_chat_settings(self) -> None:
        values = self.store.load_settings() if self.store is not None else {}
        if not values:
            return
        self._loading_settings = True
        try:
            self.settings_panel.load(values)
            self._show_template()
        finally:
            self._loading_settings = False
        self._enter_mode_changed()

    def new_chat(self) -> None:
        if self.busy_chat:
            return
        self._closing = asyncio.ensure_future(self.close_session())
        self.chat.new_conversation()
        self._applied = self._chosen()
        self.transcript.clear()
        self.kpi_label.setText("")
        self.chat_message.setText("")
        self._mark_current()
        self.update_context_meter()
        self.input.setFocus()

    def delete_conversation(self) -> None:
        if self.busy_chat or self.record is None or self.store is None:
            return
        if (
            QMessageBox.question(self, "Delete conversation", f"Delete “{self.record.title}” from this run?")
            != QMessageBox.StandardButton.Yes
        ):
            return
        self.chat.delete_record()
        self.new_chat()
        self.reload_conversations()

    def copy_conversation(self) -> None:
        QGuiApplication.clipboard().setText(self.conversation.as_markdown())
        flash(self.copy_button)
        n = len(self.conversation.turns)
        self.chat_message.setText(
            f"Copied the conversation ({n} {'reply' if n == 1 else 'replies'}) as Markdown."
        )

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export the conversation", "conversation.md", "Markdown (*.md);;JSON (*.json)"
        )
        if path:
            self.conversation.save(Path(path))
