"""What a review of the studio's pages found, each with the user's steps: an override from the page that the
stage list and gate bar did not follow, another run's "did not run" line, another run's device, a live doctor
wiped by a refresh and its Fix run on another board, a runs dialog's Open left greyed, and the keyboard's place
in the suite list lost on a tick."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import board_page_with_evk, select_board, window_on_gate_failed_run


def test_an_override_from_the_page_is_followed_by_the_gate_bar(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Override the gate… on the Evaluate page: the page said overridden, the gate bar still said the gate failed
    and offered Override again."""
    from PySide6.QtWidgets import QInputDialog

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    w.refresh()
    assert w.gate_bar.stage == "evaluate"
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **kw: ("the suite is known to be hard", True))
    w.pages["evaluate"].override()
    assert c.status("evaluate").key != "gate_failed"
    assert w.gate_bar.stage is None and w.gate_bar.isHidden()


def test_another_runs_did_not_run_line_is_not_this_runs(qtbot: Any, tmp_path: Path) -> None:
    """Report stopped at run A's failed gate ("Report did not run: ..."); run B, with a failed gate of its own,
    opened with the same line though nothing was tried in it."""
    from tests.support.gate_runs import gate_failed_run

    m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    w.update_gate_bar("report")
    assert "Report did not run" in w.gate_bar.label.text()
    other = gate_failed_run(tmp_path / "ws", "evaluate")
    assert other.run_id != m.run_id
    c.open_run(other.run_id)
    w.on_run_changed()
    assert "did not run" not in w.gate_bar.label.text(), w.gate_bar.label.text()


def test_a_device_not_in_the_list_is_shown_not_another_runs(qtbot: Any, tmp_path: Path) -> None:
    """A run whose device was set from the command line (or picked from AI Hub's list in an earlier session):
    the Compile page kept showing the previous run's device, and Compile compiled for one the page did not show."""
    from hexstudio.core.runs import change_settings

    m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    page = w.pages["compile"]
    before = page.device_combo.currentText()
    assert page.device_combo.findText("A lab board from AI Hub's list") < 0  # not offered
    change_settings(c.manifest, {"device": "A lab board from AI Hub's list"}, "test")
    c.open_run(m.run_id)
    w.on_run_changed()
    assert page.device_combo.currentText() == "A lab board from AI Hub's list" != before


def test_a_live_doctor_stays_through_a_refresh_and_fixes_only_its_board(
    qtbot: Any, tmp_path: Path, gui_loop: Any
) -> None:
    """The doctor run from the page was wiped by any refresh (a setting changed on another page); and with
    another board selected, its Fix… connected to that board with the first board's report."""
    _c, _w, page = board_page_with_evk(qtbot, tmp_path)
    select_board(page, "sim")
    gui_loop.run_until_complete(page.probe())
    shown = page.doctor.topLevelItemCount()
    assert shown > 0 and page.doctor_of == "sim"
    page.refresh_results()  # what a setting changed on another page does
    assert page.doctor.topLevelItemCount() == shown
    select_board(page, "evk")
    opened: list[str] = []

    async def never(*a: Any, **kw: Any) -> Any:
        opened.append("evk")
        raise AssertionError("the fix connected to another board")

    page.open_selected = never
    assert gui_loop.run_until_complete(page.run_fix({"id": "fastrpc_group", "fix": "group_add"})) is None
    assert opened == [] and "sim's" in page.conn_label.text(), page.conn_label.text()


def test_the_runs_dialogs_open_follows_a_stage_that_ends(qtbot: Any, tmp_path: Path) -> None:
    """Opened while a stage ran, the dialog kept Open greyed after the stage ended, until the selection changed."""
    from hexstudio.ui.dialogs.runs import RunsDialog

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    c._busy = True
    c.busyChanged.emit(True)
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    d.table.selectRow(0)
    assert not d.open_button.isEnabled()
    c._busy = False
    c.busyChanged.emit(False)
    assert d.open_button.isEnabled()


def test_a_tick_from_the_keyboard_keeps_the_place_in_the_suite_list(qtbot: Any, tmp_path: Path) -> None:
    """Space on the third suite saved the choice, the refresh rebuilt the list, and the next arrow key started
    from the top. Ticked back, the suite left Evaluate stale: the list was saved in the page's order."""
    from PySide6.QtCore import Qt

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    page = w.pages["evaluate"]
    assert page.suite_list.count() >= 3
    before = c.status("evaluate").key
    page.suite_list.setCurrentRow(2)
    ticked = page.suite_list.item(2).checkState() == Qt.CheckState.Checked
    page.suite_list.item(2).setCheckState(Qt.CheckState.Unchecked if ticked else Qt.CheckState.Checked)
    assert page.suite_list.currentRow() == 2
    assert c.status("evaluate").key == "stale"
    # ticked back: the run's choice is what it was (the shipped suites, unset), and Evaluate is not stale for it
    page.suite_list.item(2).setCheckState(Qt.CheckState.Checked if ticked else Qt.CheckState.Unchecked)
    assert c.status("evaluate").key == before != "stale", c.manifest.settings.get("eval_suites")
