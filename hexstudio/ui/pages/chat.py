"""Chat page, laid out as LM Studio and Jan are: the run's conversations on the left, the transcript in the
middle with the message box and Send/Stop pinned under it, the settings, context and rates on the right.

The page builds the widgets, forwards what the user does to its controller and shows what the controller holds:
- hexstudio.core.services.chat_controller: the Qt-free controller (the run's conversations and the open one's
  record, the session on the board and when it must load again, the context accounting),
- hexstudio.ui.chat_layout: the three columns (folded on a narrow window); chat_compose: the middle one;
  chat_view: the transcript; chat_settings, chat_context, chat_kpis, chat_conversations: the side panels."""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QResizeEvent, QShortcut, QShowEvent
from PySide6.QtWidgets import QFileDialog, QWidget

from hexstudio.core.genie.chat_store import ChatRecord
from hexstudio.core.genie.conversation import Conversation, Turn
from hexstudio.core.manifest import RunManifest
from hexstudio.core.services.chat import DIALOG_LABELS, SessionSetup, kpi_line
from hexstudio.core.services.chat_controller import (
    ChatController,
    ChatHooks,
    Chosen,
    LiveSession,
    SessionRequest,
    TurnHooks,
)
from hexstudio.core.services.chat_target import board_doc
from hexstudio.ui.chat_compose import ChatColumn
from hexstudio.ui.chat_context import ContextPanel
from hexstudio.ui.chat_conversations import ConversationsPanel, ask_delete, ask_new_chat
from hexstudio.ui.chat_kpis import PerformancePanel
from hexstudio.ui.chat_layout import ChatColumns, side_column
from hexstudio.ui.chat_settings import SAMPLER_PRESETS, ChatSettingsPanel
from hexstudio.ui.chat_view import MessageBubble, flash
from hexstudio.ui.controller import RunController
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.widgets import failed

__all__ = ["SAMPLER_PRESETS", "ChatPage", "kpi_line"]


