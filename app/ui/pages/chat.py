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

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut, QShowEvent
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
from app.ui.chat_store import ChatRecord, ChatStore, ChatTurn
from app.ui.chat_view import MessageBubble, TranscriptView
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
    def f(v: Any, nd: int = 1) -> str:
        return "—" if v is None else f"{float(v):.{nd}f}"

    src = k.get("source", "device")
    tag = "SIMULATED" if src == "simulated" else "device"
    return (f"TTFT {f(k.get('ttft_ms'), 0)} ms · prompt {f(k.get('prompt_tok_s'))} tok/s · generation "
            f"{f(k.get('gen_tok_s'))} tok/s · init {f(k.get('init_ms'), 0)} ms · {k.get('generated_tokens')} tokens "
            f"[{tag}]")


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
        self.context_label = note("")
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
        self.input.setPlaceholderText("Ask something… (Ctrl+Enter sends)")
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
        self.send_button.setToolTip("Send the message (Ctrl+Enter)")
        self.send_button.clicked.connect(lambda: asyncio.ensure_future(self.send()))
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stop_button")
        self.stop_button.setEnabled(False)
        self.stop_button.setToolTip("Stop the reply now (what came so far is kept)")
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

        self._apply_preset("deterministic")
        self.sampler_combo.currentIndexChanged.connect(lambda _i: self._preset_chosen())
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin):
            spin.valueChanged.connect(lambda _v: self._sampler_edited())
        self.template_combo.currentTextChanged.connect(self._template_chosen)
        self.system_edit.editingFinished.connect(self._settings_changed)
        self.thinking_box.toggled.connect(lambda _on: self._settings_changed())
        self.max_tokens.valueChanged.connect(lambda _v: self.update_context_meter())

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

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.send_button.isEnabled() or self.busy_chat:   # as chat apps do: ready to type
            self.input.setFocus(Qt.FocusReason.OtherFocusReason)

    def _send_shortcut(self) -> None:
        if self.send_button.isEnabled():
            self.send_button.click()

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        # the message, Send and Stop first; then the chat's settings; then the conversations and the stage
        inputs: list[QWidget] = [self.input, self.send_button, self.stop_button, self.runtime_combo,
                                 self.template_combo, self.thinking_box, self.system_edit, self.max_tokens,
                                 self.sampler_combo, self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin]
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
        badge = (f"<span style='color:{STATE_COLORS['stale']}'><b>SIMULATED</b> — the simulator board runs the "
                 "QDQ ONNX parts on this CPU; its rates are not device results.</span>" if sim else
                 "<b>device</b>")
        self.board_label.setText(f"Board <b>{html.escape(str(doc.get('label')))}</b> · {badge}")
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
        if m is not None and self.session is None:
            cl = m.stage("quantize").metric_value("context_length") or m.settings.get("context_length")
            model_dir = self.model_dir()
            if model_dir is not None and (model_dir / "model.json").is_file():
                try:
                    md = json.loads((model_dir / "model.json").read_text())
                except (OSError, ValueError):
                    md = {}
                cl = (md.get("resolved") or {}).get("context_length", cl)
                self.conversation.count_tokens = self._counter(model_dir / str(md.get("hf_dir", "hf")))
            if isinstance(cl, int):
                self.conversation.context_length = cl

    def update_context_meter(self) -> None:
        conv = self.conversation
        history = [t for t in conv.turns if t.state == "complete"]
        if self.c.manifest is None:
            self.context_meter.setRange(0, 1)
            self.context_meter.setValue(0)
            self.context_meter.setFormat("no run open")
            self.context_label.setText("")
            return
        try:
            self._conversation_settings()
            used = conv.count_tokens(conv._render(history, "")) if history else 0
        except Exception as exc:   # a broken chat template: say so, never break the page
            self.context_meter.setFormat("unknown")
            self.context_label.setText(f"The prompt could not be rendered: {exc}")
            return
        total = max(int(conv.context_length), 1)
        reply = self.max_tokens.value()
        self.context_meter.setRange(0, total)
        self.context_meter.setValue(min(used, total))
        pct = 100 * used / total
        self.context_meter.setFormat(f"{used:,} / {total:,} tokens ({pct:.0f}%)")
        free = total - used - reply
        dropped = f" The oldest {conv.dropped_turns} turn(s) no longer fit and were left out." \
            if conv.dropped_turns else ""
        self.context_label.setText(f"{reply} kept for the reply; {max(free, 0):,} free." + (
            " Full: the oldest turns are left out of the next prompt." if free < 0 else "") + dropped)

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
        self.transcript.clear()
        self.history_plot.reset()
        last_kpis: dict[str, Any] = {}
        for t in rec.turns:
            self.transcript.add("user", t.user)
            b = self.transcript.add("assistant", "", on_regenerate=self.regenerate)
            b.set_text(t.reply + ("" if t.state == "complete" else
                                  "\n\n*(stopped)*" if t.state == "aborted" else
                                  f"\n\n*(failed: {t.error or t.state})*"))
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
        if self.record is not None:
            self.record.turns.append(rec_turn)
            self._save_record()
            self.reload_conversations()
        self.transcript.add("user", user)
        bubble = self.transcript.add("assistant", "", on_regenerate=self.regenerate)
        bubble.set_text("", streaming=True)
        self._reply_bubble = bubble
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
            if rec_turn.state == "pending":
                rec_turn.state = "failed"
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
        if self.record is not None and self.record.turns:
            self.record.turns.pop()
        self.transcript.remove_last()
        self.transcript.remove_last()
        self._regen = asyncio.ensure_future(self._regenerate(last.user))

    async def _regenerate(self, user: str) -> Turn | None:
        await self.close_session()   # the loaded dialog's KV cache still holds the old reply
        return await self.send(user)

    def show_chunk(self, t: float, text: str, tokens: int | None = None) -> None:
        """A piece of the reply arrived `t` seconds after the prompt was sent, holding `tokens` tokens (from the
        runner, or counted with the bundle's tokenizer). Unknown: the plot counts chunks and says so."""
        self.streamed += text
        if self._reply_bubble is not None:
            self.transcript.stream(self._reply_bubble, self.streamed)
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
        if self.busy_chat:
            return
        if self.session is not None or self.conversation.turns:
            self.new_chat()
            self.chat_message.setText("The template or system prompt changed: a new chat starts (the last one is "
                                      "kept in the list).")
        self.update_context_meter()

    def new_chat(self) -> None:
        if self.busy_chat:
            return
        self._closing = asyncio.ensure_future(self.close_session())
        self.conversation = Conversation()
        self.record = None
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

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the conversation", "conversation.md",
                                              "Markdown (*.md);;JSON (*.json)")
        if path:
            self.conversation.save(Path(path))
