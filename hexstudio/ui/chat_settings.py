"""The chat's settings panel: the runtime, the chat template and its thinking switch, the system prompt, the reply's
length, how Enter behaves, and the sampler (a preset or custom values in Genie's keys).

The panel keeps its own rules (a preset fills the values, an edited value makes the sampler custom, Nemotron with
reasoning on picks the thinking preset as `hexstudio chat` does); what a change means for the conversation (ask,
start a new chat, load the model again) is the page's and its controller's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.genie.conversation import TEMPLATES
from hexstudio.core.genie.prompts import DETERMINISTIC, NEMOTRON_THINKING_ON, chat_format_for, template_for
from hexstudio.core.genie.runtime import RUNTIMES
from hexstudio.core.services.chat import DIALOG_LABELS, SessionSetup, bundle_dialogs, run_bundle_dir
from hexstudio.core.services.chat_controller import Chosen, Rendering, SentWith, conversation_template
from hexstudio.shared.bundle import genie_sampler_keys
from hexstudio.shared.chat_template import ChatFormat
from hexstudio.ui.widgets import check_box, float_spin_box, spin_box

# preset key -> (label, values); the keys match hexstudio.core.genie.session's presets (and the CLI's --sampler)
SAMPLER_PRESETS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "deterministic": ("deterministic (seed 42, temp 0, top-k 1, top-p 1)", DETERMINISTIC),
    "thinking": ("thinking (Nemotron reasoning on: temp 0.6, top-k 40, top-p 0.95)", NEMOTRON_THINKING_ON),
    "bundle": ("the bundle's own sampler (genie_config.json as compiled)", None),
    "custom": ("custom", None),
}
SHORT_PRESET = {
    "deterministic": "Deterministic",
    "thinking": "Thinking (temp 0.6)",
    "bundle": "The bundle's own",
    "custom": "Custom",
}
SAMPLER_TOOLTIP = (
    "How the next token is picked. The values go into this chat's copy of the bundle's genie_config.json "
    "sampler (the bundle itself is not changed). The simulator board samples with them too: temperature, "
    "top-k, top-p and seed. Deterministic always takes the most likely token; Nemotron with reasoning on "
    "uses the thinking preset, as `hexstudio chat` does."
)


FormRow = tuple[str, QWidget] | QWidget  # (label, field), or a widget on a row alone


def form_group(title: str, rows: list[FormRow]) -> QGroupBox:
    """A group box of form rows: (label, field) with the label the field's buddy, or a widget on a row alone."""
    box = QGroupBox(title)
    form = QFormLayout(box)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    for row in rows:
        if isinstance(row, tuple):
            text, w = row
            lab = QLabel(text)
            lab.setBuddy(w)
            form.addRow(lab, w)
        else:
            form.addRow(row)
    return box


