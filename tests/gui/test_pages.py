"""Page-level behaviour that needs no full run: fixes shown before they run, settings that make a
stage stale, the model page's inspect of a config-only folder, board add with the password in keyring."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.gui.conftest import studio_window
from tests.preflight.test_checks import LLAMA_8B


def _config_only_8b(tmp_path: Path) -> Path:
    d = tmp_path / "llama-8b-config"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_8B))
    return d


def test_wslconfig_fix_shows_the_diff_then_writes_with_a_backup(qtbot: Any, tmp_path: Path) -> None:
    c, w = studio_window(qtbot, tmp_path / "ws")
    c.new_run(str(_config_only_8b(tmp_path)), "sim", {"context_length": 4096})
    page = w.pages["preflight"]
    cfg = tmp_path / "wslconfig"
    original = b"# mine\r\n[wsl2]\r\nmemory=64GB\r\nprocessors=8\r\n"
    cfg.write_bytes(original)
    page.wslconfig_path = cfg
    check = {
        "id": "memory",
        "status": "fail",
        "message": "RAM + swap 64 GiB is below the 174 GiB peak.",
        "measured": 64 * 1024**3,
        "required": 174 * 1024**3,
        "fix": "Raise the WSL memory limit in .wslconfig (the Fix button writes it) and run `wsl --shutdown`.",
    }
    dlg = page.fix_dialog(check)
    qtbot.addWidget(dlg)
    shown = dlg.text.toPlainText()
    assert "-memory=64GB" in shown and "+memory=" in shown and "processors=8" in cfg.read_text()
    assert cfg.read_bytes() == original  # nothing written yet
    assert dlg.apply_button is not None
    dlg.apply_button.click()
    text = cfg.read_bytes().decode()
    assert "memory=64GB" not in text and "processors=8" in text and "# mine" in text
    backups = list(tmp_path.glob("wslconfig.hexstudio-backup-*"))
    assert len(backups) == 1 and "memory=64GB" in backups[0].read_text()
    assert "wsl --shutdown" in dlg.outcome.text()
    # a second time there is nothing to change
    again = page.fix_dialog(check)
    qtbot.addWidget(again)
    assert again.apply_button is None and "already" in again.text.toPlainText()
    # the wsl check names its own target; a missing .wslconfig is created
    page.wslconfig_path = tmp_path / "new-wslconfig"
    wsl = {
        "id": "wsl",
        "status": "fail",
        "message": "WSL2 caps Linux memory below the Windows RAM.",
        "measured": None,
        "required": "memory >= 200GB",
        "fix": "wslconfig:memory=200GB,swap=100GB",
    }
    dlg2 = page.fix_dialog(wsl)
    qtbot.addWidget(dlg2)
    assert "memory=200GB" in dlg2.text.toPlainText() and dlg2.apply_button is not None
    dlg2.apply_button.click()
    made = page.wslconfig_path.read_text()
    assert "[wsl2]" in made and "memory=200GB" in made and "swap=100GB" in made


def test_the_wsl_fix_finds_wslconfig_off_the_gui_thread(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    """Finding .wslconfig runs wslvar and cmd.exe (Windows processes, seconds each): on the GUI thread the Fix
    button froze the window, and a running stage's job dock with it."""
    import threading

    from PySide6.QtWidgets import QDialog

    c, w = studio_window(qtbot, tmp_path / "ws")
    c.new_run(str(_config_only_8b(tmp_path)), "sim", {"context_length": 4096})
    page = w.pages["preflight"]
    page.wslconfig_path = tmp_path / "wslconfig"
    threads: list[bool] = []
    plan = page._wsl_plan

    def spy(mem: Any, swap: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return plan(mem, swap)

    page._wsl_plan = spy
    wsl = {
        "id": "wsl",
        "status": "fail",
        "message": "WSL2 caps memory.",
        "fix": "wslconfig:memory=200GB,swap=100GB",
    }
    task = page.show_fix(wsl)
    assert task is not None
    gui_loop.run_until_complete(task)
    assert threads == [False]
    shown = [d for d in page.findChildren(QDialog) if d.isVisible()]
    assert shown and "memory=200GB" in shown[-1].text.toPlainText()
    shown[-1].close()


def test_changing_a_setting_makes_a_done_stage_stale(
    qtbot: Any, tmp_path: Path, compiled_sim_run: Path
) -> None:
    from tests.support.sim_runs import copy_run

    run = copy_run(compiled_sim_run, tmp_path / "ws")
    c, w = studio_window(qtbot, tmp_path / "ws")
    c.open_run(run.name)
    assert c.state("quantize") == "done"
    spin = w.pages["quantize"]._setting_widgets["calibration_samples"]
    before = len(c.manifest.data.get("events", []))
    # typing passes through 1, 12, 123: the setting is recorded once, when editing ends
    for v in (1, 12, 123):
        spin.setValue(v)
    assert c.state("quantize") == "done"
    spin.editingFinished.emit()
    assert c.state("quantize") == "stale" and c.manifest.settings["calibration_samples"] == 123
    changes = [e for e in c.manifest.data["events"][before:] if e.get("kind") == "setting_changed"]
    assert len(changes) == 1, changes
    item = w.stage_list.item(2)
    assert "stale" in item.toolTip()


def test_number_fields_take_only_their_settings_range(qtbot: Any, tmp_path: Path) -> None:
    """Every number field took 1 to 1,000,000, and the controller recorded what the registry refuses: a
    calibration length of 1 and 500,000 samples went into run.json without a word, to fail a stage later."""
    import pytest as _pytest

    from hexstudio.shared.run_settings import SETTINGS, BadSettings

    c, w = studio_window(qtbot, tmp_path / "ws")
    c.new_run("builtin:tiny-llama")
    page = w.pages["quantize"]
    page.refresh()
    for key in ("calibration_seq_len", "calibration_samples"):
        spin = page._setting_widgets[key]
        assert (spin.minimum(), spin.maximum()) == SETTINGS[key].range, key
    events = len(c.manifest.data["events"])
    with _pytest.raises(BadSettings) as err:
        c.set_setting("calibration_seq_len", 1)
    assert "calibration_seq_len" in err.value.message and "out of range" in err.value.message
    assert c.manifest.settings.get("calibration_seq_len") != 1 and len(c.manifest.data["events"]) == events
    # on the page: the field shows the run's value again, and the box says why
    page.set_setting("calibration_samples", 500_000)
    from PySide6.QtWidgets import QMessageBox

    box = page.findChild(QMessageBox, "error_box")
    assert box is not None and "out of range" in box.text()
    assert page._setting_widgets["calibration_samples"].value() == c.manifest.settings["calibration_samples"]


def test_model_page_inspects_a_config_only_folder(qtbot: Any, tmp_path: Path) -> None:
    _c, w = studio_window(qtbot, tmp_path / "ws")
    page = w.pages["model"]
    page.folder_radio.setChecked(True)
    page.folder_edit.setText(str(_config_only_8b(tmp_path)))
    loop = asyncio.new_event_loop()
    info = loop.run_until_complete(page.inspect())
    loop.close()
    assert info is not None and info["supported"] and info["num_layers"] == 32
    rows = {
        page.inspect_table.item(r, 0).text(): page.inspect_table.item(r, 1).text()
        for r in range(page.inspect_table.rowCount())
    }
    assert rows["vocabulary"] == "128,256" and "GiB" in rows["quantize peak RAM"]
    assert "reference recipe" in rows


def test_unsupported_model_is_explained(qtbot: Any, tmp_path: Path) -> None:
    _c, w = studio_window(qtbot, tmp_path / "ws")
    d = tmp_path / "mamba"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba"}))
    page = w.pages["model"]
    page.folder_radio.setChecked(True)
    page.folder_edit.setText(str(d))
    loop = asyncio.new_event_loop()
    info = loop.run_until_complete(page.inspect())
    loop.close()
    assert info is not None and not info["supported"]
    assert "not supported" in page.inspect_message.text()
    assert "NO" in page.inspect_table.item(1, 1).text() and "Mamba" in page.inspect_table.item(1, 1).text()


def _board_with_a_password(qtbot: Any, tmp_path: Path) -> Any:
    """The Board page with the form filled in for board "evk" with password auth (not yet added)."""
    _c, w = studio_window(qtbot, tmp_path / "ws")
    page = w.pages["board"]
    page.name_edit.setText("evk")
    page.host_edit.setText("10.0.0.7")
    page.user_edit.setText("ubuntu")
    page.auth_combo.setCurrentText("password")
    page.password_edit.setText("canary-Pa55-7731")
    return page


def test_adding_a_board_keeps_its_password_in_the_keyring_only(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.core.secrets import board_password_key, get_secret
    from hexstudio.core.settings import Settings

    page = _board_with_a_password(qtbot, tmp_path)
    page.add_button.click()
    assert get_secret(board_password_key("evk")) == "canary-Pa55-7731"
    saved = Settings.load().path.read_text()
    assert "evk" in saved and "canary-Pa55-7731" not in saved
    assert page.password_edit.text() == ""
    assert any("evk" in page.boards.item(i).text() for i in range(page.boards.count()))


def test_a_board_whose_password_the_keyring_refuses_is_not_added_and_says_why(
    qtbot: Any, tmp_path: Path
) -> None:
    """WSL without DBus and without keyrings.alt: keyring's fail backend refuses, the error escaped the slot,
    and the board page said nothing (the board was not saved either)."""
    import keyring
    from PySide6.QtCore import Qt

    from hexstudio.core.settings import Settings
    from tests.support.broken_keyring import BrokenKeyring

    page = _board_with_a_password(qtbot, tmp_path)
    before = keyring.get_keyring()
    keyring.set_keyring(BrokenKeyring())
    try:
        qtbot.keyClick(page.password_edit, Qt.Key.Key_Return)  # Enter in the form adds the board
    finally:
        keyring.set_keyring(before)
    text = page.conn_label.text()
    assert "keyring refused" in text and "What to do" in text and "PYTHON_KEYRING_BACKEND" in text
    assert "evk" not in Settings.load().boards and page.password_edit.text() == "canary-Pa55-7731"


def test_job_dock_log_is_bounded_filterable_and_copyable(qtbot: Any) -> None:
    from PySide6.QtGui import QGuiApplication

    from hexstudio.ui.job_dock import LOG_KEEP, LOG_SHOWN, JobDock

    dock = JobDock()
    qtbot.addWidget(dock)
    dock.begin("quantize", "Quantize", 2 * 1024**3)
    for i in range(30_000):
        dock.on_event(
            "quantize", {"type": "log", "level": "debug" if i % 2 else "info", "message": f"line {i}"}
        )
    dock.on_event("quantize", {"type": "warning", "message": "calibration text is short", "hint": "add more"})
    dock.on_event("quantize", {"type": "progress", "fraction": 0.5, "message": "part 1 of 2"})
    dock.flush()
    assert len(dock.lines) == LOG_KEEP and dock.log_model.rowCount() <= LOG_SHOWN
    shown = dock.log_model.stringList()
    assert "line 29998" in shown and "line 29999" not in shown  # debug lines hidden at level "info"
    assert dock.progress.value() == 500 and "part 1 of 2" in dock.progress.format()
    dock.level_combo.setCurrentText("warning")
    assert dock.log_model.stringList() == ["WARNING: calibration text is short — add more"]
    dock.level_combo.setCurrentText("all")
    dock.filter_edit.setText("line 2999")
    # only the last LOG_KEEP lines are kept: "line 2999" itself is long gone
    assert set(dock.log_model.stringList()) == {f"line 2999{d}" for d in range(10)}
    dock.copy_button.click()
    assert "line 29999" in QGuiApplication.clipboard().text()


def test_an_inspected_model_stays_under_its_own_heading_until_another_run(qtbot: Any, tmp_path: Path) -> None:
    """After Inspect of another model, any refresh of the window put the open run's figures back in the table,
    while the heading above still named the inspected model: its memory and disk needs read as the other's."""
    import asyncio as _asyncio

    from tests.support.gate_runs import finish_stage, rewrite_output

    c, w = studio_window(qtbot, tmp_path / "ws")
    m = c.new_run("builtin:tiny-llama")
    (m.run_dir / "artifacts" / "model").mkdir(parents=True, exist_ok=True)
    finish_stage(m, "model")
    page = w.pages["model"]
    page.refresh()
    page.folder_radio.setChecked(True)
    page.folder_edit.setText(str(_config_only_8b(tmp_path)))
    loop = _asyncio.new_event_loop()
    assert loop.run_until_complete(page.inspect()) is not None
    loop.close()

    def rows() -> dict[str, str]:
        t = page.inspect_table
        return {t.item(r, 0).text(): t.item(r, 1).text() for r in range(t.rowCount())}

    inspected = rows()
    assert "llama-8b-config" in page.inspect_message.text()
    w.refresh()  # a setting edited, a stage ended...
    assert rows() == inspected and "llama-8b-config" in page.inspect_message.text()
    # the run's Model stage ran since: its figures come back, and the heading goes
    rewrite_output(m, "model", "model.json", json.dumps({"model": "builtin:tiny-llama"}))
    c.open_run(m.run_id)  # the studio reads the run again when a stage ends
    w.refresh()
    assert rows() != inspected and page.inspect_message.text() == ""
    loop = _asyncio.new_event_loop()
    assert loop.run_until_complete(page.inspect()) is not None
    loop.close()
    assert rows() == inspected
    c.new_run("builtin:tiny-llama")  # another run: its own model, and the heading goes
    page.refresh()
    assert rows() != inspected and page.inspect_message.text() == ""


def test_new_run_says_it_made_one_and_refuses_a_model_that_names_none(qtbot: Any, tmp_path: Path) -> None:
    """New run with a folder that does not exist (or "not a valid id!!") made a run that could never start (its
    model cannot change on resume), and neither that nor a good New run said a word."""
    c, w = studio_window(qtbot, tmp_path / "ws")
    page = w.pages["model"]
    page.folder_radio.setChecked(True)
    page.folder_edit.setText(str(tmp_path / "nope" / "missing"))
    page.new_run()
    assert "No run was made" in page.inspect_message.text() and c.manifest is None
    assert c.workspace.list_runs() == []
    page.builtin_radio.setChecked(True)
    page.new_run()
    assert c.manifest is not None and f"Run <b>{c.manifest.run_id}</b> made" in page.inspect_message.text()
