"""A wizard page for one stage: what it does, its inputs, its gate, and its results.

Every page reads the stage declaration (hexstudio.core.stages) and the open run's manifest; starting
the stage goes through the RunController (the pipeline and the job runner).
"""

from __future__ import annotations

import html
import itertools
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.runs import RunBusy
from hexstudio.core.stages import Stage, get_stage
from hexstudio.core.status import override_text
from hexstudio.core.units import fmt_duration
from hexstudio.shared import run_settings
from hexstudio.shared.run_settings import BadSettings
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import log_link_html, show_error
from hexstudio.ui.widgets import (
    STATE_COLORS,
    STATE_TEXT,
    KeyValueTable,
    button,
    commit_focused_edit,
    fmt_value,
    heading,
    note,
)

SettingSpec = tuple[str, str, Any]  # (key, label, kind: "int" | "bool" | "text" | list of choices)


def _when(started: Any) -> str:
    """' (started 14:02:07)' from an ISO time stamp; '' when there is none."""
    text = str(started or "")
    return f" (started {text[11:19]})" if len(text) >= 19 else ""


def focusable_in(layout: QLayout) -> list[QWidget]:
    """Widgets that take focus with Tab, in the order the layout shows them (a widget that takes focus
    itself is not searched further: a spin box's editor, a table's cells)."""
    out: list[QWidget] = []

    def widget(w: QWidget | None) -> None:
        if w is None:
            return
        inner = w.layout()
        if w.focusPolicy() & Qt.FocusPolicy.TabFocus:
            out.append(w)
        elif inner is not None:
            walk(inner)
        elif isinstance(w, QSplitter):
            for i in range(w.count()):
                widget(w.widget(i))

    def walk(lay: QLayout) -> None:
        for i in range(lay.count()):
            item = lay.itemAt(i)
            if item is None:
                continue
            sub = item.layout()
            if item.widget() is not None:
                widget(item.widget())
            elif sub is not None:
                walk(sub)

    walk(layout)
    return out


def _int_range(key: str) -> tuple[int, int]:
    """A whole-number setting's range as a spin box holds it (the registry's, within a C int)."""
    sp = run_settings.spec(key)
    lo, hi = sp.range if sp is not None and sp.range is not None else (1, 1_000_000)
    return max(int(lo), -(2**31)), min(int(hi), 2**31 - 1)


