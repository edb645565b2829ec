"""The chat's conversations panel: New chat, the run's conversations (newest first), and Copy, Export and Delete
for the open one. It lists what the controller's store holds; what a click means is the page's. Also the question
asked before a settings change starts a new chat."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.genie.chat_store import ChatRecord
from hexstudio.ui.widgets import button


class ConversationsPanel(QWidget):
    picked = Signal(str)  # a conversation of the list was clicked or activated: its id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chat_conversations")
        cvl = QVBoxLayout(self)
        cvl.setContentsMargins(0, 0, 4, 0)
        self.new_button = button(
            "New chat", "new_chat", "Start a new conversation (the others stay in the run)"
        )
        cvl.addWidget(self.new_button)
        self.conv_list = QListWidget()
        self.conv_list.setObjectName("conversations")
        self.conv_list.setWordWrap(True)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.setToolTip("This run's conversations, newest first; kept in the run folder (chats/)")
        cvl.addWidget(self.conv_list, 1)
        for sig in (self.conv_list.itemClicked, self.conv_list.itemActivated):
            sig.connect(lambda it: self.picked.emit(str(it.data(Qt.ItemDataRole.UserRole))))
        tools = QHBoxLayout()
        self.copy_button = button("Copy", "copy_conversation", "Copy the whole conversation as Markdown")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save the conversation as Markdown or JSON")
        self.delete_button = button("Delete", "delete_conversation", "Delete this conversation from the run")
        for b in (self.copy_button, self.export_button, self.delete_button):
            b.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            tools.addWidget(b)
        cvl.addLayout(tools)
        self.setMinimumWidth(150)

    def tab_order(self) -> list[QWidget]:
        return [self.new_button, self.conv_list, self.copy_button, self.export_button, self.delete_button]

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


def ask_new_chat(parent: QWidget) -> bool:
    """The template or system prompt changed in a chat with messages: start a new chat with them? (No: keep this
    chat and its template and system prompt.)"""
    box = QMessageBox(
        QMessageBox.Icon.Question,
        "Start a new chat?",
        "The template or system prompt changed. The model reads the conversation with "
        "them, so a new chat starts with the new ones.\n\nThis conversation stays in the "
        "list.",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        parent,
    )
    box.setObjectName("new_chat_question")
    box.button(QMessageBox.StandardButton.Yes).setText("New chat")
    box.button(QMessageBox.StandardButton.No).setText("Keep this chat")
    box.setDefaultButton(QMessageBox.StandardButton.No)
    return bool(box.exec() == QMessageBox.StandardButton.Yes)


def ask_delete(parent: QWidget, title: str) -> bool:
    return bool(
        QMessageBox.question(parent, "Delete conversation", f"Delete “{title}” from this run?")
        == QMessageBox.StandardButton.Yes
    )
