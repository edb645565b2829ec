"""Issue 32: one status model, the same words and marks on every face of the studio (stage list, stage page,
runs dashboard, Compare) as in the report and the CLI (tests/core/test_status.py); a failed gate is never a
green tick; after an override the page says who overrode it and when, and the button goes; Run Report after
a failed gate says why in the window and offers the override."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import keep_screenshot, studio_window, wait_until, window_on_gate_failed_run
from tests.support.gate_runs import finish_stage, gate_failed_run, skip_board_recheck


def _item(w: Any, name: str) -> Any:
    from hexstudio.core.stages import STAGES

    return w.stage_list.item([s.name for s in STAGES].index(name))


def test_failed_gate_run_report_and_override(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtCore import Qt, QTimer

    skip_board_recheck(monkeypatch)  # a synthetic run: no pushed bundle to recheck
    from PySide6.QtWidgets import QApplication, QInputDialog

    from hexstudio.ui.dialogs.runs import run_row

    m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    w.show()
    w.show_stage("evaluate")
    # the stage list: the failed gate is "gate failed" with its own mark, never the green tick of "passed"
    ev, chat = _item(w, "evaluate"), _item(w, "chat")
    assert ev.data(Qt.ItemDataRole.UserRole) == "gate_failed" and "gate failed" in ev.toolTip()
    assert "248/256" in ev.toolTip()
    assert chat.data(Qt.ItemDataRole.UserRole) == "passed"
    assert ev.icon().pixmap(16, 16).toImage() != chat.icon().pixmap(16, 16).toImage()
    page = w.pages["evaluate"]
    assert "! gate failed" in page.state_label.text() and "done" not in page.state_label.text()
    assert page.override_button.isVisibleTo(w) and "248/256" in page.gate_label.text()
    # the dashboard says the same as the report and the CLI
    row = run_row(next(s for s in c.list_runs() if s.run_id == m.run_id))
    assert row["status"] == "gate failed at Evaluate" and row["verdict"] == "passed"
    # the gate bar is up while the gate blocks the run
    assert w.gate_bar.isVisibleTo(w) and "Evaluate gate" in w.gate_bar.label.text()
    w.show_stage("model")
    w.gate_bar.show_button.click()  # "Show the stage": the page, scrolled to its gate
    assert w.stack.currentWidget() is page
    qtbot.waitUntil(lambda: page.override_button.hasFocus(), timeout=3000)
    qtbot.wait(100)
    keep_screenshot(w, "status-gate-failed", tmp_path)

    # Run Report: the pipeline stops at the Evaluate gate; the window says why and offers the override
    async def run_report() -> None:
        w.pages["report"].run_button.click()
        await wait_until(lambda: not c.busy and c.last_result is not None, 60, "Run Report to end")

    gui_loop.run_until_complete(run_report())
    assert c.last_result is not None and not c.last_result.ok and c.last_result.stopped_at == "evaluate"
    text = w.gate_bar.label.text()
    assert w.gate_bar.isVisibleTo(w) and "Report did not run" in text and "248/256" in text
    assert w.gate_bar.override_button.isVisibleTo(w)

    # the override from the bar: a reason asked for, then recorded with who and when
    def answer() -> None:
        dlg = next(x for x in QApplication.topLevelWidgets() if isinstance(x, QInputDialog) and x.isVisible())
        dlg.setTextValue("known divergence of the simulator at token 57")
        dlg.accept()

    QTimer.singleShot(200, answer)
    w.gate_bar.override_button.click()
    assert c.manifest is not None
    assert ev.data(Qt.ItemDataRole.UserRole) == "overridden" and "overridden by" in ev.toolTip()
    assert "⚑ overridden" in page.state_label.text()
    assert "overridden by" in page.gate_label.text() and "UTC" in page.gate_label.text()
    assert not page.override_button.isVisibleTo(w)  # the button goes once the gate is overridden
    assert not w.gate_bar.isVisibleTo(w)
    assert "overridden" in w.statusBar().currentMessage()
    qtbot.wait(100)
    keep_screenshot(w, "status-overridden", tmp_path)

    # Run Report now runs past the overridden gate; the run is complete, and the dashboard says so
    async def run_report_again() -> None:
        w.pages["report"].run_button.click()
        await wait_until(
            lambda: (
                not c.busy
                and c.last_result is not None
                and c.last_target == "report"
                and c.status("report").key != "pending"
            ),
            120,
            "the report",
        )

    gui_loop.run_until_complete(run_report_again())
    assert c.status("report").key == "passed", c.last_result
    row = run_row(next(s for s in c.list_runs() if s.run_id == m.run_id))
    assert row["status"] == "complete (1 gate overridden)" and row["status_key"] == "overridden"
    # the report page says the same, in both palettes; so does the dashboard
    from hexstudio.ui import theme
    from hexstudio.ui.dialogs.runs import RunsDialog

    w.show_stage("report")
    text = w.pages["report"].preview.toPlainText()
    assert "complete (1 gate overridden)" in text and "⚑ overridden" in text and "overridden by" in text
    qtbot.wait(100)
    keep_screenshot(w, "status-report-overridden", tmp_path)
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    d.show()
    try:
        w.set_theme("dark")
        assert theme.is_dark()
        qtbot.wait(100)
        keep_screenshot(w, "status-report-overridden-dark", tmp_path)
        keep_screenshot(d, "10-runs-dashboard-dark", tmp_path)
    finally:
        w.set_theme("light")
    qtbot.wait(50)
    keep_screenshot(d, "10-runs-dashboard", tmp_path)
    w.set_theme("system")


def test_compare_and_dashboard_use_the_same_words(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_reports
    from hexstudio.ui.dialogs.runs import run_row

    ws = tmp_path / "ws"
    a = gate_failed_run(ws, "validate")
    b = gate_failed_run(ws, "evaluate")
    finish_stage(b, "report", {})
    c, _w = studio_window(qtbot, ws, (1280, 720))
    rows = {r["run"]: r for r in (run_row(s) for s in c.list_runs())}
    assert (
        rows[a.run_id]["status"] == "gate failed at Validate" and rows[a.run_id]["verdict"] == "gate failed"
    )
    cmp = compare_reports([build_report(a.run_dir), build_report(b.run_dir)])
    assert [r["status"] for r in cmp["runs"]] == [rows[a.run_id]["status"], rows[b.run_id]["status"]]
