"""The studio window: the stage list on the left, one page per stage, the job dock at the bottom."""

from __future__ import annotations

import asyncio
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.sampler import ResourceSample
from app.core.stages import STAGES, get_stage
from app.ui.controller import RunController
from app.ui.job_dock import JobDock
from app.ui.pages.base import StagePage
from app.ui.pages.board import BoardPage
from app.ui.pages.chat import ChatPage
from app.ui.pages.evaluate import EvaluatePage
from app.ui.pages.model import ModelPage
from app.ui.pages.report import ReportPage
from app.ui.pages.workstation import CompilePage, PreflightPage, QuantizePage, ValidatePage
from app.ui.widgets import STATE_TEXT, state_icon


class RunsDialog(QDialog):
    """Open, resume or delete runs."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.c = controller
        self.setWindowTitle("Runs")
        self.resize(820, 420)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel(f"Runs in {controller.workspace.runs_dir}"))
        self.table = QTableWidget(0, 4)
        self.table.setObjectName("runs_table")
        self.table.setHorizontalHeaderLabels(["run", "model", "board", "stages done"])
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.doubleClicked.connect(self.accept)
        lay.addWidget(self.table)
        bb = QDialogButtonBox()
        self.open_button = bb.addButton("Open", QDialogButtonBox.ButtonRole.AcceptRole)
        self.delete_button = bb.addButton("Delete…", QDialogButtonBox.ButtonRole.DestructiveRole)
        bb.addButton(QDialogButtonBox.StandardButton.Cancel)
        bb.accepted.connect(self.accept)
        bb.rejected.connect(self.reject)
        self.delete_button.clicked.connect(self.delete_selected)
        lay.addWidget(bb)
        self.reload()

    def reload(self) -> None:
        runs = self.c.list_runs()
        self.table.setRowCount(len(runs))
        for r, s in enumerate(runs):
            done = [k for k, v in s.states.items() if v == "done"]
            for col, text in enumerate([s.run_id, s.model, s.board, f"{len(done)}/{len(s.states)}: " +
                                        ", ".join(done)]):
                self.table.setItem(r, col, QTableWidgetItem(text))
        if runs:
            self.table.selectRow(0)

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.table.item(rows[0].row(), 0)
        return item.text() if item else None

    def delete_selected(self) -> None:
        rid = self.selected()
        if rid is None:
            return
        if QMessageBox.question(self, "Delete run", f"Delete run {rid} and all its files? This cannot be undone.") \
                == QMessageBox.StandardButton.Yes:
            try:
                self.c.delete_run(rid)
            except RuntimeError as exc:
                QMessageBox.warning(self, "Delete run", str(exc))
            self.reload()


class HistoryDialog(QDialog):
    """What happened to the open run: each stage's attempts and outcome, and run-level events
    (resumes, gate overrides, setting changes), oldest first."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        m = controller.manifest
        self.setWindowTitle(f"History of {m.run_id}" if m else "History")
        self.resize(900, 460)
        lay = QVBoxLayout(self)
        self.table = QTableWidget(0, 3)
        self.table.setObjectName("history_table")
        self.table.setHorizontalHeaderLabels(["when", "what", "details"])
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        lay.addWidget(self.table)
        rows: list[tuple[str, str, str]] = []
        if m is not None:
            for s in STAGES:
                st = m.stage(s.name).data
                if st.get("started"):
                    out = st.get("outcome") or {}
                    detail = f"{st.get('state')} after {st.get('duration_s')} s (attempt {st.get('attempts')})"
                    if out.get("message") and out.get("kind") != "ok":
                        detail += f": {out.get('message')}"
                    rows.append((str(st.get("started")), f"stage {s.name}", detail))
            for ev in m.data.get("events", []):
                rows.append((str(ev.get("t")), str(ev.get("kind")), str(ev.get("message"))))
        rows.sort()
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for col, text in enumerate(row):
                self.table.setItem(r, col, QTableWidgetItem(text))
        self.table.resizeColumnsToContents()
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        bb.rejected.connect(self.reject)
        lay.addWidget(bb)


