"""Evaluate page: pick the suites (shipped and your own: "Add suite…"), run them on the host float model, the
host quantized simulation and the board, and read every score three ways with the drop at each step. The
Compare box sets this run beside others (suite scores, tok/s, TTFT, init) with a bar plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHeaderView,
    QListWidget,
    QListWidgetItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.eval.compare import compare_runs, scores_not_current
from hexstudio.core.eval.scoring import DROP_STEPS, LEG_TITLES, LEGS, large_drop
from hexstudio.core.eval.suites import DEFAULT_SUITES, SuiteError, add_suite, available, load_found
from hexstudio.core.runs import RunBusy, Workspace
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import refused_html
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.plots import StyledPlot, restyle
from hexstudio.ui.widgets import STATE_COLORS, button, button_row, note

BAR_COLORS = ("#2f81f7", "#8250df", "#2da44e", "#d1242f", "#bf8700")


# the scores table's short column heads (the full titles are their tooltips, and the plot's legend)
COLUMN_TITLES = {"float": "host float", "sim": "host quantized (sim)", "htp": "HTP simulator (x86)"}


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().setVisible(False)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    return t


def _score_plot(name: str, axis: str) -> tuple[StyledPlot, pg.LegendItem]:
    """A plot of scores (0 to 1, `axis` on the left) and its legend, top right."""
    plot = StyledPlot()
    plot.setObjectName(name)
    plot.setMinimumHeight(190)
    plot.setLabel("left", axis)
    plot.setYRange(0, 1)
    legend = plot.addLegend(offset=(-10, 10))
    restyle(plot)  # the legend in the palette's colours too (and again at each palette change)
    return plot, legend


DROP_TIP = (
    "How much worse the score got at this step: accuracy points lost (+0.050 = 5 points), or perplexity gained "
    "(in the suite's own units). Red: more than 5 points, or a perplexity more than 5 % higher."
)


def _fill(t: QTableWidget, rows: list[list[str]], colors: list[list[str | None]] | None = None) -> None:
    t.setRowCount(len(rows))
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            item = QTableWidgetItem(v)
            if colors and colors[i][j]:
                item.setForeground(pg.mkColor(colors[i][j]))
            t.setItem(i, j, item)
    t.setMinimumHeight(min(60 + 28 * len(rows), 360))


class EvaluatePage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("evaluate", controller, parent)
        self.suite_list = QListWidget()
        self.suite_list.setObjectName("suite_list")
        self.suite_list.setMaximumHeight(130)
        self.suite_list.itemChanged.connect(self._suites_changed)
        self.inputs_layout.addWidget(note("Suites (ticked ones run; your own are added to the workspace):"))
        self.inputs_layout.addWidget(self.suite_list)
        self.add_button = button(
            "Add suite…",
            "add_suite",
            "Check a JSONL suite file and add it (docs/evaluate.md has the format)",
            self.add_dialog,
        )
        self.inputs_layout.addLayout(button_row(self.add_button))
        self.add_message = note("")
        self.add_message.setObjectName("add_message")
        self.inputs_layout.addWidget(self.add_message)

        self.source_label = note("")
        self.source_label.setObjectName("eval_source")
        self.results_layout.insertWidget(1, self.source_label)
        self.scores = _table(["suite"])  # a column per leg the evaluation ran (_show_scores)
        self.scores.setObjectName("eval_scores")
        self.results_layout.insertWidget(2, self.scores)
        self.plot, self.plot_legend = _score_plot("eval_plot", "score")  # legend: which colour is which leg
        self.results_layout.insertWidget(3, self.plot)

        self.compare_box = QGroupBox("Compare runs")
        cl = QVBoxLayout(self.compare_box)
        cl.addWidget(note("Tick runs to set beside each other: suite scores, tok/s, TTFT and init."))
        self.run_list = QListWidget()
        self.run_list.setObjectName("compare_runs")
        self.run_list.setMaximumHeight(110)
        self.run_list.itemChanged.connect(lambda _i: self.refresh_compare())
        cl.addWidget(self.run_list)
        self.compare_note = note("")
        cl.addWidget(self.compare_note)
        self.compare_table = _table(["row"])
        self.compare_table.setObjectName("compare_table")
        cl.addWidget(self.compare_table)
        self.compare_plot, self.compare_legend = _score_plot(
            "compare_plot", "board score"
        )  # legend: which run
        cl.addWidget(self.compare_plot)
        self.body.insertWidget(self.body.indexOf(self.results_box) + 1, self.compare_box)

    # -- suites --------------------------------------------------------------------------------
    def _workspace(self) -> Path | None:
        m = self.c.manifest
        return m.run_dir.parent.parent if m is not None else None

    def _load_suites(self) -> None:
        m = self.c.manifest
        chosen = list((m.settings.get("eval_suites") if m is not None else None) or DEFAULT_SUITES)
        # rebuilt on every refresh (a tick saves the setting, which refreshes every page): the keyboard's place in
        # the list and its scroll stay where they were
        row, scroll = self.suite_list.currentRow(), self.suite_list.verticalScrollBar().value()
        self.suite_list.blockSignals(True)
        self.suite_list.clear()
        for name, path in available(self._workspace()).items():
            try:
                s = load_found(path)
                text = f"{s.title} — {_cases(len(s.cases))} ({s.scorer})"
                if s.replaces_shipped:
                    text += " — yours, in place of the shipped suite"
            except SuiteError as exc:
                text = f"{name} — BROKEN: {exc.message}"
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if name in chosen else Qt.CheckState.Unchecked)
            self.suite_list.addItem(item)
        if 0 <= row < self.suite_list.count():
            self.suite_list.setCurrentRow(row)
        self.suite_list.verticalScrollBar().setValue(scroll)
        self.suite_list.blockSignals(False)
        self.suite_list.setEnabled(m is not None and not self.c.busy)
        self.add_button.setEnabled(m is not None and not self.c.busy)

    def _suites_changed(self, _item: QListWidgetItem) -> None:
        names = [
            self.suite_list.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(self.suite_list.count())
            if self.suite_list.item(i).checkState() == Qt.CheckState.Checked
        ]
        if self.c.manifest is None:
            return
        if not names:  # an empty choice would run the default suites: say so, and keep the run's choice
            self._load_suites()
            self.add_message.setText(
                refused_html(
                    "Evaluate needs at least one suite.", "Tick another suite before unticking this one."
                )
            )
            return
        self.add_message.setText("")
        self._set_suites(names)

    def _set_suites(self, names: list[str]) -> bool:
        """Record the run's suites in one order (the shipped suites' own, then the rest as listed), and the shipped
        choice as unset: a suite unticked and ticked again leaves Evaluate as it was, not stale for nothing."""
        rank = {n: i for i, n in enumerate(DEFAULT_SUITES)}
        ordered = sorted(names, key=lambda n: (rank.get(n, len(rank)), names.index(n)))
        value = None if sorted(ordered) == sorted(DEFAULT_SUITES) else ordered
        try:
            self.c.set_setting("eval_suites", value)
        except RunBusy as exc:
            # the list shows the run's choice again
            self._load_suites()
            self.add_message.setText(refused_html(exc.message, exc.hint))
            return False
        return True

    def add_file(self, path: Path) -> bool:
        ws = self._workspace()
        if ws is None:
            return False
        try:
            s = add_suite(path, ws, replace=True)
        except SuiteError as exc:
            # the message quotes the user's file (a suite's name, a line): text, never markup
            self.add_message.setText(refused_html(exc.message, exc.hint))
            return False
        m = self.c.manifest
        names = list((m.settings.get("eval_suites") if m is not None else None) or DEFAULT_SUITES)
        if s.name not in names and not self._set_suites([*names, s.name]):
            return False
        if s.name in names:
            # a suite the run already evaluates, with new cases: Evaluate's inputs changed (stale), as a setting
            # changing makes it; the stage list and the header say so now, not at the next restart
            self.c.settingsChanged.emit()
        # a suite of a shipped suite's name is used in its place (suites.available): said, never silent
        instead = " It is used in place of the shipped suite of that name." if s.replaces_shipped else ""
        self.add_message.setText(f"Added {s.title}: {_cases(len(s.cases))} (scorer {s.scorer}).{instead}")
        self._load_suites()
        return True

    def add_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Add an evaluation suite", str(Path.home()), "Suites (*.jsonl);;All files (*)"
        )
        if path:
            self.add_file(Path(path))

    # -- results -------------------------------------------------------------------------------
    def _earlier_attempt(self, warn: str) -> str:
        """What to say before the scores when they are not the stage's current result: an attempt after them
        failed or stopped (artifacts/evaluate/ still holds the earlier one), or the run changed since."""
        m = self.c.manifest
        if m is None:
            return ""
        why = scores_not_current(m)
        return f"{warn}<b>Not current:</b> {why}</span><br>" if why else ""

    def refresh_results(self) -> None:
        self._load_suites()
        doc = self.artifact_json("evaluate.json")
        self.plot.clear()
        self.plot_legend.clear()
        if doc is None:
            self.source_label.setText("Run the Evaluate stage to score the suites on each leg.")
            _fill(self.scores, [])
        else:
            warn = f"<span style='color:{STATE_COLORS['stale']}'>"
            if doc.get("source") == "host":
                where = (
                    f"{warn}<b>Host only</b>: no board leg; every score was computed on this workstation (the "
                    "float model and its quantization simulation), not on a device.</span> "
                )
            elif doc.get("simulated"):
                where = (
                    f"{warn}<b>SIMULATED board</b>: the board column comes from the simulator board on this CPU "
                    "(real Genie on Qualcomm's HTP simulator, or the onnxruntime twin), not a device.</span> "
                )
            elif doc.get("source") == "device":
                where = "<b>Board: device.</b> "
            else:  # a hand-made or older evaluate.json: never shown as a device's without its word
                where = (
                    f"{warn}<b>Board: not stated</b>: evaluate.json does not say where these scores were "
                    "computed.</span> "
                )
            said = [f"Prompts: {doc['prompt_format']}."] if doc.get("prompt_format") else []
            if doc.get("tool_format"):
                said.append(f"Tool calls read in the {doc['tool_format']} format.")
            self.source_label.setText(self._earlier_attempt(warn) + where + " ".join(said))
            self._show_scores(doc)
        self._load_runs()
        self.refresh_compare()

    def _show_scores(self, doc: dict[str, Any]) -> None:
        """The scores table and plot, with a column and a bar colour for each leg this evaluation ran (a host-only
        one has no board column), under the evaluation's own titles, then the drop at each step it can show."""
        legs = [x for x in doc.get("legs") or LEGS if x in LEGS]
        titles = {**LEG_TITLES, **(doc.get("leg_titles") or {})}
        steps = [(a, b) for a, b in DROP_STEPS if a in legs and b in legs]
        self.scores.setColumnCount(1 + len(legs) + len(steps))
        self.scores.setHorizontalHeaderLabels(
            ["suite", *[str(titles.get(x) if x == "board" else COLUMN_TITLES[x]) for x in legs]]
            + [f"drop {a}→{b}" for a, b in steps]
        )
        for i, leg in enumerate(legs, 1):  # the column's full title where the header is short
            item = self.scores.horizontalHeaderItem(i)
            if item is not None:
                item.setToolTip(str(titles.get(leg) or leg))
        for i in range(1 + len(legs), self.scores.columnCount()):
            item = self.scores.horizontalHeaderItem(i)
            if item is not None:
                item.setToolTip(DROP_TIP)
        rows: list[list[str]] = []
        colors: list[list[str | None]] = []
        for t in doc.get("suites") or []:
            got, drops = t.get("legs") or {}, t.get("drops") or {}
            cut = [drops.get(f"{a}->{b}") for a, b in steps]
            rows.append(
                [
                    t.get("title") or t["suite"],
                    *[str((got.get(x) or {}).get("text", "—")) for x in legs],
                    *["—" if v is None else f"{(v or 0.0):+.3f}" for v in cut],
                ]
            )
            red = [
                large_drop(str(t.get("scorer")), v, (got.get(a) or {}).get("value"))
                for v, (a, _b) in zip(cut, steps, strict=True)
            ]
            # the scores as they are; a large drop (scoring.large_drop) in red
            scores: list[str | None] = [None] * (1 + len(legs))
            colors.append(scores + [STATE_COLORS["failed"] if r else None for r in red])
        _fill(self.scores, rows, colors)
        acc = [t for t in doc.get("suites") or [] if t.get("scorer") not in ("perplexity",)]
        for li, leg in enumerate(legs):
            xs, hs = [], []
            for i, t in enumerate(acc):
                v = (t.get("legs") or {}).get(leg)
                if v and v.get("value") is not None:
                    xs.append(i + (li - (len(legs) - 1) / 2) * 0.8 / len(legs))
                    hs.append(float(v["value"]))
            if xs:
                self.plot.addItem(
                    pg.BarGraphItem(
                        x=xs,
                        height=hs,
                        width=0.75 / len(legs),
                        brush=BAR_COLORS[LEGS.index(leg) % len(BAR_COLORS)],  # a leg keeps its colour
                        name=str(titles.get(leg) or leg),
                    )
                )
        self.plot.getAxis("bottom").setTicks([[(i, t["suite"]) for i, t in enumerate(acc)]])

    def _load_runs(self) -> None:
        ws = self._workspace()
        m = self.c.manifest
        checked = {
            self.run_list.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(self.run_list.count())
            if self.run_list.item(i).checkState() == Qt.CheckState.Checked
        }
        if m is not None and not checked:
            checked = {m.run_id}
        self.run_list.blockSignals(True)
        self.run_list.clear()
        if ws is not None:
            for r in Workspace(ws).list_runs():
                if (
                    not (r.path / "artifacts" / "evaluate" / "evaluate.json").is_file()
                    and not (r.path / "artifacts" / "chat" / "chat.json").is_file()
                ):
                    continue
                item = QListWidgetItem(f"{r.run_id}  ({r.model})")
                item.setData(Qt.ItemDataRole.UserRole, r.run_id)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(Qt.CheckState.Checked if r.run_id in checked else Qt.CheckState.Unchecked)
                self.run_list.addItem(item)
        self.run_list.blockSignals(False)

    def refresh_compare(self) -> None:
        ws = self._workspace()
        ids = [
            self.run_list.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(self.run_list.count())
            if self.run_list.item(i).checkState() == Qt.CheckState.Checked
        ]
        self.compare_plot.clear()
        self.compare_legend.clear()
        if ws is None or not ids:
            _fill(self.compare_table, [])
            return
        c = compare_runs([Workspace(ws).run_dir(i) for i in ids])
        heads = ["row", *[f"{r['run_id']}\n{r['model'].split('/')[-1]} ({r['source']})" for r in c["runs"]]]
        self.compare_table.setColumnCount(len(heads))
        self.compare_table.setHorizontalHeaderLabels(heads)
        _fill(self.compare_table, [[r["label"], *r["texts"]] for r in c["rows"]])
        self.compare_note.setText(
            f"<span style='color:{STATE_COLORS['stale']}'>{c['note']}</span>" if c["note"] else ""
        )
        rows = [
            r for r in c["rows"] if r["kind"] == "suite" and r["leg"] == "board" and not r["lower_is_better"]
        ]
        n = max(1, len(c["runs"]))
        for ri in range(len(c["runs"])):
            xs = [
                gi + (ri - (n - 1) / 2) * 0.8 / n for gi, r in enumerate(rows) if r["values"][ri] is not None
            ]
            hs = [float(r["values"][ri]) for r in rows if r["values"][ri] is not None]
            if xs:
                run = c["runs"][ri]
                self.compare_plot.addItem(
                    pg.BarGraphItem(
                        x=xs,
                        height=hs,
                        width=0.75 / n,
                        brush=BAR_COLORS[ri % len(BAR_COLORS)],
                        name=f"{run['run_id']} ({run.get('source')})",
                    )
                )
        self.compare_plot.getAxis("bottom").setTicks([[(i, r["suite"]) for i, r in enumerate(rows)]])


def _cases(n: int) -> str:
    return f"{n} case" if n == 1 else f"{n} cases"
