"""Workstation stage pages: Preflight, Quantize, Validate, Compile."""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QShowEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hexstudio.core.jobs import human_bytes
from hexstudio.core.services import ServiceError
from hexstudio.core.services.aihub_devices import list_aihub_devices
from hexstudio.core.services.preflight import wslconfig_plan
from hexstudio.core.settings import settings_fields
from hexstudio.shared import wslconfig
from hexstudio.shared.aihub_devices import AihubDevice, DeviceListing, offline_listing
from hexstudio.shared.errors import ActionableError
from hexstudio.shared.run_settings import DEFAULT_DEVICE
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import refused_html
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.predict_panel import PredictPanel
from hexstudio.ui.widgets import STATUS_COLORS, KeyValueTable, fmt_value, note

OS_FAMILIES = {"qc_linux": "Qualcomm Linux", "android": "Android", "linux": "Linux", "windows": "Windows"}


def device_os(d: AihubDevice) -> str:
    """'Android 14', 'Qualcomm Linux 1.7': AI Hub gives the OS family as an attribute (`os:qc_linux`, named as
    qai-hub-models' scorecard names it) and the version as `os`; the offline list has only the family."""
    family = next((a.split(":", 1)[1] for a in d.attributes if a.startswith("os:")), None)
    family = OS_FAMILIES.get(family, family) if family else None
    return f"{family} {d.os}".strip() if family else (OS_FAMILIES.get(d.os, d.os) or "?")


def device_row(d: AihubDevice) -> list[str]:
    return [
        d.name,
        d.dsp_arch or "?",
        str(d.soc_model),
        "yes" if d.weight_sharing else "no",
        device_os(d),
        "yes" if d.supported else f"no — {d.reason}".rstrip(" —"),
    ]


# what each preflight check is called on the page (its id, in the tooltip, is what the CLI and JSON use)
CHECK_TITLES = {
    "memory": "Memory (RAM + swap)",
    "wsl": "WSL memory limit",
    "python": "Python version",
    "onnxruntime_conflict": "onnxruntime package",
    "libpython": "libpython (shared)",
    "aimet": "AIMET installed",
    "aimet_smoke": "AIMET smoke test",
    "aimet_build": "AIMET build",
    "disk_workspace": "Disk: workspace",
    "disk_hf_cache": "Disk: Hugging Face cache",
    "workspace_location": "Workspace location",
    "gpu": "GPU",
    "known_bad_stack": "Known-bad package combination",
    "recipe_validated": "Validated recipe pins",
}


def check_title(check_id: str) -> str:
    return CHECK_TITLES.get(check_id) or check_id.replace("_", " ").capitalize()


def _measure(v: Any, check_id: str) -> str:
    """A measured or required value as a person reads it: sizes in GiB, a record as "key value · key value"
    (never a Python dict), a list joined."""
    if (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (check_id.startswith(("memory", "disk", "local_compile")))
    ):
        return human_bytes(v)
    if isinstance(v, dict):
        parts = []
        for k, x in v.items():
            name = str(k).removesuffix("_bytes").replace("_", " ")
            if str(k).endswith("_bytes") and isinstance(x, (int, float)):
                value = human_bytes(x)
            elif str(k) == "seconds" and isinstance(x, (int, float)):  # a duration as a person says it
                name, value = (
                    "time",
                    (f"{x / 3600:.1f} h" if x >= 5400 else f"{x / 60:.0f} min" if x >= 90 else f"{x:.0f} s"),
                )
            else:
                value = _measure(x, "")
            parts.append(f"{name} {value}")
        return " · ".join(parts)
    if isinstance(v, (list, tuple)):
        return ", ".join(_measure(x, check_id) for x in v)
    return fmt_value(v)


