"""The studio's main window (minimal: the stage list; the full wizard comes with the GUI issue)."""

from __future__ import annotations

from PySide6.QtWidgets import QListWidget, QMainWindow

from app.core.stages import STAGES


class MainWindow(QMainWindow):
    def __init__(self) -> None:
        super().__init__()
        self.setWindowTitle("HexStudio")
        self.stage_list = QListWidget()
        for s in STAGES:
            self.stage_list.addItem(s.title)
        self.setCentralWidget(self.stage_list)
        self.resize(1100, 720)
