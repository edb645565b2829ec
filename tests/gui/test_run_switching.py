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


def test_a_change_made_from_a_terminal_shows_when_the_window_is_back(qtbot: Any, tmp_path: Path) -> None:
    """The studio never read run.json again while a run sat open: a `hexstudio run --resume R --set` from a terminal
    left the pages on the old states and settings, and setting the old value back in the window was dropped as
    "unchanged" (compared with the stale copy), so the run kept the terminal's value and the window showed the other."""
    from PySide6.QtCore import QEvent

    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.runs import change_settings

    c, w = studio_window(qtbot, tmp_path / "ws")
    m = c.new_run("builtin:tiny-llama", overrides={"calibration_samples": 4})
    w.open_run(m.run_id)
    # a terminal, another process: its own copy of the run
    change_settings(RunManifest.load(m.run_dir), {"calibration_samples": 16}, "a terminal's --set")
    assert c.manifest is not None and c.manifest.settings["calibration_samples"] == 4  # not read yet
    assert c.set_setting(
        "calibration_samples", 4
    )  # the window's value: a change against the run as it is now
    assert RunManifest.load(m.run_dir).settings["calibration_samples"] == 4
    change_settings(RunManifest.load(m.run_dir), {"calibration_samples": 12}, "a terminal's --set")
    w.changeEvent(QEvent(QEvent.Type.ActivationChange))  # as Qt says when the window is activated
    if (
        not w.isActiveWindow()
    ):  # offscreen: no window manager gives it focus; what the event does, asked directly
        assert c.reload_if_changed()
    assert c.manifest.settings["calibration_samples"] == 12
    assert not c.reload_if_changed()  # read once per change
    assert (
        c.set_setting("calibration_samples", 8) and not c.reload_if_changed()
    )  # its own write: not read again


def test_opening_a_run_never_marks_a_live_runners_stage_interrupted(qtbot: Any, tmp_path: Path) -> None:
    """Opening a run marked its "running" stages interrupted a second time, without the run's lock and without
    asking whether the lock is held: a stage run from a container or another host that shares the workspace (its
    owner's pid means nothing here) was saved as interrupted while it ran."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.runs import RunLock

    c, w = studio_window(qtbot, tmp_path / "ws")
    m = c.new_run("builtin:tiny-llama")
    with RunLock(m.run_dir):  # the other host's runner (a live lock holder)
        other = RunManifest.load(m.run_dir)
        other.stage("quantize").data.update(
            state="running", owner={"host": "gpu-box", "pid": 4242, "boot_id": "x"}
        )
        other.save()
        w.open_run(m.run_id)
        assert c.manifest is not None and c.manifest.stage("quantize").state == "running"
        assert RunManifest.load(m.run_dir).stage("quantize").state == "running"
