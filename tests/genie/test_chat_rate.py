"""The chat page's live rate plot counts tokens, not stdout reads: a chunk's token count (from the runner
or the bundle's tokenizer) feeds the plot; without one the plot says it counts chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _page(qtbot: Any, tmp_path: Path) -> Any:
    from PySide6.QtCore import QSettings

    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "qsettings"))
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.pages.chat import ChatPage

    page = ChatPage(RunController(Workspace(tmp_path / "ws")))
    qtbot.addWidget(page)
    return page


def test_rate_plot_counts_the_tokens_each_chunk_holds(qtbot: Any, tmp_path: Path) -> None:
    page = _page(qtbot, tmp_path)
    plot = page.rate_plot
    plot.begin_reply()
    # one stdout read every 0.1 s, each holding 3 tokens: 30 tokens/s (counting reads would say 10)
    for i in range(1, 6):
        page.show_chunk(0.1 * i, "abc ", 3)
    assert plot.ys[-1] == pytest.approx(30.0)
    assert plot.getAxis("left").labelText == "tokens/s"
    assert page.streamed == "abc " * 5


def test_rate_plot_says_chunks_when_the_token_count_is_unknown(qtbot: Any, tmp_path: Path) -> None:
    page = _page(qtbot, tmp_path)
    plot = page.rate_plot
    plot.begin_reply()
    for i in range(1, 6):
        page.show_chunk(0.1 * i, "abc ")
    assert plot.ys[-1] == pytest.approx(10.0)
    assert plot.getAxis("left").labelText.startswith("chunks/s")
