"""How the studio looks and behaves across every page: light/dark palette (following the system by default),
a visible keyboard focus ring, and inputs that never change under a passing mouse wheel.

Installed once per application by `install(app)` (the main window calls it, so tests get it too)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QRect, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QProxyStyle,
    QStyle,
    QStyleOption,
    QWidget,
)

THEMES = ("system", "light", "dark")


def dark_palette() -> QPalette:
    p = QPalette()
    window, base, text = QColor("#2b2d30"), QColor("#1e1f22"), QColor("#dfe1e5")
    for group in (QPalette.ColorGroup.Active, QPalette.ColorGroup.Inactive):
        p.setColor(group, QPalette.ColorRole.Window, window)
        p.setColor(group, QPalette.ColorRole.WindowText, text)
        p.setColor(group, QPalette.ColorRole.Base, base)
        p.setColor(group, QPalette.ColorRole.AlternateBase, QColor("#2a2c30"))
        p.setColor(group, QPalette.ColorRole.ToolTipBase, QColor("#3c3f41"))
        p.setColor(group, QPalette.ColorRole.ToolTipText, text)
        p.setColor(group, QPalette.ColorRole.PlaceholderText, QColor("#8a8f98"))
        p.setColor(group, QPalette.ColorRole.Text, text)
        p.setColor(group, QPalette.ColorRole.Button, QColor("#393b40"))
        p.setColor(group, QPalette.ColorRole.ButtonText, text)
        p.setColor(group, QPalette.ColorRole.BrightText, QColor("#ff6b6b"))
        p.setColor(group, QPalette.ColorRole.Link, QColor("#58a6ff"))
        p.setColor(group, QPalette.ColorRole.Highlight, QColor("#2f6fd6"))
        p.setColor(group, QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
        p.setColor(group, QPalette.ColorRole.Light, QColor("#4a4d52"))
        p.setColor(group, QPalette.ColorRole.Midlight, QColor("#3e4145"))
        p.setColor(group, QPalette.ColorRole.Mid, QColor("#55585d"))
        p.setColor(group, QPalette.ColorRole.Dark, QColor("#1a1b1e"))
        p.setColor(group, QPalette.ColorRole.Shadow, QColor("#000000"))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6f737a"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Base, QColor("#25262a"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Button, QColor("#303236"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Window, window)
    return p


def is_dark(palette: QPalette | None = None) -> bool:
    pal = palette or QGuiApplication.palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


class _State:
    system_palette: QPalette | None = None
    theme = "system"
    installed = False
    wheel_guard: WheelGuard | None = None


def system_palette() -> QPalette:
    """The palette the platform gave the application (captured before any theme is applied)."""
    if _State.system_palette is None:
        _State.system_palette = QPalette(QGuiApplication.palette())
    return QPalette(_State.system_palette)


def current_theme() -> str:
    return _State.theme


def apply_theme(theme: str) -> None:
    """system: the platform's palette (Fusion follows the system's light or dark scheme); light or dark:
    forced. Widgets and plots restyle on the palette change."""
    if theme not in THEMES:
        theme = "system"
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        return
    base = system_palette()
    _State.theme = theme
    if theme == "dark":
        app.setPalette(dark_palette())
    elif theme == "light":
        app.setPalette(app.style().standardPalette())
    else:
        hints: Any = QGuiApplication.styleHints()
        scheme = getattr(hints, "colorScheme", lambda: None)()
        if scheme == Qt.ColorScheme.Dark and not is_dark(base):
            app.setPalette(dark_palette())  # the system says dark but gave Fusion a light palette
        else:
            app.setPalette(base)


class FocusRingStyle(QProxyStyle):
    """The keyboard focus ring drawn as a clear 2 px outline in the highlight colour (Fusion's is faint)."""

    def drawPrimitive(
        self,
        element: QStyle.PrimitiveElement,
        option: QStyleOption,
        painter: QPainter,
        widget: QWidget | None = None,
    ) -> None:
        if element == QStyle.PrimitiveElement.PE_FrameFocusRect:
            painter.save()
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            pen = QPen(option.palette.color(QPalette.ColorRole.Highlight), 2)  # type: ignore[attr-defined]
            painter.setPen(pen)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            r: QRect = option.rect.adjusted(1, 1, -1, -1)  # type: ignore[attr-defined]
            painter.drawRoundedRect(r, 3, 3)
            painter.restore()
            return
        super().drawPrimitive(element, option, painter, widget)
        if element in _CHECKS and is_dark(option.palette):  # type: ignore[attr-defined]
            # Fusion outlines a check box in the window colour darkened: on a dark list's base it cannot be seen,
            # and an unticked suite or setting looked like no box at all
            painter.save()
            painter.setPen(QPen(option.palette.color(QPalette.ColorRole.Mid), 1))  # type: ignore[attr-defined]
            painter.setBrush(Qt.BrushStyle.NoBrush)
            box: QRect = option.rect.adjusted(0, 0, -1, -1)  # type: ignore[attr-defined]
            painter.drawRoundedRect(box, 2, 2)
            painter.restore()


_CHECKS = (
    QStyle.PrimitiveElement.PE_IndicatorItemViewItemCheck,
    QStyle.PrimitiveElement.PE_IndicatorCheckBox,
)


class WheelGuard(QObject):
    """A wheel turned over a spin box or combo box that does not have the keyboard focus scrolls the page
    instead of changing the value (a passing mouse must never change a run setting)."""

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:
        if ev.type() != QEvent.Type.Wheel or not isinstance(obj, QWidget):
            return False
        w: QWidget | None = obj
        target: QWidget | None = None
        for _ in range(3):  # the spin box's own line edit, or the combo's
            if w is None:
                break
            if isinstance(w, (QAbstractSpinBox, QComboBox)):
                target = w
                break
            w = w.parentWidget()
        if target is None or target.hasFocus():
            return False
        p = target.parentWidget()
        while p is not None and not isinstance(p, QAbstractScrollArea):
            p = p.parentWidget()
        if isinstance(p, QAbstractScrollArea):
            QCoreApplication.sendEvent(p.verticalScrollBar(), ev)
        return True


def install(app: QApplication | None = None) -> None:
    """Once per application: the focus ring style, the wheel guard, and the theme from the studio settings."""
    inst = app or QApplication.instance()
    if not isinstance(inst, QApplication) or _State.installed:
        return
    _State.installed = True
    system_palette()
    base = inst.style()
    inst.setStyle(FocusRingStyle(base.name() if base is not None else "Fusion"))
    _State.wheel_guard = WheelGuard(inst)
    inst.installEventFilter(_State.wheel_guard)
