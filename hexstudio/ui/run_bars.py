"""The bars above the pages: an interrupted stage to resume, a failed gate to override or fix."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from hexstudio.core.status import KINDS
from hexstudio.ui.widgets import STATE_COLORS


class ResumeBar(QFrame):
    """Shown above the pages when the open run has a heavy stage that was interrupted or cancelled."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("resume_bar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(
            f"QFrame#resume_bar {{ border: 1px solid {STATE_COLORS['stale']}; border-radius: 4px; }}"
        )
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        self.label = QLabel("")
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        lay.addWidget(self.label, 1)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setObjectName("resume_button")
        self.resume_button.setToolTip(
            "Run every stage that is not done, starting with the interrupted one (Ctrl+R)"
        )
        lay.addWidget(self.resume_button)
        self.dismiss_button = QToolButton()
        self.dismiss_button.setText("✕")
        self.dismiss_button.setToolTip("Hide this message")
        self.dismiss_button.setAutoRaise(True)
        self.dismiss_button.clicked.connect(self.hide)
        lay.addWidget(self.dismiss_button)
        self.hide()


class GateBar(QFrame):
    """Shown above the pages while a stage of the open run has a failed gate that nobody overrode: why, and the
    way on (override it, recorded with who and when; or open the stage to fix it). A run that stops at such a
    gate (Run Report after a failed Evaluate gate, say) says so here, not only in the status bar."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("gate_bar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(
            f"QFrame#gate_bar {{ border: 1px solid {KINDS['gate_failed'].color}; border-radius: 4px; }}"
        )
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        self.label = QLabel("")
        self.label.setObjectName("gate_bar_label")
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        lay.addWidget(self.label, 1)
        self.override_button = QPushButton("Override the gate…")
        self.override_button.setObjectName("gate_bar_override")
        self.override_button.setToolTip(
            "Continue past this gate anyway: your reason, your name and the time are "
            "recorded in the run and shown in its report"
        )
        lay.addWidget(self.override_button)
        self.show_button = QPushButton("Show the stage")
        self.show_button.setObjectName("gate_bar_show")
        lay.addWidget(self.show_button)
        self.stage: str | None = None
        self.hide()
