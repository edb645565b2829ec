"""Board page (the device console): boards and their connection state, the doctor as a checklist
whose items expand to their evidence, a Fix button beside each failing item, a console of what ran,
and the bundle push with its throughput."""

from __future__ import annotations

import asyncio
import html
import json
import time
from typing import Any

from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.ui.controller import RunController
from app.ui.pages.base import StagePage
from app.ui.widgets import STATE_COLORS, STATUS_COLORS, note


class BoardPage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("board", controller, parent)
        row = QHBoxLayout()
        left = QVBoxLayout()
        left.addWidget(QLabel("<b>Boards</b>"))
        self.boards = QListWidget()
        self.boards.setObjectName("boards")
        self.boards.setMaximumWidth(260)
        left.addWidget(self.boards)
        self.probe_button = QPushButton("Connect and run the doctor")
        self.probe_button.setObjectName("probe_button")
        self.probe_button.clicked.connect(lambda: asyncio.ensure_future(self.probe()))
        left.addWidget(self.probe_button)
        row.addLayout(left)

        add = QGroupBox("Add a board")
        form = QFormLayout(add)
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("evk")
        self.host_edit = QLineEdit()
        self.host_edit.setPlaceholderText("192.168.1.50 or a ~/.ssh/config alias")
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(22)
        self.user_edit = QLineEdit()
        self.user_edit.setPlaceholderText("ubuntu")
        self.auth_combo = QComboBox()
        self.auth_combo.addItems(["key", "agent", "ssh_config", "password"])
        self.key_edit = QLineEdit()
        self.key_edit.setPlaceholderText("~/.ssh/id_ed25519")
        self.password_edit = QLineEdit()
        self.password_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.password_edit.setPlaceholderText("kept in the system keyring, never in settings")
        form.addRow("Name", self.name_edit)
        form.addRow("Host", self.host_edit)
        form.addRow("Port", self.port_spin)
        form.addRow("User", self.user_edit)
        form.addRow("Auth", self.auth_combo)
        form.addRow("Key file", self.key_edit)
        form.addRow("Password", self.password_edit)
        self.add_button = QPushButton("Add board")
        self.add_button.clicked.connect(self.add_board)
        form.addRow(self.add_button)
        row.addWidget(add, 1)
        self.inputs_layout.addLayout(row)
        self.conn_label = note("")
        self.conn_label.setObjectName("connection_state")
        self.inputs_layout.addWidget(self.conn_label)

        doctor_box = QGroupBox("Doctor")
        dl = QVBoxLayout(doctor_box)
        self.doctor = QTreeWidget()
        self.doctor.setObjectName("doctor")
        self.doctor.setHeaderLabels(["check", "status", "what it found", ""])
        self.doctor.setColumnWidth(0, 180)
        self.doctor.setColumnWidth(1, 70)
        self.doctor.setColumnWidth(2, 520)
        self.doctor.setMinimumHeight(200)
        dl.addWidget(self.doctor)
        self.body.insertWidget(self.body.indexOf(self.results_box), doctor_box)

        console_box = QGroupBox("Console: what ran on the board")
        col = QVBoxLayout(console_box)
        self.console = QPlainTextEdit()
        self.console.setObjectName("console")
        self.console.setReadOnly(True)
        self.console.setMaximumBlockCount(5000)
        f = self.console.font()
        f.setFamily("monospace")
        self.console.setFont(f)
        self.console.setMinimumHeight(140)
        col.addWidget(self.console)
        self.push_label = QLabel("")
        self.push_label.setObjectName("push_label")
        col.addWidget(self.push_label)
        self.body.insertWidget(self.body.indexOf(self.results_box), console_box)
        self.reload_boards()
        self.c.stageEvent.connect(self._on_stage_event)
        self._push_t0 = 0.0

    # -- boards ---------------------------------------------------------------------------------
    def reload_boards(self) -> None:
        self.boards.clear()
        item = QListWidgetItem("sim — the simulator board (this PC, simulated)")
        item.setData(256, "sim")
        self.boards.addItem(item)
        for name, cfg in sorted(self.c.settings.boards.items()):
            it = QListWidgetItem(f"{name} — {cfg.get('user') or ''}@{cfg.get('host')}:{cfg.get('port') or 22}")
            it.setData(256, name)
            self.boards.addItem(it)
        run_board = str(self.c.manifest.inputs.get("board", "sim")) if self.c.manifest else "sim"
        for i in range(self.boards.count()):
            if self.boards.item(i).data(256) == run_board:
                self.boards.setCurrentRow(i)

    def selected_board(self) -> str:
        it = self.boards.currentItem()
        return str(it.data(256)) if it is not None else "sim"

    def add_board(self) -> None:
        from app.core.secrets import board_password_key, set_secret

        name = self.name_edit.text().strip()
        host = self.host_edit.text().strip()
        if not name or not host or name == "sim":
            self.conn_label.setText(f"<span style='color:{STATE_COLORS['failed']}'>Give the board a name (not "
                                    "'sim') and a host.</span>")
            return
        auth = self.auth_combo.currentText()
        cfg: dict[str, Any] = {"host": host, "port": self.port_spin.value(), "user": self.user_edit.text().strip()
                               or None, "auth": auth}
        if auth == "key":
            cfg["key_path"] = self.key_edit.text().strip() or "~/.ssh/id_ed25519"
        if auth == "ssh_config":
            cfg["ssh_alias"] = host
        if auth == "password" and self.password_edit.text():
            set_secret(board_password_key(name), self.password_edit.text())
        self.password_edit.clear()
        self.c.settings.boards[name] = cfg
        self.c.settings.save()
        self.reload_boards()
        self.conn_label.setText(f"Board <b>{html.escape(name)}</b> added. Select it and run the doctor.")

    def _trust(self, host: str, port: int, key_type: str, fp: str) -> bool:
        answer = QMessageBox.question(
            self, "Trust this board?",
            f"First connection to {host}:{port}.\nIts host key is {key_type}\n{fp}\n\nCompare it with the board's own "
            "(on the board: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub). Trust it only if they match.")
        return answer == QMessageBox.StandardButton.Yes

    # -- doctor ---------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        self.console.appendPlainText(text)

    def show_doctor(self, items: list[dict[str, Any]]) -> None:
        self.doctor.clear()
        for d in items:
            top = QTreeWidgetItem([str(d.get("id")), str(d.get("status")), str(d.get("message") or "")])
            top.setForeground(1, QColor(STATUS_COLORS.get(str(d.get("status")), "#8a8f98")))
            top.setToolTip(2, str(d.get("message") or ""))
            ev = d.get("evidence") or {}
            if isinstance(ev, dict):
                for k, v in ev.items():
                    child = QTreeWidgetItem([str(k), "", str(v)[:2000]])
                    child.setToolTip(2, str(v)[:4000])
                    top.addChild(child)
            else:
                top.addChild(QTreeWidgetItem(["evidence", "", str(ev)[:2000]]))
            self.doctor.addTopLevelItem(top)
            fix = d.get("fix")
            if fix and d.get("status") in ("fail", "warn"):
                b = QPushButton("Fix…")
                b.setToolTip(f"Show the commands of fix '{fix}' and run them")
                b.clicked.connect(lambda _=False, dd=d: asyncio.ensure_future(self.run_fix(dd)))
                self.doctor.setItemWidget(top, 3, b)

    async def probe(self) -> list[dict[str, Any]]:
        from app.core.device.board import BoardError, open_board

        name = self.selected_board()
        self.probe_button.setEnabled(False)
        self.conn_label.setText(f"Connecting to <b>{html.escape(name)}</b>…")
        items: list[dict[str, Any]] = []
        try:
            def on_state(state: str, detail: str) -> None:
                self.conn_label.setText(f"{html.escape(name)}: <b>{state}</b> {html.escape(detail)}")
                self.log(f"[{time.strftime('%H:%M:%S')}] {name}: {state} {detail}")

            board = await open_board(name, self.c.settings, self.c.workspace.root, trust=self._trust,
                                     on_state=on_state)
            try:
                items = await self._run_doctor(board)
            finally:
                await board.transport.close()
            failing = [i for i in items if i.get("status") == "fail"]
            col = STATE_COLORS["failed" if failing else "done"]
            self.conn_label.setText(f"<span style='color:{col}'><b>{html.escape(board.label)}</b>: "
                                    f"{len(failing)} failing check(s) of {len(items)}</span>")
        except BoardError as exc:
            self.conn_label.setText(f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(exc.message)}</span>"
                                    + (f"<br><b>What to do:</b> {html.escape(exc.hint)}" if exc.hint else ""))
            self.log(f"FAILED: {exc.message}")
        finally:
            self.probe_button.setEnabled(True)
        self.show_doctor(items)
        return items

    async def _run_doctor(self, board: Any) -> list[dict[str, Any]]:
        try:
            from app.core.device import doctor as doctor_mod
        except ImportError:
            doctor_mod = None  # type: ignore[assignment]
        if doctor_mod is not None and hasattr(doctor_mod, "run_doctor") and not board.simulated:
            report = await doctor_mod.run_doctor(board)
            items = [c if isinstance(c, dict) else c.as_json() for c in
                     (report.get("checks", []) if isinstance(report, dict) else report)]
        else:
            res = await board.transport.run([*board.genie_command, "--help"], timeout=60)
            self.log(f"$ genie-t2t-run --help   (exit {res.exit_status})")
            items = [{"id": "genie_runner", "status": "ok" if res.exit_status == 0 else "fail",
                      "message": "genie-t2t-run starts" + (" (simulator)" if board.simulated else ""),
                      "evidence": {"command": "genie-t2t-run --help", "exit_status": res.exit_status,
                                   "output": (res.stdout + res.stderr)[-600:]}}]
            if board.simulated:
                items.append({"id": "npu", "status": "skip", "message": "Simulator board: no Hexagon NPU, FastRPC or "
                              "QAIRT; the doctor's device checks apply to real boards.", "evidence": {}})
        for i in items:
            ev = i.get("evidence") or {}
            if isinstance(ev, dict) and ev.get("command"):
                self.log(f"$ {ev['command']}\n{str(ev.get('output', ''))[-400:]}")
        return items

    async def run_fix(self, item: dict[str, Any]) -> None:
        try:
            from app.core.device import fixes
        except ImportError:
            QMessageBox.information(self, "Fix", f"Fix '{item.get('fix')}': {item.get('message')}")
            return
        describe = getattr(fixes, "describe_fix", None)
        text = describe(str(item.get("fix"))) if describe else str(item.get("fix"))
        if QMessageBox.question(self, f"Fix {item.get('id')}", f"This fix runs on the board:\n\n{text}\n\nRun it?") \
                != QMessageBox.StandardButton.Yes:
            return
        self.log(f"# fix {item.get('fix')}\n{text}")
        await self.probe()

    # -- stage events ---------------------------------------------------------------------------
    def _on_stage_event(self, stage: str, ev: dict[str, Any]) -> None:
        if stage != "board":
            return
        if ev.get("type") == "progress":
            msg = str(ev.get("message") or "")
            if msg.startswith("pushing") and not self._push_t0:
                self._push_t0 = time.monotonic()
            self.push_label.setText(f"{float(ev.get('fraction', 0)) * 100:.0f}% — {msg}")
        elif ev.get("type") in ("log", "warning", "error"):
            self.log(str(ev.get("message")))

    def refresh_results(self) -> None:
        d = self.c.stage_dir("board")
        if d is None or not (d / "board.json").is_file():
            self.doctor.clear()
            self.push_label.setText("")
            return
        doc = json.loads((d / "board.json").read_text())
        self.show_doctor(list(doc.get("doctor") or []))
        p = doc.get("push") or {}
        sim = " (simulator board: a local copy)" if doc.get("simulated") else ""
        self.push_label.setText(f"Bundle on the board at {doc.get('remote_bundle')}: sent {p.get('sent_files')} "
                                f"file(s), {p.get('skipped_files')} unchanged, {p.get('mb_per_s')} MB/s{sim}.")
        self._push_t0 = 0.0
