"""Chat page, laid out as LM Studio and Jan are: the run's conversations on the left, the transcript in the
middle (message bubbles, Markdown, code blocks with Copy, the thinking folded, per-message KPIs, Copy and
Regenerate) with the message box and Send/Stop pinned under it, and the settings on the right (runtime,
template and thinking, system prompt, sampler, the context in use, the token-rate plots, the stage).

Replies stream in as tokens arrive; every conversation is kept in the run (app.ui.chat_store) and shown
again when the run is opened later."""

from __future__ import annotations

import asyncio
import html
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QGuiApplication, QKeyEvent, QKeySequence, QResizeEvent, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.core.genie.conversation import TEMPLATES, Conversation, Turn, token_counter
from app.core.genie.prompts import DETERMINISTIC, NEMOTRON_THINKING_ON, chat_format_for, template_for
from app.core.genie.runtime import RUNTIMES
from app.core.units import fmt_ms, fmt_rate
from app.ui.chat_store import ChatRecord, ChatStore, ChatTurn
from app.ui.chat_view import MessageBubble, TranscriptView, flash
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
SHORT_PRESET = {"deterministic": "Deterministic", "thinking": "Thinking (temp 0.6)", "bundle": "The bundle's own",
                "custom": "Custom"}
SAMPLER_TOOLTIP = (
    "How the next token is picked. The values go into this chat's copy of the bundle's genie_config.json "
    "sampler (the bundle itself is not changed). The simulator board samples with them too: temperature, "
    "top-k, top-p and seed. Deterministic always takes the most likely token; Nemotron with reasoning on "
    "uses the thinking preset, as `hexstudio chat` does.")


def genie_sampler(values: dict[str, Any]) -> dict[str, Any]:
    """Genie's genie_config.json sampler keys (top-k, top-p) from the prompts module's (top_k, top_p)."""
    return {k.replace("_", "-"): v for k, v in values.items()}


def kpi_line(k: dict[str, Any]) -> str:
    src = k.get("source", "device")
    tag = "SIMULATED" if src == "simulated" else "device"
    return (f"TTFT {fmt_ms(k.get('ttft_ms'))} ms · prompt {fmt_rate(k.get('prompt_tok_s'))} tok/s · generation "
            f"{fmt_rate(k.get('gen_tok_s'))} tok/s · init {fmt_ms(k.get('init_ms'))} ms · "
            f"{k.get('generated_tokens')} tokens [{tag}]")


def rich(label: QLabel) -> QLabel:
    """A label whose text is always read as HTML (escaped text never shows its entities raw)."""
    label.setTextFormat(Qt.TextFormat.RichText)
    return label


def _form_row(form: QFormLayout, text: str, w: QWidget) -> None:
    lab = QLabel(text)
    lab.setBuddy(w)
    form.addRow(lab, w)


