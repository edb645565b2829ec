"""Issue 32, "Elsewhere": the job dock can be hidden and made small, and a Run Report that stops at a gate
does not rewrite the last job's time; Preflight shows no Python dicts or snake_case check names; the Board
page's list agrees with the Board stage; Export HTML fills the preview and enables Open in browser."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import (
    keep_screenshot,
    report_page_on_evaluated_run,
    studio_window,
    wait_until,
    window_on_gate_failed_run,
)
from tests.support.gate_runs import gate_failed_run, rewrite_output, skip_board_recheck


def test_job_dock_hides_shrinks_and_keeps_its_time(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_board_recheck(monkeypatch)  # a synthetic run: no pushed bundle to recheck
    from PySide6.QtCore import Qt

    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    w.show()
    qtbot.waitUntil(lambda: w.dock.isVisible(), timeout=3000)
    qtbot.waitUntil(lambda: w.dock.height() <= w.height() // 4 + 2, timeout=3000)  # a quarter at most
    action = next(a for a in w.findChildren(type(w.dock.toggleViewAction())) if a.objectName() == "view_job")
    assert action.isEnabled() and action.shortcut().toString() == "Ctrl+J"
    action.trigger()
    assert not w.dock.isVisible()
    action.trigger()
    assert w.dock.isVisible()
    assert w.dock.minimumSizeHint().height() < 110, w.dock.minimumSizeHint()
    w.resizeDocks([w.dock], [70], Qt.Orientation.Vertical)
    qtbot.waitUntil(lambda: w.dock.height() < 110, timeout=3000)
    # a job's time stays its own when a later Run Report stops at a gate before any job starts
    w.dock.begin("quantize", "Quantize")
    w.dock.end(True, "completed")
    took = w.dock.eta_label.text()
    w.dock.started -= 300  # as if five minutes passed

    async def run_report() -> None:
        w.pages["report"].run_button.click()
        await wait_until(lambda: not c.busy and c.last_result is not None, 60, "Run Report to end")

    gui_loop.run_until_complete(run_report())
    assert w.dock.eta_label.text() == took and "nothing ran" in w.dock.progress.format()


def test_preflight_shows_titles_and_readable_values(qtbot: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "preflight")
    (m.run_dir / "artifacts" / "preflight" / "preflight.json").write_text(
        json.dumps(
            {
                "checks": [
                    {
                        "id": "wsl",
                        "status": "warn",
                        "measured": {"mem_total_bytes": 16 * 1024**3, "wsl_version": 2},
                        "required": 32 * 1024**3,
                        "message": "WSL has 16 GiB.",
                        "fix": "wslconfig:memory=40GB,swap=20GB",
                    },
                    {
                        "id": "python",
                        "status": "ok",
                        "measured": "3.11.7",
                        "required": "3.10–3.12",
                        "message": "ok",
                        "fix": None,
                    },
                    {
                        "id": "disk_hf_cache",
                        "status": "fail",
                        "measured": 5 * 1024**3,
                        "required": 20 * 1024**3,
                        "message": "Not enough disk.",
                        "fix": None,
                    },
                    {
                        "id": "local_compile",
                        "status": "warn",
                        "measured": 25_276_502_016,
                        "required": {"ram_bytes": 24 * 1024**3, "seconds": 1860, "disk_bytes": 11 * 10**9},
                        "message": "A local QNN compile needs about 24 GiB.",
                        "fix": None,
                    },
                ]
            }
        )
    )
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)
    page = w.pages["preflight"]
    page.refresh()
    t = page.checks
    cells = [[t.item(r, col).text() for col in range(t.columnCount())] for r in range(t.rowCount())]
    assert [row[0] for row in cells][:3] == ["WSL memory limit", "Python version", "Disk: Hugging Face cache"]
    # sizes and times in a person's units (not 25276502016 or "seconds 1860")
    assert cells[3][2] == "23.5 GiB" and "time 31 min" in cells[3][3] and "ram 24.0 GiB" in cells[3][3], (
        cells[3]
    )
    text = " ".join(" ".join(row) for row in cells)
    assert "{" not in text and "'" not in text and "_" not in text, text
    assert cells[0][2] == "mem total 16.0 GiB · wsl version 2", cells[0][2]
    assert "check id: wsl" in t.item(0, 0).toolTip()
    assert [b.text() for b in page._fix_buttons] == ["Fix: WSL memory limit…"]


def test_board_list_agrees_with_the_board_stage(qtbot: Any, tmp_path: Path) -> None:
    _m, c, w = window_on_gate_failed_run(qtbot, tmp_path)  # its Board stage passed
    page = w.pages["board"]
    page.refresh()
    item = page.board_item("sim")
    assert item is not None and "ready (Board stage" in item.text() and "not connected" not in item.text()
    fresh = c.new_run("builtin:tiny-llama")
    assert fresh is c.manifest
    page.reload_boards()
    assert "not connected yet" in page.board_item("sim").text()


def test_export_html_fills_the_preview_and_open_in_browser(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    page = report_page_on_evaluated_run(qtbot, tmp_path)
    page.refresh()
    assert not page.open_button.isEnabled() and "Run the Report stage" in page.preview.toPlainText()
    out = tmp_path / "exported" / "report.html"
    out.parent.mkdir()
    ok = gui_loop.run_until_complete(page.export("html", out))
    assert ok, page.export_message.text()
    assert page.open_button.isEnabled() and "HexStudio run report" in page.preview.toPlainText()
    assert "shown below" in page.export_message.text() and page.html_path() == out


def test_model_page_shows_the_open_runs_settings(qtbot: Any, tmp_path: Path) -> None:
    m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    page = w.pages["model"]
    page.refresh()
    assert page.calib_spin.value() == m.settings["calibration_samples"]
    c.set_setting("calibration_samples", 11)  # as the Quantize page does
    w.refresh()
    assert page.calib_spin.value() == 11 and m.run_id in page.calib_spin.toolTip()


def test_history_shows_the_old_value(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.ui.dialogs.history import HistoryDialog

    m, c, w = window_on_gate_failed_run(qtbot, tmp_path)
    before = m.settings["calibration_samples"]
    c.set_setting("calibration_samples", 11)
    ev = c.manifest.data["events"][-1]
    assert ev["old"] == before and ev["new"] == 11 and f"calibration_samples: {before} → 11" == ev["message"]
    d = HistoryDialog(c, w)
    qtbot.addWidget(d)
    texts = [d.table.item(r, 2).text() for r in range(d.table.rowCount())]  # type: ignore[union-attr]
    assert f"calibration_samples: {before} → 11" in texts


def test_evaluate_chart_has_a_legend(qtbot: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    titles = {"float": "host float", "sim": "host quantized (sim)", "board": "board"}
    rewrite_output(
        m,
        "evaluate",
        "evaluate.json",
        json.dumps(
            {
                "simulated": True,
                "prompt_format": "chat",
                "tool_format": "json",
                "legs": list(titles),
                "leg_titles": titles,
                "suites": [
                    {
                        "suite": "instruction",
                        "title": "Instruction following",
                        "scorer": "rules",
                        "cases": 8,
                        "legs": {
                            leg: {"value": v, "text": f"{v:.0%}"}
                            for leg, v in (("float", 0.75), ("sim", 0.5), ("board", 0.5))
                        },
                        "drops": {"float->sim": 0.25, "sim->board": 0.0},
                    }
                ],
            }
        ),
    )
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)
    page = w.pages["evaluate"]
    page.refresh()
    names = [label.text for _sample, label in page.plot_legend.items]
    assert names == list(titles.values()), names
    compare_names = [label.text for _sample, label in page.compare_legend.items]
    assert compare_names and m.run_id in compare_names[0]


def _headers_and_row(page: Any) -> tuple[list[str], list[str]]:
    t = page.scores
    heads = [t.horizontalHeaderItem(i).text() for i in range(t.columnCount())]
    return heads, [t.item(0, i).text() if t.item(0, i) else "" for i in range(t.columnCount())]


def test_the_scores_table_has_a_column_for_each_leg_the_evaluation_ran(qtbot: Any, tmp_path: Path) -> None:
    """The table had six fixed columns while a suite's row held seven cells once the HTP leg came: the HTP
    simulation's score stood under "board", the board's under "drop float→sim", and the last drop was lost. A
    host-only evaluation showed an empty board column and its drop."""
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")

    def evaluation(legs: dict[str, float], drops: dict[str, float], source: str) -> str:
        return json.dumps(
            {
                "source": source,
                "simulated": source != "device",
                "prompt_format": "chat",
                "tool_format": "json",
                "legs": list(legs),
                "leg_titles": {"board": "board (SIMULATED)"},
                "suites": [
                    {
                        "suite": "instruction",
                        "title": "Instruction following",
                        "scorer": "rules",
                        "legs": {leg: {"value": v, "text": f"{v:.0%}"} for leg, v in legs.items()},
                        "drops": drops,
                    }
                ],
            }
        )

    rewrite_output(
        m,
        "evaluate",
        "evaluate.json",
        evaluation(
            {"float": 0.75, "sim": 0.5, "htp": 0.5, "board": 0.25},
            {"float->sim": 0.25, "sim->board": 0.25},
            "simulated",
        ),
    )
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)
    page = w.pages["evaluate"]
    page.refresh()
    heads, row = _headers_and_row(page)
    assert heads == [
        "suite",
        "host float",
        "host quantized (sim)",
        "HTP simulator (x86)",
        "board (SIMULATED)",
        "drop float→sim",
        "drop sim→board",
    ]
    assert page.scores.horizontalHeaderItem(3).toolTip() == "host HTP simulation (Qualcomm QNN, x86)"
    assert row == ["Instruction following", "75%", "50%", "50%", "25%", "+0.250", "+0.250"]
    rewrite_output(
        m, "evaluate", "evaluate.json", evaluation({"float": 0.75, "sim": 0.5}, {"float->sim": 0.25}, "host")
    )
    page.refresh()
    heads, row = _headers_and_row(page)
    assert heads == ["suite", "host float", "host quantized (sim)", "drop float→sim"]
    assert row == ["Instruction following", "75%", "50%", "+0.250"]
    legend = [label.text for _sample, label in page.plot_legend.items]
    assert legend == ["host float", "host quantized (simulation)"]
    # a hand-made evaluate.json that says neither where it ran nor its formats: not "Board: device. Prompts: None"
    doc = json.loads(evaluation({"float": 0.75, "board": 0.5}, {}, "device"))
    for key in ("source", "simulated", "prompt_format", "tool_format"):
        del doc[key]
    rewrite_output(m, "evaluate", "evaluate.json", json.dumps(doc))
    page.refresh()
    said = page.source_label.text()
    assert "Board: not stated" in said and "device" not in said and "None" not in said, said
    rewrite_output(m, "evaluate", "evaluate.json", evaluation({"board": 0.5}, {}, "device"))
    page.refresh()
    assert (
        "<b>Board: device.</b> Prompts: chat. Tool calls read in the json format." in page.source_label.text()
    )


def test_inspect_shows_it_is_busy_and_clears_the_previous_model(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    from tests.gui.test_pages import _config_only_8b

    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    page = w.pages["model"]
    w.show()
    page.inspect_table.set_rows([["model", "the previous one"]])
    page.folder_radio.setChecked(True)
    page.folder_edit.setText(str(_config_only_8b(tmp_path)))
    seen: dict[str, Any] = {}

    async def go() -> Any:
        task = asyncio.ensure_future(page.inspect())
        await asyncio.sleep(0)  # inspect has started reading config.json in a thread
        seen["busy"] = page.inspect_busy.isVisible()
        seen["rows"] = page.inspect_table.rowCount()
        return await task

    info = gui_loop.run_until_complete(go())
    assert seen == {"busy": True, "rows": 0}
    assert info is not None and not page.inspect_busy.isVisible() and page.inspect_table.rowCount() > 3


def test_run_keeps_the_status_line_and_run_buttons_in_view(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    c.new_run("builtin:tiny-llama")
    w.show()
    w.show_stage("preflight")
    page = w.pages["preflight"]
    page.run_button.setFocus()
    qtbot.waitUntil(page.run_button.hasFocus, timeout=3000)

    async def go() -> None:
        page.run_button.click()
        await wait_until(lambda: not c.busy, 180, "the preflight stage")

    gui_loop.run_until_complete(go())
    bar = page.scroll_area.verticalScrollBar()
    assert bar.value() == 0, bar.value()  # the status line and Run are still in view
    qtbot.waitUntil(lambda: page.run_button.hasFocus() or page.hasFocus(), timeout=3000)


def test_board_form_is_cleared_and_a_board_can_be_edited_and_removed(qtbot: Any, tmp_path: Path) -> None:
    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    page = w.pages["board"]
    page.name_edit.setText("evk")
    page.host_edit.setText("192.168.1.50")
    page.user_edit.setText("ubuntu")
    page.add_button.click()
    assert c.settings.boards["evk"]["host"] == "192.168.1.50" and "added" in page.conn_label.text()
    assert page.name_edit.text() == "" and page.host_edit.text() == "" and page.user_edit.text() == ""
    page.boards.setCurrentRow(
        next(i for i in range(page.boards.count()) if page.boards.item(i).data(256) == "evk")
    )
    assert page.edit_button.isEnabled() and page.remove_button.isEnabled()
    page.edit_button.click()
    assert (
        page.name_edit.text() == "evk"
        and page.user_edit.text() == "ubuntu"
        and page.add_button.text() == "Save board"
    )
    page.host_edit.setText("192.168.1.51")
    page.add_button.click()
    assert c.settings.boards["evk"]["host"] == "192.168.1.51" and "saved" in page.conn_label.text()
    page.boards.setCurrentRow(
        next(i for i in range(page.boards.count()) if page.boards.item(i).data(256) == "evk")
    )
    page.remove_selected(confirm=False)
    assert "evk" not in c.settings.boards and page.board_item("evk") is None
    page.boards.setCurrentRow(0)  # the simulator board cannot be edited or removed
    assert not page.edit_button.isEnabled() and not page.remove_button.isEnabled()


def test_saving_a_board_keeps_what_the_form_does_not_show_and_the_model_page_lists_it(
    qtbot: Any, tmp_path: Path
) -> None:
    """Edit then Save replaced the whole entry: qairt_zip (the Board stage installs QAIRT from it) and runtime
    (GeniEx) were gone. The form took a host with a space, which the CLI refuses. And the Model page's board
    list was filled once at start: a board added on the Board page was never offered, a removed one still was."""
    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    c.edit_settings(
        lambda s: s.boards.__setitem__(
            "evk",
            {
                "host": "10.0.0.9",
                "port": 22,
                "user": "ubuntu",
                "auth": "agent",
                "qairt_zip": "/q.zip",
                "runtime": "geniex",
            },
        )
    )
    page = w.pages["board"]
    page.reload_boards()
    page.boards.setCurrentRow(
        next(i for i in range(page.boards.count()) if page.boards.item(i).data(256) == "evk")
    )
    page.edit_button.click()
    page.user_edit.setText("root")
    page.add_button.click()
    evk = c.settings.boards["evk"]
    assert evk["user"] == "root" and evk["qairt_zip"] == "/q.zip" and evk["runtime"] == "geniex", evk
    page.name_edit.setText("lab")
    page.host_edit.setText("my board")
    page.add_button.click()
    assert "lab" not in c.settings.boards and "no host name" in page.conn_label.text()
    page.host_edit.setText("10.0.0.10")
    page.add_button.click()
    assert "lab" in c.settings.boards
    # the Model page offers the boards as they are when it is shown again
    model = w.pages["model"]
    w.show()
    w.show_stage("board")
    w.show_stage("model")  # shown again: its showEvent lists the boards of now
    offered = [model.board_combo.itemText(i) for i in range(model.board_combo.count())]
    assert offered == ["sim", "evk", "lab"], offered
    model.board_combo.setCurrentIndex(offered.index("lab"))
    c.edit_settings(lambda s: s.boards.pop("lab", None))  # removed meanwhile (the Board page, or the CLI)
    runs_before = len(c.workspace.list_runs())
    model.new_run()
    assert "no board named lab any more" in model.inspect_message.text()
    assert len(c.workspace.list_runs()) == runs_before


def test_board_console_shows_what_the_stage_did(qtbot: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    (m.run_dir / "logs").mkdir(exist_ok=True)
    events = [
        {"type": "progress", "fraction": 0.05, "message": "connecting to board sim"},
        {"type": "progress", "fraction": 0.3, "message": "pushing config.json (0.0 of 3.2 MB)"},
        {"type": "log", "level": "info", "message": "doctor: 7 checks passed"},
        {"type": "warning", "message": "the board's clock is 3 s behind"},
    ]
    (m.run_dir / "logs" / "board.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)
    page = w.pages["board"]
    page.refresh()
    text = page.console.toPlainText()
    assert "what the Board stage did" in text and "connecting to board sim" in text
    assert "doctor: 7 checks passed" in text and "WARNING: the board's clock is 3 s behind" in text
    assert "pushing config.json" not in text


def test_gui_help_needs_no_display_and_missing_xcb_libraries_are_named() -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    r = subprocess.run(
        [sys.executable, "-m", "hexstudio", "gui", "--help"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "usage: hexstudio [gui]" in r.stdout and "no display" not in r.stderr, r
    # a library Qt's xcb plugin needs is missing (one no system has, added to the real check): HexStudio says
    # which package to install instead of Qt aborting with "Reinstalling the application may fix this problem"
    code = (
        "import sys, hexstudio.ui.launch as l; l.XCB_LIBS['xcb-hexstudio-test'] = 'libxcb-hexstudio-test0'; "
        "raise SystemExit(l.launch_gui([]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**env, "DISPLAY": ":99"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "libxcb-hexstudio-test0" in r.stderr and "apt-get install" in r.stderr, r
    assert "Reinstalling" not in r.stderr


def test_a_setting_changed_in_the_studio_keeps_what_a_terminal_recorded(qtbot: Any, tmp_path: Path) -> None:
    """The studio's copy of run.json is older than what `hexstudio run --override-gate` wrote from a terminal:
    a setting changed on a page keeps the terminal's override; while a terminal runs the run, the page says
    the setting was not changed and shows the run's value again."""
    from PySide6.QtWidgets import QMessageBox

    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import RunLock

    m, _c, w = window_on_gate_failed_run(qtbot, tmp_path)
    page = w.pages["quantize"]
    Pipeline(RunManifest.load(m.run_dir)).override_gate("validate", "accepted from a terminal")
    page.set_setting("calibration_samples", 11)
    disk = RunManifest.load(m.run_dir)
    assert disk.settings["calibration_samples"] == 11
    assert "validate" in disk.settings["override_gates"]
    assert any(e["kind"] == "gate_override" and e["stage"] == "validate" for e in disk.data["events"])
    with RunLock(m.run_dir):
        page.set_setting("calibration_samples", 12)
        box = page.findChild(QMessageBox, "error_box")
        assert box is not None and box.isVisible()
        text = box.text() + box.informativeText()
        assert "the setting Calibration samples was not changed" in text and "change it again" in text, text
        assert page._setting_widgets["calibration_samples"].value() == 11  # the run's value again
        w.show_stage("quantize")
        w.show()
        keep_screenshot(w, "run-busy-setting-refused", tmp_path)
        keep_screenshot(box, "run-busy-setting-refused-box", tmp_path)
        box.close()
    assert RunManifest.load(m.run_dir).settings["calibration_samples"] == 11


