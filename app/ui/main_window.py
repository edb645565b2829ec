"""The studio window: the stage list on the left, one page per stage, the job dock at the bottom."""

from __future__ import annotations

import asyncio
import html
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QRect, QSettings, Qt, QTimer, QUrl, qVersion
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QColor,
    QDesktopServices,
    QGuiApplication,
    QKeySequence,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.jobs import human_bytes
from app.core.logs import log_dir
from app.core.manifest import ManifestError, RunManifest
from app.core.runs import RunSummary
from app.core.sampler import ResourceSample
from app.core.stages import STAGES, get_stage
from app.core.status import KINDS, run_status, stage_statuses
from app.core.units import fmt_rate
from app.ui.controller import RunController
from app.ui.errors import show_error
from app.ui.job_dock import JobDock
from app.ui.pages.base import StagePage
from app.ui.pages.board import BoardPage
from app.ui.pages.chat import ChatPage
from app.ui.pages.evaluate import EvaluatePage
from app.ui.pages.model import ModelPage
from app.ui.pages.report import ReportPage
from app.ui.pages.workstation import CompilePage, PreflightPage, QuantizePage, ValidatePage
from app.ui.widgets import STATE_COLORS, state_icon
from workers.shared.errors import ActionableError


def run_row(s: RunSummary) -> dict[str, Any]:
    """One row of the runs dashboard: what the run is and how it went, from run.json alone (fast for
    hundreds of runs): status, the Validate verdict, the chat KPIs, the peak RSS of the heavy stages."""
    try:
        data = json.loads((s.path / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    stages = data.get("stages") or {}
    try:   # the one status model (app.core.status): the same words as the stage list, the report and the CLI
        statuses = stage_statuses(RunManifest.load(s.path))
        rs = run_status(statuses)
        # a run completed past an overridden gate carries the override's mark, never a plain tick
        status, status_key = rs.word, ("overridden" if rs.key == "complete" and rs.overridden else rs.key)
        verdict_status = next(x for x in statuses if x.stage == "validate")
        verdict = "" if verdict_status.key in ("pending", "running") else verdict_status.word
    except (ManifestError, OSError, KeyError, ValueError):
        status, status_key, verdict = "unreadable run.json", "failed", ""

    def metric(stage: str, name: str) -> float | None:
        v = ((stages.get(stage) or {}).get("metrics") or {}).get(name)
        v = v.get("value") if isinstance(v, dict) else v
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    peaks = [float(p) for st in stages.values() if isinstance(st, dict)
             for p in [st.get("peak_rss_bytes")] if isinstance(p, (int, float))]
    chat_source = ""
    cj = s.path / "artifacts" / "chat" / "chat.json"
    if cj.is_file():
        try:
            chat_source = str(json.loads(cj.read_text(encoding="utf-8")).get("source") or "")
        except (OSError, ValueError):
            chat_source = ""
    return {"run": s.run_id, "name": data.get("name") or s.run_id, "model": s.model, "created": s.created,
            "status": status, "status_key": status_key, "verdict": verdict, "tok_s": metric("chat", "gen_tok_s"),
            "ttft_ms": metric("chat", "ttft_ms"), "peak_rss": max(peaks) if peaks else None, "board": s.board,
            "source": chat_source}


class SortItem(QTableWidgetItem):
    """Sorts by the value it was made from (numbers as numbers, blanks last), shows its text."""

    def __init__(self, text: str, key: Any = None) -> None:
        super().__init__(text)
        self.key = key if key is not None else text

    def __lt__(self, other: QTableWidgetItem) -> bool:
        k = other.key if isinstance(other, SortItem) else other.text()
        a, b = self.key, k
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        return str(a) < str(b)


RUN_COLUMNS = ("name", "model", "created", "status", "verdict", "gen tok/s", "TTFT ms", "peak RSS", "board")


class RunsDialog(QDialog):
    """The runs dashboard: every run of the workspace in a sortable table; open one, compare several side
    by side (the report's comparison), delete."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.c = controller
        self.setWindowTitle("Runs")
        self.setObjectName("runs_dialog")
        self.resize(1100, 520)
        lay = QVBoxLayout(self)
        where = QLabel(f"Runs in {controller.workspace.runs_dir} — click a column to sort; select two or more "
                       "to compare them.")
        where.setWordWrap(True)
        lay.addWidget(where)
        self.table = QTableWidget(0, len(RUN_COLUMNS))
        self.table.setObjectName("runs_table")
        self.table.setHorizontalHeaderLabels(list(RUN_COLUMNS))
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(True)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.ExtendedSelection)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.doubleClicked.connect(self.accept)
        lay.addWidget(self.table)
        bb = QDialogButtonBox()
        self.open_button = bb.addButton("Open", QDialogButtonBox.ButtonRole.AcceptRole)
        self.compare_button = bb.addButton("Compare…", QDialogButtonBox.ButtonRole.ActionRole)
        self.compare_button.setObjectName("compare_button")
        self.compare_button.setToolTip("Side by side: settings, metrics and KPIs of the selected runs (the first "
                                       "one is the baseline)")
        self.delete_button = bb.addButton("Delete…", QDialogButtonBox.ButtonRole.DestructiveRole)
        bb.addButton(QDialogButtonBox.StandardButton.Close)
        bb.accepted.connect(self.accept)
        bb.rejected.connect(self.reject)
        self.delete_button.clicked.connect(self.delete_selected)
        self.compare_button.clicked.connect(self.compare_selected)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        lay.addWidget(bb)
        self.rows: list[dict[str, Any]] = []
        self.reload()

    def reload(self) -> None:
        self.rows = [run_row(s) for s in self.c.list_runs()]
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            tag = " (sim)" if row["source"] == "simulated" else ""
            cells = [
                SortItem(row["name"]), SortItem(row["model"]),
                SortItem(str(row["created"]).replace("T", " ")[:19], row["created"]),
                SortItem(row["status"]), SortItem(row["verdict"]),
                SortItem("" if row["tok_s"] is None else f"{fmt_rate(row['tok_s'])}{tag}", row["tok_s"] or -1.0),
                SortItem("" if row["ttft_ms"] is None else f"{row['ttft_ms']:.0f}{tag}",
                         row["ttft_ms"] if row["ttft_ms"] is not None else float("inf")),
                SortItem("" if row["peak_rss"] is None else human_bytes(row["peak_rss"]), row["peak_rss"] or -1.0),
                SortItem(row["board"]),
            ]
            cells[0].setData(Qt.ItemDataRole.UserRole, row["run"])
            cells[0].setToolTip(f"{row['run']}\n{row['model']}")
            run_kind = {"complete": "passed", "in_progress": "pending"}.get(row["status_key"], row["status_key"])
            cells[3].setIcon(state_icon(run_kind))
            if run_kind in KINDS:
                cells[3].setForeground(QColor(KINDS[run_kind].color))
            verdict_kind = next((k for k in KINDS.values() if k.word == row["verdict"]), None)
            if verdict_kind is not None:
                cells[4].setIcon(state_icon(verdict_kind.key))
                cells[4].setForeground(QColor(verdict_kind.color))
            for col, item in enumerate(cells):
                self.table.setItem(r, col, item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(2, Qt.SortOrder.DescendingOrder)
        self.table.resizeColumnsToContents()
        for col in (0, 1):
            self.table.setColumnWidth(col, min(self.table.columnWidth(col), 300))
        if self.rows:
            self.table.selectRow(0)
        self._selection_changed()

    def selected_runs(self) -> list[str]:
        out = []
        for idx in sorted(self.table.selectionModel().selectedRows(), key=lambda i: i.row()):
            item = self.table.item(idx.row(), 0)
            if item is not None:
                out.append(str(item.data(Qt.ItemDataRole.UserRole)))
        return out

    def selected(self) -> str | None:
        runs = self.selected_runs()
        return runs[0] if runs else None

    def _selection_changed(self) -> None:
        n = len(self.selected_runs())
        self.open_button.setEnabled(n == 1)
        self.compare_button.setEnabled(n >= 2)
        self.delete_button.setEnabled(n == 1)

    def comparison_reports(self, runs: list[str]) -> list[dict[str, Any]]:
        from app.core.reports.collect import build_report

        return [build_report(self.c.workspace.run_dir(r), redact_hosts=True) for r in runs]

    def comparison_html(self, runs: list[str]) -> str:
        from app.core.reports.compare import compare_html, compare_reports

        return compare_html(compare_reports(self.comparison_reports(runs)))

    def compare_selected(self) -> None:
        from app.ui.compare import CompareDialog

        runs = self.selected_runs()
        if len(runs) < 2:
            return
        try:
            d = CompareDialog(self.comparison_reports(runs), self)
        except Exception as exc:
            show_error(self, "Compare runs", f"The runs could not be compared: {exc}", exc=exc)
            return
        self.compare_dialog = d
        d.show()

    def delete_selected(self) -> None:
        rid = self.selected()
        if rid is None:
            return
        if QMessageBox.question(self, "Delete run", f"Delete run {rid} and all its files? This cannot be undone.") \
                == QMessageBox.StandardButton.Yes:
            try:
                self.c.delete_run(rid)
            except RuntimeError as exc:
                show_error(self, "Delete run", str(exc))
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


class AboutDialog(QDialog):
    """Help → About: versions, where the documentation and the logs are."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        import platform

        import pyqtgraph
        import PySide6

        from app import __version__
        from app.core.paths import REPO_ROOT
        from app.core.secrets import backend_info, stored_where
        self.setWindowTitle("About HexStudio")
        self.setObjectName("about_dialog")
        lay = QVBoxLayout(self)
        docs = REPO_ROOT / "docs"
        links = " · ".join(f"<a href='{QUrl.fromLocalFile(str(docs / f)).toString()}'>{f}</a>"
                           for f in ("gui.md", "genie.md", "board.md", "reports.md", "PERFORMANCE.md")
                           if (docs / f).is_file())
        readme = REPO_ROOT / "README.md"
        run = controller.manifest
        kb = backend_info()       # the keyring backend in use, and whether it encrypts (issue 27)
        self.text = QLabel(
            f"<h2>HexStudio {__version__}</h2>"
            "<p>Deploys Hugging Face LLMs to Qualcomm Hexagon NPU boards: quantize (AIMET-ONNX W4A16), validate, "
            "compile (AI Hub → Genie bundle), push over SSH, chat, report.</p>"
            f"<p><b>Versions</b>: Python {platform.python_version()} · Qt {qVersion()} · PySide6 "
            f"{PySide6.__version__} · pyqtgraph {pyqtgraph.__version__} · {html.escape(platform.platform())}</p>"
            f"<p><b>Documentation</b>: <a href='{QUrl.fromLocalFile(str(readme)).toString()}'>README</a> · {links}</p>"
            + (f"<p style='color:{STATE_COLORS['failed']}'><b>Warning</b>: secrets (passwords, tokens) are kept "
               if kb.get("warning") else "<p><b>Secrets</b> (passwords, tokens) are kept ")
            + f"{html.escape(stored_where(kb))}.</p>"
            f"<p><b>Studio log</b>: {html.escape(str(log_dir()))}<br>"
            f"<b>Workspace</b>: {html.escape(str(controller.workspace.root))}"
            + (f"<br><b>This run's logs</b>: {html.escape(str(run.run_dir / 'logs'))}" if run else "") + "</p>")
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setWordWrap(True)
        self.text.setOpenExternalLinks(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        lay.addWidget(self.text)
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        logs = bb.addButton("Open the log folder", QDialogButtonBox.ButtonRole.ActionRole)
        logs.clicked.connect(lambda: open_folder(log_dir()))
        if run is not None:
            rl = bb.addButton("Open this run's folder", QDialogButtonBox.ButtonRole.ActionRole)
            rl.clicked.connect(lambda: open_folder(run.run_dir))
        bb.rejected.connect(self.reject)
        lay.addWidget(bb)
        self.resize(640, 360)


class ResumeBar(QFrame):
    """Shown above the pages when the open run has a heavy stage that was interrupted or cancelled."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("resume_bar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(f"QFrame#resume_bar {{ border: 1px solid {STATE_COLORS['stale']}; border-radius: 4px; }}")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        self.label = QLabel("")
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        lay.addWidget(self.label, 1)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setObjectName("resume_button")
        self.resume_button.setToolTip("Run every stage that is not done, starting with the interrupted one "
                                      "(Ctrl+R)")
        lay.addWidget(self.resume_button)
        self.dismiss_button = QToolButton()
        self.dismiss_button.setText("✕")
        self.dismiss_button.setToolTip("Hide this message")
        self.dismiss_button.setAutoRaise(True)
        self.dismiss_button.clicked.connect(self.hide)
        lay.addWidget(self.dismiss_button)
        self.hide()


class GateBar(QFrame):
    """Shown above the pages while a stage of the open run has a failed gate that nobody overrode: why, and the
    way on (override it, recorded with who and when; or open the stage to fix it). A run that stops at such a
    gate (Run Report after a failed Evaluate gate, say) says so here, not only in the status bar."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("gate_bar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(f"QFrame#gate_bar {{ border: 1px solid {KINDS['gate_failed'].color}; "
                           "border-radius: 4px; }")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        self.label = QLabel("")
        self.label.setObjectName("gate_bar_label")
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        lay.addWidget(self.label, 1)
        self.override_button = QPushButton("Override the gate…")
        self.override_button.setObjectName("gate_bar_override")
        self.override_button.setToolTip("Continue past this gate anyway: your reason, your name and the time are "
                                        "recorded in the run and shown in its report")
        lay.addWidget(self.override_button)
        self.show_button = QPushButton("Show the stage")
        self.show_button.setObjectName("gate_bar_show")
        lay.addWidget(self.show_button)
        self.stage: str | None = None
        self.hide()


def open_folder(path: Path) -> bool:
    """Show a folder in the system's file manager (made first if it does not exist yet)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))


def fitted_frame(avail: QRect, client: QRect, frame: QRect, title_guess: int = 0) -> tuple[int, int, int, int]:
    """Where a window goes to lie inside `avail` (a screen's available area), frame included: the frame's
    top-left and the client's new size, as (x, y, width, height).

    `frame` is the window system's frame (title bar and borders) around `client`; before the window manager
    has decorated the window the two are equal, and `title_guess` pixels are kept for the title bar it will
    add (at 150 % a restored window otherwise lost its title bar 20 px above the screen)."""
    extra_w = max(frame.width() - client.width(), 0)
    extra_h = max(frame.height() - client.height(), 0)
    if extra_h == 0:          # not decorated yet: keep room for the title bar to come
        extra_h = max(title_guess, 0)
    w = max(min(client.width(), avail.width() - extra_w), 320)
    h = max(min(client.height(), avail.height() - extra_h), 240)
    fw, fh = w + extra_w, h + extra_h
    x = min(max(frame.x(), avail.x()), avail.x() + max(avail.width() - fw, 0))
    y = min(max(frame.y(), avail.y()), avail.y() + max(avail.height() - fh, 0))
    return x, y, w, h


def fit_to_screen(win: QWidget) -> None:
    """Keep a restored window, title bar and borders included, inside the available area of the screen it
    is on (at any scaling, a saved size can be larger than the screen in device-independent pixels)."""
    screen = win.screen() or QGuiApplication.primaryScreen()
    if screen is None:
        return
    guess = win.style().pixelMetric(QStyle.PixelMetric.PM_TitleBarHeight) + 4
    x, y, w, h = fitted_frame(screen.availableGeometry(), win.geometry(), win.frameGeometry(), guess)
    if (w, h) != (win.width(), win.height()):
        win.resize(w, h)
    if (x, y) != (win.frameGeometry().x(), win.frameGeometry().y()):
        win.move(x, y)      # a top-level's move() places its frame


class MainWindow(QMainWindow):
    def __init__(self, controller: RunController | None = None) -> None:
        super().__init__()
        from app.ui import theme

        theme.install()
        saved = QSettings().value("ui/theme")
        if isinstance(saved, str) and saved in theme.THEMES and saved != theme.current_theme():
            theme.apply_theme(saved)
        self.setWindowTitle("HexStudio")
        self.setObjectName("main_window")
        self.c = controller or RunController()
        self.stage_list = QListWidget()
        self.stage_list.setObjectName("stage_list")
        self.stage_list.setMaximumWidth(210)
        self.stage_list.setMinimumWidth(150)
        self.stack = QStackedWidget()
        self.pages: dict[str, StagePage] = {
            "model": ModelPage(self.c), "preflight": PreflightPage(self.c), "quantize": QuantizePage(self.c),
            "validate": ValidatePage(self.c), "compile": CompilePage(self.c), "board": BoardPage(self.c),
            "chat": ChatPage(self.c), "evaluate": EvaluatePage(self.c), "report": ReportPage(self.c),
        }
        for s in STAGES:   # a stage with no page of its own yet still gets its stage page
            if s.name not in self.pages:
                self.pages[s.name] = StagePage(s.name, self.c)
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
        self.run_label.setTextFormat(Qt.TextFormat.RichText)
        self.run_label.setWordWrap(True)
        self.run_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        ll.addWidget(self.run_label)
        ll.addWidget(self.stage_list, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(self.stack)
        split.setStretchFactor(1, 1)
        split.setChildrenCollapsible(False)
        central = QWidget()
        cl = QVBoxLayout(central)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        self.resume_bar = ResumeBar()
        self.resume_bar.resume_button.clicked.connect(self.resume)
        cl.addWidget(self.resume_bar)
        self.gate_bar = GateBar()
        self._gate_stopped: str | None = None
        self.gate_bar.override_button.clicked.connect(self._override_from_bar)
        self.gate_bar.show_button.clicked.connect(self._show_gate)
        cl.addWidget(self.gate_bar)
        cl.addWidget(split, 1)
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
        self.resizeDocks([self.dock], [230], Qt.Orientation.Vertical)
        self._restore_geometry()
        self._fit_dock()
        self._closing_after_cancel = False
        self.refresh()

    # -- chrome ---------------------------------------------------------------------------------
    def _make_menu(self) -> None:
        from app.ui import theme

        m = self.menuBar().addMenu("&Run")
        new = QAction("&New run…", self)
        new.setShortcut(QKeySequence.StandardKey.New)
        new.triggered.connect(lambda: self.stage_list.setCurrentRow(0))
        opn = QAction("&Runs: open, compare or delete…", self)
        opn.setShortcut(QKeySequence.StandardKey.Open)
        opn.triggered.connect(self.open_runs_dialog)
        resume = QAction("&Resume (run every stage that is not done)", self)
        resume.setShortcut("Ctrl+R")
        resume.triggered.connect(self.resume)
        history = QAction("&History of this run…", self)
        history.setShortcut("Ctrl+H")
        history.triggered.connect(lambda: HistoryDialog(self.c, self).exec())
        folder = QAction("Open the run &folder", self)
        folder.triggered.connect(lambda: self.c.manifest is not None and open_folder(self.c.manifest.run_dir))
        cancel = QAction("&Cancel the running stage", self)
        cancel.setShortcut("Ctrl+.")
        cancel.triggered.connect(lambda: asyncio.ensure_future(self.c.cancel()))
        quit_ = QAction("&Quit", self)
        quit_.setShortcut(QKeySequence.StandardKey.Quit)
        quit_.triggered.connect(self.close)
        for a in (new, opn, resume, history, folder, cancel):
            m.addAction(a)
        m.addSeparator()
        m.addAction(quit_)
        v = self.menuBar().addMenu("&View")
        job = self.dock.toggleViewAction()
        job.setText("&Job (progress, log, memory)")
        job.setShortcut(QKeySequence("Ctrl+J"))
        job.setObjectName("view_job")
        v.addAction(job)
        for i, s in enumerate(STAGES):
            a = QAction(s.title, self)
            a.setShortcut(f"Alt+{i + 1}")
            a.triggered.connect(lambda _=False, row=i: self.stage_list.setCurrentRow(row))
            v.addAction(a)
        v.addSeparator()
        tm = v.addMenu("&Theme")
        self.theme_actions: dict[str, QAction] = {}
        group = QActionGroup(self)
        for key, label in (("system", "Follow the &system"), ("light", "&Light"), ("dark", "&Dark")):
            a = QAction(label, self)
            a.setCheckable(True)
            a.setChecked(theme.current_theme() == key)
            a.triggered.connect(lambda _=False, k=key: self.set_theme(k))
            group.addAction(a)
            tm.addAction(a)
            self.theme_actions[key] = a
        h = self.menuBar().addMenu("&Help")
        docs = QAction("&Documentation (docs/gui.md)", self)
        docs.setShortcut(QKeySequence.StandardKey.HelpContents)
        docs.triggered.connect(self.open_docs)
        logs = QAction("Open the &log folder", self)
        logs.triggered.connect(self.open_log_folder)
        about = QAction("&About HexStudio", self)
        about.triggered.connect(lambda: AboutDialog(self.c, self).exec())
        for a in (docs, logs, about):
            h.addAction(a)

    def set_theme(self, key: str) -> None:
        from app.ui import theme

        theme.apply_theme(key)
        QSettings().setValue("ui/theme", key)
        if key in self.theme_actions:
            self.theme_actions[key].setChecked(True)

    def open_docs(self) -> None:
        from app.core.paths import REPO_ROOT

        guide = REPO_ROOT / "docs" / "gui.md"
        if guide.is_file():      # a checkout; an installed wheel carries no docs/
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(guide)))
        else:
            QMessageBox.information(self, "Documentation",
                                    "The guides (docs/gui.md and the others) live in HexStudio's source "
                                    "repository; this installed copy does not carry them. Help → About shows "
                                    "the versions and where the logs are.")

    def open_log_folder(self) -> None:
        open_folder(log_dir())

    def _restore_geometry(self) -> None:
        qs = QSettings()
        g = qs.value("window/geometry")
        if isinstance(g, QByteArray):
            self.restoreGeometry(g)
        st = qs.value("window/state")
        if isinstance(st, QByteArray):
            self.restoreState(st)
        if QGuiApplication.platformName() != "offscreen":
            fit_to_screen(self)

    def _fit_dock(self) -> None:
        """The job dock takes at most a quarter of the window's height (a 720-px screen at 150 % keeps its
        pages); the person can drag it smaller still, or hide it (View → Job)."""
        if self.dock.isVisible() and not self.dock.isFloating() and self.dock.height() > self.height() // 4:
            self.resizeDocks([self.dock], [max(self.height() // 4, 60)], Qt.Orientation.Vertical)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        QTimer.singleShot(0, self._fit_dock)
        if QGuiApplication.platformName() != "offscreen":   # the offscreen test screen is only 800 x 600
            fit_to_screen(self)
            for ms in (0, 300, 1200):      # once the window manager has placed and decorated it
                QTimer.singleShot(ms, lambda: fit_to_screen(self))

    def restore_last_run(self) -> str | None:
        """Open the run that was open when the studio last closed (the recent run); None if there is none
        or it is gone."""
        recent = QSettings().value("recent/run")
        if not isinstance(recent, str) or not recent:
            return None
        try:
            self.c.open_run(recent)
        except Exception:
            QSettings().remove("recent/run")
            return None
        return recent

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.c.busy and not self._closing_after_cancel:
            if QMessageBox.question(
                    self, "Quit HexStudio", f"The {self.c.running_stage} stage is still working. Cancel it and "
                    "quit? (The run can be resumed later.)") != QMessageBox.StandardButton.Yes:
                event.ignore()
                return
            # cancel first and quit once the stage has stopped: the run then says "cancelled by you", not
            # "interrupted (crash or reboot)"
            event.ignore()
            self._closing_after_cancel = True
            self.statusBar().showMessage(f"Cancelling the {self.c.running_stage} stage, then quitting…")
            self._shutdown = asyncio.ensure_future(self._cancel_then_close())
            return
        self._save_window()
        event.accept()

    async def _cancel_then_close(self) -> None:
        await self.c.shutdown()
        self.close()

    def _save_window(self) -> None:
        qs = QSettings()
        qs.setValue("window/geometry", self.saveGeometry())
        qs.setValue("window/state", self.saveState())

    # -- actions --------------------------------------------------------------------------------
    def open_runs_dialog(self) -> None:
        d = RunsDialog(self.c, self)
        if d.exec() == QDialog.DialogCode.Accepted and d.selected():
            self.open_run(str(d.selected()))

    def open_run(self, run_id: str) -> None:
        try:
            self.c.open_run(run_id)
        except Exception as exc:
            show_error(self, "Open run", getattr(exc, "message", None) or str(exc), getattr(exc, "hint", None),
                       exc=None if isinstance(exc, ActionableError) else exc)

    def resume(self) -> None:
        if self.c.manifest is None or self.c.busy:
            return
        self.resume_bar.hide()
        self.c.start(STAGES[-1].name)

    def show_stage(self, name: str) -> None:
        self.stage_list.setCurrentRow([s.name for s in STAGES].index(name))

    # -- controller signals ---------------------------------------------------------------------
    def on_run_changed(self) -> None:
        self.dock.plot.clear_data()
        board = self.pages["board"]
        if isinstance(board, BoardPage):
            board.reload_boards()
        m = self.c.manifest
        if m is not None:
            QSettings().setValue("recent/run", m.run_id)   # reopened at the next launch
        self.update_resume_bar()
        self.refresh()

    def update_resume_bar(self) -> None:
        m = self.c.manifest
        stopped = [s for s in STAGES if m is not None and s.heavy and self.c.state(s.name) in ("interrupted",
                                                                                              "cancelled")]
        if not stopped or self.c.busy:
            self.resume_bar.hide()
            return
        s = stopped[0]
        how = ("was interrupted (the studio or the machine stopped while it ran)"
               if self.c.state(s.name) == "interrupted" else "was cancelled by you")
        self.resume_bar.label.setText(f"The <b>{s.title}</b> stage of this run {how}. Resume runs it again from a "
                                      "clean state, then every later stage that is not done.")
        self.resume_bar.show()

    def update_gate_bar(self, stopped: str | None = None) -> None:
        """Show the first stage whose gate failed and was not overridden; `stopped` is the stage a run was
        started for and did not reach because of it."""
        blocked = next((st for st in (self.c.status(s.name) for s in STAGES) if st.key == "gate_failed"), None)
        self._gate_stopped = stopped if blocked is not None else None
        if blocked is None or self.c.busy:
            self.gate_bar.hide()
            self.gate_bar.stage = None
            return
        lead = ""
        if stopped:
            lead = f"<b>{html.escape(get_stage(stopped).title)} did not run:</b> "
        self.gate_bar.stage = blocked.stage
        self.gate_bar.label.setText(
            f"{lead}<span style='color:{blocked.color}'><b>{blocked.symbol} The {html.escape(blocked.title)} gate "
            f"failed</b></span> — {html.escape(str(blocked.gate_reason))}. Later stages wait until it passes "
            "(fix and run the stage again) or you override it.")
        self.gate_bar.override_button.setVisible(blocked.overridable)
        self.gate_bar.show()

    def _show_gate(self) -> None:
        """Open the blocked stage's page scrolled to its gate, where the reason and the Override button are."""
        name = self.gate_bar.stage
        page = self.pages.get(name) if name else None
        if isinstance(page, StagePage):
            self.show_stage(page.stage.name)
            if page.scroll_area is not None:
                page.scroll_area.ensureWidgetVisible(page.gate_box)
            if page.override_button.isVisible():
                page.override_button.setFocus()

    def _override_from_bar(self) -> None:
        name = self.gate_bar.stage
        page = self.pages.get(name) if name else None
        if isinstance(page, StagePage):
            page.override()
            if self.c.status(page.stage.name).key == "overridden":
                self.statusBar().showMessage(f"{page.stage.title} gate overridden: recorded in the run", 15000)
        self.refresh()

    def refresh(self) -> None:
        m = self.c.manifest
        if m is None:
            self.run_label.setText("<b>No run open</b><br>New run: Model page · Open: Ctrl+O")
            self.setWindowTitle("HexStudio")
        else:
            self.run_label.setText(f"<b>{html.escape(m.run_id)}</b><br>{html.escape(str(m.inputs.get('model')))} → "
                                   f"{html.escape(str(m.inputs.get('board')))}")
            self.run_label.setToolTip(str(m.run_dir))
            self.setWindowTitle(f"{m.run_id} — HexStudio")
        for i, s in enumerate(STAGES):
            self._show_status(i, s.name)
        for p in self.pages.values():
            p.refresh()
        if self.c.busy:
            self.resume_bar.hide()
        self.update_gate_bar(self._gate_stopped)

    def _show_status(self, i: int, name: str) -> None:
        """One stage list entry: the status's icon, and its word and detail in the tooltip and for screen readers."""
        st = self.c.status(name)
        item = self.stage_list.item(i)
        item.setIcon(state_icon(st.key))
        item.setToolTip(f"{st.title}: {st.word} — {st.detail}")
        item.setData(Qt.ItemDataRole.AccessibleDescriptionRole, st.word)
        item.setData(Qt.ItemDataRole.UserRole, st.key)

    def on_stage_state(self, name: str, state: str) -> None:
        if state == "running":
            est = None
            if self.c.manifest is not None:
                st = get_stage(name)
                doc = self.pages["model"].artifact_json("model.json") if st.heavy else None
                if doc:
                    est = (doc.get("estimates") or {}).get(f"{name}_peak_rss_bytes")
            self.dock.begin(name, get_stage(name).title, est)
        self._show_status([s.name for s in STAGES].index(name), name)
        self.pages[name].refresh()   # running: the page says so and greys its previous results

    def on_stage_event(self, stage: str, ev: dict[str, Any]) -> None:
        self.dock.on_event(stage, ev)

    def on_sample(self, stage: str, s: ResourceSample) -> None:
        self.dock.on_sample(stage, s)

    def on_finished(self, stage: str, ok: bool, message: str, hint: str) -> None:
        self.dock.end(ok, message if not hint else f"{message} — {hint}")
        self.refresh()
        self.update_resume_bar()
        if not ok and message != "cancelled":
            self.statusBar().showMessage(f"{stage}: {message}", 15000)
            if self.c.status(stage).key == "gate_failed":
                target = self.c.last_target if self.c.last_target != stage else None
                self.update_gate_bar(stopped=target)
