"""The runs dashboard: every run of the workspace in a sortable table; open, compare, delete."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QMessageBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.jobs import human_bytes
from hexstudio.core.manifest import ManifestError, RunManifest
from hexstudio.core.runs import RunSummary
from hexstudio.core.status import KINDS, run_status, stage_statuses
from hexstudio.core.units import fmt_rate
from hexstudio.shared.errors import ActionableError
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import show_error
from hexstudio.ui.widgets import state_icon


def run_row(s: RunSummary) -> dict[str, Any]:
    """One row of the runs dashboard: what the run is and how it went, from run.json alone (fast for
    hundreds of runs): status, the Validate verdict, the chat KPIs, the peak RSS of the heavy stages."""
    try:
        data = json.loads((s.path / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    stages = data.get("stages") or {}
    try:  # the one status model (hexstudio.core.status): the same words as the stage list, the report and the CLI
        statuses = stage_statuses(RunManifest.load(s.path))
        rs = run_status(statuses)
        # a run completed past an overridden gate carries the override's mark, never a plain tick
        status, status_key = rs.word, ("overridden" if rs.key == "complete" and rs.overridden else rs.key)
        verdict_status = next(x for x in statuses if x.stage == "validate")
        verdict = "" if verdict_status.key in ("pending", "running") else verdict_status.word
    except (ManifestError, OSError, KeyError, ValueError):
        status, status_key, verdict = "unreadable run.json", "failed", ""

    def metric(stage: str, name: str) -> float | None:
        v = ((stages.get(stage) or {}).get("metrics") or {}).get(name)
        v = v.get("value") if isinstance(v, dict) else v
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    peaks = [
        float(p)
        for st in stages.values()
        if isinstance(st, dict)
        for p in [st.get("peak_rss_bytes")]
        if isinstance(p, (int, float))
    ]
    chat_source = ""
    cj = s.path / "artifacts" / "chat" / "chat.json"
    if cj.is_file():
        try:
            chat_source = str(json.loads(cj.read_text(encoding="utf-8")).get("source") or "")
        except (OSError, ValueError):
            chat_source = ""
    return {
        "run": s.run_id,
        "name": data.get("name") or s.run_id,
        "model": s.model,
        "created": s.created,
        "status": status,
        "status_key": status_key,
        "verdict": verdict,
        "tok_s": metric("chat", "gen_tok_s"),
        "ttft_ms": metric("chat", "ttft_ms"),
        "peak_rss": max(peaks) if peaks else None,
        "board": s.board,
        "source": chat_source,
    }


class SortItem(QTableWidgetItem):
    """Sorts by the value it was made from (numbers as numbers, blanks last), shows its text."""

    def __init__(self, text: str, key: Any = None) -> None:
        super().__init__(text)
        self.key = key if key is not None else text

    def __lt__(self, other: QTableWidgetItem) -> bool:
        k = other.key if isinstance(other, SortItem) else other.text()
        a, b = self.key, k
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        return str(a) < str(b)


RUN_COLUMNS = ("name", "model", "created", "status", "verdict", "gen tok/s", "TTFT ms", "peak RSS", "board")


class RunsDialog(QDialog):
    """The runs dashboard: every run of the workspace in a sortable table; open one, compare several side
    by side (the report's comparison), delete."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.c = controller
        self.setWindowTitle("Runs")
        self.setObjectName("runs_dialog")
        self.resize(1100, 520)
        lay = QVBoxLayout(self)
        where = QLabel(
            f"Runs in {controller.workspace.runs_dir} — click a column to sort; select two or more "
            "to compare them."
        )
        where.setWordWrap(True)
        lay.addWidget(where)
        self.table = QTableWidget(0, len(RUN_COLUMNS))
        self.table.setObjectName("runs_table")
        self.table.setHorizontalHeaderLabels(list(RUN_COLUMNS))
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(True)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.ExtendedSelection)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        # as Open: not while a stage works (a run reopened then would no longer be the one the pipeline updates)
        self.table.doubleClicked.connect(self._open_on_double_click)
        lay.addWidget(self.table)
        bb = QDialogButtonBox()
        self.open_button = bb.addButton("Open", QDialogButtonBox.ButtonRole.AcceptRole)
        self.compare_button = bb.addButton("Compare…", QDialogButtonBox.ButtonRole.ActionRole)
        self.compare_button.setObjectName("compare_button")
        self.compare_button.setToolTip(
            "Side by side: settings, metrics and KPIs of the selected runs (the first one is the baseline)"
        )
        self.delete_button = bb.addButton("Delete…", QDialogButtonBox.ButtonRole.DestructiveRole)
        bb.addButton(QDialogButtonBox.StandardButton.Close)
        bb.accepted.connect(self.accept)
        bb.rejected.connect(self.reject)
        self.delete_button.clicked.connect(self.delete_selected)
        self.compare_button.clicked.connect(self.compare_selected)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        # a stage that ends (or starts) while the dialog is open: Open follows it, not the last selection's moment
        controller.busyChanged.connect(self._busy_changed)
        lay.addWidget(bb)
        self.rows: list[dict[str, Any]] = []
        self.reload()

    def reload(self) -> None:
        self.rows = [run_row(s) for s in self.c.list_runs()]
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            tag = " (sim)" if row["source"] == "simulated" else ""
            cells = [
                SortItem(row["name"]),
                SortItem(row["model"]),
                SortItem(str(row["created"]).replace("T", " ")[:19], row["created"]),
                SortItem(row["status"]),
                SortItem(row["verdict"]),
                SortItem(
                    "" if row["tok_s"] is None else f"{fmt_rate(row['tok_s'])}{tag}", row["tok_s"] or -1.0
                ),
                SortItem(
                    "" if row["ttft_ms"] is None else f"{row['ttft_ms']:.0f}{tag}",
                    row["ttft_ms"] if row["ttft_ms"] is not None else float("inf"),
                ),
                SortItem(
                    "" if row["peak_rss"] is None else human_bytes(row["peak_rss"]), row["peak_rss"] or -1.0
                ),
                SortItem(row["board"]),
            ]
            cells[0].setData(Qt.ItemDataRole.UserRole, row["run"])
            cells[0].setToolTip(f"{row['run']}\n{row['model']}")
            run_kind = {"complete": "passed", "in_progress": "pending"}.get(
                row["status_key"], row["status_key"]
            )
            cells[3].setIcon(state_icon(run_kind))
            if run_kind in KINDS:
                cells[3].setForeground(QColor(KINDS[run_kind].color))
            verdict_kind = next((k for k in KINDS.values() if k.word == row["verdict"]), None)
            if verdict_kind is not None:
                cells[4].setIcon(state_icon(verdict_kind.key))
                cells[4].setForeground(QColor(verdict_kind.color))
            for col, item in enumerate(cells):
                self.table.setItem(r, col, item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(2, Qt.SortOrder.DescendingOrder)
        self.table.resizeColumnsToContents()
        for col in (0, 1):
            self.table.setColumnWidth(col, min(self.table.columnWidth(col), 300))
        if self.rows:
            self.table.selectRow(0)
        self._selection_changed()

    def _open_on_double_click(self, _index: Any) -> None:
        if self.open_button.isEnabled():
            self.accept()

    def selected_runs(self) -> list[str]:
        out = []
        for idx in sorted(self.table.selectionModel().selectedRows(), key=lambda i: i.row()):
            item = self.table.item(idx.row(), 0)
            if item is not None:
                out.append(str(item.data(Qt.ItemDataRole.UserRole)))
        return out

    def selected(self) -> str | None:
        runs = self.selected_runs()
        return runs[0] if runs else None

    def _busy_changed(self, _busy: bool) -> None:
        self._selection_changed()

    def _selection_changed(self) -> None:
        n = len(self.selected_runs())
        # while a stage runs the studio stays on its run (RunController._not_while_working)
        self.open_button.setEnabled(n == 1 and not self.c.busy)
        self.open_button.setToolTip(
            "A stage is running: wait for it or cancel it first." if self.c.busy else ""
        )
        self.compare_button.setEnabled(n >= 2)
        self.delete_button.setEnabled(n == 1)

    def comparison_reports(self, runs: list[str]) -> list[dict[str, Any]]:
        from hexstudio.core.reports.collect import build_report

        return [build_report(self.c.workspace.run_dir(r), redact_hosts=True) for r in runs]

    def comparison_html(self, runs: list[str]) -> str:
        from hexstudio.core.reports.compare import compare_html, compare_reports

        return compare_html(compare_reports(self.comparison_reports(runs)))

    def compare_selected(self) -> asyncio.Future[None] | None:
        """The runs' reports built in a thread (each reads its run's logs: megabytes for a long quantize, and the
        keyring for what to scrub), then set side by side; the button waits meanwhile."""
        runs = self.selected_runs()
        if len(runs) < 2:
            return None
        self.compare_button.setEnabled(False)
        self.compare_button.setText("Comparing…")
        self._comparing = asyncio.ensure_future(self._compare(runs))
        return self._comparing

    async def _compare(self, runs: list[str]) -> None:
        from hexstudio.ui.compare import CompareDialog

        try:
            reports = await asyncio.to_thread(self.comparison_reports, runs)
            d = CompareDialog(reports, self)
        except Exception as exc:
            show_error(self, "Compare runs", f"The runs could not be compared: {exc}", exc=exc)
            return
        finally:
            self.compare_button.setText("Compare…")
            self._selection_changed()
        self.compare_dialog = d
        d.show()

    def delete_selected(self) -> None:
        rid = self.selected()
        if rid is None:
            return
        if (
            QMessageBox.question(
                self, "Delete run", f"Delete run {rid} and all its files? This cannot be undone."
            )
            == QMessageBox.StandardButton.Yes
        ):
            try:
                self.c.delete_run(rid)
            except ActionableError as exc:
                # the running run, one a terminal runs (RunBusy), one gone meanwhile (RunNotFound)
                show_error(self, "Delete run", exc.message, exc.hint)
            except OSError as exc:
                show_error(self, "Delete run", f"Run {rid} could not be deleted: {exc}")
            self.reload()