def test_boards_added_in_a_terminal_are_kept_and_offered(qtbot: Any, tmp_path: Path) -> None:
    """The studio saved the settings it read at start: a board added with `hexstudio board add` while it was
    open vanished from settings.json at the studio's next board change, and was never offered. Each change now
    reads the file again, and the studio reads it again when it has changed."""
    from hexstudio.core.settings import Settings
    from tests.support.cli import python_m_hexstudio

    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    w.show()
    w.show_stage("board")
    page = w.pages["board"]
    r = python_m_hexstudio("board", "add", "lab2", "--host", "10.0.0.7", "--auth", "agent", "--no-connect")
    assert r.returncode == 0, r.stderr
    w.show_stage("model")
    w.show_stage("board")  # coming back to the page lists it
    qtbot.waitUntil(lambda: page.board_item("lab2") is not None, timeout=3000)
    page.name_edit.setText("evk")
    page.host_edit.setText("192.168.1.50")
    page.add_button.click()
    assert "added" in page.conn_label.text(), page.conn_label.text()
    assert set(Settings.load().boards) == {"lab2", "evk"}
    assert page.board_item("lab2") is not None and page.board_item("evk") is not None
    # a name the CLI refuses is refused here too (it names keyring entries and files)
    page.name_edit.setText("lab/3")
    page.host_edit.setText("10.0.0.8")
    page.add_button.click()
    assert "is not allowed" in page.conn_label.text() and "lab/3" not in Settings.load().boards


