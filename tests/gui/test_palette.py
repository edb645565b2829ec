"""Light and dark: the plots follow the application palette when it changes while the studio runs
(the system switching to dark mode, or a theme change), not only the palette they were built with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def test_plots_restyle_when_the_palette_switches_to_dark_and_back(qtbot: Any, tmp_path: Path) -> None:
    from PySide6.QtGui import QColor, QPalette
    from PySide6.QtWidgets import QApplication

    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow
    from hexstudio.ui.plots import StyledPlot

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    w = MainWindow(RunController(Workspace(tmp_path / "ws")))
    qtbot.addWidget(w)
    w.show()
    plots = w.findChildren(StyledPlot)
    # the job dock's memory plot and the chat page's token-rate and reply-history plots
    assert len(plots) >= 3
    original = QPalette(app.palette())
    light_base = original.color(QPalette.ColorRole.Base)

    def colours(p: Any) -> tuple[QColor, QColor, QColor]:
        ax = p.getAxis("left")
        return p.backgroundBrush().color(), ax.pen().color(), ax.textPen().color()

    for p in plots:
        assert colours(p)[0] == light_base
    dark = QPalette(original)
    base, text = QColor("#1e1f22"), QColor("#dfe1e5")
    dark.setColor(QPalette.ColorRole.Window, QColor("#2b2d30"))
    dark.setColor(QPalette.ColorRole.Base, base)
    dark.setColor(QPalette.ColorRole.Text, text)
    dark.setColor(QPalette.ColorRole.WindowText, text)
    assert base != light_base
    try:
        app.setPalette(dark)
        qtbot.waitUntil(lambda: all(colours(p) == (base, text, text) for p in plots), timeout=5000)
        # a label drawn on the axis uses the new text colour too
        assert all(p.getAxis("bottom").labelStyle["color"] == text.name() for p in plots)
    finally:
        app.setPalette(original)
    qtbot.waitUntil(lambda: all(colours(p)[0] == light_base for p in plots), timeout=5000)
    assert all(colours(p)[2] == original.color(QPalette.ColorRole.Text) for p in plots)


def test_a_score_legend_drawn_in_light_follows_the_switch_to_dark(qtbot: Any, tmp_path: Path) -> None:
    """The Evaluate page drew its legend's veil and labels in the palette of the moment they were drawn: the page,
    drawn before the window was shown (or before a switch to dark), kept a white veil with pale labels on it."""
    from PySide6.QtGui import QColor, QPalette
    from PySide6.QtWidgets import QApplication

    from hexstudio.ui.pages.evaluate import _score_plot

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    plot, legend = _score_plot("p", "score")
    qtbot.addWidget(plot)
    plot.plot([0, 1], [0.5, 0.7], name="host float")  # a label drawn in the light palette
    original = QPalette(app.palette())
    dark = QPalette(original)
    base, text = QColor("#1e1f22"), QColor("#dfe1e5")
    dark.setColor(QPalette.ColorRole.Base, base)
    dark.setColor(QPalette.ColorRole.Text, text)
    try:
        app.setPalette(dark)
        qtbot.waitUntil(lambda: legend.opts["brush"].color().rgb() == base.rgb(), timeout=5000)
        ((_sample, label),) = legend.items
        assert text.name() in label.item.toHtml() or label.item.defaultTextColor() == text
    finally:
        app.setPalette(original)


def test_tab_leaves_a_results_table_and_an_empty_override_reason_is_asked_again(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tab moved cell by cell through a results table (28 presses to leave the preflight checks), and OK on an
    empty override reason closed the dialog and did nothing, without a word."""
    from PySide6.QtWidgets import QInputDialog

    from hexstudio.ui.widgets import KeyValueTable
    from tests.gui.conftest import studio_window
    from tests.support.gate_runs import gate_failed_run

    assert not KeyValueTable(["a", "b"]).tabKeyNavigation()
    m = gate_failed_run(tmp_path / "ws", "validate")
    c, w = studio_window(qtbot, tmp_path / "ws")
    c.open_run(m.run_id)
    answers = iter([("", True), ("  ", True), ("known on this toy model", True)])
    asked: list[str] = []

    def get_text(parent: Any, title: str, label: str, *a: Any, **kw: Any) -> tuple[str, bool]:
        asked.append(label)
        return next(answers)

    monkeypatch.setattr(QInputDialog, "getText", get_text)
    w.pages["validate"].override()
    assert len(asked) == 3 and asked[1].startswith("A reason is needed")
    assert c.manifest.stage("validate").data["gate"]["override"]


def test_a_settings_field_shows_its_unit_and_says_what_it_does(qtbot: Any, tmp_path: Path) -> None:
    """The stage pages' setting fields dropped the registry's unit and help: bare numbers, no tooltip."""
    from PySide6.QtWidgets import QSpinBox

    from tests.gui.conftest import studio_window

    _c, w = studio_window(qtbot, tmp_path / "ws")
    sb = w.pages["quantize"].findChild(QSpinBox, "setting_calibration_seq_len")
    assert sb is not None and sb.suffix() == " tokens" and sb.toolTip().startswith("Tokens per calibration")


def test_stale_and_gate_failed_differ_in_shape_not_only_in_colour(qtbot: Any) -> None:
    """The stage list drew the same "!" for a stale stage and a failed gate, amber against red: told apart by
    colour alone. Stale now draws its own mark (↻)."""
    from hexstudio.ui.widgets import state_icon

    def mark(state: str) -> set[tuple[int, int]]:
        img = state_icon(state, 16).pixmap(16, 16).toImage()
        return {
            (x, y)
            for x in range(16)
            for y in range(16)
            if min(img.pixelColor(x, y).red(), img.pixelColor(x, y).green(), img.pixelColor(x, y).blue())
            > 200
        }

    assert mark("stale") and mark("gate_failed") and mark("stale") != mark("gate_failed")
