"""Qt's own messages (qWarning from a widget, a plugin that failed to load, QPainter misuse) into the studio
log (hexstudio/core/logs.py), with the file and line Qt gives."""

from __future__ import annotations

import logging

from PySide6.QtCore import QMessageLogContext, QtMsgType, qInstallMessageHandler

log = logging.getLogger("hexstudio.qt")

LEVELS = {
    QtMsgType.QtDebugMsg: logging.DEBUG,
    QtMsgType.QtInfoMsg: logging.INFO,
    QtMsgType.QtWarningMsg: logging.WARNING,
    QtMsgType.QtCriticalMsg: logging.ERROR,
    QtMsgType.QtFatalMsg: logging.CRITICAL,
}


def qt_message_handler(mode: QtMsgType, context: QMessageLogContext, message: str) -> None:
    file, line, category = (getattr(context, a, None) for a in ("file", "line", "category"))
    where = f" ({file}:{line})" if file else ""
    label = f"[{category}] " if category and category != "default" else ""
    log.log(LEVELS.get(mode, logging.WARNING), "%s%s%s", label, message, where)


def install_qt_message_handler() -> None:
    qInstallMessageHandler(qt_message_handler)
