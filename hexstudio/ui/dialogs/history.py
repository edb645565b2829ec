"""A run's history: each stage's attempts and outcome, and run-level events, oldest first."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from hexstudio.core.stages import STAGES
from hexstudio.core.units import fmt_duration
from hexstudio.ui.controller import RunController


class HistoryDialog(QDialog):
    """What happened to the open run: each stage's attempts and outcome, and run-level events
    (resumes, gate overrides, setting changes), oldest first."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        m = controller.manifest
        self.setWindowTitle(f"History of {m.run_id}" if m else "History")
        self.resize(900, 460)
        lay = QVBoxLayout(self)
        self.table = QTableWidget(0, 3)
        self.table.setObjectName("history_table")
        self.table.setHorizontalHeaderLabels(["when", "what", "details"])
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        lay.addWidget(self.table)
        rows: list[tuple[str, str, str]] = []
        if m is not None:
            for s in STAGES:
                st = m.stage(s.name).data
                if st.get("started"):
                    out = st.get("outcome") or {}
                    # the word every face says (a gate that failed, a stale stage), not run.json's raw state
                    word = controller.status(s.name).word
                    took = st.get("duration_s")
                    after = f" after {fmt_duration(float(took))}" if isinstance(took, int | float) else ""
                    detail = f"{word}{after} (attempt {st.get('attempts') or 1})"
                    if out.get("message") and out.get("kind") != "ok":
                        detail += f": {out.get('message')}"
                    rows.append((str(st.get("started")), f"stage {s.name}", detail))
            for ev in m.data.get("events", []):
                rows.append((str(ev.get("t")), str(ev.get("kind")), str(ev.get("message"))))
        rows.sort()
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for col, text in enumerate(row):
                self.table.setItem(r, col, QTableWidgetItem(text))
        self.table.resizeColumnsToContents()
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        bb.rejected.connect(self.reject)
        lay.addWidget(bb)
