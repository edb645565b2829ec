"""Model page: pick the built-in model, a Hugging Face id or a local folder; inspect it; start a run."""

from __future__ import annotations

import asyncio
import html
from pathlib import Path
from typing import Any

from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QWidget,
)

from hexstudio.core.jobs import human_bytes
from hexstudio.core.paths import BUILTIN_MODEL_ID
from hexstudio.core.runs import WorkspaceError
from hexstudio.core.services import model as model_service
from hexstudio.shared.errors import ActionableError
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import refused_html
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.widgets import STATE_COLORS, KeyValueTable, button, button_row, note, spin_box


def inspect_rows(info: dict[str, Any]) -> list[list[str]]:
    rows = [
        ["architecture", str(info.get("architecture"))],
        ["supported", ("yes — " if info.get("supported") else "NO — ") + str(info.get("reason", ""))],
    ]
    if info.get("supported"):
        rs = info.get("rope_scaling")
        rows += [
            ["parameters", f"{int(info.get('num_parameters') or 0):,}"],
            [
                "layers / heads / KV heads",
                f"{info.get('num_layers')} / {info.get('num_heads')} / {info.get('num_kv_heads')}",
            ],
            ["vocabulary", f"{int(info.get('vocab_size') or 0):,}"],
            [
                "rope",
                f"theta {info.get('rope_theta'):g}"
                + (f", {rs.get('rope_type')} x{rs.get('factor')}" if rs else ""),
            ],
        ]
        if "context_length" in info:
            rows.append(
                [
                    "context length / AR-N / parts",
                    f"{info['context_length']} / {info['ar_n']} / {info['parts']}",
                ]
            )
        e = info.get("estimates") or {}
        for key, label in (
            ("hf_download_bytes", "download"),
            ("quantize_peak_rss_bytes", "quantize peak RAM"),
            ("validate_peak_rss_bytes", "validate peak RAM"),
            ("disk_bytes", "workspace disk"),
            ("bundle_bytes", "bundle size"),
        ):
            if key in e:
                rows.append([label, human_bytes(e[key])])
        ref = e.get("reference")
        if isinstance(ref, dict) and ref.get("quantize_peak_rss_bytes"):
            rows.append(
                [
                    "reference recipe",
                    f"{ref.get('model')}: quantize peak {human_bytes(ref['quantize_peak_rss_bytes'])}",
                ]
            )
    return rows


