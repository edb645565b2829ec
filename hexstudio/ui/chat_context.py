"""The chat's Context panel: how much of the model's context the next prompt fills, the room kept for the reply,
and which turns no longer fit (hexstudio.core.services.chat.context_use counts them)."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QGroupBox, QProgressBar, QVBoxLayout, QWidget

from hexstudio.core.services.chat import ContextUse
from hexstudio.ui.widgets import STATE_COLORS, note, rich


class ContextPanel(QGroupBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Context", parent)
        cxl = QVBoxLayout(self)
        self.context_meter = QProgressBar()
        self.context_meter.setObjectName("context_meter")
        self.context_meter.setRange(0, 1)
        self.context_meter.setValue(0)
        self.context_meter.setTextVisible(True)
        self.context_meter.setFormat("no conversation yet")
        self.context_meter.setToolTip(
            "Tokens this conversation fills in the model's context (what the next "
            "message is sent with), and the room kept for the reply. When it is "
            "full, the oldest turns are left out (you are told)."
        )
        cxl.addWidget(self.context_meter)
        self.context_label = rich(note(""))
        self.context_label.setObjectName("context_label")
        cxl.addWidget(self.context_label)

    def show_no_run(self) -> None:
        self.context_meter.setRange(0, 1)
        self.context_meter.setValue(0)
        self.context_meter.setFormat("no run open")
        self.context_label.setText("")

    def show_error(self, exc: Exception) -> None:
        """A broken chat template: say so, never break the page."""
        self.context_meter.setFormat("unknown")
        self.context_label.setText(f"The prompt could not be rendered: {exc}")

    def show_use(self, use: ContextUse) -> None:
        total = use.total
        shown = min(use.used, total)
        self.context_meter.setRange(0, total)
        self.context_meter.setValue(shown)
        self.context_meter.setFormat(f"{shown:,} / {total:,} tokens ({100 * shown / total:.0f}%)")
        text = f"{use.reply:,} kept for the reply; {use.free:,} free (the model's context: {total:,} tokens)."
        if use.dropped:
            first = use.kept[0].user if use.kept else ""
            text = (
                f"<span style='color:{STATE_COLORS['stale']}'><b>Full:</b> the oldest {use.dropped} of "
                f"{len(use.history)} turns no longer fit and are left out of the next prompt"
                + (f" (it starts at “{html.escape(first[:40])}”)" if first else "")
                + ".</span> "
                + text
            )
        self.context_label.setText(text)
