"""While a stage runs, the studio stays on its run: opening or making another run is refused and said (the
pages, the job dock and the gate bar mixed the two runs: the other run's stage showed "working", and the delete
guard protected the wrong one). Deleting a run that a terminal runs says why it cannot; typed text and the
user's files never render as markup."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import studio_window


def _error_box(parent: Any) -> Any:
    from PySide6.QtWidgets import QMessageBox

    box = parent.findChild(QMessageBox, "error_box")
    assert box is not None and box.isVisible()
    return box


def test_another_run_is_not_shown_while_a_stage_runs(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.ui.dialogs.runs import RunsDialog

    c, w = studio_window(qtbot, tmp_path / "ws")
    a = c.new_run("builtin:tiny-llama")
    b = c.new_run("builtin:tiny-llama")
    w.open_run(a.run_id)
    # a stage of run A is running (as RunController.start sets it)
    c._busy, c.running_stage = True, "quantize"
    try:
        w.open_run(b.run_id)
        box = _error_box(w)
        assert f"Run {a.run_id} is working (its quantize stage runs)" in box.text()
        assert "Cancel in the job dock" in box.informativeText()
        assert c.manifest is not None and c.manifest.run_id == a.run_id
        with pytest.raises(Exception, match="a new run is not possible"):
            c.new_run("builtin:tiny-llama")
        w.pages["model"].new_run()
        assert "Could not create the run" in w.pages["model"].inspect_message.text()
        d = RunsDialog(c, w)
        qtbot.addWidget(d)
        d.table.selectRow(0)
        assert not d.open_button.isEnabled() and "A stage is running" in d.open_button.toolTip()
        box.close()
    finally:
        c._busy, c.running_stage = False, None
    w.open_run(b.run_id)
    assert c.manifest is not None and c.manifest.run_id == b.run_id


def test_deleting_a_run_a_terminal_runs_says_why(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QMessageBox

    from hexstudio.core.runs import RunLock
    from hexstudio.ui.dialogs.runs import RunsDialog

    c, w = studio_window(qtbot, tmp_path / "ws")
    a = c.new_run("builtin:tiny-llama")
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    d.show()
    d.table.selectRow(0)
    monkeypatch.setattr(QMessageBox, "question", lambda *_a, **_k: QMessageBox.StandardButton.Yes)
    with RunLock(a.run_dir):
        d.delete_selected()
        box = _error_box(d)
        assert f"Run {a.run_id} is being run by" in box.text(), box.text()
        box.close()
    assert a.run_dir.is_dir() and d.table.rowCount() == 1


def test_typed_model_ids_and_errors_are_text_not_markup(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    _c, w = studio_window(qtbot, tmp_path / "ws")
    page = w.pages["model"]
    page.folder_radio.setChecked(True)
    page.folder_edit.setText(str(tmp_path / "R&D" / "<h1>big</h1>"))
    assert gui_loop.run_until_complete(page.inspect()) is None  # no such folder: the error quotes the path
    text = page.inspect_message.text()
    assert "&lt;h1&gt;" in text and "<h1>" not in text, text
