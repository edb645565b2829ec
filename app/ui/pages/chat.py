"""Chat page: talk to the model on the run's board; the reply streams in as tokens arrive, with
per-message TTFT / prompt tok/s / generation tok/s / init time and a live token-rate plot."""

from __future__ import annotations

import asyncio
import html
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.core.genie.conversation import TEMPLATES, Conversation, Turn, token_counter
from app.core.genie.prompts import DETERMINISTIC, NEMOTRON_THINKING_ON, chat_format_for, template_for
from app.ui.controller import RunController
from app.ui.pages.base import StagePage
from app.ui.plots import ReplyHistoryPlot, TokenRatePlot
from app.ui.widgets import STATE_COLORS, note

# preset key -> (label, values); the keys match app.core.genie.session's presets (and the CLI's --sampler)
SAMPLER_PRESETS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "deterministic": ("deterministic (seed 42, temp 0, top-k 1, top-p 1)", DETERMINISTIC),
    "thinking": ("thinking (Nemotron reasoning on: temp 0.6, top-k 40, top-p 0.95)", NEMOTRON_THINKING_ON),
    "bundle": ("the bundle's own sampler (genie_config.json as compiled)", None),
    "custom": ("custom", None),
}
SAMPLER_TOOLTIP = (
    "How the next token is picked. The values go into this chat's copy of the bundle's genie_config.json "
    "sampler (the bundle itself is not changed). The simulator board samples with them too: temperature, "
    "top-k, top-p and seed. Deterministic always takes the most likely token; Nemotron with reasoning on "
    "uses the thinking preset, as `hexstudio chat` does.")


def genie_sampler(values: dict[str, Any]) -> dict[str, Any]:
    """Genie's genie_config.json sampler keys (top-k, top-p) from the prompts module's (top_k, top_p)."""
    return {k.replace("_", "-"): v for k, v in values.items()}


def kpi_line(k: dict[str, Any]) -> str:
    def f(v: Any, nd: int = 1) -> str:
        return "—" if v is None else f"{float(v):.{nd}f}"

    src = k.get("source", "device")
    tag = "SIMULATED" if src == "simulated" else "device"
    return (f"TTFT {f(k.get('ttft_ms'), 0)} ms · prompt {f(k.get('prompt_tok_s'))} tok/s · generation "
            f"{f(k.get('gen_tok_s'))} tok/s · init {f(k.get('init_ms'), 0)} ms · {k.get('generated_tokens')} tokens "
            f"[{tag}]")


