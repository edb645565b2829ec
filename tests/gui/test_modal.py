"""A dialog opened from a coroutine must not stop the other tasks. exec(), QMessageBox.question() and the
QFileDialog.get*() functions run a nested Qt loop inside the task's step; qasync can then wake no other task
("Cannot enter into task"), and a running stage's readers, its sampler and the pipeline never resume: the stage
shows "running" for good. Here a ticker stands in for them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import report_page_on_evaluated_run


async def _ticker(ticks: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.01)
        ticks.append(1)


def test_a_question_asked_from_a_coroutine_lets_other_tasks_run(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop
) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

    from hexstudio.ui import modal

    parent = QWidget()
    qtbot.addWidget(parent)
    parent.show()
    ticks: list[int] = []
    seen: list[int] = []

    def click_yes() -> None:
        seen.append(len(ticks))
        box = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible())
        box.button(QMessageBox.StandardButton.Yes).click()

    async def scenario() -> bool:
        stop = asyncio.Event()
        ticker = asyncio.ensure_future(_ticker(ticks, stop))
        await asyncio.sleep(0.05)
        before = len(ticks)
        QTimer.singleShot(400, click_yes)
        said = await modal.question(parent, "Trust this board?", "First connection.")
        assert seen and seen[0] > before + 5, (before, seen)  # the ticker ran while the question was open
        stop.set()
        await asyncio.wait_for(ticker, 5)
        return said

    assert gui_loop.run_until_complete(scenario()) is True


def test_the_report_export_asks_where_outside_any_task(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Report page asked for the file inside its export coroutine: a stage running meanwhile froze."""
    from PySide6.QtWidgets import QFileDialog

    page = report_page_on_evaluated_run(qtbot, tmp_path)
    out = tmp_path / "report.html"
    in_task: list[bool] = []

    def ask(*_a: Any, **_k: Any) -> tuple[str, str]:
        try:
            in_task.append(asyncio.current_task() is not None)
        except RuntimeError:  # no loop running at all: no task either
            in_task.append(False)
        return str(out), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", ask)

    task = page.export_dialog("html")  # in the button's slot: no task runs
    assert task is not None and gui_loop.run_until_complete(task)
    assert in_task == [False] and out.is_file()
