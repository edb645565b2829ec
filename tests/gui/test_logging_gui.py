"""The studio (offscreen) logs to <config>/logs/studio.log: a slot that raises, a failed asyncio task on the
qasync loop and Qt's own warnings land there with their tracebacks; error dialogs name the log and open it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

GUI = """
import asyncio, gc, sys
from PySide6.QtCore import QTimer, qWarning
from PySide6.QtWidgets import QApplication

app = QApplication([sys.argv[0]])

def crash_in_a_slot():
    raise ZeroDivisionError("boom in a Qt slot")

async def failing_task():
    raise LookupError("boom in a GUI task")

def start_task():
    asyncio.ensure_future(failing_task())   # never awaited: the qasync loop's exception handler gets it

QTimer.singleShot(50, crash_in_a_slot)
QTimer.singleShot(50, start_task)
QTimer.singleShot(100, lambda: qWarning("hexstudio-qt-warning-canary"))
QTimer.singleShot(300, gc.collect)
QTimer.singleShot(600, app.quit)

from hexstudio.ui.launch import launch_gui
raise SystemExit(launch_gui(["--workspace", sys.argv[1]]))
"""


def test_gui_crashes_land_in_the_log_with_their_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "HEXSTUDIO_CONFIG_DIR": str(cfg),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "PYTHONPATH": str(REPO),
    }
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GUI), str(tmp_path / "ws")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    text = (cfg / "logs" / "studio.log").read_text(encoding="utf-8")
    assert "studio started" in text
    assert (
        "uncaught exception" in text
        and "in crash_in_a_slot" in text
        and "ZeroDivisionError: boom in a Qt slot" in text
    )
    assert (
        "hexstudio.asyncio" in text
        and "in failing_task" in text
        and "LookupError: boom in a GUI task" in text
    )
    assert "hexstudio.qt: hexstudio-qt-warning-canary" in text


def test_error_dialog_names_the_log_and_has_show_log(qtbot: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtCore import QUrl
    from PySide6.QtWidgets import QMessageBox

    from hexstudio.core import logs
    from hexstudio.ui import errors

    opened: list[str] = []

    def open_url(url: QUrl) -> bool:
        opened.append(url.toLocalFile())
        return True

    monkeypatch.setattr(errors.QDesktopServices, "openUrl", open_url)
    from hexstudio.core.secrets import remember_secret

    remember_secret("sudo-pw-in-a-traceback")
    try:
        raise RuntimeError("the compare failed with sudo-pw-in-a-traceback")
    except RuntimeError as exc:
        box = errors.show_error(
            None, "Compare runs", "The runs could not be compared.", "Try again.", exc=exc
        )
    try:
        assert (
            str(logs.log_path()) in box.informativeText()
            and "What to do: Try again." in box.informativeText()
        )
        # scrubbed as the log is: the details are pasted into bug reports
        assert "RuntimeError: the compare failed with [redacted]" in box.detailedText()
        show = next(b for b in box.buttons() if b.text() == "Show log")
        show.click()
        assert opened and opened[0] in (str(logs.log_path()), str(logs.log_dir()))
        assert box.isVisible()  # "Show log" leaves the dialog open
        assert box.icon() == QMessageBox.Icon.Warning
    finally:
        box.close()


def test_stage_failure_label_links_to_the_log() -> None:
    from hexstudio.core import logs
    from hexstudio.ui.errors import log_link_html

    html = log_link_html()
    assert str(logs.log_path()) in html and "<a href='file://" in html
