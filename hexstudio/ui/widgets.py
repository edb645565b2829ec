"""Small shared widgets: stage state icons, key/value tables, section headers; showing a folder."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, QUrl
from PySide6.QtGui import QColor, QDesktopServices, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QCheckBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from hexstudio.core.status import KINDS

# The one status model (hexstudio.core.status): colours, words and marks come from there; "done" stays a key for
# the few widgets that show a plain success (a board connection, a fix applied).
STATE_COLORS = {k.key: k.color for k in KINDS.values()} | {"done": KINDS["passed"].color}
STATE_TEXT = {k.key: k.word for k in KINDS.values()} | {
    "done": "done",
    "running": "working…",
    "interrupted": "interrupted (crash or reboot): resume to run it again",
    "cancelled": "cancelled by you",
    "stale": "stale: its inputs changed since it ran",
}
STATUS_COLORS = {"ok": "#2da44e", "warn": "#bf8700", "fail": "#d1242f", "skip": "#8a8f98"}

_icon_cache: dict[str, QIcon] = {}


def commit_focused_edit() -> None:
    """Record a value still being typed in a field before a run starts: fields record on editingFinished (Enter,
    Tab, a click elsewhere), which a shortcut such as Ctrl+R does not cause. The focus stays where it is."""
    w = QApplication.focusWidget()
    if isinstance(w, QAbstractSpinBox):
        w.interpretText()
        w.editingFinished.emit()
    elif isinstance(w, QLineEdit) and isinstance(w.parent(), QAbstractSpinBox):
        box = w.parent()
        assert isinstance(box, QAbstractSpinBox)
        box.interpretText()
        box.editingFinished.emit()
    elif isinstance(w, QLineEdit):
        w.editingFinished.emit()


def failed(text: str) -> str:
    """`text` (plain) as a failure, in rich text."""
    return f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(text)}</span>"


def state_icon(state: str, size: int = 16) -> QIcon:
    """A drawn icon per status (no image files, no font glyphs), the same mark as the status's symbol that the
    CLI and the report print: ✓ passed, ! gate failed, ⚑ overridden, ✗ failed, ↯ interrupted, ⊘ cancelled,
    ↻ stale, ○ not run yet, ◐ running."""
    state = {"done": "passed"}.get(state, state)
    key = f"{state}:{size}"
    if key in _icon_cache:
        return _icon_cache[key]
    pm = QPixmap(QSize(size, size))
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    color = QColor(STATE_COLORS.get(state, "#8a8f98"))
    m = 2
    c = size / 2
    if state == "running":
        p.setPen(QPen(color, 2.5))
        p.drawArc(m, m, size - 2 * m, size - 2 * m, 30 * 16, 300 * 16)
    elif state in ("pending", "cancelled"):
        p.setPen(QPen(color, 1.8))
        p.drawEllipse(m, m, size - 2 * m, size - 2 * m)
        if state == "cancelled":
            p.drawLine(QPointF(c - 3.5, c + 3.5), QPointF(c + 3.5, c - 3.5))
    else:
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(color)
        p.drawEllipse(m, m, size - 2 * m, size - 2 * m)
        pen = QPen(QColor("white"), 2)
        pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        p.setPen(pen)
        if state == "passed":
            p.drawLine(QPointF(c - 4, c), QPointF(c - 1, c + 3))
            p.drawLine(QPointF(c - 1, c + 3), QPointF(c + 4, c - 3))
        elif state == "failed":
            p.drawLine(QPointF(c - 3, c - 3), QPointF(c + 3, c + 3))
            p.drawLine(QPointF(c - 3, c + 3), QPointF(c + 3, c - 3))
        elif state == "gate_failed":
            p.drawLine(QPointF(c, c - 4), QPointF(c, c + 0.5))
            p.drawPoint(QPointF(c, c + 3.5))
        elif state == "stale":  # ↻, not gate_failed's "!": told apart without telling amber from red
            r = 3.8
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawArc(QRectF(c - r, c - r, 2 * r, 2 * r), 60 * 16, 270 * 16)
            p.setBrush(QColor("white"))
            p.setPen(Qt.PenStyle.NoPen)
            tip = QPointF(c + r * 0.5, c - r * 0.87)  # where the arc starts (60°), its arrowhead
            p.drawPolygon(
                [
                    QPointF(tip.x() + 2.6, tip.y() - 1.2),
                    QPointF(tip.x() - 0.6, tip.y() - 2.6),
                    QPointF(tip.x() + 0.4, tip.y() + 1.6),
                ]
            )
        elif state == "overridden":  # a flag
            p.drawLine(QPointF(c - 3, c - 4), QPointF(c - 3, c + 4))
            p.setBrush(QColor("white"))
            p.setPen(Qt.PenStyle.NoPen)
            p.drawPolygon([QPointF(c - 3, c - 4), QPointF(c + 4, c - 2), QPointF(c - 3, c + 1)])
        elif state == "interrupted":  # a broken line
            p.drawPolyline(
                [
                    QPointF(c + 1, c - 4.5),
                    QPointF(c - 2.5, c + 0.5),
                    QPointF(c + 2.5, c - 0.5),
                    QPointF(c - 1, c + 4.5),
                ]
            )
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


def button(
    text: str, name: str, tip: str | None = None, on_click: Callable[..., object] | None = None
) -> QPushButton:
    """A push button with its object name (what the tests and the style find it by), its tooltip and what a
    click does, where given."""
    b = QPushButton(text)
    b.setObjectName(name)
    if tip is not None:
        b.setToolTip(tip)
    if on_click is not None:
        b.clicked.connect(on_click)
    return b


def check_box(text: str, name: str, tip: str | None = None, *, checked: bool = False) -> QCheckBox:
    """A check box with its object name, whether it starts checked and, where given, its tooltip."""
    box = QCheckBox(text)
    box.setObjectName(name)
    box.setChecked(checked)
    if tip is not None:
        box.setToolTip(tip)
    return box


def spin_box(name: str, lo: int, hi: int, tip: str | None = None, *, step: int = 1) -> QSpinBox:
    """A whole-number box from lo to hi, with its object name and, where given, its tooltip."""
    box = QSpinBox()
    box.setObjectName(name)
    box.setRange(lo, hi)
    box.setSingleStep(step)
    if tip is not None:
        box.setToolTip(tip)
    return box


def float_spin_box(
    name: str, lo: float, hi: float, decimals: int, tip: str | None = None, *, step: float = 1.0
) -> QDoubleSpinBox:
    """A number box from lo to hi shown with `decimals` decimals (spin_box for fractions)."""
    box = QDoubleSpinBox()
    box.setObjectName(name)
    box.setRange(lo, hi)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    if tip is not None:
        box.setToolTip(tip)
    return box


def button_row(*widgets: QWidget) -> QHBoxLayout:
    """The widgets (buttons) side by side from the left, the rest of the row left empty."""
    row = QHBoxLayout()
    for w in widgets:
        row.addWidget(w)
    row.addStretch(1)
    return row


def rich(label: QLabel) -> QLabel:
    """A label whose text is always read as HTML (escaped text never shows its entities raw)."""
    label.setTextFormat(Qt.TextFormat.RichText)
    return label


def fmt_value(v: Any, unit: str | None = None) -> str:
    from hexstudio.core.units import fmt_quantity

    q = fmt_quantity(v, unit) if isinstance(v, (int, float)) else None
    if q is not None:  # rates and times: the one rule the CLI prints them by (hexstudio/core/units.py)
        return q
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
        from hexstudio.core.jobs import human_bytes

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
        # Tab leaves the table (cell by cell, a preflight's checks took 28 presses): the arrows move within it
        self.setTabKeyNavigation(False)
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


def open_folder(path: Path) -> bool:
    """Show a folder in the system's file manager (made first if it does not exist yet)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))
