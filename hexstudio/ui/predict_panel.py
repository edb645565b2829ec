"""The Preflight page's speed panel (issue 28): the run's model on its board, PREDICTED by QNN's HTP simulator
before any quantization or compile. It calls the predict service (hexstudio.core.services.predict.predict_for_run,
as `hexstudio predict --run` does): the predictor worker compiles synthetic layers for seconds to minutes in its own
process while the window stays responsive, and the prediction is kept with the run, where the report and Compare
show it beside the measured figures. Every figure here says predicted."""

from __future__ import annotations

import asyncio
import html
import logging
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QGroupBox, QTableWidgetItem, QVBoxLayout, QWidget

from hexstudio.core.services.predict import predict_for_run, prediction_out_of_date, run_prediction_doc
from hexstudio.shared.errors import ActionableError
from hexstudio.shared.predict import LABEL
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import refused_html
from hexstudio.ui.widgets import KeyValueTable, button, button_row, failed, note

log = logging.getLogger("hexstudio.predict")
PREDICT_TIMEOUT_S = 3600.0  # an 8B's 2-layer graphs compile for minutes each on a small machine


class PredictPanel(QGroupBox):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(f"Speed on the board — {LABEL}", parent)
        self.setObjectName("predict_panel")
        self.c = controller
        lay = QVBoxLayout(self)
        lay.addWidget(
            note(
                "Before quantizing or compiling: synthetic layers at this model's true shapes (random "
                "weights, int4 LPBQ / 16-bit activations / 8-bit KV) are compiled for the board's "
                "Hexagon arch and run on Qualcomm's HTP simulator. A prediction, not a measurement: "
                "the report shows it beside what the board measures."
            )
        )
        self.button = button(
            "Predict speed",
            "predict_button",
            "Run `hexstudio predict` for this run's model, board and settings",
            self._start,
        )
        lay.addLayout(button_row(self.button))
        self.message = note("")
        self.message.setObjectName("predict_message")
        lay.addWidget(self.message)
        self.table = KeyValueTable(["figure (predicted)", "value", "lower", "upper"])
        self.table.setObjectName("predict_table")
        self.table.setMinimumHeight(150)
        lay.addWidget(self.table)
        self._task: asyncio.Future[dict[str, Any] | None] | None = None
        self._running_for: Path | None = None  # the run a prediction under way is for
        self.refresh()

    @property
    def predicting(self) -> bool:
        return self._running_for is not None

    def refresh(self) -> None:
        """Show the prediction kept with the current run, if any. While a prediction runs the panel stays on it
        (its progress, the button off): it belongs to the run it was started for, and is shown when it ends."""
        if self.predicting:
            return
        m = self.c.manifest
        doc = run_prediction_doc(m.run_dir) if m is not None else None
        self.button.setEnabled(m is not None)
        if doc:
            self.show_prediction(doc)
            assert m is not None
            why = prediction_out_of_date(m.run_dir, doc)
            if why:
                # the report marks it so too, and leaves it out of its comparisons
                self.message.setText(failed(f"Out of date: {why}.") + "<br>" + self.message.text())
        else:
            self.table.setRowCount(0)
            self.message.setText(
                "No prediction for this run yet." if m is not None else "Open or start a run first."
            )

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self.predict())

    async def predict(self) -> dict[str, Any] | None:
        if self.c.manifest is None:
            return None
        self.button.setEnabled(False)
        self.message.setText("Compiling synthetic layers for the board's Hexagon arch and simulating them…")
        run_dir = self.c.manifest.run_dir

        def on_event(ev: dict[str, Any]) -> None:
            if ev.get("type") == "progress" and ev.get("message"):
                self.message.setText(html.escape(str(ev["message"])))

        self._running_for = run_dir
        failure: tuple[str, str | None] | None = None
        try:
            doc = await asyncio.wait_for(
                predict_for_run(run_dir, self.c.workspace.root, on_event=on_event), PREDICT_TIMEOUT_S
            )
        except (ActionableError, TimeoutError) as exc:
            why = str(exc) if isinstance(exc, ActionableError) else f"no result in {PREDICT_TIMEOUT_S:.0f} s"
            failure = (f"The prediction failed: {why}", getattr(exc, "hint", None))
        except Exception as exc:  # a fault of HexStudio's own: said, and the panel is usable again
            log.exception("the speed prediction failed unexpectedly")
            failure = (
                f"The prediction failed unexpectedly: {type(exc).__name__}: {exc}",
                "This is a fault in HexStudio: the studio's log (Help ▸ Open the log folder) has its trace.",
            )
        finally:
            self._running_for = None
            self.refresh()  # the open run's panel, the button back on
        if failure is not None:
            self.message.setText(refused_html(*failure))
            return None
        m = self.c.manifest
        if m is None or m.run_dir != run_dir:
            # another run was opened meanwhile: the prediction is kept with its own run, and this one's shown
            self.message.setText(
                html.escape(f"The prediction for run {run_dir.name} is done and kept with that run.")
                + "<br>"
                + self.message.text()
            )
        return doc  # the panel shows it: refresh read it back from the run, with "Out of date" where it is

    def show_prediction(self, doc: dict[str, Any]) -> None:
        t = doc.get("target") or {}
        rows: list[tuple[str, dict[str, float], str]] = []
        for n, b in sorted(doc["ttft_ms"].items(), key=lambda kv: int(kv[0])):
            rows.append((f"predicted TTFT, {int(n)}-token prompt", b, "ms"))
        for k, b in doc["decode_tok_s"].items():
            rows.append((f"predicted decode, {k.replace('_', ' ')}", b, "tok/s"))
        self.table.setRowCount(len(rows))
        for r, (label, b, unit) in enumerate(rows):
            for col, text in enumerate(
                (label, f"{b['value']:.1f} {unit}", f"{b['lower']:.1f}", f"{b['upper']:.1f}")
            ):
                self.table.setItem(r, col, QTableWidgetItem(text))
        self.table.resizeRowsToContents()
        notes = "".join(f"<br>· {html.escape(str(n))}" for n in doc.get("notes") or [])
        self.message.setText(
            f"<b>{html.escape(str(doc.get('label')))}</b> for {html.escape(str(t.get('name')))} "
            f"(soc_model {t.get('soc_model')}, {html.escape(str(t.get('dsp_arch')))}), context "
            f"{doc.get('context_length')}, AR-{doc.get('ar_n')}, {doc.get('parts')} parts, QNN "
            f"{html.escape(str(doc.get('qnn_version')))}.{notes}"
        )