def test_a_perplexity_drop_is_red_by_its_share_not_its_points(qtbot: Any, tmp_path: Path) -> None:
    """Perplexity 12.00 -> 12.06 (+0.5 %) was red and 3 -> 4 (+33 %) too, by the accuracy's 0.05: the colour now
    reads a perplexity's rise as a share of the step's start (scoring.large_drop)."""
    import pyqtgraph as pg

    from hexstudio.ui.widgets import STATE_COLORS

    _c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    page = w.pages["evaluate"]

    def suite(name: str, scorer: str, legs: dict[str, float]) -> dict[str, Any]:
        drops = {"float->sim": legs["sim"] - legs["float"], "sim->board": legs["board"] - legs["sim"]}
        if scorer != "perplexity":
            drops = {k: -v for k, v in drops.items()}
        return {
            "suite": name,
            "scorer": scorer,
            "legs": {k: {"value": v, "text": str(v)} for k, v in legs.items()},
            "drops": drops,
        }

    page._show_scores(
        {
            "legs": ["float", "sim", "board"],
            "suites": [
                suite("ppl", "perplexity", {"float": 12.0, "sim": 12.06, "board": 16.0}),
                suite("acc", "exact", {"float": 0.9, "sim": 0.88, "board": 0.7}),
            ],
        }
    )
    red = pg.mkColor(STATE_COLORS["failed"])

    def is_red(row: int, col: int) -> bool:
        return page.scores.item(row, col).foreground().color() == red

    assert "5 %" in page.scores.horizontalHeaderItem(4).toolTip()  # the rule, where the numbers are
    assert [is_red(0, c) for c in (4, 5)] == [False, True]  # +0.5 %, then +33 %
    assert [is_red(1, c) for c in (4, 5)] == [False, True]  # 2 points, then 18