class StagePage(QWidget):
    """Subclasses add widgets to `self.inputs_box` / `self.results_box` and override refresh_results()."""

    settings_fields: tuple[SettingSpec, ...] = ()
    inputs_note = ""  # what the stage does with its inputs, shown under its settings

    def __init__(
        self, stage_name: str, controller: RunController, parent: QWidget | None = None, scroll: bool = True
    ) -> None:
        super().__init__(parent)
        self.stage: Stage = get_stage(stage_name)
        self.c = controller
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # holds the focus while its Run button is disabled
        self.setObjectName(f"page_{stage_name}")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        body = QWidget()
        if scroll:  # a page taller than the window scrolls; the Chat page lays itself out to fit instead
            area = QScrollArea()
            self.scroll_area: QScrollArea | None = area
            area.setWidgetResizable(True)
            area.setFrameShape(QScrollArea.Shape.NoFrame)
            outer.addWidget(area)
            area.setWidget(body)
        else:
            self.scroll_area = None
            outer.addWidget(body)
        self.body = QVBoxLayout(body)
        self.body.setContentsMargins(18, 14, 18, 14)
        self.body.setSpacing(10)

        head = QHBoxLayout()
        head.addWidget(heading(self.stage.title))
        self.state_label = QLabel()
        self.state_label.setObjectName("state_label")
        head.addWidget(self.state_label)
        head.addStretch(1)
        self.run_button = button(
            f"Run {self.stage.title}",
            "run_button",
            "Run this stage (and any earlier stage that is not done yet)",
            self.start,
        )
        self.rerun_button = QPushButton("Run again")
        self.rerun_button.setToolTip("Run only this stage again, even if it is up to date")
        self.rerun_button.clicked.connect(lambda: self.start(force=True))
        head.addWidget(self.run_button)
        head.addWidget(self.rerun_button)
        self.body.addLayout(head)
        self.summary_label = note(self.stage.summary)
        self.body.addWidget(self.summary_label)

        self.inputs_box = QGroupBox("Inputs")
        self.inputs_layout = QVBoxLayout(self.inputs_box)
        self.form = QFormLayout()
        self.inputs_layout.addLayout(self.form)
        self._setting_widgets: dict[str, QWidget] = {}
        # messages of earlier actions on this page (an export, a connect): cleared when the stage runs again
        self.transient_labels: list[QLabel] = []
        for key, label, kind in self.settings_fields:
            self._add_setting(key, label, kind)
        if self.inputs_note:
            self.inputs_layout.addWidget(note(self.inputs_note))
        self.body.addWidget(self.inputs_box)

        self.gate_box = QGroupBox("Gate")
        gl = QVBoxLayout(self.gate_box)
        gl.addWidget(note(self.stage.gate_text))
        self.gate_label = note("")
        self.gate_label.setObjectName("gate_label")
        gl.addWidget(self.gate_label)
        self.override_button = QPushButton("Override the gate…")
        self.override_button.setToolTip(
            "Continue past this failed gate; the override and your reason are recorded"
        )
        self.override_button.clicked.connect(self.override)
        self.override_button.setVisible(False)
        gl.addWidget(self.override_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.body.addWidget(self.gate_box)

        self.results_box = QGroupBox("Results")
        self.results_layout = QVBoxLayout(self.results_box)
        self.outcome_label = note("")
        self.outcome_label.setObjectName("outcome_label")
        self.outcome_label.setOpenExternalLinks(True)  # a failure links to the studio log
        self.outcome_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.results_layout.addWidget(self.outcome_label)
        self.metrics = KeyValueTable(["metric", "value", "scope"])
        self.metrics.setMinimumHeight(120)
        self.results_layout.addWidget(self.metrics)
        self.body.addWidget(self.results_box)
        self.body.addStretch(1)

    # -- keyboard ------------------------------------------------------------------------------
    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        """The page's focusable widgets in layout order, split into inputs, actions (push buttons) and
        results (tables, lists, read-only text). Pages reorder within the groups where that reads better."""
        inputs: list[QWidget] = []
        actions: list[QWidget] = []
        results: list[QWidget] = []
        for w in focusable_in(self.body):
            if isinstance(w, (QPushButton, QToolButton)):
                actions.append(w)
            elif isinstance(w, QAbstractItemView) or (
                isinstance(w, (QTextEdit, QPlainTextEdit)) and w.isReadOnly()
            ):
                results.append(w)
            else:
                inputs.append(w)
        return inputs, actions, results

    def apply_tab_order(self) -> None:
        """Tab walks the page as it reads: its inputs, then its actions, then its results."""
        inputs, actions, results = self.tab_groups()
        chain = [*inputs, *actions, *results]
        for a, b in itertools.pairwise(chain):
            QWidget.setTabOrder(a, b)

    # -- settings ------------------------------------------------------------------------------
    def _add_setting(self, key: str, label: str, kind: Any) -> None:
        w: QWidget
        if kind == "int":
            # recorded once, when editing ends (Enter, Tab or a click elsewhere): not every value passed on the
            # way, and never by a wheel turned over it without the focus (hexstudio.ui.theme.WheelGuard)
            sb = QSpinBox()
            lo, hi = _int_range(key)
            sb.setRange(
                lo, hi
            )  # the setting's own range (the registry's): a value outside it cannot be typed
            sb.setKeyboardTracking(False)
            sb.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            if (sp := run_settings.spec(key)) is not None and sp.unit:
                sb.setSuffix(f" {sp.unit}")  # "256 tokens", not a bare 256
            sb.editingFinished.connect(lambda k=key, b=sb: self.set_setting(k, int(b.value())))
            w = sb
        elif kind == "bool":
            cb = QCheckBox()
            cb.toggled.connect(lambda v, k=key: self.set_setting(k, bool(v)))
            w = cb
        elif isinstance(kind, (list, tuple)):
            combo = QComboBox()
            combo.addItems([str(x) for x in kind])
            combo.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            combo.activated.connect(
                lambda _i, k=key, b=combo: self.set_setting(k, b.currentText())
            )  # the user's
            w = combo
        else:
            le = QLineEdit()
            le.editingFinished.connect(lambda k=key, e=le: self.set_setting(k, e.text()))
            w = le
        w.setObjectName(f"setting_{key}")
        if (sp := run_settings.spec(key)) is not None and sp.help:
            w.setToolTip(sp.help)  # what the setting does, from the registry (docs/settings.md says the same)
        self._setting_widgets[key] = w
        self.form.addRow(label, w)

    def set_setting(self, key: str, value: Any) -> None:
        try:
            self.c.set_setting(key, value)
        except RunBusy as exc:
            # the field shows the run's value again; said where it is seen (the outcome label may be out of view)
            self._load_settings()
            show_error(self, "Setting not changed", exc.message, exc.hint)
        except BadSettings as exc:  # a value the setting does not take: nothing is recorded
            self._load_settings()
            show_error(self, "Setting not changed", exc.message, "The field shows the run's value again.")

    def _load_settings(self) -> None:
        m = self.c.manifest
        for key, w in self._setting_widgets.items():
            v = m.settings.get(key) if m is not None else None
            w.blockSignals(True)
            if isinstance(w, QSpinBox) and isinstance(v, int):
                w.setValue(v)
            elif isinstance(w, QCheckBox):
                w.setChecked(bool(v))
            elif isinstance(w, QComboBox) and v is not None:
                i = w.findText(str(v))
                if (
                    i < 0
                ):  # a value not offered (set from the command line, an AI Hub device): shown, not another run's
                    w.addItem(str(v))
                    i = w.count() - 1
                w.setCurrentIndex(i)
            elif isinstance(w, QLineEdit):
                w.setText("" if v is None else str(v))
            w.blockSignals(False)
            w.setEnabled(m is not None and not self.c.busy)

    # -- actions -------------------------------------------------------------------------------
    def start(self, force: bool = False) -> None:
        commit_focused_edit()  # a value typed but not yet recorded (a shortcut started the run): the run gets it
        # the Run button is about to be disabled: Qt would pass its focus to the next widget down the page and
        # scroll there, taking the status line and the Run buttons out of view; the page keeps the focus instead
        if self.run_button.hasFocus() or self.rerun_button.hasFocus():
            self._focus_back: QPushButton | None = (
                self.rerun_button if self.rerun_button.hasFocus() else self.run_button
            )
            self.setFocus(Qt.FocusReason.OtherFocusReason)
        if self.scroll_area is not None:
            self.scroll_area.ensureWidgetVisible(self.state_label)
        try:
            if force:
                self.c.start(self.stage.name, only=self.stage.name, force=True)
            else:
                self.c.start(self.stage.name)
        except RuntimeError as exc:
            self.outcome_label.setText(f"<span style='color:{STATE_COLORS['failed']}'>{exc}</span>")

    def override(self) -> None:
        reason, ok = QInputDialog.getText(
            self, "Override the gate", f"Why continue past the {self.stage.title} gate? (recorded in the run)"
        )
        while ok and not reason.strip():  # OK on an empty reason closed the dialog and did nothing, silently
            reason, ok = QInputDialog.getText(
                self,
                "Override the gate",
                f"A reason is needed: it is recorded in the run beside the {self.stage.title} gate it overrides.",
            )
        if ok and reason.strip():
            try:
                self.c.override_gate(self.stage.name, reason.strip())
            except RunBusy as exc:
                show_error(self, "Gate not overridden", exc.message, exc.hint)
                return
            self.refresh()

    # -- reading the run -----------------------------------------------------------------------
    def artifact_json(self, name: str) -> dict[str, Any] | None:
        d = self.c.stage_dir(self.stage.name)
        if d is None or not (d / name).is_file():
            return None
        try:
            data: dict[str, Any] = json.loads((d / name).read_text(encoding="utf-8"))
            return data
        except (OSError, json.JSONDecodeError):
            return None

    def artifact_path(self, name: str) -> Path | None:
        d = self.c.stage_dir(self.stage.name)
        return d / name if d is not None and (d / name).exists() else None

    def refresh(self) -> None:
        m = self.c.manifest
        state = self.c.state(self.stage.name)
        status = self.c.status(self.stage.name)  # the one status model: the stage list says the same
        attempt = int(m.stage(self.stage.name).data.get("attempts") or 0) if m is not None else 0
        label = STATE_TEXT.get(status.key, status.word)
        if status.key == "running":
            label = f"working… (attempt {max(attempt, 1)})"
        self.state_label.setText(
            f"<span style='color:{status.color}'>{html.escape(status.symbol)} {html.escape(label)}</span>"
        )
        self.state_label.setToolTip(status.kind.explain)
        self.state_label.setProperty("status", status.key)
        busy = self.c.busy
        running = state == "running"
        # while the stage runs, what is shown below is the previous attempt's: greyed and said so
        self.results_box.setEnabled(not running)
        self.gate_box.setEnabled(not running)
        self.results_box.setTitle(
            "Results — from the previous attempt; this stage is running now" if running else "Results"
        )
        self.run_button.setEnabled(m is not None and not busy)
        back = getattr(self, "_focus_back", None)
        if back is not None and not busy and self.hasFocus():  # the run ended: the focus goes back to Run
            self._focus_back = None
            back.setFocus(Qt.FocusReason.OtherFocusReason)
        self.rerun_button.setEnabled(m is not None and not busy and state in ("done", "stale", "failed"))
        self._load_settings()
        if m is None:
            self.gate_label.setText("No run is open: create one on the Model page or open one (Ctrl+O).")
            self.outcome_label.setText("")
            self.metrics.set_rows([])
            self.override_button.setVisible(False)
            self.refresh_results()
            return
        st = m.stage(self.stage.name)
        if status.key in ("passed", "gate_failed", "overridden"):
            text = {
                "passed": "✓ passed: ",
                "gate_failed": "! gate failed: ",
                "overridden": "⚑ gate failed, overridden: ",
            }[status.key] + html.escape(str(status.gate_reason))
            if status.override:
                text = f"{text}<br><b>{html.escape(override_text(status.override))}</b>"
            self.gate_label.setText(f"<span style='color:{status.color}'>{text}</span>")
            self.override_button.setVisible(status.key == "gate_failed" and status.overridable and not busy)
        elif status.key == "stale" and status.gate_reason:
            self.gate_label.setText(
                f"<span style='color:{status.color}'>↻ stale (runs again on resume); last "
                f"gate: {html.escape(status.gate_reason)}</span>"
            )
            self.override_button.setVisible(False)
        else:
            self.gate_label.setText("not evaluated yet")
            self.override_button.setVisible(False)
        out = st.outcome
        if running:
            for lab in self.transient_labels:
                lab.setText("")
            self.outcome_label.setText(
                f"Attempt {max(attempt, 1)} is running: the job dock below shows its progress and log."
            )
        elif out and out.get("kind") == "cancelled":
            self.outcome_label.setText(
                f"<span style='color:{STATE_COLORS['cancelled']}'><b>Attempt {attempt} was "
                f"cancelled by you</b>{_when(st.data.get('started'))}.</span> Run it again "
                "when you are ready."
            )
        elif out and out.get("kind") not in (None, "ok"):
            hint = f"<br><b>What to do:</b> {html.escape(str(out['hint']))}" if out.get("hint") else ""
            what = (
                "was interrupted (the studio or the machine stopped while it ran)"
                if state == "interrupted"
                else "failed"
            )
            self.outcome_label.setText(
                f"<span style='color:{STATE_COLORS['failed']}'><b>Attempt {attempt} {what}"
                f"{_when(st.data.get('started'))}:</b> "
                f"{html.escape(str(out.get('message')))}</span>{hint}{log_link_html()}"
            )
        elif state in ("done", "stale"):
            dur = st.data.get("duration_s")
            peak = st.data.get("peak_rss_bytes")
            self.outcome_label.setText(
                (f"Completed in {fmt_duration(float(dur))}" if isinstance(dur, int | float) else "Completed")
                + (f", peak RSS {fmt_value(peak, 'bytes')}" if peak else "")
                + "."
            )
        else:
            self.outcome_label.setText("")
        rows = [
            [k, fmt_value(v.get("value"), v.get("unit")), str(v.get("scope") or "")]
            for k, v in st.metrics.items()
        ]
        self.metrics.set_rows(rows)
        self.refresh_results()

    def refresh_results(self) -> None:
        """Stage-specific results (override)."""
