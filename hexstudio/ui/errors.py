"""How the studio shows a failure: what happened, what to do, and where the log is.

Every error dialog has a "Show log" button (the studio log, <config>/logs/studio.log, in the system's
editor) and names the file, so that whoever helps has the traceback; failure labels on the pages end with
a link to the same file (`log_link_html`)."""

from __future__ import annotations

import html
import logging
import traceback

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox, QWidget

from hexstudio.core import logs
from hexstudio.ui.widgets import failed

log = logging.getLogger("hexstudio.gui")


def show_log() -> bool:
    """Open the studio log (its folder when the file is not there yet)."""
    path = logs.log_path()
    target = path if path.is_file() else path.parent
    try:
        target.mkdir(parents=True, exist_ok=True) if target == path.parent else None
    except OSError:
        pass
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(target)))


def log_link_html() -> str:
    """'Details: the studio log' as a link (for a QLabel with openExternalLinks)."""
    path = logs.log_path()
    return (
        f"<br><small>Details: <a href='{html.escape(QUrl.fromLocalFile(str(path)).toString())}'>"
        f"{html.escape(str(path))}</a></small>"
    )


def show_error(
    parent: QWidget | None,
    title: str,
    message: str,
    hint: str | None = None,
    exc: BaseException | None = None,
) -> QMessageBox:
    """A warning dialog with the message, what to do, the log's path and a "Show log" button, shown without
    blocking (the event loop is asyncio's: a nested exec() would stall it). With `exc`, its traceback is
    written to the log first and offered under "Show Details..."."""
    log.warning("%s: %s", title, message)
    if exc is not None:
        logs.log_exception(log, f"{title}: {message}", exc)
    box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Close, parent)
    box.setObjectName("error_box")
    info = (f"What to do: {hint}\n\n" if hint else "") + f"The studio log has the details: {logs.log_path()}"
    box.setInformativeText(info)
    if exc is not None:
        # scrubbed as the log is: the details are what a user pastes into a bug report
        box.setDetailedText(
            logs.scrub_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        )
    button = box.addButton("Show log", QMessageBox.ButtonRole.HelpRole)
    button.setObjectName("show_log_button")
    button.clicked.disconnect()  # a HelpRole button would close the box: keep it open
    button.clicked.connect(show_log)
    box.open()
    return box


def refused_html(message: str, hint: str | None) -> str:
    """A refusal or failure on a page's label: what happened in the failed colour, then what to do."""
    return failed(message) + (f"<br><b>What to do:</b> {html.escape(hint)}" if hint else "")
