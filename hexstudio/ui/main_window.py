"""The studio window: the stage list on the left, one page per stage, the job dock at the bottom."""

from __future__ import annotations

import asyncio
import html
import logging
from collections.abc import Coroutine
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QRect, QSettings, Qt, QTimer, QUrl
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QDesktopServices,
    QGuiApplication,
    QKeySequence,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.logs import log_dir
from hexstudio.core.sampler import ResourceSample
from hexstudio.core.stages import STAGES, get_stage
from hexstudio.shared.errors import ActionableError
from hexstudio.ui.controller import RunController
from hexstudio.ui.dialogs.about import AboutDialog
from hexstudio.ui.dialogs.history import HistoryDialog
from hexstudio.ui.dialogs.runs import RunsDialog
from hexstudio.ui.errors import show_error
from hexstudio.ui.job_dock import JobDock
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.pages.board import BoardPage
from hexstudio.ui.pages.chat import ChatPage
from hexstudio.ui.pages.evaluate import EvaluatePage
from hexstudio.ui.pages.model import ModelPage
from hexstudio.ui.pages.report import ReportPage
from hexstudio.ui.pages.workstation import CompilePage, PreflightPage, QuantizePage, ValidatePage
from hexstudio.ui.run_bars import GateBar, ResumeBar
from hexstudio.ui.widgets import commit_focused_edit, open_folder, state_icon

log = logging.getLogger("hexstudio.gui")


def fitted_frame(
    avail: QRect, client: QRect, frame: QRect, title_guess: int = 0
) -> tuple[int, int, int, int]:
    """Where a window goes to lie inside `avail` (a screen's available area), frame included: the frame's
    top-left and the client's new size, as (x, y, width, height).

    `frame` is the window system's frame (title bar and borders) around `client`; before the window manager
    has decorated the window the two are equal, and `title_guess` pixels are kept for the title bar it will
    add (at 150 % a restored window otherwise lost its title bar 20 px above the screen)."""
    extra_w = max(frame.width() - client.width(), 0)
    extra_h = max(frame.height() - client.height(), 0)
    if extra_h == 0:  # not decorated yet: keep room for the title bar to come
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
        win.move(x, y)  # a top-level's move() places its frame


def _loop_running() -> bool:
    """Whether the studio's event loop runs (work can be stopped before the window goes); False where this thread
    has no loop at all (a window closed after its loop, at a test's teardown)."""
    try:
        return asyncio.get_event_loop().is_running()
    except RuntimeError:
        return False


