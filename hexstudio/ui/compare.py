"""Compare runs, as DL Workbench does: a chosen baseline, a bar chart of any measured figure (pyqtgraph), the
table of every like-for-like row with differences marked only beyond the noise (hexstudio.core.reports.noise), and
export to HTML, CSV or JSON."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.reports.compare import compare_html, compare_reports, write_compare
from hexstudio.core.reports.noise import QUALITY_TOLERANCE, TIMING_TOLERANCE, chart_rows
from hexstudio.core.status import KINDS
from hexstudio.ui.plots import StyledPlot
from hexstudio.ui.widgets import button, float_spin_box, paper

JUDGEMENT_COLORS = {
    "better": KINDS["passed"].color,
    "worse": KINDS["failed"].color,
    "changed": "#bf8700",
    "same": "#8a8f98",
    "baseline": "#2f81f7",
}


def _add_labelled(row: QHBoxLayout, text: str, widget: QWidget, stretch: int = 0) -> None:
    """`widget` on `row` after its label `text` (whose & letter moves the focus to it)."""
    label = QLabel(text)
    label.setBuddy(widget)
    row.addWidget(label)
    row.addWidget(widget, stretch)


def _tolerance(name: str, fraction: float, tip: str) -> QDoubleSpinBox:
    """A tolerance in percent, from 0 to 100, set to `fraction`."""
    box = float_spin_box(name, 0.0, 100.0, 1, tip)
    box.setSuffix(" %")
    box.setValue(fraction * 100)
    return box


class CompareDialog(QDialog):
    def __init__(self, reports: list[dict[str, Any]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.reports = reports
        ids = [r["run"]["run_id"] for r in reports]
        self.setObjectName("compare_dialog")
        self.setWindowTitle("Compare: " + " vs ".join(ids))
        self.resize(1100, 720)
        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        self.baseline_combo = QComboBox()
        self.baseline_combo.setObjectName("compare_baseline")
        for rid in ids:
            self.baseline_combo.addItem(rid, rid)
        self.baseline_combo.setToolTip("The run the others are compared against")
        _add_labelled(top, "&Baseline", self.baseline_combo, 1)
        self.timing_tol = _tolerance(
            "compare_timing_tolerance",
            TIMING_TOLERANCE,
            "Timings and memory: a difference within this is the same (one measurement on a "
            "shared machine varies this much); where the runs measured their spread "
            "(hexstudio bench), twice the spread counts if it is larger",
        )
        _add_labelled(top, "&Timing tolerance", self.timing_tol)
        self.quality_tol = _tolerance(
            "compare_quality_tolerance",
            QUALITY_TOLERANCE,
            "Validation and evaluation figures: a difference within this is the same",
        )
        _add_labelled(top, "&Quality tolerance", self.quality_tol)
        lay.addLayout(top)

        chart_head = QHBoxLayout()
        self.metric_combo = QComboBox()
        self.metric_combo.setObjectName("compare_metric")
        self.metric_combo.setToolTip("The figure the chart shows, one bar per run")
        _add_labelled(chart_head, "&Chart", self.metric_combo, 1)
        self.export_buttons: dict[str, QPushButton] = {}
        for fmt, text in (("html", "Export HTML…"), ("csv", "Export CSV…"), ("json", "Export JSON…")):
            b = button(text, f"compare_export_{fmt}", on_click=lambda _c=False, f=fmt: self.export_dialog(f))
            chart_head.addWidget(b)
            self.export_buttons[fmt] = b
        lay.addLayout(chart_head)
        self.message = QLabel("")
        self.message.setObjectName("compare_message")
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.message)

        split = QSplitter(Qt.Orientation.Vertical)
        self.plot = StyledPlot()
        self.plot.setObjectName("compare_chart")
        self.plot.setMinimumHeight(160)
        self.legend = self.plot.addLegend(
            offset=(-10, 10), brush=pg.mkBrush(255, 255, 255, 200), labelTextColor="#1f2328"
        )
        split.addWidget(self.plot)
        self.view = QTextBrowser()
        self.view.setObjectName("compare_view")
        self.view.setOpenExternalLinks(True)
        paper(self.view)
        split.addWidget(self.view)
        split.setSizes([260, 420])
        lay.addWidget(split, 1)
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        bb.rejected.connect(self.reject)
        lay.addWidget(bb)

        self.c: dict[str, Any] = {}
        self.baseline_combo.currentIndexChanged.connect(lambda _i: self.recompute())
        self.timing_tol.editingFinished.connect(self.recompute)
        self.quality_tol.editingFinished.connect(self.recompute)
        self.metric_combo.currentIndexChanged.connect(lambda _i: self.draw_chart())
        self.recompute()

    # -- the comparison ---------------------------------------------------------------------------------------
    def recompute(self) -> None:
        self.c = compare_reports(
            self.reports,
            str(self.baseline_combo.currentData()),
            self.timing_tol.value() / 100,
            self.quality_tol.value() / 100,
        )
        # the table without the report's SVG chart (a QTextBrowser cannot draw SVG: it printed it as text);
        # the chart above draws the same figures
        self.view.setHtml(compare_html({**self.c, "eval_plot": ""}))
        self.message.setText(
            f"Baseline <b>{html.escape(self.c['baseline'])}</b>. {html.escape(self.c['noise_rule'])}"
        )
        current = self.metric_combo.currentText()
        self.metric_combo.blockSignals(True)
        self.metric_combo.clear()
        for i, row in enumerate(chart_rows(self.c)):
            unit = f" ({row['unit']})" if row["unit"] else ""
            self.metric_combo.addItem(f"{row['label']}{unit}", i)
        k = self.metric_combo.findText(current)
        self.metric_combo.setCurrentIndex(k if k >= 0 else 0)
        self.metric_combo.blockSignals(False)
        self.draw_chart()

    def chart_row(self) -> dict[str, Any] | None:
        rows = chart_rows(self.c)
        i = self.metric_combo.currentData()
        return rows[int(i)] if isinstance(i, int) and 0 <= i < len(rows) else None

    def draw_chart(self) -> None:
        self.plot.clear()
        self.legend.clear()
        row = self.chart_row()
        if row is None:
            self.plot.setTitle("No measured figure is shared by these runs")
            return
        values = [float(v) for v in row["values"]]
        scale, unit = 1.0, row["unit"]
        if unit == "bytes":
            scale, unit = 1024**3, "GiB"
        ys = [v / scale for v in values]
        kinds = ["baseline", *row["judgement"]]
        for kind in dict.fromkeys(kinds):
            xs = [i for i, k in enumerate(kinds) if k == kind]
            bars = pg.BarGraphItem(
                x=xs,
                height=[ys[i] for i in xs],
                width=0.6,
                brush=QColor(JUDGEMENT_COLORS.get(kind, "#8a8f98")),
                pen=pg.mkPen(None),
                name=kind if kind != "same" else "same (within the noise)",
            )
            self.plot.addItem(bars)  # named: the legend lists it
        noise = [n for n in row.get("noise") or [] if n]
        if noise:  # the band a difference must leave to count: baseline ± the noise
            band = max(n["abs"] for n in noise) / scale
            region = pg.LinearRegionItem(
                values=(ys[0] - band, ys[0] + band),
                orientation="horizontal",
                movable=False,
                brush=pg.mkBrush(47, 129, 247, 40),
                pen=pg.mkPen(None),
            )
            self.plot.addItem(region)
        ids = [r["run_id"] for r in self.c["runs"]]
        # each bar says where its figure comes from (simulated, device, ...), as the table's badges do
        sources = row.get("sources") or [""] * len(ids)
        ticks = [
            (
                i,
                (rid if len(rid) <= 26 else "…" + rid[-25:])
                + (" (baseline)" if i == 0 else "")
                + (f"\n{sources[i]}" if sources[i] else ""),
            )
            for i, rid in enumerate(ids)
        ]
        self.plot.getAxis("bottom").setTicks([ticks])
        self.plot.setLabel("left", unit or "")
        self.plot.setTitle(html.escape(row["label"]))
        self.plot.setXRange(-0.6, len(ids) - 0.4, padding=0)
        top = max([*ys, 0.0])
        self.plot.setYRange(min(0.0, min(ys)), top * 1.15 if top > 0 else 1.0, padding=0)

    # -- export -------------------------------------------------------------------------------------------------
    def export(self, fmt: str, path: Path) -> Path:
        out = write_compare(self.c, fmt, path)
        self.message.setText(
            f"Exported the comparison as {fmt.upper()}: <code>{html.escape(str(out))}</code>"
        )
        return out

    def export_dialog(self, fmt: str) -> None:
        filters = {"html": "HTML (*.html)", "csv": "CSV (*.csv)", "json": "JSON (*.json)"}
        path, _ = QFileDialog.getSaveFileName(
            self, f"Export the comparison as {fmt.upper()}", f"comparison.{fmt}", filters[fmt]
        )
        if path:
            try:
                self.export(fmt, Path(path))
            except Exception as exc:  # a full disk, a read-only folder: say so here
                self.message.setText(
                    f"<span style='color:{KINDS['failed'].color}'>The comparison could not be "
                    f"written: {html.escape(str(exc))}</span>"
                )
