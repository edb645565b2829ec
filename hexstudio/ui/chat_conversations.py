"""The chat's conversations panel: New chat, the run's conversations (newest first), and Copy, Export and Delete
for the open one. It lists what the controller's store holds; what a click means is the page's."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.genie.chat_store import ChatRecord


class ConversationsPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chat_conversations")
        cvl = QVBoxLayout(self)
        cvl.setContentsMargins(0, 0, 4, 0)
        self.new_button = QPushButton("New chat")
        self.new_button.setObjectName("new_chat")
        self.new_button.setToolTip("Start a new conversation (the others stay in the run)")
        cvl.addWidget(self.new_button)
        self.conv_list = QListWidget()
        self.conv_list.setObjectName("conversations")
        self.conv_list.setWordWrap(True)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.setToolTip("This run's conversations, newest first; kept in the run folder (chats/)")
        cvl.addWidget(self.conv_list, 1)
        tools = QHBoxLayout()
        self.copy_button = QPushButton("Copy")
        self.copy_button.setObjectName("copy_conversation")
        self.copy_button.setToolTip("Copy the whole conversation as Markdown")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save the conversation as Markdown or JSON")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("delete_conversation")
        self.delete_button.setToolTip("Delete this conversation from the run")
        for b in (self.copy_button, self.export_button, self.delete_button):
            b.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            tools.addWidget(b)
        cvl.addLayout(tools)
        self.setMinimumWidth(150)

    def fill(self, records: list[ChatRecord]) -> None:
        """List the run's conversations (no selection signals)."""
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for rec in records:
            n = len(rec.turns)
            it = QListWidgetItem(
                f"{rec.title}\n{rec.updated.replace('T', ' ')[5:16]} · {n} {'reply' if n == 1 else 'replies'}"
            )
            it.setData(Qt.ItemDataRole.UserRole, rec.id)
            it.setToolTip(f"{rec.title}\n{rec.origin}, created {rec.created}")
            self.conv_list.addItem(it)
        self.conv_list.blockSignals(False)

    def mark(self, cid: str | None) -> None:
        """Select the open conversation's row (none for a new chat not yet kept)."""
        for i in range(self.conv_list.count()):
            it = self.conv_list.item(i)
            if it.data(Qt.ItemDataRole.UserRole) == cid:
                self.conv_list.setCurrentRow(i)
                return
        self.conv_list.clearSelection()
        self.conv_list.setCurrentRow(-1)

    def set_busy(self, busy: bool) -> None:
        """While a reply streams, the conversation cannot change."""
        self.conv_list.setEnabled(not busy)
        self.new_button.setEnabled(not busy)
