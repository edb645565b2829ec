"""Small shared widgets: stage state icons, key/value tables, section headers."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QHeaderView, QLabel, QSizePolicy, QTableWidget, QTableWidgetItem, QWidget

STATE_COLORS = {
    "pending": "#8a8f98", "running": "#2f81f7", "done": "#2da44e", "failed": "#d1242f",
    "stale": "#bf8700", "interrupted": "#d1242f", "cancelled": "#8a8f98",
}
STATE_TEXT = {
    "pending": "not run yet", "running": "working…", "done": "done", "failed": "failed",
    "stale": "stale: its inputs changed since it ran",
    "interrupted": "interrupted (crash or reboot): resume to run it again",
    "cancelled": "cancelled by you",
}
STATUS_COLORS = {"ok": "#2da44e", "warn": "#bf8700", "fail": "#d1242f", "skip": "#8a8f98"}

_icon_cache: dict[str, QIcon] = {}


def state_icon(state: str, size: int = 16) -> QIcon:
    """A drawn icon per state (no image files): a dot, a ring for running, a cross for failures."""
    key = f"{state}:{size}"
    if key in _icon_cache:
        return _icon_cache[key]
    pm = QPixmap(QSize(size, size))
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    color = QColor(STATE_COLORS.get(state, "#8a8f98"))
    m = 2
    if state == "running":
        p.setPen(QPen(color, 2.5))
        p.drawArc(m, m, size - 2 * m, size - 2 * m, 30 * 16, 300 * 16)
    elif state in ("pending", "cancelled"):
        p.setPen(QPen(color, 1.8))
        p.drawEllipse(m, m, size - 2 * m, size - 2 * m)
    else:
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(color)
        p.drawEllipse(m, m, size - 2 * m, size - 2 * m)
        p.setPen(QPen(QColor("white"), 2))
        c = size / 2
        if state == "done":
            p.drawLine(int(c - 4), int(c), int(c - 1), int(c + 3))
            p.drawLine(int(c - 1), int(c + 3), int(c + 4), int(c - 3))
        elif state in ("failed", "interrupted"):
            p.drawLine(int(c - 3), int(c - 3), int(c + 3), int(c + 3))
            p.drawLine(int(c - 3), int(c + 3), int(c + 3), int(c - 3))
        elif state == "stale":
            p.drawLine(int(c), int(c - 4), int(c), int(c + 1))
            p.drawPoint(int(c), int(c + 4))
    p.end()
    icon = QIcon(pm)
    _icon_cache[key] = icon
    return icon


def paper(view: QWidget) -> None:
    """An HTML document view (report preview, comparison) drawn as paper: dark text on white whatever the
    window's palette, since the document's own styles are for a white page."""
    from PySide6.QtGui import QPalette

    pal = view.palette()
    for group in (QPalette.ColorGroup.Active, QPalette.ColorGroup.Inactive, QPalette.ColorGroup.Disabled):
        pal.setColor(group, QPalette.ColorRole.Base, QColor("#ffffff"))
        pal.setColor(group, QPalette.ColorRole.Text, QColor("#1f2328"))
        pal.setColor(group, QPalette.ColorRole.Link, QColor("#0969da"))
    view.setPalette(pal)
    view.setAutoFillBackground(True)


def heading(text: str, level: int = 1) -> QLabel:
    lab = QLabel(text)
    f = lab.font()
    f.setPointSizeF(f.pointSizeF() * (1.45 if level == 1 else 1.15))
    f.setBold(True)
    lab.setFont(f)
    return lab


def note(text: str) -> QLabel:
    lab = QLabel(text)
    lab.setWordWrap(True)
    lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    # long paths have no break points: never let one label widen the whole page
    lab.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
    return lab


def fmt_value(v: Any, unit: str | None = None) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        s = f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    elif isinstance(v, int):
        s = f"{v:,}"
    elif v is None:
        s = "—"
    else:
        s = str(v)
    if unit == "bytes" and isinstance(v, (int, float)):
        from app.core.jobs import human_bytes

        return human_bytes(v)
    return f"{s} {unit}".strip() if unit else s


class KeyValueTable(QTableWidget):
    """A read-only two-or-more column table (metrics, settings, checks)."""

    def __init__(self, headers: list[str], parent: QWidget | None = None) -> None:
        super().__init__(0, len(headers), parent)
        self.setHorizontalHeaderLabels(headers)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.setAlternatingRowColors(True)
        hh = self.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setStretchLastSection(True)
        self.setWordWrap(True)

    def set_rows(self, rows: list[list[str]], colors: list[str | None] | None = None) -> None:
        self.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if colors and colors[r] and c == 1:
                    item.setForeground(QColor(colors[r]))
                self.setItem(r, c, item)
        self.resizeRowsToContents()