class ChatPage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("chat", controller, parent, scroll=False)
        self.body.setContentsMargins(12, 8, 12, 8)
        self.body.setSpacing(6)
        # the stage's own parts (inputs, gate, results) go to the side panel; the page is the chat
        self.summary_label.setVisible(False)
        self.inputs_box.setVisible(False)
        stretch = self.body.takeAt(self.body.count() - 1)
        del stretch
        self.body.removeWidget(self.gate_box)
        self.body.removeWidget(self.results_box)

        # -- settings (right) ---------------------------------------------------------------------
        self.runtime_combo = QComboBox()
        self.runtime_combo.setObjectName("runtime")
        self.runtime_combo.addItem("the board's setting", None)
        for r in RUNTIMES:
            self.runtime_combo.addItem({"genie": "Genie", "geniex": "GenieX"}.get(r, r), r)
        self.runtime_combo.setToolTip("Which runtime runs the model on the board: Genie (libGenie) or GenieX; "
                                      "by default the board's \"runtime\" setting (Genie if none).")
        self.template_combo = QComboBox()
        self.template_combo.setObjectName("template")
        self.template_combo.addItems(list(TEMPLATES))
        self.template_combo.setToolTip("auto: the model's own chat template where it has one (else plain "
                                       "completion); llama3 / nemotron: HexStudio's; qa: the built-in model's.")
        self.thinking_box = QCheckBox("Thinking")
        self.thinking_box.setObjectName("thinking")
        self.thinking_box.setEnabled(False)
        self.thinking_box.setToolTip("The chat template's thinking switch (enable_thinking, or Nemotron's "
                                     "\"detailed thinking on/off\"); off where the template has none. The "
                                     "thinking shows folded above the answer.")
        self.template_in_use = QLabel("")
        self.template_in_use.setObjectName("template_in_use")
        self.template_in_use.setWordWrap(True)
        self.template_in_use.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.system_edit = QLineEdit()
        self.system_edit.setObjectName("system_prompt")
        self.system_edit.setPlaceholderText("System prompt (Llama 3 / model templates)")
        self.enter_sends_box = QCheckBox("Enter sends (Shift+Enter: new line)")
        self.enter_sends_box.setObjectName("enter_sends")
        self.enter_sends_box.setChecked(True)
        self.enter_sends_box.setToolTip("On: Enter sends the message and Shift+Enter starts a new line. Off: Enter "
                                        "starts a new line. Ctrl+Enter always sends.")
        self.max_tokens = QSpinBox()
        self.max_tokens.setObjectName("max_tokens")
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(48)
        self.max_tokens.setToolTip("The most tokens a reply may have (the context keeps room for them).")
        self.sampler_combo = QComboBox()
        self.sampler_combo.setObjectName("sampler_preset")
        for key, (label, _values) in SAMPLER_PRESETS.items():
            self.sampler_combo.addItem(SHORT_PRESET.get(key, label), key)
            self.sampler_combo.setItemData(self.sampler_combo.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
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
        for w in (self.runtime_combo, self.template_combo, self.sampler_combo, self.temp_spin, self.topk_spin,
                  self.topp_spin, self.seed_spin, self.max_tokens):
            w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            w.setMinimumWidth(60)
            w.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

        side = QWidget()
        side.setObjectName("chat_settings")
        sl = QVBoxLayout(side)
        sl.setContentsMargins(4, 0, 4, 0)
        model_box = QGroupBox("Model")
        mf = QFormLayout(model_box)
        mf.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        _form_row(mf, "Runtime", self.runtime_combo)
        _form_row(mf, "Template", self.template_combo)
        mf.addRow(self.thinking_box)
        mf.addRow(self.template_in_use)
        _form_row(mf, "System", self.system_edit)
        _form_row(mf, "Max reply", self.max_tokens)
        mf.addRow(self.enter_sends_box)
        sl.addWidget(model_box)
        sampler_box = QGroupBox("Sampler")
        sf = QFormLayout(sampler_box)
        sf.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        _form_row(sf, "Preset", self.sampler_combo)
        _form_row(sf, "Temperature", self.temp_spin)
        _form_row(sf, "Top-k", self.topk_spin)
        _form_row(sf, "Top-p", self.topp_spin)
        _form_row(sf, "Seed", self.seed_spin)
        sl.addWidget(sampler_box)
        ctx_box = QGroupBox("Context")
        cxl = QVBoxLayout(ctx_box)
        self.context_meter = QProgressBar()
        self.context_meter.setObjectName("context_meter")
        self.context_meter.setRange(0, 1)
        self.context_meter.setValue(0)
        self.context_meter.setTextVisible(True)
        self.context_meter.setFormat("no conversation yet")
        self.context_meter.setToolTip("Tokens this conversation fills in the model's context (what the next "
                                      "message is sent with), and the room kept for the reply. When it is "
                                      "full, the oldest turns are left out (you are told).")
        cxl.addWidget(self.context_meter)
        self.context_label = rich(note(""))
        self.context_label.setObjectName("context_label")
        cxl.addWidget(self.context_label)
        sl.addWidget(ctx_box)
        perf_box = QGroupBox("Performance")
        pl = QVBoxLayout(perf_box)
        self.kpi_label = note("")
        self.kpi_label.setObjectName("kpi_label")
        self.kpi_label.setTextFormat(Qt.TextFormat.PlainText)
        pl.addWidget(self.kpi_label)
        self.mode_label = note("")
        self.mode_label.setObjectName("session_mode")
        self.mode_label.setTextFormat(Qt.TextFormat.PlainText)
        pl.addWidget(self.mode_label)
        pl.addWidget(QLabel("Token rate, this reply"))
        self.rate_plot = TokenRatePlot()
        self.rate_plot.setMinimumHeight(150)
        pl.addWidget(self.rate_plot)
        pl.addWidget(QLabel("Generation rate per reply"))
        self.history_plot = ReplyHistoryPlot()
        self.history_plot.setMinimumHeight(120)
        pl.addWidget(self.history_plot)
        sl.addWidget(perf_box)
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
        convs = QWidget()
        convs.setObjectName("chat_conversations")
        cvl = QVBoxLayout(convs)
        cvl.setContentsMargins(0, 0, 4, 0)
        self.new_button = QPushButton("New chat")
        self.new_button.setObjectName("new_chat")
        self.new_button.setToolTip("Start a new conversation (the others stay in the run)")
        self.new_button.clicked.connect(self.new_chat)
        cvl.addWidget(self.new_button)
        self.conv_list = QListWidget()
        self.conv_list.setObjectName("conversations")
        self.conv_list.setWordWrap(True)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.setToolTip("This run's conversations, newest first; kept in the run folder (chats/)")
        self.conv_list.itemClicked.connect(self._conversation_clicked)
        self.conv_list.itemActivated.connect(self._conversation_clicked)
        cvl.addWidget(self.conv_list, 1)
        tools = QHBoxLayout()
        self.copy_button = QPushButton("Copy")
        self.copy_button.setObjectName("copy_conversation")
        self.copy_button.setToolTip("Copy the whole conversation as Markdown")
        self.copy_button.clicked.connect(self.copy_conversation)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save the conversation as Markdown or JSON")
        self.export_button.clicked.connect(self.export_dialog)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("delete_conversation")
        self.delete_button.setToolTip("Delete this conversation from the run")
        self.delete_button.clicked.connect(self.delete_conversation)
        for b in (self.copy_button, self.export_button, self.delete_button):
            b.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            tools.addWidget(b)
        cvl.addLayout(tools)
        convs.setMinimumWidth(150)

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
        self.convs_toggle.setToolTip("Show or hide the conversations (the window is narrow, so they fold away)")
        self.side_toggle = QPushButton("Settings")
        self.side_toggle.setObjectName("show_chat_settings")
        self.side_toggle.setCheckable(True)
        self.side_toggle.setToolTip("Show or hide the chat settings, context and rates (folded on a narrow window)")
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

        self._apply_preset("deterministic")
        self.sampler_combo.currentIndexChanged.connect(lambda _i: self._preset_chosen())
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin):
            spin.valueChanged.connect(lambda _v: self._sampler_edited())
        self.template_combo.currentTextChanged.connect(self._template_chosen)
        self.system_edit.editingFinished.connect(self._settings_changed)
        self.thinking_box.toggled.connect(lambda _on: self._settings_changed())
        self.max_tokens.valueChanged.connect(lambda _v: self.update_context_meter())
        self.enter_sends_box.toggled.connect(lambda _on: self._enter_mode_changed())
        for w in (self.runtime_combo, self.sampler_combo):
            w.currentIndexChanged.connect(lambda _i: self.save_chat_settings())
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin, self.max_tokens):
            spin.editingFinished.connect(self.save_chat_settings)
        self._enter_mode_changed()

        self.conversation = Conversation()
        self.record: ChatRecord | None = None
        self.store: ChatStore | None = None
        self.session: Any = None
        self.session_runtime: str | None = None
        self.journal: Any = None
        self.session_mode = "auto"          # auto | persistent | per_turn (ChatSession modes)
        self.streamed = ""
        self._stop: asyncio.Event | None = None
        self.busy_chat = False
        self._loaded_run: Path | None = None
        self._bench_stamp: float | None = None
        self._counters: dict[str, Callable[[str], int]] = {}
        self._reply_bubble: MessageBubble | None = None
        # what the open conversation was started with: a change asks first, and only a real change counts
        self._applied: tuple[str, str, bool | None] = self._chosen()
        self._asking = False
        self._prior_versions: list[dict[str, Any]] | None = None
        self._context_length: tuple[Path | None, int | None] = (None, None)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.send_button.isEnabled() or self.busy_chat:   # as chat apps do: ready to type
            self.input.setFocus(Qt.FocusReason.OtherFocusReason)

    def _send_shortcut(self) -> None:
        if self.send_button.isEnabled():
            self.send_button.click()

    # -- keyboard -------------------------------------------------------------------------------
    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:
        """The message box: Enter sends and Shift+Enter starts a new line (or, with "Enter sends" off, Enter is
        a new line); Ctrl+Enter always sends (the page's shortcut)."""
        if (obj is self.input and ev.type() == QEvent.Type.KeyPress and isinstance(ev, QKeyEvent)
                and ev.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)):
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
        self.input.setPlaceholderText("Ask something… (Enter sends · Shift+Enter new line)" if enter else
                                      "Ask something… (Ctrl+Enter sends · Enter new line)")
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
        if on and self.compact:   # one side panel at a time on a narrow window, so the chat keeps its room
            other, toggle = ((self.side_panel, self.side_toggle) if panel is self.convs_panel else
                             (self.convs_panel, self.convs_toggle))
            toggle.setChecked(False)
            other.setVisible(False)

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        # the message, Send and Stop first; then the chat's settings; then the conversations and the stage
        inputs: list[QWidget] = [self.input, self.send_button, self.stop_button, self.convs_toggle, self.side_toggle,
                                 self.runtime_combo, self.template_combo, self.thinking_box, self.system_edit,
                                 self.max_tokens, self.enter_sends_box, self.sampler_combo, self.temp_spin,
                                 self.topk_spin, self.topp_spin, self.seed_spin]
        actions: list[QWidget] = [self.new_button, self.conv_list, self.copy_button, self.export_button,
                                  self.delete_button, self.run_button, self.rerun_button, self.override_button]
        return inputs, actions, [self.transcript, self.metrics]

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

    def runtime(self) -> str | None:
        v = self.runtime_combo.currentData()
        return str(v) if v else None

    # -- run context ----------------------------------------------------------------------------
    def board_doc(self) -> dict[str, Any] | None:
        from app.core.services.chat_target import board_doc

        return board_doc(self.c.stage_dir("board"))

    def model_dir(self) -> Path | None:
        return self.c.stage_dir("model")

    def refresh_results(self) -> None:
        self._sync_run()
        doc = self.board_doc()
        if doc is None:
            self.board_label.setText("Run the Board stage first: it pushes the bundle that chat runs." if
                                     self.c.manifest is not None else "No run is open: create one on the Model "
                                     "page or open one (Ctrl+O).")
            self.send_button.setEnabled(False)
            self.transcript.set_placeholder("" if self.transcript.bubbles else
                                            "The Board stage pushes the bundle to the board; then ask here.")
            return
        # the board record, or what the runner itself reported (a simulator installed on an SSH board)
        session = self.session
        sim = doc.get("simulated") or (session is not None and session.simulated)
        runner = session.runtime.title if session is not None else "the simulator board"
        badge = (f"<span style='color:{STATE_COLORS['stale']}'><b>SIMULATED</b> — {html.escape(runner)} on this "
                 "CPU; its rates are not device results.</span>" if sim else "<b>device</b>")
        label = str(doc.get("label"))
        short = label if len(label) <= 48 else label[:22] + "…" + label[-22:]
        self.board_label.setText(f"Board <b>{html.escape(short)}</b> · {badge}")
        self.board_label.setToolTip(label)
        self.send_button.setEnabled(not self.busy_chat)
        self.transcript.set_placeholder("Ask something: the reply streams in here, with its token rate and "
                                        "KPIs.")
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
        self.template_in_use.setText("in use: " + (fmt.label(thinking) if t == "model" else
                                                   "plain completion" if t == "plain" else f"{t} template"))
        return fmt, thinking

    def _counter(self, hf_dir: Path) -> Callable[[str], int]:
        key = str(hf_dir)
        if key not in self._counters:
            self._counters[key] = token_counter(hf_dir)
        return self._counters[key]

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
        cl = self.context_length()
        if cl is not None:   # every conversation, new ones too: the model's context, never the 4,096 default
            self.conversation.context_length = cl
        model_dir = self.model_dir()
        if m is not None and self.session is None and model_dir is not None and (model_dir / "model.json").is_file():
            try:
                md = json.loads((model_dir / "model.json").read_text())
            except (OSError, ValueError):
                md = {}
            self.conversation.count_tokens = self._counter(model_dir / str(md.get("hf_dir", "hf")))

    def context_length(self) -> int | None:
        """The bundle's context length: what the model was compiled for (the Compile stage's bundle), else what
        Quantize and the model resolved, else the run's setting."""
        m = self.c.manifest
        if m is None:
            return None
        if self._context_length[0] == m.run_dir and self._context_length[1] is not None:
            return self._context_length[1]
        cl: Any = None
        bundle = m.run_dir / "artifacts" / "compile" / "bundle" / "bundle.json"
        for doc_path, keys in ((bundle, ("context_length",)),
                               (m.run_dir / "artifacts" / "model" / "model.json", ("resolved", "context_length"))):
            try:
                doc: Any = json.loads(doc_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            for k in keys:
                doc = doc.get(k) if isinstance(doc, dict) else None
            if isinstance(doc, int) and doc > 0:
                cl = doc
                break
        if cl is None:
            cl = m.stage("quantize").metric_value("context_length") or m.settings.get("context_length")
        if cl in (None, "auto"):   # not resolved yet (no Model stage): the "auto" rule's figure
            from workers.shared.run_settings import AUTO_CONTEXT_LENGTH

            cl = AUTO_CONTEXT_LENGTH["builtin" if str(m.inputs.get("model") or "").startswith("builtin:") else "other"]
        value = int(cl) if isinstance(cl, int) and cl > 0 else None
        self._context_length = (m.run_dir, value)
        return value

    def update_context_meter(self) -> None:
        conv = self.conversation
        history = [t for t in conv.turns if t.state == "complete"]
        if self.c.manifest is None:
            self.context_meter.setRange(0, 1)
            self.context_meter.setValue(0)
            self.context_meter.setFormat("no run open")
            self.context_label.setText("")
            return
        total = max(int(conv.context_length), 1)
        reply = self.max_tokens.value()
        try:
            self._conversation_settings()
            total = max(int(conv.context_length), 1)
            budget = max(total - reply, 1)
            # what the next prompt is made of: as Conversation.prompt_for, the oldest turns go first when the
            # conversation and the reply's room no longer fit
            kept = list(history)
            used = conv.count_tokens(conv._render(kept, "")) if kept else 0
            while kept and used > budget:
                kept = kept[1:]
                used = conv.count_tokens(conv._render(kept, "")) if kept else 0
        except Exception as exc:   # a broken chat template: say so, never break the page
            self.context_meter.setFormat("unknown")
            self.context_label.setText(f"The prompt could not be rendered: {exc}")
            return
        dropped = len(history) - len(kept)
        shown = min(used, total)
        self.context_meter.setRange(0, total)
        self.context_meter.setValue(shown)
        self.context_meter.setFormat(f"{shown:,} / {total:,} tokens ({100 * shown / total:.0f}%)")
        free = max(total - used - reply, 0)
        text = f"{reply:,} kept for the reply; {free:,} free (the model's context: {total:,} tokens)."
        if dropped:
            first = kept[0].user if kept else ""
            text = (f"<span style='color:{STATE_COLORS['stale']}'><b>Full:</b> the oldest {dropped} of "
                    f"{len(history)} turns no longer fit and are left out of the next prompt"
                    + (f" (it starts at “{html.escape(first[:40])}”)" if first else "") + ".</span> " + text)
        self.context_label.setText(text)

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

    def _switch_run(self) -> None:
        if self.session is not None:
            self._closing = asyncio.ensure_future(self.close_session())
        m = self.c.manifest
        self.store = ChatStore(m.run_dir) if m is not None else None
        self.record = None
        self.conversation = Conversation()
        self._context_length = (None, None)
        self.load_chat_settings()
        self._applied = self._chosen()
        self.transcript.clear()
        self.history_plot.reset()
        self.kpi_label.setText("")
        self.chat_message.setText("")
        self.reload_conversations(select_newest=True)

    def reload_conversations(self, select_newest: bool = False) -> None:
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        records = self.store.conversations() if self.store is not None else []
        for rec in records:
            n = len(rec.turns)
            it = QListWidgetItem(f"{rec.title}\n{rec.updated.replace('T', ' ')[5:16]} · {n} "
                                 f"{'reply' if n == 1 else 'replies'}")
            it.setData(Qt.ItemDataRole.UserRole, rec.id)
            it.setToolTip(f"{rec.title}\n{rec.origin}, created {rec.created}")
            self.conv_list.addItem(it)
        self.conv_list.blockSignals(False)
        if select_newest and records:
            self.show_conversation(records[0])
        else:
            self._mark_current()

    def _mark_current(self) -> None:
        cid = self.record.id if self.record is not None else None
        for i in range(self.conv_list.count()):
            it = self.conv_list.item(i)
            if it.data(Qt.ItemDataRole.UserRole) == cid:
                self.conv_list.setCurrentRow(i)
                return
        self.conv_list.clearSelection()
        self.conv_list.setCurrentRow(-1)

    def _conversation_clicked(self, item: QListWidgetItem) -> None:
        if self.busy_chat or self.store is None:
            self._mark_current()
            return
        rec = self.store.load(str(item.data(Qt.ItemDataRole.UserRole)))
        if rec is not None and (self.record is None or rec.id != self.record.id):
            self.show_conversation(rec)

    def show_conversation(self, rec: ChatRecord) -> None:
        """Show a stored conversation; the next message continues it (the model loads it again)."""
        if self.session is not None:
            self._closing = asyncio.ensure_future(self.close_session())
        self.record = rec
        conv = Conversation()
        conv.turns = [Turn(user=t.user, reply=t.reply, kpis=dict(t.kpis), state=t.state) for t in rec.turns]
        self.conversation = conv
        for w, value in ((self.template_combo, rec.template), (self.system_edit, rec.system)):
            w.blockSignals(True)
            if isinstance(w, QComboBox) and w.findText(value) >= 0:
                w.setCurrentText(value)
            elif isinstance(w, QLineEdit):
                w.setText(value)
            w.blockSignals(False)
        if rec.thinking is not None:
            self.thinking_box.blockSignals(True)
            self.thinking_box.setChecked(bool(rec.thinking))
            self.thinking_box.blockSignals(False)
        self._show_template()
        self._applied = self._chosen()
        self.transcript.clear()
        self.history_plot.reset()
        last_kpis: dict[str, Any] = {}
        for t in rec.turns:
            self.transcript.add("user", t.user)
            b = self.transcript.add("assistant", "", on_regenerate=self.regenerate)
            b.set_text(t.reply + ("" if t.state == "complete" else
                                  "\n\n*(stopped)*" if t.state == "aborted" else
                                  "\n\n*(interrupted: the studio stopped during this reply)*"
                                  if t.state in ("pending", "streaming") else
                                  f"\n\n*(failed: {t.error or t.state})*"))
            if t.versions:
                b.set_versions(t.versions, t.version, navigable=t is rec.turns[-1])
                b.versionChosen.connect(self._version_chosen)
            if t.kpis:
                b.set_kpis(kpi_line(t.kpis))
                last_kpis = t.kpis
                if t.kpis.get("gen_tok_s"):
                    self.history_plot.add_reply(float(t.kpis["gen_tok_s"]))
        self.kpi_label.setText(kpi_line(last_kpis) if last_kpis else "")
        self.chat_message.setText(f"From {html.escape(rec.origin)}." if rec.origin != "chat page" else "")
        self._mark_current()
        self.update_context_meter()

    def _save_record(self) -> None:
        if self.store is None or self.record is None:
            return
        rec = self.record
        rec.template = self.template_combo.currentText()
        rec.system = self.system_edit.text()
        rec.thinking = self.thinking_box.isChecked() if self.thinking_box.isEnabled() else None
        rec.sampler = self.sampler_settings()
        rec.runtime = self.runtime()
        if self.journal is not None and self.journal.path.stem not in rec.journals and self.journal.turns:
            rec.journals.append(self.journal.path.stem)
        try:
            self.store.save(rec)
        except OSError as exc:
            self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>The conversation could not "
                                      f"be saved in the run: {html.escape(str(exc))}</span>")

    # -- chat -------------------------------------------------------------------------------------
    async def open_session(self) -> Any:
        """Connect to the run's board and open a chat session on its bundle: the model stays loaded
        between turns where the board allows it (else one genie-t2t-run per turn)."""
        from app.core.genie.journal import ChatJournal
        from app.core.genie.session import ChatSession
        from app.core.services.chat_target import open_run_board

        doc = self.board_doc()
        assert doc is not None
        self._conversation_settings()
        target = await open_run_board(doc, self.c.settings, self.c.workspace.root)
        board = target.board
        sampler = self.sampler_settings()
        session = ChatSession(board, target.remote_bundle, self.conversation, mode=self.session_mode,
                              max_tokens=self.max_tokens.value(), sampler=sampler if sampler is not None else "bundle",
                              on_status=lambda text: self.chat_message.setText(html.escape(text)),
                              runtime=self.runtime())
        session.on_genie_log = self.c.runtimeLog.emit     # Genie's own lines, into the Board page's console
        mode = await session.open()
        self.journal = None
        if self.c.manifest is not None:  # the turns go into the run, for its report (<run>/chats/)
            self.journal = ChatJournal(self.c.manifest.run_dir, session, board.label)
            session.on_turn = self.journal.record
        self.session = session
        self.session_runtime = self.runtime()
        self.refresh_results()  # the runner may have reported itself as the simulator
        self.conversation = session.conversation
        runtime = getattr(getattr(session, "runtime", None), "title", "")
        self.mode_label.setText((f"{runtime}: " if runtime else "") + (
            "model stays loaded between turns" if mode == "persistent" else
            f"one genie-t2t-run per turn ({session.fallback_reason or 'chosen'})"))
        return session

    async def send(self, text: str | None = None) -> Turn | None:
        from app.core.device.errors import BoardError
        from app.core.genie.run import Chunk
        from app.core.genie.session import SessionError

        user = (text if text is not None else self.input.toPlainText()).strip()
        if not user or self.board_doc() is None or self.busy_chat:
            return None
        self.busy_chat = True
        self.save_chat_settings()   # what this message is sent with is what the run keeps
        self.send_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.conv_list.setEnabled(False)
        self.new_button.setEnabled(False)
        self.chat_message.setText("")
        self.streamed = ""
        self._stop = asyncio.Event()
        if text is None:
            self.input.clear()
        if self.record is None and self.store is not None:
            self.record = self.store.new(template=self.template_combo.currentText(), system=self.system_edit.text())
        rec_turn = ChatTurn(user=user, t=time.strftime("%Y-%m-%dT%H:%M:%S"))
        self._rec_turn: ChatTurn | None = rec_turn
        if self.record is not None:
            self.record.turns.append(rec_turn)
            self._save_record()
            self.reload_conversations()
        self.transcript.add("user", user)
        for b in self.transcript.bubbles:   # earlier replies' versions are fixed once the chat goes on
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
            if self.session is not None and (self.session.sampler_values != self.sampler_settings()
                                             or self.session_runtime != self.runtime()):
                # the sampler is fixed when the model loads: load it again with the new one (history is kept)
                await self.close_session()
                self.chat_message.setText("The sampler or runtime changed: the model loads again with it; the "
                                          "conversation is kept.")
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
                self.kpi_label.setText(kpi_line(turn.kpis))
                bubble.set_kpis(kpi_line(turn.kpis))
                if res.kpis.gen_tok_s:
                    self.history_plot.add_reply(float(res.kpis.gen_tok_s))
            if self.record is not None:
                self.record.source = "simulated" if res.simulated else "device"
            if res.state == "aborted":
                self.chat_message.setText("Reply stopped; what came so far is kept.")
            if res.note:
                self.chat_message.setText(html.escape(res.note))
            if res.error and res.state == "failed":
                self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>Genie failed: "
                                          f"{html.escape(res.error)}</span>")
        except ValueError as exc:  # the message alone does not fit in the context
            rec_turn.state, rec_turn.error = "failed", str(exc)
            self.transcript.finish(bubble, f"*(not sent: {exc})*")
            self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(str(exc))}</span>")
        except (BoardError, SessionError) as exc:
            rec_turn.state, rec_turn.error = "failed", exc.message
            self.transcript.finish(bubble, f"*(failed: {exc.message})*")
            self.chat_message.setText(f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(exc.message)}</span>"
                                      + (f"<br><b>What to do:</b> {html.escape(exc.hint)}" if exc.hint else ""))
            await self.close_session()
        finally:
            self.busy_chat = False
            self._reply_bubble = None
            if rec_turn.state in ("pending", "streaming"):
                rec_turn.state = "failed"
            self._rec_turn = None
            if prior:
                versions = [*prior, {"reply": rec_turn.reply, "kpis": dict(rec_turn.kpis), "state": rec_turn.state,
                                     "kpi_line": kpi_line(rec_turn.kpis) if rec_turn.kpis else ""}]
                bubble.set_versions(versions, len(versions) - 1)
                rec_turn.versions, rec_turn.version = versions, len(versions) - 1
            self.send_button.setEnabled(self.board_doc() is not None)
            self.stop_button.setEnabled(False)
            self.conv_list.setEnabled(True)
            self.new_button.setEnabled(True)
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
            {"reply": last.reply, "kpis": dict(last.kpis), "state": last.state,
             "kpi_line": kpi_line(last.kpis) if last.kpis else ""}]
        if self.record is not None and self.record.turns:
            self.record.turns.pop()
        self.transcript.remove_last()
        self.transcript.remove_last()
        self._prior_versions = prior
        self._regen = asyncio.ensure_future(self._regenerate(last.user))

    def _version_chosen(self, index: int) -> None:
        """‹ › on the last reply: that version becomes the reply the conversation continues from."""
        bubble = self.sender()
        if (self.busy_chat or not isinstance(bubble, MessageBubble) or not self.transcript.bubbles
                or bubble is not self.transcript.bubbles[-1] or not self.conversation.turns):
            return
        v = bubble.versions[index]
        turn = self.conversation.turns[-1]
        turn.reply, turn.kpis, turn.state = str(v.get("reply") or ""), dict(v.get("kpis") or {}), \
            str(v.get("state") or "complete")
        if self.record is not None and self.record.turns:
            rt = self.record.turns[-1]
            rt.reply, rt.kpis, rt.state, rt.version = turn.reply, dict(turn.kpis), turn.state, index
            self._save_record()
        # the loaded dialog's KV cache holds the other reply: the next message loads the conversation again
        self._closing = asyncio.ensure_future(self.close_session())
        self.update_context_meter()

    async def _regenerate(self, user: str) -> Turn | None:
        await self.close_session()   # the loaded dialog's KV cache still holds the old reply
        return await self.send(user)

    def show_chunk(self, t: float, text: str, tokens: int | None = None) -> None:
        """A piece of the reply arrived `t` seconds after the prompt was sent, holding `tokens` tokens (from the
        runner, or counted with the bundle's tokenizer). Unknown: the plot counts chunks and says so."""
        first = not self.streamed
        self.streamed += text
        if self._reply_bubble is not None:
            self.transcript.stream(self._reply_bubble, self.streamed)
        rec_turn = getattr(self, "_rec_turn", None)
        if first and rec_turn is not None and self.busy_chat:
            # the reply has started: kept in the run at once (a crash mid-reply still leaves its start), once
            rec_turn.reply, rec_turn.state = self.streamed, "streaming"
            self._save_record()
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

    def _chosen(self) -> tuple[str, str, bool | None]:
        """The template, system prompt and thinking switch as the controls show them now."""
        thinking = self.thinking_box.isChecked() if self.thinking_box.isEnabled() else None
        return self.template_combo.currentText(), self.system_edit.text().strip(), thinking

    def _show_chosen(self, chosen: tuple[str, str, bool | None]) -> None:
        template, system, thinking = chosen
        for w in (self.template_combo, self.system_edit, self.thinking_box):
            w.blockSignals(True)
        if self.template_combo.findText(template) >= 0:
            self.template_combo.setCurrentText(template)
        self.system_edit.setText(system)
        if thinking is not None:
            self.thinking_box.setChecked(thinking)
        for w in (self.template_combo, self.system_edit, self.thinking_box):
            w.blockSignals(False)
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
            self.chat_message.setText("Wait for the reply to end (or stop it with Esc) before changing the "
                                      "template or system prompt.")
            return
        if self.conversation.turns:
            self._asking = True
            try:
                box = QMessageBox(QMessageBox.Icon.Question, "Start a new chat?",
                                  "The template or system prompt changed. The model reads the conversation with "
                                  "them, so a new chat starts with the new ones.\n\nThis conversation stays in the "
                                  "list.", QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, self)
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
            self.chat_message.setText("The template or system prompt changed: a new chat started (the last one is "
                                      "kept in the list).")
        elif self.session is not None:   # no messages yet: the model loads again with them at the next send
            self._closing = asyncio.ensure_future(self.close_session())
        self._applied = self._chosen()
        self.save_chat_settings()
        self.update_context_meter()

    # -- settings kept per run (<run>/chats/settings.json) ----------------------------------------------
    def chat_settings(self) -> dict[str, Any]:
        template, system, thinking = self._chosen()
        return {"runtime": self.runtime(), "template": template, "thinking": thinking, "system": system,
                "max_tokens": self.max_tokens.value(), "sampler_preset": self.sampler_preset(),
                "sampler": self.sampler_settings(), "enter_sends": self.enter_sends_box.isChecked()}

    def save_chat_settings(self) -> None:
        if getattr(self, "_loading_settings", False) or getattr(self, "store", None) is None:
            return
        assert self.store is not None
        try:
            self.store.save_settings(self.chat_settings())
        except OSError:   # a read-only run folder: the settings still apply to this session
            pass

    def load_chat_settings(self) -> None:
        values = self.store.load_settings() if self.store is not None else {}
        if not values:
            return
        self._loading_settings = True
        widgets = (self.runtime_combo, self.template_combo, self.system_edit, self.thinking_box, self.max_tokens,
                   self.sampler_combo, self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin,
                   self.enter_sends_box)
        for w in widgets:
            w.blockSignals(True)
        try:
            i = self.runtime_combo.findData(values.get("runtime"))
            if i >= 0:
                self.runtime_combo.setCurrentIndex(i)
            if isinstance(values.get("max_tokens"), int):
                self.max_tokens.setValue(int(values["max_tokens"]))
            preset = values.get("sampler_preset")
            if preset in SAMPLER_PRESETS:
                self._apply_preset(str(preset))
                sampler = values.get("sampler")
                if preset == "custom" and isinstance(sampler, dict):
                    self.temp_spin.setValue(float(sampler.get("temp", self.temp_spin.value())))
                    self.topk_spin.setValue(int(sampler.get("top-k", self.topk_spin.value())))
                    self.topp_spin.setValue(float(sampler.get("top-p", self.topp_spin.value())))
                    self.seed_spin.setValue(int(sampler.get("seed", self.seed_spin.value())))
            if isinstance(values.get("enter_sends"), bool):
                self.enter_sends_box.setChecked(bool(values["enter_sends"]))
            self._show_chosen((str(values.get("template") or "auto"), str(values.get("system") or ""),
                               values.get("thinking") if isinstance(values.get("thinking"), bool) else None))
        finally:
            for w in widgets:
                w.blockSignals(False)
            self._loading_settings = False
        self._enter_mode_changed()

    def new_chat(self) -> None:
        if self.busy_chat:
            return
        self._closing = asyncio.ensure_future(self.close_session())
        self.conversation = Conversation()
        self.record = None
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
        if QMessageBox.question(self, "Delete conversation", f"Delete “{self.record.title}” from this run?") \
                != QMessageBox.StandardButton.Yes:
            return
        self.store.delete(self.record.id)
        self.new_chat()
        self.reload_conversations()

    def copy_conversation(self) -> None:
        QGuiApplication.clipboard().setText(self.conversation.as_markdown())
        flash(self.copy_button)
        n = len(self.conversation.turns)
        self.chat_message.setText(f"Copied the conversation ({n} {'reply' if n == 1 else 'replies'}) as Markdown.")

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the conversation", "conversation.md",
                                              "Markdown (*.md);;JSON (*.json)")
        if path:
            self.conversation.save(Path(path))