class MainWindow(QMainWindow):
    def __init__(self, controller: RunController | None = None) -> None:
        super().__init__()
        self.setWindowTitle("HexStudio")
        self.setObjectName("main_window")
        self.c = controller or RunController()
        self.stage_list = QListWidget()
        self.stage_list.setObjectName("stage_list")
        self.stage_list.setMaximumWidth(210)
        self.stage_list.setMinimumWidth(170)
        self.stack = QStackedWidget()
        self.pages: dict[str, StagePage] = {
            "model": ModelPage(self.c), "preflight": PreflightPage(self.c), "quantize": QuantizePage(self.c),
            "validate": ValidatePage(self.c), "compile": CompilePage(self.c), "board": BoardPage(self.c),
            "chat": ChatPage(self.c), "evaluate": EvaluatePage(self.c), "report": ReportPage(self.c),
        }
        for page in self.pages.values():
            page.apply_tab_order()
        for s in STAGES:
            item = QListWidgetItem(state_icon("pending"), s.title)
            item.setData(Qt.ItemDataRole.UserRole, s.name)
            self.stage_list.addItem(item)
            self.stack.addWidget(self.pages[s.name])
        self.stage_list.currentRowChanged.connect(self.stack.setCurrentIndex)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(6, 6, 0, 6)
        self.run_label = QLabel()
        self.run_label.setObjectName("run_label")
        self.run_label.setWordWrap(True)
        ll.addWidget(self.run_label)
        ll.addWidget(self.stage_list, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(self.stack)
        split.setStretchFactor(1, 1)
        central = QWidget()
        cl = QHBoxLayout(central)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(split)
        self.setCentralWidget(central)
        self.dock = JobDock(self)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.dock)
        self._make_menu()

        self.c.runChanged.connect(self.on_run_changed)
        self.c.stageState.connect(self.on_stage_state)
        self.c.stageEvent.connect(self.on_stage_event)
        self.c.resourceSample.connect(self.on_sample)
        self.c.busyChanged.connect(lambda _b: self.refresh())
        self.c.settingsChanged.connect(self.refresh)
        self.c.finished.connect(self.on_finished)
        self.dock.cancelRequested.connect(lambda: asyncio.ensure_future(self.c.cancel()))
        self.stage_list.setCurrentRow(0)
        self.resize(1280, 860)
        self.resizeDocks([self.dock], [250], Qt.Orientation.Vertical)
        self._restore_geometry()
        self.refresh()

    # -- chrome ---------------------------------------------------------------------------------
    def _make_menu(self) -> None:
        m = self.menuBar().addMenu("&Run")
        new = QAction("&New run…", self)
        new.setShortcut(QKeySequence.StandardKey.New)
        new.triggered.connect(lambda: self.stage_list.setCurrentRow(0))
        opn = QAction("&Open or delete runs…", self)
        opn.setShortcut(QKeySequence.StandardKey.Open)
        opn.triggered.connect(self.open_runs_dialog)
        resume = QAction("&Resume (run every stage that is not done)", self)
        resume.setShortcut("Ctrl+R")
        resume.triggered.connect(self.resume)
        history = QAction("&History of this run…", self)
        history.setShortcut("Ctrl+H")
        history.triggered.connect(lambda: HistoryDialog(self.c, self).exec())
        cancel = QAction("&Cancel the running stage", self)
        cancel.setShortcut("Ctrl+.")
        cancel.triggered.connect(lambda: asyncio.ensure_future(self.c.cancel()))
        quit_ = QAction("&Quit", self)
        quit_.setShortcut(QKeySequence.StandardKey.Quit)
        quit_.triggered.connect(self.close)
        for a in (new, opn, resume, history, cancel):
            m.addAction(a)
        m.addSeparator()
        m.addAction(quit_)
        v = self.menuBar().addMenu("&View")
        v.addAction(self.dock.toggleViewAction())
        for i, s in enumerate(STAGES):
            a = QAction(s.title, self)
            a.setShortcut(f"Alt+{i + 1}")
            a.triggered.connect(lambda _=False, row=i: self.stage_list.setCurrentRow(row))
            v.addAction(a)

    def _restore_geometry(self) -> None:
        qs = QSettings()
        g = qs.value("window/geometry")
        if isinstance(g, QByteArray):
            self.restoreGeometry(g)
        st = qs.value("window/state")
        if isinstance(st, QByteArray):
            self.restoreState(st)

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.c.busy and QMessageBox.question(
                self, "Quit HexStudio", f"The {self.c.running_stage} stage is still working. Cancel it and quit? "
                "(The run can be resumed later.)") != QMessageBox.StandardButton.Yes:
            event.ignore()
            return
        qs = QSettings()
        qs.setValue("window/geometry", self.saveGeometry())
        qs.setValue("window/state", self.saveState())
        if self.c.busy:
            self._shutdown = asyncio.ensure_future(self.c.shutdown())
        event.accept()

    # -- actions --------------------------------------------------------------------------------
    def open_runs_dialog(self) -> None:
        d = RunsDialog(self.c, self)
        if d.exec() == QDialog.DialogCode.Accepted and d.selected():
            self.open_run(str(d.selected()))

    def open_run(self, run_id: str) -> None:
        try:
            self.c.open_run(run_id)
            QSettings().setValue("recent/run", run_id)
        except Exception as exc:
            QMessageBox.warning(self, "Open run", str(exc))

    def resume(self) -> None:
        if self.c.manifest is None or self.c.busy:
            return
        self.c.start("report")

    def show_stage(self, name: str) -> None:
        self.stage_list.setCurrentRow([s.name for s in STAGES].index(name))

    # -- controller signals ---------------------------------------------------------------------
    def on_run_changed(self) -> None:
        self.dock.plot.clear_data()
        board = self.pages["board"]
        if isinstance(board, BoardPage):
            board.reload_boards()
        self.refresh()

    def refresh(self) -> None:
        m = self.c.manifest
        if m is None:
            self.run_label.setText("<b>No run open</b><br>New run: Model page · Open: Ctrl+O")
        else:
            self.run_label.setText(f"<b>{m.run_id}</b><br>{m.inputs.get('model')} → {m.inputs.get('board')}")
        for i, s in enumerate(STAGES):
            state = self.c.state(s.name)
            item = self.stage_list.item(i)
            item.setIcon(state_icon(state))
            item.setToolTip(f"{s.title}: {STATE_TEXT.get(state, state)}")
        for p in self.pages.values():
            p.refresh()

    def on_stage_state(self, name: str, state: str) -> None:
        if state == "running":
            est = None
            if self.c.manifest is not None:
                st = get_stage(name)
                doc = self.pages["model"].artifact_json("model.json") if st.heavy else None
                if doc:
                    est = (doc.get("estimates") or {}).get(f"{name}_peak_rss_bytes")
            self.dock.begin(name, get_stage(name).title, est)
        i = [s.name for s in STAGES].index(name)
        self.stage_list.item(i).setIcon(state_icon(self.c.state(name)))
        if state != "running":
            self.pages[name].refresh()

    def on_stage_event(self, stage: str, ev: dict[str, Any]) -> None:
        self.dock.on_event(stage, ev)

    def on_sample(self, stage: str, s: ResourceSample) -> None:
        self.dock.on_sample(stage, s)

    def on_finished(self, stage: str, ok: bool, message: str, hint: str) -> None:
        self.dock.end(ok, message if not hint else f"{message} — {hint}")
        self.refresh()
        if not ok and message != "cancelled":
            self.statusBar().showMessage(f"{stage}: {message}", 15000)