class FixDialog(QDialog):
    """Shows what a fix does, word for word, before anything is run or changed. With `apply`, an
    Apply button runs it and shows what happened."""

    def __init__(
        self,
        title: str,
        text: str,
        parent: QWidget | None = None,
        apply: Callable[[], str] | None = None,
        apply_label: str = "Apply",
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        lay = QVBoxLayout(self)
        lay.addWidget(note("This is exactly what the fix does. Nothing runs or changes until you choose to."))
        self.text = QPlainTextEdit(text)
        self.text.setReadOnly(True)
        lay.addWidget(self.text)
        self.outcome = note("")
        self.outcome.setObjectName("fix_result")
        lay.addWidget(self.outcome)
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        copy = bb.addButton("Copy", QDialogButtonBox.ButtonRole.ActionRole)
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(text))
        self.apply_button: QPushButton | None = None
        if apply is not None:
            self.apply_button = bb.addButton(apply_label, QDialogButtonBox.ButtonRole.ActionRole)
            self.apply_button.setObjectName("apply_fix")

            def run() -> None:
                try:
                    self.outcome.setText(apply())
                except Exception as exc:
                    self.outcome.setText(f"<span style='color:{STATUS_COLORS['fail']}'>{exc}</span>")
                assert self.apply_button is not None
                self.apply_button.setEnabled(False)

            self.apply_button.clicked.connect(run)
        bb.rejected.connect(self.reject)
        lay.addWidget(bb)
        self.resize(720, 380)