class MainWindow(QMainWindow):
    def __init__(self, controller: RunController | None = None) -> None:
        super().__init__()
        from hexstudio.ui import theme

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
            "model": ModelPage(self.c),
            "preflight": PreflightPage(self.c),
            "quantize": QuantizePage(self.c),
            "validate": ValidatePage(self.c),
            "compile": CompilePage(self.c),
            "board": BoardPage(self.c),
            "chat": ChatPage(self.c),
            "evaluate": EvaluatePage(self.c),
            "report": ReportPage(self.c),
        }
        for s in STAGES:  # a stage with no page of its own yet still gets its stage page
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
        self._closing_after_cancel = self._closing_after_chat = self._closing_after_work = False
        self.refresh()

    # -- chrome ---------------------------------------------------------------------------------
    def _make_menu(self) -> None:
        from hexstudio.ui import theme

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
        from hexstudio.ui import theme

        theme.apply_theme(key)
        QSettings().setValue("ui/theme", key)
        if key in self.theme_actions:
            self.theme_actions[key].setChecked(True)

    def open_docs(self) -> None:
        from hexstudio.core.paths import REPO_ROOT

        guide = REPO_ROOT / "docs" / "gui.md"
        if guide.is_file():  # a checkout; an installed wheel carries no docs/
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(guide)))
        else:
            QMessageBox.information(
                self,
                "Documentation",
                "The guides (docs/gui.md and the others) live in HexStudio's source "
                "repository; this installed copy does not carry them. Help → About shows "
                "the versions and where the logs are.",
            )

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
        if QGuiApplication.platformName() != "offscreen":  # the offscreen test screen is only 800 x 600
            fit_to_screen(self)
            for ms in (0, 300, 1200):  # once the window manager has placed and decorated it
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

    def changeEvent(self, event: QEvent) -> None:
        """Back in the window (from a terminal, say): the open run as its run.json is now, where another process
        (`hexstudio run --resume`, `--set`) wrote it meanwhile."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow():
            self.c.reload_if_changed()

    def closeEvent(self, event: QCloseEvent) -> None:
        """Work under way is stopped first, the window closing once it has: a running stage is cancelled (the run
        then says "cancelled by you", not "interrupted"), the chat's session on the board closed (not left running
        there), a Board-page fix or a prediction stopped (a task left pending keeps the studio alive without a
        window until its thread ends)."""
        stage = self.c.running_stage
        if self.c.busy and not self._closing_after_cancel:
            if not self._asked(
                f"The {stage} stage is still working. Cancel it and quit? (The run can be resumed later.)"
            ):
                event.ignore()
                return
            self._closing_after_cancel = True
            self._then_close(
                event, f"Cancelling the {stage} stage, then quitting…", self._cancel_then_close()
            )
            return
        running = _loop_running()  # the studio's loop: the work can be stopped first
        chat = self.pages["chat"]
        if (
            isinstance(chat, ChatPage)
            and not self._closing_after_chat
            and (chat.busy_chat or chat.chat.session is not None)
            and running
        ):
            if chat.busy_chat and not self._asked("A reply is still coming. Stop it and quit?"):
                event.ignore()
                return
            self._closing_after_chat = True
            self._then_close(
                event,
                "Closing the chat's session on the board, then quitting…",
                self._close_chat_then_close(chat),
            )
            return
        work = self._page_work()
        if work and not self._closing_after_work and running:
            first = work[0][0]
            if any(what.startswith("a board") for what, _t in work) and not self._asked(
                f"{first[0].upper()}{first[1:]} is still working. Stop it and quit? "
                "(Run the doctor again later: a fix half done shows as failing.)"
            ):
                event.ignore()
                return
            self._closing_after_work = True
            tasks = [t for _w, t in work]
            status = f"Stopping {', '.join(w for w, _t in work)}, then quitting…"
            self._then_close(event, status, self._stop_work_then_close(tasks))
            return
        self._save_window()
        event.accept()

    def _asked(self, question: str) -> bool:
        """Whether the user agreed to quit with `question` asked."""
        return QMessageBox.question(self, "Quit HexStudio", question) == QMessageBox.StandardButton.Yes

    def _then_close(self, event: QCloseEvent, status: str, work: Coroutine[Any, Any, None]) -> None:
        """Not closed yet: `work` first (it closes the window again when done), `status` said meanwhile."""
        event.ignore()
        self.statusBar().showMessage(status)
        self._shutdown = asyncio.ensure_future(work)

    def _page_work(self) -> list[tuple[str, asyncio.Future[Any]]]:
        """What the pages started and is still under way: the Board page's doctor or fix, a speed prediction."""
        out: list[tuple[str, asyncio.Future[Any]]] = []
        board, preflight = self.pages.get("board"), self.pages.get("preflight")
        task = getattr(board, "_task", None)
        if task is not None and not task.done():
            out.append(("a board check or fix", task))
        task = getattr(getattr(preflight, "predict_panel", None), "_task", None)
        if task is not None and not task.done():
            out.append(("the speed prediction", task))
        return out

    async def _stop_work_then_close(self, tasks: list[asyncio.Future[Any]]) -> None:
        for t in tasks:
            t.cancel()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        except Exception:  # quitting goes on: a board that does not answer keeps no one waiting
            log.warning("page work did not stop before quitting", exc_info=True)
        finally:
            self.close()

    async def _cancel_then_close(self) -> None:
        await self.c.shutdown()
        self.close()

    async def _close_chat_then_close(self, chat: ChatPage) -> None:
        try:
            await asyncio.wait_for(chat.shut_down(), 45)
        except Exception:  # quitting goes on: a board that does not answer keeps no one waiting
            log.warning("the chat session did not close before quitting", exc_info=True)
        finally:
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
            show_error(
                self,
                "Open run",
                getattr(exc, "message", None) or str(exc),
                getattr(exc, "hint", None),
                exc=None if isinstance(exc, ActionableError) else exc,
            )

    def resume(self) -> None:
        if self.c.manifest is None or self.c.busy:
            return
        commit_focused_edit()  # Ctrl+R in a field: the value typed there is recorded before the run starts
        self.resume_bar.hide()
        self.c.start(STAGES[-1].name)

    def show_stage(self, name: str) -> None:
        self.stage_list.setCurrentRow([s.name for s in STAGES].index(name))

    # -- controller signals ---------------------------------------------------------------------
    def on_run_changed(self) -> None:
        self._gate_stopped = None  # the stage another run's pipeline stopped before is not this run's
        self.dock.plot.clear_data()
        board = self.pages["board"]
        if isinstance(board, BoardPage):
            board.reload_boards()
        m = self.c.manifest
        if m is not None:
            QSettings().setValue("recent/run", m.run_id)  # reopened at the next launch
        self.update_resume_bar()
        self.refresh()

    def update_resume_bar(self) -> None:
        m = self.c.manifest
        stopped = [
            s
            for s in STAGES
            if m is not None and s.heavy and self.c.state(s.name) in ("interrupted", "cancelled")
        ]
        if not stopped or self.c.busy:
            self.resume_bar.hide()
            return
        s = stopped[0]
        how = (
            "was interrupted (the studio or the machine stopped while it ran)"
            if self.c.state(s.name) == "interrupted"
            else "was cancelled by you"
        )
        self.resume_bar.label.setText(
            f"The <b>{s.title}</b> stage of this run {how}. Resume runs it again from a "
            "clean state, then every later stage that is not done."
        )
        self.resume_bar.show()

    def update_gate_bar(self, stopped: str | None = None) -> None:
        """Show the first stage whose gate failed and was not overridden; `stopped` is the stage a run was
        started for and did not reach because of it."""
        blocked = next(
            (st for st in (self.c.status(s.name) for s in STAGES) if st.key == "gate_failed"), None
        )
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
            "(fix and run the stage again) or you override it."
        )
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
                self.statusBar().showMessage(
                    f"{page.stage.title} gate overridden: recorded in the run", 15000
                )
        self.refresh()

    def refresh(self) -> None:
        m = self.c.manifest
        if m is None:
            self.run_label.setText("<b>No run open</b><br>New run: Model page · Open: Ctrl+O")
            self.setWindowTitle("HexStudio")
        else:
            self.run_label.setText(
                f"<b>{html.escape(m.run_id)}</b><br>{html.escape(str(m.inputs.get('model')))} → "
                f"{html.escape(str(m.inputs.get('board')))}"
            )
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
        self.pages[name].refresh()  # running: the page says so and greys its previous results

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
