"""The bottom dock: the live job — progress with ETA, the log, and the RSS/VRAM plot."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from PySide6.QtCore import QStringListModel, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.jobs import human_bytes
from hexstudio.core.sampler import ResourceSample
from hexstudio.core.units import fmt_duration
from hexstudio.ui.plots import ResourcePlot

LEVELS = ("all", "info", "warning", "error")  # "all" includes debug
LOG_KEEP = 20_000  # lines kept for filtering
LOG_SHOWN = 5_000  # lines in the view


class JobDock(QDockWidget):
    cancelRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Job", parent)
        self.setObjectName("job_dock")
        # closable: View → Job (Ctrl+J) hides and shows it; it can also be dragged down to its first line
        self.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
            | QDockWidget.DockWidgetFeature.DockWidgetClosable
        )
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(6, 4, 6, 4)
        top = QHBoxLayout()
        self.stage_label = QLabel("No job running.")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.setFormat("")
        self.eta_label = QLabel("")
        self.rss_label = QLabel("")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.setToolTip("Stop the running stage (its half-written output is removed).")
        self.cancel_button.clicked.connect(self.cancelRequested.emit)
        top.addWidget(self.stage_label)
        top.addWidget(self.progress, 1)
        top.addWidget(self.eta_label)
        top.addWidget(self.rss_label)
        top.addWidget(self.cancel_button)
        lay.addLayout(top)

        split = QSplitter(Qt.Orientation.Horizontal)
        logbox = QWidget()
        ll = QVBoxLayout(logbox)
        ll.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter the log…")
        self.filter_edit.setClearButtonEnabled(True)
        self.level_combo = QComboBox()
        self.level_combo.addItems(LEVELS)
        self.level_combo.setCurrentText("info")  # debug lines (e.g. streamed tokens) only on request
        self.level_combo.setToolTip("Show only lines of this level or worse")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the shown log lines to the clipboard")
        bar.addWidget(self.filter_edit, 1)
        bar.addWidget(self.level_combo)
        bar.addWidget(self.copy_button)
        ll.addLayout(bar)
        # a C++ string-list model: no Python call per row, and the list view paints only visible rows
        self.log_model = QStringListModel()
        self.log_view = QListView()
        self.log_view.setObjectName("log_view")
        self.log_view.setModel(self.log_model)
        self.log_view.setUniformItemSizes(True)
        self.log_view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.log_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        ll.addWidget(self.log_view)
        split.addWidget(logbox)
        self.plot = ResourcePlot()
        self.plot.setMinimumWidth(280)
        split.addWidget(self.plot)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        # small enough for a 720-px screen at 150 %: the log and the plot shrink to nothing before the
        # progress line does (a minimum of 0 would mean "use the size hint": 1 px overrides it)
        for w in (self.log_view, self.plot, logbox, split):
            w.setMinimumHeight(1)
        lay.addWidget(split, 1)
        self.setWidget(body)

        self.lines: deque[tuple[str, str]] = deque(maxlen=LOG_KEEP)  # (level, text)
        self.shown: deque[str] = deque(maxlen=LOG_SHOWN)
        self.pending: list[tuple[str, str]] = []
        self.dropped = 0
        self.started = 0.0
        self._ended = True
        self.fraction = 0.0
        self.message = ""
        self.stage: str | None = None
        self._flush = QTimer(self)
        self._flush.setInterval(100)
        self._flush.timeout.connect(self.flush)
        self._flush.start()
        self.filter_edit.textChanged.connect(self.refilter)
        self.level_combo.currentIndexChanged.connect(self.refilter)
        self.copy_button.clicked.connect(self.copy_log)

    # -- job lifecycle -------------------------------------------------------------------------
    def begin(self, stage: str, title: str, estimate_bytes: float | None = None) -> None:
        self.stage = stage
        self.started = time.monotonic()
        self._ended = False
        self.fraction = 0.0
        self.message = ""
        self.stage_label.setText(f"<b>{title}</b>")
        self.progress.setValue(0)
        self.progress.setFormat("starting…")
        self.eta_label.setText("")
        self.rss_label.setText("")
        self.cancel_button.setEnabled(True)
        self.plot.clear_data()
        self.plot.set_estimate(estimate_bytes)
        self.append("info", f"── {title} ──")

    def end(self, ok: bool, message: str) -> None:
        """The run the studio started has ended. Its time is the job's that began last, and only if one began
        since the previous end: a Run Report that stops at a gate before any job starts leaves the previous
        job's time as it was (it once became the minutes since that job began)."""
        self.cancel_button.setEnabled(False)
        began = self.started and not self._ended
        self._ended = True
        if not began:
            self.progress.setFormat(("done: " if ok else "nothing ran: ") + message[:120])
            return
        if ok:
            self.progress.setValue(1000)
        self.progress.setFormat(("done: " if ok else "stopped: ") + message[:120])
        self.eta_label.setText(fmt_duration(time.monotonic() - self.started))

    # -- data ----------------------------------------------------------------------------------
    def on_event(self, stage: str, ev: dict[str, Any]) -> None:
        t = ev.get("type")
        if t == "progress":
            self.fraction = float(ev.get("fraction", 0.0))
            self.message = str(ev.get("message") or "")
            self.progress.setValue(int(self.fraction * 1000))
            self.progress.setFormat(f"{self.fraction * 100:.0f}%  {self.message}"[:140])
            el = time.monotonic() - self.started
            if 0.02 < self.fraction < 1.0 and el > 2:
                self.eta_label.setText("ETA " + fmt_duration(el * (1 - self.fraction) / self.fraction))
        elif t == "log":
            self.append(str(ev.get("level", "info")), str(ev.get("message", "")))
        elif t == "warning":
            hint = f" — {ev['hint']}" if ev.get("hint") else ""
            self.append("warning", f"WARNING: {ev.get('message')}{hint}")
        elif t == "error":
            hint = f"\n    what to do: {ev['hint']}" if ev.get("hint") else ""
            self.append("error", f"ERROR [{ev.get('code')}]: {ev.get('message')}{hint}")
        elif t == "metric":
            self.append(
                "info", f"metric {ev.get('name')} = {ev.get('value')} {ev.get('unit') or ''}".rstrip()
            )
        elif t == "artifact":
            self.append("info", f"artifact {ev.get('path')}")

    def on_sample(self, stage: str, s: ResourceSample) -> None:
        if not s.rss_bytes:  # the process tree has already exited: not a measurement
            return
        self.plot.add(s.t, s.rss_bytes, s.vram_bytes)
        vram = f"  VRAM {human_bytes(s.vram_bytes)}" if s.vram_bytes else ""
        self.rss_label.setText(f"RSS {human_bytes(s.rss_bytes)}{vram}")

    def append(self, level: str, text: str) -> None:
        item = (level, text)
        self.lines.append(item)
        if self._visible(item):
            self.pending.append(item)
            if len(self.pending) > LOG_SHOWN:
                self.dropped += len(self.pending) - LOG_SHOWN
                del self.pending[: len(self.pending) - LOG_SHOWN]

    def _visible(self, item: tuple[str, str]) -> bool:
        level = self.level_combo.currentText()
        if level != "all":
            order = {"debug": 0, "info": 1, "warn": 2, "warning": 2, "error": 3}
            if order.get(item[0], 1) < order[level]:
                return False
        needle = self.filter_edit.text().strip().lower()
        return not needle or needle in item[1].lower()

    def flush(self) -> None:
        """Append what arrived since the last flush in one edit (bounded work per tick)."""
        if not self.pending:
            return
        lines = [t for _, t in self.pending]
        self.pending.clear()
        if self.dropped:
            lines.insert(0, f"… {self.dropped} lines skipped in the view (all are in the stage's log file)")
            self.dropped = 0
        self.shown.extend(lines)
        bar = self.log_view.verticalScrollBar()
        if bar.value() < bar.maximum() - 2 and self.log_view.selectionModel().hasSelection():
            return  # the person is reading or selecting: keep the view still; lines are kept meanwhile
        self.log_model.setStringList(list(self.shown))
        self.log_view.scrollToBottom()

    def refilter(self) -> None:
        self.pending.clear()
        self.shown.clear()
        self.shown.extend(t for level, t in self.lines if self._visible((level, t)))
        self.log_model.setStringList(list(self.shown))
        self.log_view.scrollToBottom()

    def shown_text(self) -> str:
        return "\n".join(self.shown)

    def copy_log(self) -> None:
        """The selected lines, or every shown line when none is selected."""
        rows = sorted(i.row() for i in self.log_view.selectionModel().selectedIndexes())
        shown = self.log_model.stringList()
        text = "\n".join(shown[r] for r in rows) if rows else self.shown_text()
        QGuiApplication.clipboard().setText(text)