class PreflightPage(StagePage):
    inputs_note = (
        "Reads this machine (RAM, swap, disk, GPU, WSL, packages) and compares it "
        "with what this model needs at the run's context length."
    )

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("preflight", controller, parent)
        self.checks = KeyValueTable(["check", "status", "measured", "required", "message", "fix"])
        self.checks.setObjectName("preflight_checks")
        self.checks.setMinimumHeight(260)
        # long measured values (package pins) stay on one line in a capped column; the tooltip has all of it
        self.checks.setWordWrap(False)
        hh = self.checks.horizontalHeader()
        for col in (2, 3):
            hh.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
            self.checks.setColumnWidth(col, 170)
        hh.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        hh.setStretchLastSection(False)
        self.results_layout.insertWidget(1, self.checks)
        self.fix_row = QHBoxLayout()
        self.results_layout.insertLayout(2, self.fix_row)
        self._fix_buttons: list[QPushButton] = []
        self.predict_panel = PredictPanel(
            controller, self
        )  # speed, predicted by the HTP simulator (issue 28)
        self.body.insertWidget(self.body.count() - 1, self.predict_panel)

    def refresh_results(self) -> None:
        self.predict_panel.refresh()
        doc = self.artifact_json("preflight.json")
        for b in self._fix_buttons:
            b.deleteLater()
        self._fix_buttons = []
        checks: list[dict[str, Any]] = list(doc.get("checks") or []) if doc else []
        self.checks.setRowCount(len(checks))
        for r, c in enumerate(checks):
            cells = [
                check_title(c["id"]),
                c["status"],
                _measure(c.get("measured"), c["id"]),
                _measure(c.get("required"), c["id"]),
                str(c.get("message") or ""),
                "Fix available" if c.get("fix") else "",
            ]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(
                    str(c.get("fix") or text)
                    if col == 5
                    else f"{text}\n(check id: {c['id']})"
                    if col == 0
                    else text
                )
                if col == 1:
                    from PySide6.QtGui import QColor

                    item.setForeground(QColor(STATUS_COLORS.get(c["status"], "#8a8f98")))
                self.checks.setItem(r, col, item)
            if c.get("fix") and c["status"] in ("warn", "fail"):
                b = QPushButton(f"Fix: {check_title(c['id'])}…")
                b.setObjectName(f"fix_{c['id']}")
                b.clicked.connect(lambda _=False, cc=c: self.show_fix(cc))
                self.fix_row.addWidget(b)
                self._fix_buttons.append(b)
        self.checks.resizeRowsToContents()

    wslconfig_path: Path | None = None  # None: found with wslvar/cmd.exe + wslpath (tests give a file)

    def _wsl_request(self, check: dict[str, Any]) -> tuple[str, int | None, int | None] | None:
        """For a check whose fix is the WSL memory limit: (the dialog's text, memory GB, swap GB); else None."""
        fix = str(check.get("fix") or "")
        if not ((fix.startswith("wslconfig:") or ".wslconfig" in fix) and self.c.manifest is not None):
            return None
        text = f"{check.get('message')}\n\n{fix}"
        mem_gb: int | None = None
        swap_gb: int | None = None
        if fix.startswith("wslconfig:"):  # the check's own target, e.g. wslconfig:memory=180GB,swap=90GB
            want = dict(kv.split("=", 1) for kv in fix.split(":", 1)[1].split(",") if "=" in kv)
            mem_gb = int(want["memory"].upper().rstrip("GB")) if "memory" in want else None
            swap_gb = int(want["swap"].upper().rstrip("GB")) if "swap" in want else None
            text = (
                f"{check.get('message')}\n\nHexStudio sets [wsl2] memory={mem_gb}GB and swap={swap_gb}GB "
                "in your Windows .wslconfig."
            )
        elif isinstance(check.get("required"), (int, float)):
            # the limits the check itself asked for (its "required")
            mem_gb, swap_gb = wslconfig.target_limits(int(check["required"]))
        return text, mem_gb, swap_gb

    def _wsl_plan(self, mem_gb: int | None, swap_gb: int | None) -> Any:
        """The .wslconfig change, or the ActionableError saying why there is none. Slow: finding the file runs
        wslvar and cmd.exe (Windows processes, seconds each), and the model's shape may come from the Hub."""
        m = self.c.manifest
        assert m is not None
        try:
            plan, _basis = wslconfig_plan(  # the run's own shape, "auto" resolved by the one rule
                str(m.inputs.get("model")),
                self.wslconfig_path,
                memory_gb=mem_gb,
                swap_gb=swap_gb,
                settings=m.settings,
            )
        except ActionableError as exc:
            return exc
        return plan

    def fix_dialog(self, check: dict[str, Any], planned: Any = None) -> FixDialog:
        """The check's fix in a dialog; the WSL memory fix with its .wslconfig change (`planned`: from _wsl_plan,
        made here when not given)."""
        req = self._wsl_request(check)
        if req is None:
            return FixDialog(
                f"Fix: {check['id']}", f"{check.get('message')}\n\n{check.get('fix') or ''}", self
            )
        text, mem_gb, swap_gb = req
        plan = planned if planned is not None else self._wsl_plan(mem_gb, swap_gb)
        if isinstance(plan, ActionableError):
            return FixDialog(f"Fix: {check['id']}", f"{text}\n\n{plan}", self)
        if not plan.changed:
            return FixDialog(f"Fix: {check['id']}", f"{text}\n\n{plan.path} already has these limits.", self)

        def write() -> str:
            try:
                backup = wslconfig.write(plan)
            except wslconfig.ChangedMeanwhile as exc:
                raise wslconfig.ChangedMeanwhile(
                    f"{exc.message} Close this and press Fix… again to see the change from the file as it is now."
                ) from None
            kept = f" (the old file is kept as {backup})" if backup else ""
            return (
                f"Wrote {plan.path}{kept}. Now close HexStudio, run <b>wsl --shutdown</b> in Windows "
                "PowerShell, and start HexStudio again: WSL reads .wslconfig only when it starts."
            )

        return FixDialog(
            f"Fix: {check['id']} — .wslconfig",
            f"{text}\n\nThe change to {plan.path}:\n\n{plan.diff()}",
            self,
            apply=write,
            apply_label="Write .wslconfig",
        )

    def show_fix(self, check: dict[str, Any]) -> asyncio.Future[None] | None:
        """Open the fix's dialog. The WSL memory fix first finds .wslconfig in a thread: on the GUI thread it froze
        the window (and a running stage's job dock) for seconds."""
        req = self._wsl_request(check)
        if req is None:
            self.fix_dialog(check).open()
            return None
        self._fix_task = asyncio.ensure_future(self._show_wsl_fix(check, req[1], req[2]))
        return self._fix_task

    async def _show_wsl_fix(self, check: dict[str, Any], mem_gb: int | None, swap_gb: int | None) -> None:
        planned = await asyncio.to_thread(self._wsl_plan, mem_gb, swap_gb)
        self.fix_dialog(check, planned).open()