class ChatPage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("chat", controller, parent)
        form = QFormLayout()
        self.template_combo = QComboBox()
        self.template_combo.setObjectName("template")
        self.template_combo.addItems(list(TEMPLATES))
        self.system_edit = QLineEdit()
        self.system_edit.setObjectName("system_prompt")
        self.system_edit.setPlaceholderText("System prompt (Llama 3 template; Nemotron sets its own)")
        self.sampler_combo = QComboBox()
        self.sampler_combo.setObjectName("sampler_preset")
        for key, (label, _values) in SAMPLER_PRESETS.items():
            self.sampler_combo.addItem(label, key)
        self.sampler_combo.setToolTip(SAMPLER_TOOLTIP)
        self.temp_spin = QDoubleSpinBox()
        self.temp_spin.setObjectName("sampler_temp")
        self.temp_spin.setRange(0.0, 2.0)
        self.temp_spin.setSingleStep(0.05)
        self.temp_spin.setDecimals(2)
        self.temp_spin.setToolTip("Temperature: 0 always takes the most likely token; higher is more varied.")
        self.topk_spin = QSpinBox()
        self.topk_spin.setObjectName("sampler_top_k")
        self.topk_spin.setRange(1, 1000)
        self.topk_spin.setToolTip("Top-k: sample only among the k most likely tokens (1 = greedy).")
        self.topp_spin = QDoubleSpinBox()
        self.topp_spin.setObjectName("sampler_top_p")
        self.topp_spin.setRange(0.01, 1.0)
        self.topp_spin.setSingleStep(0.05)
        self.topp_spin.setDecimals(2)
        self.topp_spin.setToolTip("Top-p: sample only among the most likely tokens that together reach p.")
        self.seed_spin = QSpinBox()
        self.seed_spin.setObjectName("sampler_seed")
        self.seed_spin.setRange(0, 2 ** 31 - 1)
        self.seed_spin.setToolTip("Seed of the sampler's random numbers: the same seed gives the same reply.")
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("max_tokens")
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(48)
        # which template is in use (the model's own chat template, by file) and its thinking switch, if any
        self.thinking_box = QCheckBox("Thinking")
        self.thinking_box.setObjectName("thinking")
        self.thinking_box.setEnabled(False)
        self.thinking_box.setToolTip("The chat template's thinking switch (enable_thinking, or Nemotron's "
                                     "\"detailed thinking on/off\"); off where the template has none.")
        self.template_in_use = QLabel("")
        self.template_in_use.setObjectName("template_in_use")
        top = QHBoxLayout()
        for label, widget in (("Template", self.template_combo), ("Max reply tokens", self.max_tokens)):
            top.addWidget(QLabel(label))
            top.addWidget(widget)
        top.addWidget(self.thinking_box)
        top.addWidget(self.template_in_use)
        top.addStretch(1)
        self.inputs_layout.addLayout(top)
        sampler_row = QHBoxLayout()
        sampler_widgets: tuple[tuple[str, QWidget], ...] = (
            ("Sampler", self.sampler_combo), ("Temperature", self.temp_spin), ("Top-k", self.topk_spin),
            ("Top-p", self.topp_spin), ("Seed", self.seed_spin))
        for label, sw in sampler_widgets:
            lab = QLabel(label)
            lab.setBuddy(sw)
            sampler_row.addWidget(lab)
            sampler_row.addWidget(sw)
        sampler_row.addStretch(1)
        self.inputs_layout.addLayout(sampler_row)
        self._apply_preset("deterministic")
        self.sampler_combo.currentIndexChanged.connect(lambda _i: self._preset_chosen())
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin):
            spin.valueChanged.connect(lambda _v: self._sampler_edited())
        form.addRow("System prompt", self.system_edit)
        self.inputs_layout.addLayout(form)

        chat_box = QWidget()
        cl = QVBoxLayout(chat_box)
        cl.setContentsMargins(0, 0, 0, 0)
        self.board_label = note("")
        self.board_label.setObjectName("chat_board_label")
        cl.addWidget(self.board_label)
        split = QSplitter(Qt.Orientation.Horizontal)
        self.transcript = QTextBrowser()
        self.transcript.setObjectName("transcript")
        self.transcript.setOpenExternalLinks(False)
        self.transcript.setMinimumHeight(340)
        split.addWidget(self.transcript)
        plots = QWidget()
        pl = QVBoxLayout(plots)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.addWidget(QLabel("Token rate, this reply"))
        self.rate_plot = TokenRatePlot()
        pl.addWidget(self.rate_plot, 2)
        pl.addWidget(QLabel("Generation rate per reply"))
        self.history_plot = ReplyHistoryPlot()
        pl.addWidget(self.history_plot, 1)
        split.addWidget(plots)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        cl.addWidget(split, 1)
        self.kpi_label = QLabel("")
        self.kpi_label.setObjectName("kpi_label")
        cl.addWidget(self.kpi_label)
        self.mode_label = QLabel("")
        self.mode_label.setObjectName("session_mode")
        self.mode_label.setWordWrap(True)   # a fallback reason can be long: wrap, never widen the page
        cl.addWidget(self.mode_label)
        row = QHBoxLayout()
        self.input = QPlainTextEdit()
        self.input.setObjectName("chat_input")
        self.input.setPlaceholderText("Ask something… (Ctrl+Enter sends)")
        self.input.setMaximumHeight(70)
        self.input.setTabChangesFocus(True)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("send_button")
        self.send_button.setShortcut("Ctrl+Return")
        self.send_button.clicked.connect(lambda: asyncio.ensure_future(self.send()))
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stop_button")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        row.addWidget(self.input, 1)
        row.addWidget(self.send_button)
        row.addWidget(self.stop_button)
        cl.addLayout(row)
        tools = QHBoxLayout()
        self.copy_button = QPushButton("Copy conversation")
        self.copy_button.clicked.connect(self.copy_conversation)
        self.export_button = QPushButton("Export…")
        self.export_button.clicked.connect(self.export_dialog)
        self.new_button = QPushButton("New chat")
        self.new_button.clicked.connect(self.new_chat)
        tools.addWidget(self.copy_button)
        tools.addWidget(self.export_button)
        tools.addWidget(self.new_button)
        tools.addStretch(1)
        cl.addLayout(tools)
        self.body.insertWidget(self.body.indexOf(self.inputs_box) + 1, chat_box, 1)
        self.chat_message = note("")
        cl.addWidget(self.chat_message)

        self.template_combo.currentTextChanged.connect(self._template_chosen)
        self.system_edit.editingFinished.connect(self._settings_changed)
        self.thinking_box.toggled.connect(lambda _on: self._settings_changed())
        self.conversation = Conversation()
        self.session: Any = None
        self.session_mode = "auto"          # auto | persistent | per_turn (ChatSession modes)
        self.streamed = ""
        self._stop: asyncio.Event | None = None
        self._reply_start = 0
        self.busy_chat = False

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        inputs, actions, results = super().tab_groups()
        # the message box is followed by Send and Stop, then the other actions
        first = [self.send_button, self.stop_button]
        return inputs, [*first, *(a for a in actions if a not in first)], results

    # -- sampler --------------------------------------------------------------------------------
    def sampler_preset(self) -> str:
        return str(self.sampler_combo.currentData())

    def sampler_settings(self) -> dict[str, Any] | None:
        """The sampler this chat runs with (Genie's keys), or None for the bundle's own."""
        if self.sampler_preset() == "bundle":
            return None
        return {"seed": self.seed_spin.value(), "temp": round(self.temp_spin.value(), 2),
                "top-k": self.topk_spin.value(), "top-p": round(self.topp_spin.value(), 2)}

    def _apply_preset(self, key: str) -> None:
        values = SAMPLER_PRESETS[key][1]
        spins = (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin)
        for spin in spins:
            spin.blockSignals(True)
        if values is not None:
            g = genie_sampler(values)
            self.temp_spin.setValue(float(g["temp"]))
            self.topk_spin.setValue(int(g["top-k"]))
            self.topp_spin.setValue(float(g["top-p"]))
            self.seed_spin.setValue(int(g["seed"]))
        for spin in spins:
            spin.blockSignals(False)
            spin.setEnabled(key != "bundle")
        i = self.sampler_combo.findData(key)
        if i != self.sampler_combo.currentIndex():
            self.sampler_combo.blockSignals(True)
            self.sampler_combo.setCurrentIndex(i)
            self.sampler_combo.blockSignals(False)

    def _preset_chosen(self) -> None:
        self._apply_preset(self.sampler_preset())

    def _sampler_edited(self) -> None:
        """A value was edited: it is no longer the preset, so the combo says custom."""
        values = SAMPLER_PRESETS[self.sampler_preset()][1]
        if values is not None and genie_sampler(values) != self.sampler_settings():
            self._apply_preset("custom")

    def _template_chosen(self, template: str) -> None:
        # as `hexstudio chat`: Nemotron with reasoning on samples with the thinking preset, else deterministic
        preset = self.sampler_preset()
        if template == "nemotron-reasoning-on" and preset == "deterministic":
            self._apply_preset("thinking")
        elif template != "nemotron-reasoning-on" and preset == "thinking":
            self._apply_preset("deterministic")
        self._settings_changed()

    # -- run context ----------------------------------------------------------------------------
    def board_doc(self) -> dict[str, Any] | None:
        d = self.c.stage_dir("board")
        if d is None or not (d / "board.json").is_file():
            return None
        doc: dict[str, Any] = json.loads((d / "board.json").read_text())
        return doc

    def model_dir(self) -> Path | None:
        return self.c.stage_dir("model")

    def refresh_results(self) -> None:
        doc = self.board_doc()
        if doc is None:
            self.board_label.setText("Run the Board stage first: it pushes the bundle that chat runs.")
            self.send_button.setEnabled(False)
            return
        # the board record, or what the runner itself reported (a simulator installed on an SSH board)
        session = getattr(self, "session", None)
        sim = doc.get("simulated") or (session is not None and session.simulated)
        badge = (f"<span style='color:{STATE_COLORS['stale']}'><b>SIMULATED</b> — the simulator board runs the "
                 "QDQ ONNX parts on this CPU; its rates are not device results.</span>" if sim else
                 "<b>device</b>")
        self.board_label.setText(f"Board <b>{html.escape(str(doc.get('label')))}</b> · {badge}")
        self.send_button.setEnabled(not self.busy_chat)
        self._show_template()

    def _show_template(self, t: str | None = None) -> tuple[Any, bool | None]:
        """Show which template is in use and enable the thinking switch where the chat template has one;
        returns the model's chat format and the thinking setting."""
        if t is None:
            t = self.template_combo.currentText()
            t = template_for(self.model_dir()) if t == "auto" else t
        fmt = chat_format_for(self.model_dir())
        self.thinking_box.setEnabled(t == "model" and fmt.thinking_switch is not None)
        thinking = self.thinking_box.isChecked() if self.thinking_box.isEnabled() else None
        self.template_in_use.setText(fmt.label(thinking) if t == "model" else
                                     "plain completion" if t == "plain" else f"{t} template")
        return fmt, thinking

    def _conversation_settings(self) -> None:
        m = self.c.manifest
        t = self.template_combo.currentText()
        if t == "auto":
            auto = template_for(self.model_dir())
            t = {"nemotron": "nemotron-reasoning-off"}.get(auto, auto)
        self.conversation.template = t
        self.conversation.chat_format, self.conversation.thinking = self._show_template(t)
        self.conversation.system = self.system_edit.text()
        self.conversation.max_reply_tokens = self.max_tokens.value()
        if m is not None:
            cl = m.stage("quantize").metric_value("context_length") or m.settings.get("context_length")
            model_dir = self.model_dir()
            if model_dir is not None and (model_dir / "model.json").is_file():
                md = json.loads((model_dir / "model.json").read_text())
                cl = (md.get("resolved") or {}).get("context_length", cl)
                self.conversation.count_tokens = token_counter(model_dir / str(md.get("hf_dir", "hf")))
            if isinstance(cl, int):
                self.conversation.context_length = cl

    # -- chat -------------------------------------------------------------------------------------
    def _append_html(self, text: str) -> None:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        self.transcript.setTextCursor(cur)
        self.transcript.insertHtml(text)

    def _append_text(self, text: str) -> None:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.insertText(text)
        self.transcript.setTextCursor(cur)
        self.transcript.ensureCursorVisible()

    async def open_session(self) -> Any:
        """Connect to the run's board and open a chat session on its bundle: the model stays loaded
        between turns where the board allows it (else one genie-t2t-run per turn)."""
        from app.core.device.board import open_board
        from app.core.genie.journal import ChatJournal
        from app.core.genie.session import ChatSession

        doc = self.board_doc()
        assert doc is not None
        self._conversation_settings()
        board = await open_board(str(doc["board"]), self.c.settings, self.c.workspace.root)
        sampler = self.sampler_settings()
        session = ChatSession(board, str(doc["remote_bundle"]), self.conversation, mode=self.session_mode,
                              max_tokens=self.max_tokens.value(), sampler=sampler if sampler is not None else "bundle",
                              on_status=self.chat_message.setText)
        mode = await session.open()
        if self.c.manifest is not None:  # the turns go into the run, for its report (<run>/chats/)
            session.on_turn = ChatJournal(self.c.manifest.run_dir, session, board.label).record
        self.session = session
        self.refresh_results()  # the runner may have reported itself as the simulator
        self.conversation = session.conversation
        self.mode_label.setText("model stays loaded between turns" if mode == "persistent" else
                                f"one genie-t2t-run per turn ({session.fallback_reason or 'chosen'})")
        return session

    async def send(self, text: str | None = None) -> Turn | None:
        from app.core.device.errors import BoardError
        from app.core.genie.run import Chunk
        from app.core.genie.session import SessionError

        user = (text if text is not None else self.input.toPlainText()).strip()
        if not user or self.board_doc() is None or self.busy_chat:
            return None
        self.busy_chat = True
        self.send_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.chat_message.setText("")
        self.streamed = ""
        self._stop = asyncio.Event()
        turn: Turn | None = None
        try:
            if self.session is not None and self.session.sampler_values != self.sampler_settings():
                # the sampler is fixed when the model loads: load it again with the new one (history is kept)
                await self.close_session()
                self.chat_message.setText("The sampler changed: the model loads again with it; the conversation "
                                          "is kept.")
            if self.session is None:
                await self.open_session()
            assert self.session is not None
            self.session.max_tokens = self.max_tokens.value()
            self.input.clear()
            self._append_html(f"<p><b>You:</b> {html.escape(user)}</p><p><b>Model:</b> ")
            self.rate_plot.begin_reply()

            def on_chunk(c: Chunk) -> None:
                self.show_chunk(c.t, c.text, c.tokens)

            res = await self.session.send(user, on_chunk=on_chunk, stop=self._stop)
            turn = res.turn
            if res.kpis is not None:
                turn.kpis = res.kpis.as_json()
                self.kpi_label.setText(kpi_line(turn.kpis))
                if res.kpis.gen_tok_s:
                    self.history_plot.add_reply(float(res.kpis.gen_tok_s))
                self._append_html(f"<br><span style='color:#8a8f98'><small>{html.escape(kpi_line(turn.kpis))}"
                                  "</small></span>")
            if res.state == "aborted":
                self._append_html(" <i>(stopped)</i>")
            if res.note:
                self.chat_message.setText(html.escape(res.note))
            if res.error and res.state == "failed":
                self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>Genie failed: "
                                          f"{html.escape(res.error)}</span>")
            self._append_html("</p><br>")
        except ValueError as exc:  # the message alone does not fit in the context
            self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(str(exc))}</span>")
        except (BoardError, SessionError) as exc:
            self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(exc.message)}</span>"
                                      + (f"<br><b>What to do:</b> {html.escape(exc.hint)}" if exc.hint else ""))
            await self.close_session()
        finally:
            self.busy_chat = False
            self.send_button.setEnabled(True)
            self.stop_button.setEnabled(False)
        return turn

    def show_chunk(self, t: float, text: str, tokens: int | None = None) -> None:
        """A piece of the reply arrived `t` seconds after the prompt was sent, holding `tokens` tokens (from the
        runner, or counted with the bundle's tokenizer). Unknown: the plot counts chunks and says so."""
        self.streamed += text
        self._append_text(text)
        unit = "tokens/s" if tokens is not None else "chunks/s (token count unknown)"
        if getattr(self, "_rate_unit", "tokens/s") != unit:
            self._rate_unit = unit
            self.rate_plot.setLabel("left", unit)
        self.rate_plot.add_tokens(t, tokens if tokens is not None else 1)

    async def close_session(self) -> None:
        s, self.session = self.session, None
        if s is not None:
            try:
                await s.close()
            finally:
                await s.board.transport.close()
        self.mode_label.setText("")

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _settings_changed(self) -> None:
        if self.session is not None or self.conversation.turns:
            self.new_chat()
            self.chat_message.setText("The template or system prompt changed: a new chat starts.")

    def new_chat(self) -> None:
        self._closing = asyncio.ensure_future(self.close_session())
        self.conversation = Conversation()
        self.transcript.clear()
        self.kpi_label.setText("")
        self.chat_message.setText("")

    def copy_conversation(self) -> None:
        QGuiApplication.clipboard().setText(self.conversation.as_markdown())

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the conversation", "conversation.md",
                                              "Markdown (*.md);;JSON (*.json)")
        if path:
            self.conversation.save(Path(path))