class ChatPage(StagePage):
    COMPACT_BELOW = 900  # a narrow window (1280x720 at 150 %): the side columns fold away

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("chat", controller, parent, scroll=False)
        self.settings_panel = ChatSettingsPanel()
        self.chat = ChatController(
            ChatHooks(
                sent_with=self.settings_panel.sent_with,
                save_failed=self._save_failed,
                session_closed=lambda: self.mode_label.setText(""),
            )
        )
        self._loading_settings = self._asking = self.busy_chat = self._switch_waits = False
        # the run a reply on its way belongs to (its manifest and model folder), held while another run waits
        self._turn_run: tuple[RunManifest | None, Path | None] | None = None
        self._sending: asyncio.Task[Any] | None = None  # the message being sent (its task)
        self.body.setContentsMargins(12, 8, 12, 8)
        self.body.setSpacing(6)
        # the stage's own parts (inputs, gate, results) go to the side column; the page is the chat
        self.summary_label.setVisible(False)
        self.inputs_box.setVisible(False)
        stretch = self.body.takeAt(self.body.count() - 1)
        del stretch
        self.body.removeWidget(self.gate_box)
        self.body.removeWidget(self.results_box)
        self.gate_box.setTitle("Stage gate")
        self.results_box.setTitle("Run Chat (the stage's benchmark reply)")
        self.context_panel, self.performance = ContextPanel(), PerformancePanel()
        self.conversations_panel, self.center = ConversationsPanel(), ChatColumn()
        side = side_column(
            [self.settings_panel, self.context_panel, self.performance, self.gate_box, self.results_box]
        )
        self.splitter = ChatColumns(
            self.conversations_panel, self.center, side, (self.center.convs_toggle, self.center.side_toggle)
        )
        self.body.addWidget(self.splitter, 1)
        self._name_parts()
        self.transient_labels.append(self.chat_message)
        self._connect()
        self.center.set_enter_sends(self.enter_sends_box.isChecked())
        self.chat.applied = self.settings_panel.chosen()

    def _name_parts(self) -> None:
        """The parts under the names the page has always had (the tests and the keyboard walk use them)."""
        s, cx, pf = self.settings_panel, self.context_panel, self.performance
        self.runtime_combo, self.dialog_combo = s.runtime_combo, s.dialog_combo
        self.template_combo, self.thinking_box = s.template_combo, s.thinking_box
        self.system_edit, self.enter_sends_box = s.system_edit, s.enter_sends_box
        self.max_tokens, self.sampler_combo = s.max_tokens, s.sampler_combo
        self.temp_spin, self.topk_spin = s.temp_spin, s.topk_spin
        self.topp_spin, self.seed_spin = s.topp_spin, s.seed_spin
        self.context_meter, self.context_label = cx.context_meter, cx.context_label
        self.kpi_label, self.mode_label = pf.kpi_label, pf.mode_label
        self.rate_plot, self.history_plot = pf.rate_plot, pf.history_plot
        cv, ce = self.conversations_panel, self.center
        self.new_button, self.conv_list, self.copy_button = cv.new_button, cv.conv_list, cv.copy_button
        self.export_button, self.delete_button = cv.export_button, cv.delete_button
        self.board_label, self.convs_toggle = ce.board_label, ce.convs_toggle
        self.side_toggle, self.transcript = ce.side_toggle, ce.transcript
        self.chat_message, self.input = ce.chat_message, ce.input
        self.send_button, self.stop_button = ce.send_button, ce.stop_button
        self.convs_panel, self.side_panel = self.splitter.convs_panel, self.splitter.side_panel

    def _connect(self) -> None:
        self.new_button.clicked.connect(self.new_chat)
        self.conversations_panel.picked.connect(self._conversation_picked)
        self.copy_button.clicked.connect(self.copy_conversation)
        self.export_button.clicked.connect(self.export_dialog)
        self.delete_button.clicked.connect(self.delete_conversation)
        self.send_button.clicked.connect(lambda: asyncio.ensure_future(self.send()))
        self.stop_button.clicked.connect(self.stop)
        self.center.sendRequested.connect(self._send_shortcut)
        for keys, slot in (("Ctrl+Return", self._send_shortcut), ("Ctrl+Enter", self._send_shortcut)):
            self._shortcut(keys, slot)
        self._shortcut("Esc", self._escape)
        self.template_combo.currentTextChanged.connect(lambda _t: self._settings_changed())
        self.system_edit.editingFinished.connect(self._settings_changed)
        self.thinking_box.toggled.connect(lambda _on: self._settings_changed())
        self.max_tokens.valueChanged.connect(lambda _v: self.update_context_meter())
        self.enter_sends_box.toggled.connect(self.center.set_enter_sends)
        self.settings_panel.edited.connect(self.save_chat_settings)
        self.dialog_combo.currentIndexChanged.connect(lambda _i: self._dialog_changed())

    def _shortcut(self, keys: str, slot: Callable[[], None]) -> None:
        sc = QShortcut(QKeySequence(keys), self)
        sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        sc.activated.connect(slot)

    # -- what the controller holds, under the names the page has always shown ----------------------------
    @property
    def conversation(self) -> Conversation:
        return self.chat.conversation

    @property
    def record(self) -> ChatRecord | None:
        return self.chat.record

    @property
    def session(self) -> LiveSession | None:
        return self.chat.session

    @property
    def session_mode(self) -> str:
        """auto | persistent | per_turn (ChatSession modes) for the next session."""
        return self.chat.mode

    @session_mode.setter
    def session_mode(self, mode: str) -> None:
        self.chat.mode = mode

    @property
    def streamed(self) -> str:
        return self.chat.streamed

    @property
    def compact(self) -> bool:
        return self.splitter.compact

    # -- keyboard and layout ------------------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.send_button.isEnabled() or self.busy_chat:  # as chat apps do: ready to type
            self.input.setFocus(Qt.FocusReason.OtherFocusReason)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        compact = self.width() < self.COMPACT_BELOW
        if compact != self.splitter.compact:
            self.splitter.set_compact(compact)

    def _send_shortcut(self) -> None:
        if self.send_button.isEnabled():
            self.send_button.click()

    def _escape(self) -> None:
        """Esc stops a streaming reply (what came so far is kept); otherwise it takes you back to the message box."""
        if self.busy_chat:
            self.stop()
            self.chat_message.setText("Stopping the reply (Esc)…")
        else:
            self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        # the message, Send and Stop first; then the chat's settings; then the conversations and the stage
        inputs = self.center.tab_order() + self.settings_panel.tab_order()
        stage: list[QWidget] = [self.run_button, self.rerun_button, self.override_button]
        actions = self.conversations_panel.tab_order() + stage
        return inputs, actions, [self.transcript, self.metrics]

    # -- settings -------------------------------------------------------------------------------
    def sampler_preset(self) -> str:
        return self.settings_panel.sampler_preset()

    def sampler_settings(self) -> dict[str, Any] | None:
        """The sampler this chat runs with (Genie's keys), or None for the bundle's own."""
        return self.settings_panel.sampler_settings()

    def dialog(self) -> str:
        """Genie's dialog type the next message runs with (basic, or one of the bundle's speculative ones)."""
        return self.settings_panel.dialog()

    def session_setup(self) -> SessionSetup:
        """What the next message's session must be loaded with."""
        return self.settings_panel.session_setup()

    def _dialog_changed(self) -> None:
        """Another dialog: the next message loads the model with it (the conversation kept)."""
        self.save_chat_settings()
        if self.busy_chat:
            return  # the reply goes on with the dialog it started with; the next message takes the new one
        self.chat_message.setText(
            f"Dialog: {html.escape(DIALOG_LABELS.get(self.dialog(), self.dialog()))}; the "
            "next message loads the model with it (the conversation is kept)."
        )

    def _show_chosen(self, chosen: Chosen) -> None:
        self.settings_panel.show_chosen(chosen)
        self._show_template()

    def _settings_changed(self) -> None:
        """The template, system prompt or thinking switch was edited: only a real change counts (Tab through the
        fields changes nothing); with messages in the chat it asks before starting a new one (No puts the old value
        back)."""
        chosen = self.settings_panel.chosen()
        change = "same" if self._asking else self.chat.change_settings(chosen, busy=self.busy_chat)
        if change == "busy":
            self._show_chosen(self.chat.applied)
            self.chat_message.setText(
                "Wait for the reply to end (or stop it with Esc) before changing the template or system prompt."
            )
            return
        if change == "ask":
            self._asking = True
            try:
                yes = ask_new_chat(self)
            finally:
                self._asking = False
            if not yes:
                self._show_chosen(self.chat.applied)
                self.chat_message.setText("Kept this chat and its template and system prompt.")
                return
            self.new_chat()
            self.chat_message.setText(
                "The template or system prompt changed: a new chat started (the last one is kept in the list)."
            )
        if change != "same":
            self.save_chat_settings()
        self.update_context_meter()

    # -- settings kept per run (<run>/chats/settings.json) ----------------------------------------------
    def save_chat_settings(self) -> None:
        if not self._loading_settings:
            self.chat.save_settings(self.settings_panel.values())

    def load_chat_settings(self) -> None:
        values = self.chat.load_settings()
        if not values:
            return
        self._loading_settings = True
        try:
            self.settings_panel.load(values)
            self._show_template()
        finally:
            self._loading_settings = False
        self.center.set_enter_sends(self.enter_sends_box.isChecked())
        self.save_chat_settings()

    # -- run context ----------------------------------------------------------------------------
    def board_doc(self) -> dict[str, Any] | None:
        return board_doc(self.c.stage_dir("board"))

    def model_dir(self) -> Path | None:
        return self.c.stage_dir("model")

    def refresh_results(self) -> None:
        if not self._sync_run():
            return
        doc = self.board_doc()
        self.settings_panel.list_dialogs(
            self.c.manifest.run_dir if self.c.manifest is not None else None, doc
        )
        if doc is None:
            self.center.show_no_board(run_open=self.c.manifest is not None)
            self.send_button.setEnabled(False)
            return
        self.center.show_board(doc, self.session)
        self.send_button.setEnabled(not self.busy_chat)
        self._show_template()

    def _show_template(self) -> None:
        """Show which template is in use; the thinking switch where the chat template has one."""
        self.settings_panel.show_template_for(self.model_dir())

    def _chat_run(self) -> tuple[RunManifest | None, Path | None]:
        """The run the open conversation belongs to, and its model folder: the open run, or while a reply is on
        its way the run it was sent in (another run opened meanwhile waits for the reply's end)."""
        if self._turn_run is not None:
            return self._turn_run
        return self.c.manifest, self.model_dir()

    def _conversation_settings(self) -> None:
        """The open conversation takes the template, system prompt, reply room and context length shown now, and
        its own run's context length and tokenizer (never those of a run opened while its reply is on its way)."""
        m, d = self._chat_run()
        self.chat.render_with(self.settings_panel.rendering(d), m, d)

    def update_context_meter(self) -> None:
        if self._chat_run()[0] is None:
            self.context_panel.show_no_run()
            return
        try:
            self._conversation_settings()
            use = self.chat.context_use(self.max_tokens.value())
        except Exception as exc:  # a broken chat template: say so, never break the page
            self.context_panel.show_error(exc)
            return
        self.context_panel.show_use(use)

    # -- the run's conversations ------------------------------------------------------------------
    def _sync_run(self) -> bool:
        """Load the run's conversations when another run is opened, and list a new Run Chat reply. False: another
        run was opened while a reply is on its way; the page stays on the reply's run until it ends."""
        m = self.c.manifest
        sync = self.chat.sync_run(m.run_dir if m is not None else None, busy=self.busy_chat)
        if sync == "waiting":
            self._switch_waits = True
            self.chat_message.setText(
                f"Run {html.escape(m.run_id if m is not None else 'none')} is open: the chat shows it when this "
                "reply ends (Stop ends it now)."
            )
            return False
        if self._switch_waits and sync != "switched":
            # back on the reply's run before it ended
            self.chat_message.setText("")
        self._switch_waits = False
        if sync == "switched":
            self.load_chat_settings()
            self.chat.applied = self.settings_panel.chosen()
            self.transcript.clear()
            self._clear_plots()
            self.kpi_label.setText("")
            self.chat_message.setText("")
            self.reload_conversations(select_newest=True)
        elif sync == "listed":
            self.reload_conversations(select_newest=not self.conversation.turns)
        return True

    def reload_conversations(self, select_newest: bool = False) -> None:
        records = self.chat.conversations()
        self.conversations_panel.fill(records)
        if select_newest and records:
            self.show_conversation(records[0])
        else:
            self._mark_current()

    def _mark_current(self) -> None:
        self.conversations_panel.mark(self.record.id if self.record is not None else None)

    def _conversation_picked(self, cid: str) -> None:
        if self.busy_chat or self.chat.store is None:
            self._mark_current()
            return
        rec = self.chat.pick(cid)
        if rec is not None:
            self.show_conversation(rec)

    def show_conversation(self, rec: ChatRecord) -> None:
        """Show a stored conversation; the next message continues it (the model loads it again)."""
        self.chat.show_record(rec)
        self._show_chosen(Chosen(rec.template, rec.system, rec.thinking))
        self.chat.applied = self.settings_panel.chosen()
        self.transcript.show_record(rec, self.regenerate, self._version_chosen)
        self.performance.show_replies([t.kpis for t in rec.turns if t.kpis])
        self.chat_message.setText(f"From {html.escape(rec.origin)}." if rec.origin != "chat page" else "")
        self._mark_current()
        self.update_context_meter()

    def _save_failed(self, exc: OSError) -> None:
        self.chat_message.setText(failed(f"The conversation could not be saved in the run: {exc}"))

    # -- chat -------------------------------------------------------------------------------------
    def _set_busy(self, busy: bool) -> None:
        self.busy_chat = busy
        self.center.set_busy(busy, can_send=self.board_doc() is not None)
        self.conversations_panel.set_busy(busy)

    def _session_opened(self, mode: str) -> None:
        self.refresh_results()  # the runner may have reported itself as the simulator
        self.mode_label.setText(self.chat.mode_text(mode))

    def _request(self, doc: dict[str, Any]) -> SessionRequest:
        """Where the next session opens (the run's board) and what it is loaded with (the settings shown)."""
        m = self.c.manifest
        return SessionRequest(
            doc,
            self.c.settings,
            self.c.workspace.root,
            self.session_setup(),
            self.max_tokens.value(),
            run_dir=m.run_dir if m is not None else None,
            on_status=lambda text: self.chat_message.setText(html.escape(text)),
            on_genie_log=self.c.runtimeLog.emit,
        )

    async def send(self, text: str | None = None) -> Turn | None:
        user = (text if text is not None else self.input.toPlainText()).strip()
        doc = self.board_doc()
        if not user or doc is None or self.busy_chat:
            return None
        m = self.c.manifest
        if self.chat.run_dir != (m.run_dir if m is not None else None):
            # another run was opened after this message was asked for (a Regenerate waiting for its turn): the
            # chat shows that run now, and the message is not sent into its conversation
            self.refresh_results()
            self.chat_message.setText(
                "Another run was opened, so the message was not sent; send it again here."
            )
            return None
        self._turn_run = (m, self.model_dir())
        self._sending = asyncio.current_task()  # what quitting cancels if the model is still loading
        self._set_busy(True)
        self.save_chat_settings()  # what this message is sent with is what the run keeps
        self.chat_message.setText("")
        if text is None:
            self.input.clear()
        self.chat.start_turn(user)
        if self.record is not None:
            self.reload_conversations()
        self.center.begin_reply(user, self.regenerate, self._version_chosen)
        hooks = TurnHooks(
            reloading=self.chat_message.setText,
            opening=self._conversation_settings,
            opened=self._session_opened,
            sending=self.rate_plot.begin_reply,
            chunk=lambda c: self.show_chunk(c.t, c.text, c.tokens),
        )
        try:
            out = await self.chat.run_turn(user, self._request(doc), hooks)
            self.center.finish(out)
            if out.kpis is not None:
                self.performance.show_reply(out.kpis)
        finally:
            self.center.end_reply(self.chat.end_turn())
            self._turn_run = None
            self._set_busy(False)
            # another run opened meanwhile is shown now
            self.refresh_results()
            self.reload_conversations()
            self.update_context_meter()
        return out.turn

    def show_chunk(self, t: float, text: str, tokens: int | None = None) -> None:
        """A piece of the reply arrived `t` seconds after the prompt was sent, holding `tokens` tokens (from the
        runner, or counted with the bundle's tokenizer). Unknown: the plot counts chunks and says so."""
        self.center.stream(self.chat.add_chunk(text))
        self.performance.add_chunk(t, tokens)

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the earlier ones are kept as versions: ‹ n+1/n+1 ›)."""
        if self.busy_chat or len(self.transcript.bubbles) < 2:
            return
        sender = self.sender()
        if isinstance(sender, MessageBubble) and sender is not self.transcript.bubbles[-1]:
            self.chat_message.setText("Only the last reply can be generated again.")
            return
        if self.board_doc() is None:
            # send() would refuse it after the exchange was taken out: the turn and its reply would be lost
            self.chat_message.setText(
                "No board holds this run's bundle, so the reply cannot be generated again: run the Board stage."
            )
            return
        user = self.chat.regenerate()
        if user is not None:
            self.transcript.remove_last()
            self.transcript.remove_last()
            self._regen = asyncio.ensure_future(self.send(user))

    def _version_chosen(self, index: int) -> None:
        """‹ › on the last reply: that version becomes the reply the conversation continues from."""
        bubble = self.sender()
        if self.busy_chat or not self.transcript.bubbles or bubble is not self.transcript.bubbles[-1]:
            return
        if self.chat.choose_version(index):
            self.update_context_meter()

    async def close_session(self) -> None:
        await self.chat.close_session()

    quit_grace_s = 10.0  # how long quitting waits for a reply to stop before it cancels the turn

    async def shut_down(self) -> None:
        """Before the studio quits: stop the reply, cancel a turn still loading the model (stop only ends token
        generation) once `quit_grace_s` has passed, then close the session, so none is left open on the board."""
        self.stop()
        deadline = asyncio.get_running_loop().time() + self.quit_grace_s
        while self.busy_chat and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        task = getattr(self, "_sending", None)
        if self.busy_chat and task is not None and not task.done():
            task.cancel()  # a session opened meanwhile is closed by the open path (awaited), or detached below
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.close_session()

    def stop(self) -> None:
        self.chat.stop()

    def _clear_plots(self) -> None:
        """A new chat or another run: no rate of an earlier conversation's replies stays on screen (they carry no
        SIMULATED tag of their own)."""
        self.history_plot.reset()
        self.rate_plot.begin_reply()
        self.rate_plot.draw()

    def new_chat(self) -> None:
        if self.busy_chat:
            return
        self.chat.new_conversation(self.settings_panel.chosen())
        self.transcript.clear()
        self._clear_plots()
        self.kpi_label.setText("")
        self.chat_message.setText("")
        self._mark_current()
        self.update_context_meter()
        self.input.setFocus()

    def delete_conversation(self) -> None:
        if self.busy_chat or self.record is None or self.chat.store is None:
            return
        if not ask_delete(self, self.record.title):
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
        if not path:
            return
        try:
            self.conversation.save(Path(path))
        except OSError as exc:
            self.chat_message.setText(
                failed(
                    f"The conversation could not be written to {path}: {exc.strerror or exc}. "
                    "Choose a folder you can write to (your home folder, for one) and export again."
                )
            )
            return
        n = len(self.conversation.turns)
        self.chat_message.setText(
            html.escape(f"Exported the conversation ({n} {'reply' if n == 1 else 'replies'}) to {path}.")
        )