class QuantizePage(StagePage):
    settings_fields = settings_fields("quantize")  # from the one run-settings registry
    inputs_note = (
        "W4A16 as in Qualcomm's recipe: int4 blockwise (LPBQ) weights, 16-bit "
        "activations, 8-bit KV cache; one part at a time so memory stays bounded."
    )

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("quantize", controller, parent)
        self.graphs = KeyValueTable(["graph", "kind", "part", "layers", "encodings"])
        self.graphs.setObjectName("quantize_graphs")
        self.graphs.setMinimumHeight(160)
        self.results_layout.insertWidget(1, self.graphs)
        self.precision = QLabel()
        self.precision.setWordWrap(True)
        self.results_layout.insertWidget(1, self.precision)

    def refresh_results(self) -> None:
        doc = self.artifact_json("quantize.json")
        if not doc:
            self.graphs.set_rows([])
            self.precision.setText("")
            return
        p = doc.get("precision") or {}
        cal = doc.get("calibration") or {}
        self.precision.setText(
            f"<b>Precision</b>: weights {p.get('weights')}, activations {p.get('activations')}, KV cache "
            f"{p.get('kv_cache')}, lm-head {p.get('lm_head')}.  <b>Calibration</b>: {cal.get('samples')} samples of "
            f"{cal.get('seq_len')} tokens.  Context length {doc.get('context_length')}, AR-{doc.get('ar_n')}, "
            f"{doc.get('parts')} part(s)."
        )
        rows = []
        for g in doc.get("graphs") or []:
            layers = g.get("layers") or []
            rows.append(
                [
                    g.get("name", ""),
                    g.get("kind", ""),
                    str(g.get("part", "")),
                    f"{layers[0]}–{layers[-1]}" if layers else "",
                    str(g.get("encodings") or g.get("encodings_file") or ""),
                ]
            )
        self.graphs.set_rows(rows)


class ValidatePage(StagePage):
    inputs_note = (
        "Runs the prompt processor (AR-N) over the prompt, then the token "
        "generator (AR-1) one token at a time — as the board will — float and "
        "quantized side by side."
    )

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("validate", controller, parent)
        self.verdict = QLabel()
        self.verdict.setObjectName("verdict")
        self.verdict.setWordWrap(True)
        self.results_layout.insertWidget(1, self.verdict)
        self.checks = KeyValueTable(["metric", "value", "threshold", "ok"])
        self.checks.setObjectName("validate_checks")
        self.checks.setMinimumHeight(170)
        self.results_layout.insertWidget(2, self.checks)
        self.greedy = QPlainTextEdit()
        self.greedy.setReadOnly(True)
        self.greedy.setMaximumHeight(140)
        self.results_layout.insertWidget(3, self.greedy)

    def refresh_results(self) -> None:
        doc = self.artifact_json("validation.json")
        if not doc:
            self.verdict.setText("")
            self.checks.set_rows([])
            self.greedy.setPlainText("")
            return
        ok = doc.get("verdict") == "pass"
        col = STATUS_COLORS["ok" if ok else "fail"]
        self.verdict.setText(
            f"<b style='color:{col}'>Verdict: {doc.get('verdict')}</b> — {doc.get('summary')}<br>"
            + _where_validated(doc)
        )
        rows: list[list[str]] = []
        colors: list[str | None] = []
        for name, c in (doc.get("checks") or {}).items():
            sign = "≥" if c.get("direction") == "min" else "≤"
            rows.append(
                [
                    name,
                    fmt_value(c.get("value")),
                    f"{sign} {c.get('threshold')}",
                    "yes" if c.get("ok") else "NO",
                ]
            )
            colors.append(STATUS_COLORS["ok" if c.get("ok") else "fail"])
        self.checks.set_rows(rows, colors)
        lines = []
        for g in (doc.get("greedy") or [])[:2]:
            lines.append(
                f"prompt:          …{str(g.get('prompt'))[-80:]}\nfloat:           {g.get('float')!r}\n"
                f"quantized (sim): {g.get('quantized')!r}\n"
            )
        self.greedy.setPlainText("\n".join(lines))


