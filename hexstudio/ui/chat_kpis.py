"""The chat's Performance panel: the last reply's KPI line, how the session runs, the token rate of the reply as it
streams and the generation rate of every reply so far."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGroupBox, QLabel, QVBoxLayout, QWidget

from hexstudio.core.services.chat import kpi_line
from hexstudio.ui.plots import ReplyHistoryPlot, TokenRatePlot
from hexstudio.ui.widgets import note


class PerformancePanel(QGroupBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Performance", parent)
        pl = QVBoxLayout(self)
        self.kpi_label = note("")
        self.kpi_label.setObjectName("kpi_label")
        self.kpi_label.setTextFormat(Qt.TextFormat.PlainText)
        pl.addWidget(self.kpi_label)
        self.mode_label = note("")
        self.mode_label.setObjectName("session_mode")
        self.mode_label.setTextFormat(Qt.TextFormat.PlainText)
        pl.addWidget(self.mode_label)
        pl.addWidget(QLabel("Token rate, this reply"))
        self.rate_plot = TokenRatePlot()
        self.rate_plot.setMinimumHeight(150)
        pl.addWidget(self.rate_plot)
        pl.addWidget(QLabel("Generation rate per reply"))
        self.history_plot = ReplyHistoryPlot()
        self.history_plot.setMinimumHeight(120)
        pl.addWidget(self.history_plot)
        self._rate_unit = "tokens/s"

    def add_chunk(self, t: float, tokens: int | None) -> None:
        """A piece of the reply arrived `t` seconds after the prompt was sent, holding `tokens` tokens (from the
        runner, or counted with the bundle's tokenizer). Unknown: the plot counts chunks and says so."""
        unit = "tokens/s" if tokens is not None else "chunks/s (token count unknown)"
        if self._rate_unit != unit:
            self._rate_unit = unit
            self.rate_plot.setLabel("left", unit)
        self.rate_plot.add_tokens(t, tokens if tokens is not None else 1)

    def show_reply(self, kpis: dict[str, Any]) -> None:
        """A finished reply's KPIs: the line, and its generation rate on the history plot."""
        self.kpi_label.setText(kpi_line(kpis))
        if kpis.get("gen_tok_s"):
            self.history_plot.add_reply(float(kpis["gen_tok_s"]))

    def show_replies(self, replies: list[dict[str, Any]]) -> None:
        """A stored conversation's replies (their KPIs, oldest first): the plot again, the last one's line."""
        self.history_plot.reset()
        for k in replies:
            if k.get("gen_tok_s"):
                self.history_plot.add_reply(float(k["gen_tok_s"]))
        self.kpi_label.setText(kpi_line(replies[-1]) if replies else "")