def test_adding_a_suite_of_a_shipped_name_says_it_takes_its_place(qtbot: Any, tmp_path: Path) -> None:
    """The Evaluate page adds a suite with replace (the person chose the file), so a user's "perplexity" took the
    shipped suite's place in every run that names it with only "Added ..." said."""
    ws = tmp_path / "ws"
    m = gate_failed_run(ws, "evaluate")
    c, w = studio_window(qtbot, ws, (1280, 720))
    c.open_run(m.run_id)
    page = w.pages["evaluate"]
    mine = tmp_path / "mine.jsonl"
    mine.write_text(
        '{"suite": {"name": "perplexity", "scorer": "exact"}}\n'
        '{"id": "a", "prompt": "Capital of France?", "expected": {"answer": "Paris"}}\n'
    )
    assert c.status("evaluate").key == "gate_failed"
    assert page.add_file(mine)
    assert "in place of the shipped suite" in page.add_message.text(), page.add_message.text()
    # perplexity is one of the run's suites: its cases changed, so Evaluate is stale, in the stage list too
    assert c.status("evaluate").key == "stale", c.status("evaluate")
    from PySide6.QtCore import Qt

    from hexstudio.core.stages import STAGE_NAMES

    item = w.stage_list.item(STAGE_NAMES.index("evaluate"))
    assert item.data(Qt.ItemDataRole.UserRole) == "stale", item.data(Qt.ItemDataRole.UserRole)
    assert "1 case (" in page.add_message.text(), page.add_message.text()
    texts = [page.suite_list.item(i).text() for i in range(page.suite_list.count())]
    assert [t for t in texts if "in place of the shipped suite" in t] == [
        "perplexity — 1 case (exact) — yours, in place of the shipped suite"
    ], texts
    other = tmp_path / "other.jsonl"
    other.write_text(mine.read_text().replace('"perplexity"', '"capitals"'))
    assert page.add_file(other)
    assert "shipped" not in page.add_message.text(), page.add_message.text()


