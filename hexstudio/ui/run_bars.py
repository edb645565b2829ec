"""The bars above the pages: an interrupted stage to resume, a failed gate to override or fix."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

from hexstudio.core.status import KINDS
from hexstudio.ui.widgets import STATE_COLORS, button


class _RunBar(QFrame):
    """A framed bar in the colour of what it reports: a message that wraps, then the buttons a bar adds."""

    def __init__(self, name: str, color: str, parent: QWidget | None) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(f"QFrame#{name} {{ border: 1px solid {color}; border-radius: 4px; }}")
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(10, 4, 6, 4)
        self.label = QLabel("")
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        self.row.addWidget(self.label, 1)
        self.hide()


class ResumeBar(_RunBar):
    """Shown above the pages when the open run has a heavy stage that was interrupted or cancelled."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("resume_bar", STATE_COLORS["stale"], parent)
        self.resume_button = button(
            "Resume",
            "resume_button",
            "Run every stage that is not done, starting with the interrupted one (Ctrl+R)",
        )
        self.row.addWidget(self.resume_button)
        self.dismiss_button = QToolButton()
        self.dismiss_button.setText("✕")
        self.dismiss_button.setToolTip("Hide this message")
        self.dismiss_button.setAutoRaise(True)
        self.dismiss_button.clicked.connect(self.hide)
        self.row.addWidget(self.dismiss_button)


class GateBar(_RunBar):
    """Shown above the pages while a stage of the open run has a failed gate that nobody overrode: why, and the
    way on (override it, recorded with who and when; or open the stage to fix it). A run that stops at such a
    gate (Run Report after a failed Evaluate gate, say) says so here, not only in the status bar."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("gate_bar", KINDS["gate_failed"].color, parent)
        self.label.setObjectName("gate_bar_label")
        self.override_button = button(
            "Override the gate…",
            "gate_bar_override",
            "Continue past this gate anyway: your reason, your name and the time are "
            "recorded in the run and shown in its report",
        )
        self.row.addWidget(self.override_button)
        self.show_button = button("Show the stage", "gate_bar_show")
        self.row.addWidget(self.show_button)
        self.stage: str | None = None