def _where_validated(doc: dict[str, Any]) -> str:
    """Where the figures above come from (the quantized model is simulated on this CPU), and whether Qualcomm's
    HTP simulator checked the graphs too: the page said neither, and a skipped HTP check went unseen."""
    htp = doc.get("htp_simulation") or {}
    if htp.get("ran"):
        agree = htp.get("logits_argmax_agreement")
        said = "ran" + (f", logits argmax agreement {agree:.4f}" if isinstance(agree, (int, float)) else "")
        said += "" if htp.get("ok", True) else " — NOT within its bounds"
    else:
        said = f"skipped: {htp.get('why') or 'not recorded'}"
    where = html.escape(str(doc.get("quantized") or "simulation on this CPU"))
    return (
        f"Quantized: SIMULATED ({where}), not a device. Qualcomm's HTP simulator check: {html.escape(said)}."
    )


class CompilePage(StagePage):
    settings_fields = settings_fields("compile")
    inputs_note = (
        "Target 'auto' makes the simulation bundle for the simulator board and "
        "compiles on Qualcomm AI Hub for a real board. Nothing is uploaded to "
        "AI Hub without your consent above; the AI Hub token comes from the "
        "system keyring."
    )

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("compile", controller, parent)
        combo = self._setting_widgets["device"]
        assert isinstance(combo, QComboBox)
        self.device_combo: QComboBox = combo
        self.device_combo.setToolTip(
            "The device AI Hub compiles for. Offline this lists the devices HexStudio "
            "knows; Refresh from AI Hub lists your account's devices live."
        )
        token_row = QHBoxLayout()
        self.token_edit = QLineEdit()
        self.token_edit.setObjectName("aihub_token")
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("paste the API token from app.aihub.qualcomm.com/account")
        self.token_edit.returnPressed.connect(self.store_token)
        self.token_button = QPushButton("Store token")
        self.token_button.setObjectName("store_token")
        self.token_button.setToolTip(
            "Keep the token in the system keyring only (the same place `hexstudio aihub "
            "login` uses); it is never written to settings, runs or logs."
        )
        self.token_button.clicked.connect(self.store_token)
        token_label = QLabel("AI Hub token")
        token_label.setBuddy(self.token_edit)
        token_row.addWidget(token_label)
        token_row.addWidget(self.token_edit, 1)
        token_row.addWidget(self.token_button)
        self.inputs_layout.addLayout(token_row)
        self.token_state = note("")
        self.token_state.setObjectName("aihub_token_state")
        self.inputs_layout.addWidget(self.token_state)
        dev_row = QHBoxLayout()
        self.refresh_devices_button = QPushButton("Refresh from AI Hub")
        self.refresh_devices_button.setObjectName("refresh_devices")
        self.refresh_devices_button.setToolTip(
            "List the devices of your AI Hub account now (`hexstudio bundle "
            "devices --aihub`, in a separate process)"
        )
        self.refresh_devices_button.clicked.connect(lambda: self._start_refresh())
        dev_row.addWidget(self.refresh_devices_button)
        self.devices_message = note(
            "Devices known offline (click a row, or Enter on it, to compile for it). Refresh from AI Hub to list "
            "your account's devices."
        )
        self.devices_message.setObjectName("devices_message")
        dev_row.addWidget(self.devices_message, 1)
        self.inputs_layout.addLayout(dev_row)
        self.devices_table = KeyValueTable(
            ["device", "Hexagon arch", "soc_model", "weight sharing", "OS", "usable"]
        )
        self.devices_table.setObjectName("aihub_devices")
        self.devices_table.setMinimumHeight(150)
        self.devices_table.setWordWrap(False)  # one line per device; the tooltip has a refusal's whole reason
        # a click or Enter on a row chooses its device; the arrow keys only move through the list (each choice is a
        # change of the run's setting, recorded, and makes Quantize and Compile stale)
        self.devices_table.itemClicked.connect(lambda item: self._device_row_chosen(item.row()))
        self.devices_table.itemActivated.connect(lambda item: self._device_row_chosen(item.row()))
        self.inputs_layout.addWidget(self.devices_table)
        self.devices: tuple[AihubDevice, ...] = offline_listing().devices
        self.devices_table.set_rows([device_row(d) for d in self.devices])
        self._token_task: asyncio.Future[None] | None = None
        self.token_state.setText("Looking for an AI Hub token…")
        QTimer.singleShot(
            0, self._show_token_state
        )  # once the window runs: the keyring may ask to be unlocked
        self.bundle_label = QLabel()
        self.bundle_label.setWordWrap(True)
        self.results_layout.insertWidget(1, self.bundle_label)
        self.files = KeyValueTable(["file", "size", "sha256"])
        self.files.setObjectName("bundle_files")
        self.files.setMinimumHeight(200)
        self.results_layout.insertWidget(2, self.files)
        self.open_bundle_button = QPushButton("Open the bundle folder")
        self.open_bundle_button.setObjectName("open_bundle_folder")
        self.open_bundle_button.setToolTip("Show the Genie bundle in the file manager")
        self.open_bundle_button.clicked.connect(self.open_bundle_folder)
        self.results_layout.insertWidget(3, self.open_bundle_button, 0, Qt.AlignmentFlag.AlignLeft)

    def open_bundle_folder(self) -> None:
        d = self.c.stage_dir("compile")
        if d is not None and (d / "bundle").is_dir():
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(d / "bundle")))

    # -- AI Hub token and devices -------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:
        """Coming back to the page: a token stored elsewhere since (`hexstudio aihub login`) is said."""
        super().showEvent(event)
        self._show_token_state()

    def _show_token_state(self) -> None:
        """Where the Compile stage would find a token (keyring, environment or the qai_hub client.ini), as
        `hexstudio aihub status` says it: read in a thread while the studio's loop runs (a Secret Service keyring
        may block on its unlock prompt, and the loop is the window)."""
        from hexstudio.core.services.aihub_token import token_status

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop running (the page built by a test): read here
            self._say_token_state(token_status())
            return
        if self._token_task is None or self._token_task.done():
            self._token_task = asyncio.ensure_future(self._check_token())

    async def _check_token(self) -> None:
        from hexstudio.core.services.aihub_token import token_status

        self._say_token_state(await asyncio.to_thread(token_status))

    def _say_token_state(self, st: dict[str, Any]) -> None:
        from hexstudio.core.services.aihub_token import describe

        if st["keyring_error"] and not st["found"]:
            self.token_state.setText(
                f"<span style='color:{STATUS_COLORS['fail']}'>{html.escape(st['keyring_error'])}</span>"
            )
            return
        self.token_state.setText(html.escape(describe(st)))

    def store_token(self) -> None:
        from hexstudio.core.secrets import SecretStoreError, stored_where
        from hexstudio.core.services.aihub_token import store_token

        token = self.token_edit.text().strip()
        if not token:
            self.token_state.setText("Paste the token first: it is on your AI Hub account page.")
            return
        try:
            store_token(token)
        except SecretStoreError as exc:
            # the pasted token stays in the (password) field for another try once the keyring is fixed
            self.token_state.setText(refused_html(exc.message, exc.hint))
            return
        self.token_edit.clear()
        self.token_state.setText(
            html.escape(f"Token stored {stored_where()}.") + " Refresh from AI Hub to check it."
        )

    def _start_refresh(self) -> None:
        self._refresh_task = asyncio.ensure_future(self.refresh_devices())

    async def refresh_devices(self) -> DeviceListing | None:
        """List the account's devices live (hexstudio.core.services.aihub_devices: a worker process of its own,
        since qai_hub takes a second to import and does network I/O; the window stays responsive)."""
        self.refresh_devices_button.setEnabled(False)
        self.devices_message.setText("Asking AI Hub for its devices…")
        try:
            listing = await list_aihub_devices()
        except ServiceError as exc:
            self.devices_message.setText(
                refused_html(f"Could not list the AI Hub devices: {exc.message}", exc.hint)
            )
            return None
        finally:
            self.refresh_devices_button.setEnabled(True)
        self.show_devices(listing)
        return listing

    def show_devices(self, listing: DeviceListing) -> None:
        self.devices = listing.devices
        tag = " <b>EMULATED AI Hub</b> (test emulator, not Qualcomm's service)." if listing.emulated else ""
        self.devices_message.setText(
            f"{len(listing.devices)} device(s) on AI Hub, {len(listing.usable)} can run this bundle "
            f"({time.strftime('%H:%M:%S')}).{tag}"
        )
        self.devices_table.set_rows([device_row(d) for d in listing.devices])
        combo = self.device_combo
        m = self.c.manifest
        current = (
            str(m.settings.get("device"))
            if m is not None and m.settings.get("device")
            else (combo.currentText() or DEFAULT_DEVICE)
        )
        names = [d.name for d in listing.usable]
        if current not in names:
            names.insert(0, current)
        combo.blockSignals(True)
        combo.clear()
        for n in names:
            combo.addItem(n)
            d = next((d for d in listing.devices if d.name == n), None)
            combo.setItemData(
                combo.count() - 1,
                "not on this AI Hub account"
                if d is None
                else f"Hexagon {d.dsp_arch}, soc_model {d.soc_model}, weight sharing "
                f"{'yes' if d.weight_sharing else 'no'}, {device_os(d)}",
                3,
            )  # ToolTipRole
        combo.setCurrentIndex(max(combo.findText(current), 0))
        combo.blockSignals(False)

    def _device_row_chosen(self, row: int) -> None:
        d = self.devices[row] if 0 <= row < len(self.devices) else None
        if d is None or not d.supported:
            return
        i = self.device_combo.findText(d.name)
        if i >= 0 and self.device_combo.isEnabled():
            self.device_combo.setCurrentIndex(i)
            self.set_setting("device", self.device_combo.currentText())  # a row chosen: one edit, recorded

    def refresh_results(self) -> None:
        doc = self.artifact_json(
            "bundle/bundle.json"
        )  # a damaged one: no results, not a refresh stopped midway
        self.open_bundle_button.setEnabled(doc is not None)
        if doc is None:
            self.bundle_label.setText("")
            self.files.set_rows([])
            return
        dev = doc.get("device") or {}
        form = doc.get("context_binary_form")
        label = (
            "SIMULATION bundle: the onnxruntime twin's stand-in binaries (for the simulator board; not a device "
            "result)"
            if doc.get("simulated")
            else "EMULATED AI Hub bundle (test emulator; not a real context binary)"
            if doc.get("emulated")
            else f"Genie bundle of real QNN context binaries, compiled on this PC by QNN {doc.get('qnn_version')} "
            + (
                "(one per graph: what Qualcomm's HTP simulator loads)"
                if form == "single"
                else "(both graphs of a part sharing weights, for a board)"
            )
            if doc.get("compile_target") == "local"
            else "Genie bundle"
        )
        self.bundle_label.setText(
            f"<b>{label}</b><br>device {dev.get('name')} (soc_model {dev.get('soc_model')}, "
            f"dsp_arch {dev.get('dsp_arch')}), QAIRT {doc.get('qairt_version') or '—'}, "
            f"context length {doc.get('context_length')}, {doc.get('parts')} part(s), "
            f"{len(doc.get('aihub_jobs') or [])} AI Hub job(s)."
        )
        files = doc.get("files", [])
        self.files.set_rows([[f["path"], human_bytes(f["size"]), f["sha256"][:16] + "…"] for f in files])
        for r, f in enumerate(files):  # the whole hash, to read or copy and check a pushed bundle against
            if (cell := self.files.item(r, 2)) is not None:
                cell.setToolTip(f["sha256"])