def test_the_export_is_what_the_preview_shows_and_the_box_starts_from_the_setting(
    qtbot: Any, tmp_path: Path, gui_loop: asyncio.AbstractEventLoop
) -> None:
    """With the Report stage's own report.html there, an exported HTML said "(shown below)" while the preview kept
    the stage's. And the host-names box started ticked whatever the studio setting the Run Report stage follows
    said, so the box and the stage's report could disagree."""
    import os
    import time

    from hexstudio.core.settings import Settings

    s = Settings.load()
    s.data["include_host_in_reports"] = True
    s.save()
    page = report_page_on_evaluated_run(qtbot, tmp_path)
    assert not page.redact_hosts.isChecked() and "include_host_in_reports" in page.redact_hosts.toolTip()
    stage_html = page.c.manifest.run_dir / "artifacts" / "report" / "report.html"
    stage_html.parent.mkdir(parents=True, exist_ok=True)
    stage_html.write_text("<html><body>STAGE REPORT</body></html>")
    old = time.time() - 60
    os.utime(stage_html, (old, old))
    out = tmp_path / "exported" / "report.html"
    out.parent.mkdir()
    assert gui_loop.run_until_complete(page.export("html", out)), page.export_message.text()
    assert "shown below" in page.export_message.text() and page.html_path() == out
    stage_html.write_text(
        "<html><body>STAGE REPORT, run again</body></html>"
    )  # the stage writes its own again
    assert page.html_path() == stage_html