class ChatSettingsPanel(QWidget):
    """The Model and Sampler groups of the chat's side panel."""

    # a setting the run keeps was edited (the runtime, the sampler, the reply's length, how Enter behaves); the
    # template, system prompt, thinking switch and dialog say so by their own signals (a change means more)
    edited = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model_fields()
        self._sampler_fields()
        self._lay_out()
        self.apply_preset("deterministic")
        self._connect()

    def _model_fields(self) -> None:
        """The Model group's fields: runtime, dialog, template and its thinking switch, system prompt, reply
        length, how Enter behaves."""
        self.runtime_combo = QComboBox()
        self.runtime_combo.setObjectName("runtime")
        self.runtime_combo.addItem("the board's setting", None)
        for r in RUNTIMES:
            self.runtime_combo.addItem({"genie": "Genie", "geniex": "GenieX"}.get(r, r), r)
        self.runtime_combo.setToolTip(
            "Which runtime runs the model on the board: Genie (libGenie) or GenieX; "
            'by default the board\'s "runtime" setting (Genie if none).'
        )
        self.dialog_combo = QComboBox()
        self.dialog_combo.setObjectName("dialog")
        self.dialog_combo.setToolTip(
            "Genie's dialog: basic (one token a step), or a speculative one the bundle "
            "carries (the Compile stage's speculative_dialogs): lade looks ahead, spd "
            "drafts with a small model; both may accept several tokens a step. Only the "
            "dialogs of the open bundle are listed; a change loads the model again."
        )
        self._wanted_dialog = "basic"  # the user's (or the run's kept) choice, shown when the bundle has it
        self.set_dialogs(["basic"])
        self.dialog_combo.currentIndexChanged.connect(lambda _i: self._dialog_picked())
        self.template_combo = QComboBox()
        self.template_combo.setObjectName("template")
        self.template_combo.addItems(list(TEMPLATES))
        self.template_combo.setToolTip(
            "auto: the model's own chat template where it has one (else plain "
            "completion); llama3 / nemotron: HexStudio's; qa: the built-in model's."
        )
        self.thinking_box = check_box(
            "Thinking",
            "thinking",
            "The chat template's thinking switch (enable_thinking, or Nemotron's "
            '"detailed thinking on/off"); off where the template has none. The '
            "thinking shows folded above the answer.",
        )
        self.thinking_box.setEnabled(False)
        self.template_in_use = QLabel("")
        self.template_in_use.setObjectName("template_in_use")
        self.template_in_use.setWordWrap(True)
        self.template_in_use.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.system_edit = QLineEdit()
        self.system_edit.setObjectName("system_prompt")
        self.system_edit.setPlaceholderText("System prompt (Llama 3 / model templates)")
        self.enter_sends_box = check_box(
            "Enter sends (Shift+Enter: new line)",
            "enter_sends",
            "On: Enter sends the message and Shift+Enter starts a new line. Off: Enter "
            "starts a new line. Ctrl+Enter always sends.",
            checked=True,
        )
        self.max_tokens = spin_box(
            "max_tokens", 1, 4096, "The most tokens a reply may have (the context keeps room for them)."
        )
        self.max_tokens.setValue(48)

    def _sampler_fields(self) -> None:
        """The Sampler group's fields: the preset and the values it sets (temperature, top-k, top-p, seed)."""
        self.sampler_combo = QComboBox()
        self.sampler_combo.setObjectName("sampler_preset")
        for key, (label, _values) in SAMPLER_PRESETS.items():
            self.sampler_combo.addItem(SHORT_PRESET.get(key, label), key)
            self.sampler_combo.setItemData(self.sampler_combo.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
        self.sampler_combo.setToolTip(SAMPLER_TOOLTIP)
        self.temp_spin = float_spin_box(
            "sampler_temp",
            0.0,
            2.0,
            2,
            "Temperature: 0 always takes the most likely token; higher is more varied.",
            step=0.05,
        )
        self.topk_spin = spin_box(
            "sampler_top_k", 1, 1000, "Top-k: sample only among the k most likely tokens (1 = greedy)."
        )
        self.topp_spin = float_spin_box(
            "sampler_top_p",
            0.01,
            1.0,
            2,
            "Top-p: sample only among the most likely tokens that together reach p.",
            step=0.05,
        )
        self.seed_spin = spin_box(
            "sampler_seed",
            0,
            2**31 - 1,
            "Seed of the sampler's random numbers: the same seed gives the same reply.",
        )

    def _lay_out(self) -> None:
        """Both groups as forms, each field as wide as the panel lets it be."""
        for w in (
            self.runtime_combo,
            self.dialog_combo,
            self.template_combo,
            self.sampler_combo,
            self.temp_spin,
            self.topk_spin,
            self.topp_spin,
            self.seed_spin,
            self.max_tokens,
        ):
            w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            w.setMinimumWidth(60)
            w.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        groups: list[tuple[str, list[FormRow]]] = [
            (
                "Model",
                [
                    ("Runtime", self.runtime_combo),
                    ("Dialog", self.dialog_combo),
                    ("Template", self.template_combo),
                    self.thinking_box,
                    self.template_in_use,
                    ("System", self.system_edit),
                    ("Max reply", self.max_tokens),
                    self.enter_sends_box,
                ],
            ),
            (
                "Sampler",
                [
                    ("Preset", self.sampler_combo),
                    ("Temperature", self.temp_spin),
                    ("Top-k", self.topk_spin),
                    ("Top-p", self.topp_spin),
                    ("Seed", self.seed_spin),
                ],
            ),
        ]
        for title, rows in groups:
            lay.addWidget(form_group(title, rows))

    def _connect(self) -> None:
        """A preset sets the values, an edited value makes the preset Custom, and every kept setting says `edited`."""
        self.sampler_combo.currentIndexChanged.connect(lambda _i: self.apply_preset(self.sampler_preset()))
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin):
            spin.valueChanged.connect(lambda _v: self._sampler_edited())
        # connected first, so the preset is in place when the page hears of the template change
        self.template_combo.currentTextChanged.connect(self._template_chosen)
        for combo in (self.runtime_combo, self.sampler_combo):
            combo.currentIndexChanged.connect(lambda _i: self.edited.emit())
        for spin in (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin, self.max_tokens):
            spin.editingFinished.connect(self.edited.emit)
        self.enter_sends_box.toggled.connect(lambda _on: self.edited.emit())

    def tab_order(self) -> list[QWidget]:
        return [
            self.runtime_combo,
            self.dialog_combo,
            self.template_combo,
            self.thinking_box,
            self.system_edit,
            self.max_tokens,
            self.enter_sends_box,
            self.sampler_combo,
            self.temp_spin,
            self.topk_spin,
            self.topp_spin,
            self.seed_spin,
        ]

    # -- the runtime, the template, the system prompt ---------------------------------------------------
    def runtime(self) -> str | None:
        v = self.runtime_combo.currentData()
        return str(v) if v else None

    def dialog(self) -> str:
        return str(self.dialog_combo.currentData() or "basic")

    def _dialog_picked(self) -> None:
        self._wanted_dialog = self.dialog()

    def set_dialogs(self, dialogs: list[str]) -> None:
        """List the dialogs the open bundle has (basic always), showing the one last chosen where the bundle has
        it, else basic. No change signal: the caller says what a change means."""
        if [self.dialog_combo.itemData(i) for i in range(self.dialog_combo.count())] == dialogs:
            return
        want = self._wanted_dialog
        self.dialog_combo.blockSignals(True)
        self.dialog_combo.clear()
        for d in dialogs:
            self.dialog_combo.addItem(DIALOG_LABELS.get(d, d), d)
        i = self.dialog_combo.findData(want)
        self.dialog_combo.setCurrentIndex(i if i >= 0 else 0)
        self.dialog_combo.setEnabled(len(dialogs) > 1)
        self.dialog_combo.blockSignals(False)

    def session_setup(self) -> SessionSetup:
        """What the next message's session must be loaded with."""
        return SessionSetup(runtime=self.runtime(), sampler=self.sampler_settings(), dialog=self.dialog())

    def list_dialogs(self, run_dir: Path | None, board_doc: dict[str, Any] | None) -> None:
        """The dialogs the open run's bundle carries (genie_config.<type>.json beside genie_config.json)."""
        self.set_dialogs(bundle_dialogs(run_bundle_dir(run_dir, board_doc) if run_dir is not None else None))

    def thinking(self) -> bool | None:
        return self.thinking_box.isChecked() if self.thinking_box.isEnabled() else None

    def chosen(self) -> Chosen:
        """The template, system prompt and thinking switch as the controls show them now."""
        return Chosen(self.template_combo.currentText(), self.system_edit.text().strip(), self.thinking())

    def sent_with(self) -> SentWith:
        """What the conversation's messages are sent with, kept in its record."""
        return SentWith(
            template=self.template_combo.currentText(),
            system=self.system_edit.text(),
            thinking=self.thinking(),
            sampler=self.sampler_settings(),
            runtime=self.runtime(),
            dialog=self.dialog(),
        )

    def show_chosen(self, chosen: Chosen) -> None:
        """Show a conversation's template, system prompt and thinking switch (no change signals)."""
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

    def show_template(self, template: str, fmt: ChatFormat) -> bool | None:
        """Say which template is in use (`template` resolved from auto) and enable the thinking switch where the
        model's chat format has one; returns the thinking setting."""
        self.thinking_box.setEnabled(template == "model" and fmt.thinking_switch is not None)
        thinking = self.thinking()
        self.template_in_use.setText(
            "in use: "
            + (
                fmt.label(thinking)
                if template == "model"
                else "plain completion"
                if template == "plain"
                else f"{template} template"
            )
        )
        return thinking

    def show_template_for(
        self, model_dir: Path | None, template: str | None = None
    ) -> tuple[ChatFormat, bool | None]:
        """Show the template in use for the model in `model_dir` (`template`, else the one chosen, auto resolved);
        returns the model's chat format and the thinking setting."""
        if template is None:
            template = self.template_combo.currentText()
            template = template_for(model_dir) if template == "auto" else template
        fmt = chat_format_for(model_dir)
        return fmt, self.show_template(template, fmt)

    def rendering(self, model_dir: Path | None) -> Rendering:
        """What the open conversation is rendered with, as the settings show it now."""
        template = conversation_template(self.template_combo.currentText(), model_dir)
        fmt, thinking = self.show_template_for(model_dir, template)
        return Rendering(template, fmt, thinking, self.system_edit.text(), self.max_tokens.value())

    # -- the sampler --------------------------------------------------------------------------------------
    def sampler_preset(self) -> str:
        return str(self.sampler_combo.currentData())

    def sampler_settings(self) -> dict[str, Any] | None:
        """The sampler this chat runs with (Genie's keys), or None for the bundle's own."""
        if self.sampler_preset() == "bundle":
            return None
        return {
            "seed": self.seed_spin.value(),
            "temp": round(self.temp_spin.value(), 2),
            "top-k": self.topk_spin.value(),
            "top-p": round(self.topp_spin.value(), 2),
        }

    def apply_preset(self, key: str) -> None:
        values = SAMPLER_PRESETS[key][1]
        spins = (self.temp_spin, self.topk_spin, self.topp_spin, self.seed_spin)
        for spin in spins:
            spin.blockSignals(True)
        if values is not None:
            g = genie_sampler_keys(values)
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

    def _sampler_edited(self) -> None:
        """A value was edited: it is no longer the preset, so the combo says custom."""
        values = SAMPLER_PRESETS[self.sampler_preset()][1]
        if values is not None and genie_sampler_keys(values) != self.sampler_settings():
            self.apply_preset("custom")

    def _template_chosen(self, template: str) -> None:
        # as `hexstudio chat`: Nemotron with reasoning on samples with the thinking preset, else deterministic
        preset = self.sampler_preset()
        if template == "nemotron-reasoning-on" and preset == "deterministic":
            self.apply_preset("thinking")
        elif template != "nemotron-reasoning-on" and preset == "thinking":
            self.apply_preset("deterministic")

    # -- kept per run (<run>/chats/settings.json) ---------------------------------------------------------
    def values(self) -> dict[str, Any]:
        template, system, thinking = self.chosen()
        return {
            "runtime": self.runtime(),
            "dialog": self.dialog(),
            "template": template,
            "thinking": thinking,
            "system": system,
            "max_tokens": self.max_tokens.value(),
            "sampler_preset": self.sampler_preset(),
            "sampler": self.sampler_settings(),
            "enter_sends": self.enter_sends_box.isChecked(),
        }

    def load(self, values: dict[str, Any]) -> None:
        """Show the settings a run kept (no change signals)."""
        widgets = (
            self.runtime_combo,
            self.dialog_combo,
            self.template_combo,
            self.system_edit,
            self.thinking_box,
            self.max_tokens,
            self.sampler_combo,
            self.temp_spin,
            self.topk_spin,
            self.topp_spin,
            self.seed_spin,
            self.enter_sends_box,
        )
        for w in widgets:
            w.blockSignals(True)
        try:
            i = self.runtime_combo.findData(values.get("runtime"))
            if i >= 0:
                self.runtime_combo.setCurrentIndex(i)
            if isinstance(values.get("dialog"), str):  # kept where the bundle has it (set_dialogs)
                self._wanted_dialog = str(values["dialog"])
                i = self.dialog_combo.findData(self._wanted_dialog)
                if i >= 0:
                    self.dialog_combo.setCurrentIndex(i)
            if isinstance(values.get("max_tokens"), int):
                self.max_tokens.setValue(int(values["max_tokens"]))
            preset = values.get("sampler_preset")
            if preset in SAMPLER_PRESETS:
                self.apply_preset(str(preset))
                sampler = values.get("sampler")
                if preset == "custom" and isinstance(sampler, dict):
                    self.temp_spin.setValue(float(sampler.get("temp", self.temp_spin.value())))
                    self.topk_spin.setValue(int(sampler.get("top-k", self.topk_spin.value())))
                    self.topp_spin.setValue(float(sampler.get("top-p", self.topp_spin.value())))
                    self.seed_spin.setValue(int(sampler.get("seed", self.seed_spin.value())))
            if isinstance(values.get("enter_sends"), bool):
                self.enter_sends_box.setChecked(bool(values["enter_sends"]))
            self.show_chosen(
                Chosen(
                    str(values.get("template") or "auto"),
                    str(values.get("system") or ""),
                    values.get("thinking") if isinstance(values.get("thinking"), bool) else None,
                )
            )
        finally:
            for w in widgets:
                w.blockSignals(False)