class ModelPage(StagePage):
    # an inspected model's figures on show (inspect), and the run open then with its Model stage's output: a
    # refresh keeps them until either changes
    _inspection_shown = False
    _inspected_on: tuple[Path, object] | None = None

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("model", controller, parent)
        self.source_group = QButtonGroup(self)
        self.builtin_radio = QRadioButton(
            "Built-in model (tiny-llama, 3.6 M parameters, ships with HexStudio)"
        )
        self.hf_radio = QRadioButton("Hugging Face model id")
        self.folder_radio = QRadioButton("Local Hugging Face folder")
        for i, r in enumerate((self.builtin_radio, self.hf_radio, self.folder_radio)):
            self.source_group.addButton(r, i)
        self.builtin_radio.setChecked(True)
        self.hf_edit = QLineEdit()
        self.hf_edit.setObjectName("hf_id")
        self.hf_edit.setPlaceholderText("e.g. nvidia/Llama-3.1-Nemotron-Nano-8B-v1")
        self.folder_edit = QLineEdit()
        self.folder_edit.setObjectName("model_folder")
        self.folder_edit.setPlaceholderText("a folder holding config.json (weights are optional for Inspect)")
        browse = self.browse_button = QPushButton("Browse…")
        browse.clicked.connect(self.browse)
        self.inputs_layout.insertWidget(0, self.builtin_radio)
        hf_row = QHBoxLayout()
        hf_row.addWidget(self.hf_radio)
        hf_row.addWidget(self.hf_edit, 1)
        self.inputs_layout.insertLayout(1, hf_row)
        f_row = QHBoxLayout()
        f_row.addWidget(self.folder_radio)
        f_row.addWidget(self.folder_edit, 1)
        f_row.addWidget(browse)
        self.inputs_layout.insertLayout(2, f_row)
        self.hf_edit.textEdited.connect(lambda _t: self.hf_radio.setChecked(True))
        self.folder_edit.textEdited.connect(lambda _t: self.folder_radio.setChecked(True))

        opts = QFormLayout()
        self.board_combo = QComboBox()
        self.board_combo.setObjectName("board_combo")
        self.context_spin = spin_box("context_length", 0, 131072, step=512)
        self.context_spin.setSpecialValueText("auto (built-in 512, others 4096)")
        self.calib_spin = spin_box("calibration_samples", 1, 4096)
        self.calib_spin.setValue(int(controller.settings.run_defaults().get("calibration_samples", 8)))
        opts.addRow("Board", self.board_combo)
        opts.addRow("Context length", self.context_spin)
        opts.addRow("Calibration samples", self.calib_spin)
        self.inputs_layout.addLayout(opts)

        self.inspect_button = button(
            "Inspect",
            "inspect_button",
            "Read config.json only: architecture, support and memory/disk estimates",
            lambda: asyncio.ensure_future(self.inspect()),
        )
        self.new_run_button = button("New run with this model", "new_run_button", on_click=self.new_run)
        self.inputs_layout.addLayout(button_row(self.inspect_button, self.new_run_button))
        self.inspect_message = note("")
        self.inputs_layout.addWidget(self.inspect_message)
        # busy while config.json is read (offline, the Hub client retries for many seconds before its error)
        self.inspect_busy = QProgressBar()
        self.inspect_busy.setObjectName("inspect_busy")
        self.inspect_busy.setRange(0, 0)
        self.inspect_busy.setMaximumHeight(8)
        self.inspect_busy.setTextVisible(False)
        self.inspect_busy.setVisible(False)
        self.inputs_layout.addWidget(self.inspect_busy)
        self.inspect_table = KeyValueTable(["", ""])
        self.inspect_table.horizontalHeader().setVisible(False)
        self.inspect_table.setMinimumHeight(200)
        self.inputs_layout.addWidget(self.inspect_table)
        self.reload_boards()

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        inputs, actions, results = super().tab_groups()
        # Browse… belongs to the folder field; Inspect and New run are this page's main actions
        inputs.insert(inputs.index(self.folder_edit) + 1, self.browse_button)
        first = [self.inspect_button, self.new_run_button]
        return inputs, [*first, *(a for a in actions if a not in (*first, self.browse_button))], results

    def showEvent(self, event: QShowEvent) -> None:
        """Coming back to the page: boards added or removed on the Board page (or by `hexstudio board add`) are
        the ones offered."""
        super().showEvent(event)
        self.reload_boards()

    def reload_boards(self) -> None:
        current = self.board_combo.currentText()
        self.board_combo.clear()
        self.board_combo.addItem("sim")
        self.board_combo.setItemText(0, "sim")
        for name in sorted(self.c.settings.boards):
            self.board_combo.addItem(name)
        i = self.board_combo.findText(current or str(self.c.settings.data.get("default_board") or "sim"))
        self.board_combo.setCurrentIndex(max(i, 0))

    def browse(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Hugging Face model folder")
        if d:
            self.folder_edit.setText(d)
            self.folder_radio.setChecked(True)

    def model_spec(self) -> str:
        if self.hf_radio.isChecked():
            return self.hf_edit.text().strip()
        if self.folder_radio.isChecked():
            return self.folder_edit.text().strip()
        return BUILTIN_MODEL_ID

    async def inspect(self) -> dict[str, Any] | None:
        spec = self.model_spec()
        if not spec:
            self.inspect_message.setText("Type a Hugging Face id or choose a folder first.")
            return None
        self.inspect_button.setEnabled(False)
        self.inspect_message.setText(
            f"Reading config.json of {html.escape(spec)}… (from the Hugging Face Hub unless it is "
            "cached: offline this takes a while before it says so)"
        )
        self.inspect_table.set_rows([])  # never the previous model's figures under this one's name
        self._inspection_shown = (
            False  # until this one answers (a failed one leaves the run's figures to come)
        )
        self.inspect_busy.setVisible(True)
        try:
            info = await asyncio.to_thread(
                model_service.inspect, spec, self.context_spin.value() or None, 128, None
            )
        except ActionableError as exc:
            self.inspect_message.setText(refused_html(exc.message, exc.hint))
            return None
        finally:
            self.inspect_button.setEnabled(True)
            self.inspect_busy.setVisible(False)
        ok = info.get("supported")
        self.inspect_message.setText(
            f"<b>{html.escape(spec)}</b>: "
            + ("supported." if ok else f"<span style='color:{STATE_COLORS['failed']}'>not supported.</span>")
        )
        self.inspect_table.set_rows(inspect_rows(info))
        # shown until another run is opened: a refresh puts no other model's figures under this heading
        self._inspected_on = self._run_model_state()
        self._inspection_shown = True
        return info

    def _run_model_state(self) -> tuple[Path, object] | None:
        """The open run and what its Model stage produced (its output digest): an inspection stays on show while
        neither changes."""
        m = self.c.manifest
        return (m.run_dir, m.stage("model").data.get("output_digest")) if m is not None else None

    def new_run(self) -> None:
        spec = self.model_spec()
        if not spec:
            self.inspect_message.setText("Type a Hugging Face id or choose a folder first.")
            return
        overrides: dict[str, Any] = {"calibration_samples": self.calib_spin.value()}
        if self.context_spin.value():
            overrides["context_length"] = self.context_spin.value()
        board = self.board_combo.currentText() or "sim"
        if board != "sim" and board not in self.c.settings.boards:  # removed since the list was filled
            self.reload_boards()
            self.inspect_message.setText(
                refused_html(
                    f"There is no board named {board} any more: no run was made.",
                    "Choose a board in the list (or add it again on the Board page), then New run.",
                )
            )
            return
        try:
            m = self.c.new_run(spec, board, overrides)
        except WorkspaceError as exc:  # its message says no run was made, and why
            self.inspect_message.setText(refused_html(exc.message, exc.hint))
            return
        except Exception as exc:
            self.inspect_message.setText(
                refused_html(
                    f"Could not create the run: {getattr(exc, 'message', None) or exc}",
                    getattr(exc, "hint", None),
                )
            )
            return
        self.inspect_message.setText(
            f"Run <b>{html.escape(m.run_id)}</b> made for {html.escape(spec)} on {html.escape(board)}: "
            "Run Model to begin, or Run ▸ Resume (Ctrl+R) for every stage in turn."
        )

    def _show_run_settings(self) -> None:
        """The fields show the open run's own values (they once showed 8 calibration samples while the run used
        11); New run starts from them. Set again only when the run or its values change, so an edit meant for
        the next run is not undone by a refresh."""
        m = self.c.manifest
        if m is None:
            return
        cs, cl = m.settings.get("calibration_samples"), m.settings.get("context_length")
        key = (m.run_dir, cs, cl, m.inputs.get("board"))
        if key == getattr(self, "_shown_settings", None):
            return
        self._shown_settings = key
        if isinstance(cs, int):
            self.calib_spin.setValue(cs)
        self.context_spin.setValue(cl if isinstance(cl, int) else 0)
        i = self.board_combo.findText(str(m.inputs.get("board") or ""))
        if i >= 0:
            self.board_combo.setCurrentIndex(i)
        for w in (self.calib_spin, self.context_spin, self.board_combo):
            w.setToolTip(f"Run {m.run_id} uses this value; New run starts a run with what is shown here.")

    def refresh_results(self) -> None:
        self._show_run_settings()
        self.new_run_button.setEnabled(not self.c.busy)
        if self._inspection_shown:
            if self._run_model_state() == self._inspected_on:
                return  # an inspected model is on show, under its own name: the run's comes back with another run
                # (or when its Model stage has run since)
            self._inspection_shown = False
            self.inspect_message.setText("")  # its heading and figures go with it
            self.inspect_table.set_rows([])
        doc = self.artifact_json("model.json")
        if doc is not None:
            info = dict(doc.get("info") or {})
            info.update(doc.get("resolved") or {})
            info["estimates"] = doc.get("estimates") or {}
            self.inspect_table.set_rows(
                [["model", str(doc.get("model"))], ["source", str(doc.get("source"))], *inspect_rows(info)]
            )