def test_saving_an_edited_board_never_reverts_a_change_made_elsewhere(qtbot: Any, tmp_path: Path) -> None:
    """Edit filled the form; a `hexstudio board add evk --host NEW` landed meanwhile; Save wrote the form's old host,
    port, user and auth back over it and said "saved". The entry is compared with what the form was filled with."""
    from hexstudio.core.settings import Settings
    from tests.support.cli import python_m_hexstudio

    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 720))
    c.edit_settings(lambda s: s.boards.__setitem__("evk", {"host": "10.0.0.4", "port": 22, "auth": "agent"}))
    page = w.pages["board"]
    page.reload_boards()
    page.boards.setCurrentRow(
        next(i for i in range(page.boards.count()) if page.boards.item(i).data(256) == "evk")
    )
    page.edit_button.click()
    r = python_m_hexstudio("board", "add", "evk", "--host", "10.0.0.5", "--auth", "agent", "--no-connect")
    assert r.returncode == 0, r.stderr
    page.user_edit.setText("root")
    page.auth_combo.setCurrentIndex(page.auth_combo.findText("password"))
    page.password_edit.setText("new-pw")  # not stored either: nothing of the refused save is kept
    page.add_button.click()
    assert Settings.load().boards["evk"]["host"] == "10.0.0.5"  # the terminal's change stands
    from hexstudio.core.secrets import board_password_key, get_secret

    assert get_secret(board_password_key("evk")) is None
    assert "changed elsewhere" in page.conn_label.text() and "Edit" in page.conn_label.text()
    page.boards.setCurrentRow(
        next(i for i in range(page.boards.count()) if page.boards.item(i).data(256) == "evk")
    )
    page.edit_button.click()  # again: the form shows what the entry holds now, and saves
    assert page.host_edit.text() == "10.0.0.5"
    page.user_edit.setText("root")
    page.add_button.click()
    assert Settings.load().boards["evk"]["user"] == "root" and "saved" in page.conn_label.text()
