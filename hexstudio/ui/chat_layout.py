"""The chat's three columns, as LM Studio and Jan lay them out: the conversations on the left, the chat in the middle,
the settings (scrolled) on the right. On a narrow window (1280x720 at 150 %) the side columns fold away behind the
middle column's Chats and Settings toggles, one shown at a time so the chat keeps its room."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QPushButton, QScrollArea, QSplitter, QVBoxLayout, QWidget


def side_column(parts: list[QWidget]) -> QScrollArea:
    """The right column: `parts` one under the other, scrolled."""
    side = QWidget()
    side.setObjectName("chat_settings")
    sl = QVBoxLayout(side)
    sl.setContentsMargins(4, 0, 4, 0)
    for w in parts:
        sl.addWidget(w)
    sl.addStretch(1)
    scroll = QScrollArea()
    scroll.setObjectName("chat_side")
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setWidget(side)
    scroll.setMinimumWidth(220)
    return scroll


class ChatColumns(QSplitter):
    def __init__(
        self,
        convs: QWidget,
        center: QWidget,
        side: QWidget,
        toggles: tuple[QPushButton, QPushButton],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.setObjectName("chat_splitter")
        self.setChildrenCollapsible(False)
        for i, (w, stretch) in enumerate(((convs, 0), (center, 1), (side, 0))):
            self.addWidget(w)
            self.setStretchFactor(i, stretch)
        self.setSizes([180, 560, 300])
        self.convs_panel, self.side_panel = convs, side
        self.convs_toggle, self.side_toggle = toggles
        self.compact = False
        self.convs_toggle.toggled.connect(lambda on: self._show_panel(self.convs_panel, on))
        self.side_toggle.toggled.connect(lambda on: self._show_panel(self.side_panel, on))
        self.set_compact(False)

    def set_compact(self, compact: bool) -> None:
        """Fold the side columns away behind their toggles (compact), or show them all."""
        self.compact = compact
        for toggle, panel in ((self.convs_toggle, self.convs_panel), (self.side_toggle, self.side_panel)):
            toggle.setVisible(compact)
            toggle.blockSignals(True)
            toggle.setChecked(False)
            toggle.blockSignals(False)
            panel.setVisible(not compact)
        self.convs_panel.setMinimumWidth(120 if compact else 150)
        self.side_panel.setMinimumWidth(200 if compact else 220)

    def _show_panel(self, panel: QWidget, on: bool) -> None:
        panel.setVisible(on or not self.compact)
        if on and self.compact:  # one side column at a time on a narrow window, so the chat keeps its room
            other, toggle = (
                (self.side_panel, self.side_toggle)
                if panel is self.convs_panel
                else (self.convs_panel, self.convs_toggle)
            )
            toggle.setChecked(False)
            other.setVisible(False)
