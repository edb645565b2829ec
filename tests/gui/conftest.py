"""GUI tests: real Qt widgets (offscreen) on a qasync event loop, as the studio runs them."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def gui_loop(qapp: Any) -> Iterator[asyncio.AbstractEventLoop]:
    import qasync

    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()  # joins the loop's worker threads (asyncio.to_thread)
    asyncio.set_event_loop(None)


@pytest.fixture(autouse=True)
def _qasync_loop_is_current(gui_loop: asyncio.AbstractEventLoop) -> None:
    """Every GUI test starts with the studio's qasync loop as the current loop, as in the studio: an earlier test's
    asyncio.run() ends by setting no loop at all, and a page scheduling a coroutine (asyncio.ensure_future) then
    fails with 'There is no current event loop' depending on test order."""
    asyncio.set_event_loop(gui_loop)


@pytest.fixture(autouse=True)
def _isolated_qsettings(qapp: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Window geometry and recent runs go to a temp folder, never the user's QSettings."""
    from PySide6.QtCore import QSettings

    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path_factory.mktemp("qsettings"))
    )


def _stop_its_stage(window: Any, nodeid: str) -> None:
    """Cancel the stage `window` still runs and wait for its worker to end. Left running, the worker outlived the
    test, and its end (busyChanged) reached that window's deleted widgets in whichever test ran next: a failure
    blamed on an innocent test (seen in a full run)."""
    c = getattr(window, "c", None)
    loop = asyncio.get_event_loop_policy().get_event_loop()
    if c is None or not getattr(c, "busy", False) or loop.is_running():
        return
    stage = c.running_stage or "running"
    try:
        loop.run_until_complete(asyncio.wait_for(c.shutdown(), 60))
        sys.stderr.write(f"{nodeid}: at teardown, cancelled the {stage} stage\n")
    except Exception as exc:  # the test's own failure stays the report
        sys.stderr.write(f"{nodeid}: at teardown, the running stage could not be cancelled: {exc!r}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """A test that fails while a stage still runs leaves its window busy, and closing the window at teardown (pytest-qt
    closes every widget a test added) asks "Cancel it and quit?" in a modal box nobody answers. The nested Qt loop
    holds the interpreter, so even pytest-timeout's thread cannot end it: the whole suite hung (seen in a full run).
    At teardown every such question is answered No, and said on stderr, after the stage has been cancelled here (no
    worker outlives its test); the test's own failure stays the report."""
    from PySide6.QtWidgets import QMessageBox

    def no(*args: Any, **kwargs: Any) -> QMessageBox.StandardButton:
        text = next((a for a in args[2:3] if isinstance(a, str)), kwargs.get("text", ""))
        sys.stderr.write(f"{item.nodeid}: at teardown, answered No to the question {text!r}\n")
        _stop_its_stage(args[0] if args else kwargs.get("parent"), item.nodeid)
        return QMessageBox.StandardButton.No

    orig = QMessageBox.question
    QMessageBox.question = no  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        QMessageBox.question = orig  # type: ignore[method-assign]


async def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Let the Qt/asyncio loop run until `pred()` holds (the GUI stays live meanwhile)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def keep_screenshot(widget: Any, name: str, tmp: Path) -> Path:
    """Grab `widget` as tmp/<name>.png; with HEXSTUDIO_SCREENSHOTS=DIR also keep a copy there (docs/screenshots)."""
    import os
    import shutil

    path = tmp / f"{name}.png"
    assert widget.grab().save(str(path)), f"could not save {path}"
    keep = os.environ.get("HEXSTUDIO_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(keep) / path.name)
    return path


def studio_window(qtbot: Any, ws: Path, size: tuple[int, int] | None = None) -> tuple[Any, Any]:
    """The studio's main window (controller, window) on the workspace `ws`, no run open; with `size`, resized
    (not shown)."""
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow

    c = RunController(Workspace(ws))
    w = MainWindow(c)
    qtbot.addWidget(w)
    if size is not None:
        w.resize(*size)
    return c, w


def window_on_run(
    qtbot: Any, tmp_path: Path, run: Path, size: tuple[int, int] | None = None
) -> tuple[Any, Any]:
    """The studio's main window (controller, window) on a copy of a prepared run in tmp_path/ws, opened; with
    `size`, resized and shown as a user sees it."""
    from tests.support.sim_runs import copy_run

    copy = copy_run(run, tmp_path / "ws")
    c, w = studio_window(qtbot, tmp_path / "ws", size)
    if size is not None:
        w.show()
    c.open_run(copy.name)
    return c, w


def window_on_gate_failed_run(qtbot: Any, tmp_path: Path, failing: str = "evaluate") -> tuple[Any, Any, Any]:
    """(run manifest, controller, window): a run in tmp_path/ws whose `failing` stage's gate failed
    (tests/support/gate_runs.py), opened in the studio's main window at 1280x720 (not shown)."""
    from tests.support.gate_runs import gate_failed_run

    m = gate_failed_run(tmp_path / "ws", failing)
    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    c.open_run(m.run_id)
    return m, c, w


def board_page_with_evk(qtbot: Any, tmp_path: Path) -> tuple[Any, Any, Any]:
    """(controller, window, Board page) on a gate-failed run (window_on_gate_failed_run), with a board "evk"
    configured besides the simulator and the page's list read again."""
    from hexstudio.core.settings import Settings

    s = Settings.load()
    s.boards["evk"] = {"host": "192.0.2.1", "user": "evk", "auth": "key"}
    s.save()
    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    page = w.pages["board"]
    page.reload_boards()
    return c, w, page


def select_board(page: Any, name: str) -> None:
    page.boards.setCurrentRow([page.boards.item(i).data(256) for i in range(page.boards.count())].index(name))


async def push_to_board(c: Any, w: Any) -> None:
    """Run the Board stage from its page, as a click does, and wait for it to pass."""
    w.show_stage("board")
    w.pages["board"].run_button.click()
    await wait_until(lambda: not c.busy, 180, "the board stage")
    assert c.state("board") == "done", c.last_result and c.last_result.message


def report_page_on_evaluated_run(qtbot: Any, tmp_path: Path) -> Any:
    """The Report page of a run whose stages are done up to Evaluate (parity 256/256), opened in the studio's
    main window at 1280x720 (not shown)."""
    from tests.support.gate_runs import finish_stage, gate_failed_run

    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    finish_stage(m, "evaluate", {"parity_matched": 256, "parity_total": 256})
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)
    return w.pages["report"]
