"""Dialogs a coroutine can wait for.

`QDialog.exec()`, `QMessageBox.question()` and `QFileDialog.getOpenFileName()` run a nested Qt event loop. Called
from a coroutine, that loop runs inside the task's step, and qasync can then wake no other task ("Cannot enter
into task ... while another task ... is being executed"): a running stage's job readers, its memory sampler and
the pipeline itself never resume, and the stage shows "running" for good. The functions here open the dialog
window-modal (`open()`, no nested loop) and await its `finished` signal instead. In a plain slot (not a
coroutine) the blocking forms stay fine."""

from __future__ import annotations

import asyncio

from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox, QWidget


async def answer(dlg: QDialog) -> int:
    """Show `dlg` window-modal and wait for its result (QDialog.DialogCode, or a QMessageBox button)."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def done(result: int) -> None:
        if not fut.done():
            fut.set_result(result)

    dlg.finished.connect(done)
    dlg.open()
    try:
        return await fut
    finally:
        dlg.finished.disconnect(done)
        if dlg.isVisible():  # the coroutine was cancelled: the dialog goes with it
            dlg.reject()


async def question(parent: QWidget | None, title: str, text: str, *, default_yes: bool = True) -> bool:
    """Yes or No, as QMessageBox.question asks it."""
    yes, no = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No
    box = QMessageBox(QMessageBox.Icon.Question, title, text, yes | no, parent)
    box.setDefaultButton(yes if default_yes else no)
    await answer(box)
    return box.standardButton(box.clickedButton()) == yes


async def open_file(parent: QWidget | None, caption: str, directory: str, filters: str) -> str | None:
    """A file to open, as QFileDialog.getOpenFileName picks it (None: cancelled)."""
    dlg = QFileDialog(parent, caption, directory, filters)
    dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
    dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptOpen)
    if await answer(dlg) != QDialog.DialogCode.Accepted or not dlg.selectedFiles():
        return None
    return dlg.selectedFiles()[0]
