"""Board page (the device console): boards and their connection state, the doctor as a checklist
whose items expand to their evidence, a Fix button beside each failing item, a console of what ran,
and the bundle push with its throughput."""

from __future__ import annotations

import asyncio
import copy
import html
import json
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
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

from hexstudio.core.settings import Settings, SettingsError, check_board_name
from hexstudio.ui import modal
from hexstudio.ui.controller import RunController
from hexstudio.ui.errors import refused_html
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.widgets import STATE_COLORS, STATUS_COLORS, button, note, state_icon

# the board settings this page's form shows (and so replaces when a board is saved); the others are kept
FORM_KEYS = frozenset({"host", "port", "user", "auth", "key_path", "ssh_alias"})


class BoardPage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("board", controller, parent)
        row = QHBoxLayout()
        left = QVBoxLayout()
        left.addWidget(QLabel("<b>Boards</b>"))
        self.boards = QListWidget()
        self.boards.setObjectName("boards")
        self.boards.setMaximumWidth(340)
        self.boards.setMinimumWidth(280)
        # long names and failure reasons wrap instead of being cut off (the tooltip has the whole message)
        self.boards.setWordWrap(True)
        self.boards.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.boards.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.board_states: dict[str, tuple[str, str, str]] = {}  # name -> (state, detail, when)
        self._task: asyncio.Future[Any] | None = None  # the doctor or fix under way (one at a time)
        self._editing: tuple[str, dict[str, Any]] | None = None  # the board Edit… filled the form with
        self.fix_buttons: dict[str, QPushButton] = {}  # the last doctor's fixes, by fix id
        # whose checks the list shows, and when a doctor run from this page made them (0: the Board stage's, from
        # board.json): a refresh keeps a newer live probe, and a fix acts on the board that was checked
        self.doctor_of: str | None = None
        self.live_doctor_at = 0.0
        left.addWidget(self.boards)
        self.probe_button = button(
            "Connect and run the doctor", "probe_button", on_click=lambda: self._start(self.probe())
        )
        left.addWidget(self.probe_button)
        manage = QHBoxLayout()
        self.edit_button = button(
            "Edit…",
            "edit_board",
            "Put the selected board into the form: change it there and save",
            self.edit_selected,
        )
        self.remove_button = button(
            "Remove",
            "remove_board",
            "Remove the selected board from HexStudio (and its password from the keyring)",
            self.remove_selected,
        )
        manage.addWidget(self.edit_button)
        manage.addWidget(self.remove_button)
        left.addLayout(manage)
        self.boards.currentRowChanged.connect(lambda _r: self._manage_enabled())
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
        # Enter in the form adds (or saves) the board, as a form is submitted from the keyboard
        for edit in (self.name_edit, self.host_edit, self.user_edit, self.key_edit, self.password_edit):
            edit.returnPressed.connect(self.add_button.click)
        row.addWidget(add, 1)
        self.inputs_layout.addLayout(row)
        self.conn_label = note("")
        self.conn_label.setObjectName("connection_state")
        self.transient_labels.append(self.conn_label)
        self.inputs_layout.addWidget(self.conn_label)

        doctor_box = QGroupBox("Doctor")
        dl = QVBoxLayout(doctor_box)
        self.doctor = QTreeWidget()
        self.doctor.setObjectName("doctor")
        self.doctor.setHeaderLabels(["check", "status", "what it found", ""])
        self.doctor.setColumnWidth(0, 260)
        self.doctor.setColumnWidth(1, 60)
        self.doctor.setColumnWidth(2, 560)
        self.doctor.setMinimumHeight(340)
        dl.addWidget(self.doctor)
        self.body.insertWidget(self.body.indexOf(self.results_box), doctor_box)

        console_box = QGroupBox("Console: what ran on the board")
        col = QVBoxLayout(console_box)
        self.console = QPlainTextEdit()
        self.console.setObjectName("console")
        self.console.setReadOnly(True)
        self.console.setMaximumBlockCount(5000)
        controller.runtimeLog.connect(lambda level, text: self.log(f"[Genie {level}] {text}"))
        f = self.console.font()
        f.setFamily("monospace")
        self.console.setFont(f)
        self.console.setMinimumHeight(140)
        col.addWidget(self.console)
        self.push_label = note("")  # a long remote path wraps instead of widening the page
        self.push_label.setObjectName("push_label")
        col.addWidget(self.push_label)
        self.body.insertWidget(self.body.indexOf(self.results_box), console_box)
        self.reload_boards()
        self.c.stageEvent.connect(self._on_stage_event)
        self._push_t0 = 0.0

    def tab_groups(self) -> tuple[list[QWidget], list[QWidget], list[QWidget]]:
        inputs, actions, results = super().tab_groups()
        # as the page reads: the board list and its Connect button, then the Add a board form
        first = [self.boards, self.probe_button, self.edit_button, self.remove_button]
        form = [w for w in inputs if w not in first]
        return (
            [*first, *form, self.add_button],
            [a for a in actions if a not in (*first, self.add_button)],
            [r for r in results if r not in first],
        )

    # -- boards ---------------------------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:
        """Coming back to the page: boards added or changed elsewhere (`hexstudio board add`) are listed."""
        super().showEvent(event)
        if self._listed != self.c.settings.boards:
            self.reload_boards()

    def reload_boards(self) -> None:
        self._listed = copy.deepcopy(self.c.settings.boards)
        self.boards.clear()
        item = QListWidgetItem()
        item.setData(256, "sim")
        item.setData(257, "sim — the simulator board (this PC, simulated)")
        self.boards.addItem(item)
        for name, cfg in sorted(self.c.settings.boards.items()):
            it = QListWidgetItem()
            it.setData(256, name)
            it.setData(257, f"{name} — {cfg.get('user') or ''}@{cfg.get('host')}:{cfg.get('port') or 22}")
            self.boards.addItem(it)
        for i in range(self.boards.count()):
            self._show_board_state(self.boards.item(i))
        run_board = str(self.c.manifest.inputs.get("board", "sim")) if self.c.manifest else "sim"
        for i in range(self.boards.count()):
            if self.boards.item(i).data(256) == run_board:
                self.boards.setCurrentRow(i)
        self._manage_enabled()

    def board_item(self, name: str) -> QListWidgetItem | None:
        for i in range(self.boards.count()):
            if self.boards.item(i).data(256) == name:
                return self.boards.item(i)
        return None

    def set_board_state(self, name: str, state: str, detail: str = "") -> None:
        """Connection state of one board, shown in the list: connecting, ready, or failed with the reason."""
        self.board_states[name] = (state, detail, time.strftime("%H:%M:%S"))
        item = self.board_item(name)
        if item is not None:
            self._show_board_state(item)

    def _show_board_state(self, item: QListWidgetItem) -> None:
        name = str(item.data(256))
        state, detail, when = self.board_states.get(name) or self._stage_board_state(name)
        icon = {"connecting": "running", "ready": "done", "failed": "failed"}.get(state, "pending")
        line = {"connecting": "connecting…", "ready": f"ready ({when})", "failed": f"FAILED ({when})"}.get(
            state, "not connected yet"
        )
        reason = f": {detail}" if state == "failed" and detail else ""
        short = reason if len(reason) <= 90 else reason[:89] + "…"
        item.setText(f"{item.data(257)}\n   {line}{short}")
        item.setIcon(state_icon(icon))
        item.setToolTip(
            f"{item.data(257)}\n{state}" + (f" at {when}" if when else "") + (f": {detail}" if detail else "")
        )
        item.setForeground(
            QColor(STATE_COLORS["failed"]) if state == "failed" else self.boards.palette().text().color()
        )

    def _stage_board_state(self, name: str) -> tuple[str, str, str]:
        """Before this window connects to it: what the run's Board stage found on its board, so the list agrees
        with the stage (a passed Board stage is a ready board, not "not connected yet")."""
        m = self.c.manifest
        if m is None or str(m.inputs.get("board", "sim")) != name:
            return ("not connected", "", "")
        st = self.c.status("board")
        ended = str(m.stage("board").data.get("ended") or "")
        when = ended[11:19] if len(ended) >= 19 else ""
        if st.key in ("passed", "overridden"):
            return (
                "ready",
                "the run's Board stage connected, ran the doctor and pushed the bundle",
                f"Board stage {when}".strip(),
            )
        if st.key in ("failed", "gate_failed"):
            return ("failed", f"the run's Board stage: {st.detail}", f"Board stage {when}".strip())
        return ("not connected", "", "")

    def selected_board(self) -> str:
        it = self.boards.currentItem()
        return str(it.data(256)) if it is not None else "sim"

    def add_board(self) -> None:
        from hexstudio.core.secrets import SecretStoreError, board_password_key, set_secret

        name = self.name_edit.text().strip()
        host = self.host_edit.text().strip()
        if not name or not host:
            self.conn_label.setText(
                f"<span style='color:{STATE_COLORS['failed']}'>Give the board a name (not "
                "'sim') and a host.</span>"
            )
            return
        if any(c.isspace() for c in host):  # the CLI's rule (`hexstudio board add --host`)
            self.conn_label.setText(
                refused_html(
                    f"'{host}' is no host name: the board was not saved.",
                    "Give its host name, IP address or ~/.ssh/config alias, e.g. 192.168.1.50.",
                )
            )
            self.host_edit.setFocus()
            return
        try:
            # the CLI's rule: the name goes into keyring entries and file names ("a/b" made a folder)
            check_board_name(name)
        except SettingsError as exc:
            self.conn_label.setText(refused_html(exc.message, exc.hint))
            self.name_edit.setFocus()
            return
        auth = self.auth_combo.currentText()
        cfg: dict[str, Any] = {
            "host": host,
            "port": self.port_spin.value(),
            "user": self.user_edit.text().strip() or None,
            "auth": auth,
        }
        if auth == "key":
            cfg["key_path"] = self.key_edit.text().strip() or "~/.ssh/id_ed25519"
        if auth == "ssh_config":
            cfg["ssh_alias"] = host
        before = self.c.settings.boards.get(name)
        # what the form does not show (qairt_zip, runtime, qairt_home, ... from `hexstudio board add`) stays
        kept = {k: v for k, v in (before or {}).items() if k not in FORM_KEYS}
        shown = self._editing[1] if self._editing is not None and self._editing[0] == name else None

        changed = SettingsError(
            f"Board '{name}' was changed elsewhere (`hexstudio board add`, another studio window) while "
            "this form was open; nothing was saved.",
            "Select the board and Edit… again: the form then shows what it holds now.",
        )
        if shown is not None and before != shown:  # before its password is stored: nothing of it is kept
            self.conn_label.setText(refused_html(changed.message, changed.hint))
            return
        if auth == "password" and self.password_edit.text():
            try:
                set_secret(board_password_key(name), self.password_edit.text())
            except SecretStoreError as exc:
                # the board is not saved without its password (the password stays typed for another try)
                self.conn_label.setText(refused_html(exc.message, exc.hint))
                return

        def put(s: Settings) -> None:
            if (
                shown is not None and s.boards.get(name) != shown
            ):  # again under the settings lock: as it is now
                raise changed
            s.boards[name] = {**kept, **cfg}

        try:
            self.c.edit_settings(put)
        except SettingsError as exc:
            self.conn_label.setText(refused_html(exc.message, exc.hint))
            return
        existed = before is not None
        self.password_edit.clear()
        self.reload_boards()
        self.clear_form()
        self.conn_label.setText(
            f"Board <b>{html.escape(name)}</b> {'saved' if existed else 'added'}. Select it and "
            "run the doctor."
        )

    def clear_form(self) -> None:
        """After a board is added or saved the form is empty again, ready for the next one."""
        for e in (self.name_edit, self.host_edit, self.user_edit, self.key_edit, self.password_edit):
            e.clear()
        self.port_spin.setValue(22)
        self.auth_combo.setCurrentIndex(0)
        self.add_button.setText("Add board")
        self._editing = None

    def _manage_enabled(self) -> None:
        """What may change a board: not while a stage runs (the Board stage may be pushing to it), nor a second
        doctor or fix while one is under way."""
        own = self.selected_board() != "sim"  # the simulator board is built in
        idle = not self.c.busy
        self.edit_button.setEnabled(own and idle)
        self.remove_button.setEnabled(own and idle)
        free = idle and (self._task is None or self._task.done())
        self.probe_button.setEnabled(free)
        for b in self.fix_buttons.values():
            b.setEnabled(free)

    def edit_selected(self) -> None:
        name = self.selected_board()
        cfg = self.c.settings.boards.get(name)
        if cfg is None:
            return
        self.name_edit.setText(name)
        self.host_edit.setText(str(cfg.get("ssh_alias") or cfg.get("host") or ""))
        self.port_spin.setValue(int(cfg.get("port") or 22))
        self.user_edit.setText(str(cfg.get("user") or ""))
        i = self.auth_combo.findText(str(cfg.get("auth") or "key"))
        self.auth_combo.setCurrentIndex(max(i, 0))
        self.key_edit.setText(str(cfg.get("key_path") or ""))
        self.add_button.setText("Save board")
        self._editing = (name, dict(cfg))  # the entry as the form shows it: Save checks it is still so
        self.conn_label.setText(
            f"Editing <b>{html.escape(name)}</b>: change the form and Save (a new password "
            "replaces the one in the keyring; empty keeps it)."
        )
        self.host_edit.setFocus()

    def remove_selected(self, confirm: bool = True) -> None:
        from hexstudio.core.secrets import board_secret_names, delete_secret

        name = self.selected_board()
        if name not in self.c.settings.boards:
            return
        if (
            confirm
            and QMessageBox.question(
                self,
                "Remove board",
                f"Remove the board {name} from HexStudio? Its SSH and sudo "
                "passwords (if any) are deleted from the keyring; runs that used it keep "
                "their records.",
            )
            != QMessageBox.StandardButton.Yes
        ):
            return
        try:
            self.c.edit_settings(lambda s: s.boards.pop(name, None))
        except SettingsError as exc:
            self.conn_label.setText(refused_html(exc.message, exc.hint))
            return
        for secret in board_secret_names(name):
            try:
                delete_secret(secret)
            except Exception:  # no keyring entry, or no keyring: nothing to delete
                pass
        self.board_states.pop(name, None)
        self.reload_boards()
        self.conn_label.setText(f"Board <b>{html.escape(name)}</b> removed.")

    # -- connecting -------------------------------------------------------------------------------
    async def confirm_trust(self, host: str, port: int, key_type: str, fp: str) -> bool:
        """First contact: show the host key's fingerprint and ask (tests replace this)."""
        return await modal.question(
            self,
            "Trust this board?",
            f"First connection to {host}:{port}.\nIts host key is {key_type}\n{fp}\n\nCompare it with the board's "
            "own (on the board: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub). Trust it only if they match.",
        )

    async def offer_known_hosts(self, host: str, port: int, key_type: str, fp: str, path: Path) -> bool:
        """After the person trusted a host key: also add it to ~/.ssh/known_hosts? (tests replace this)."""
        return await modal.question(
            self,
            "Also trust it outside HexStudio?",
            f"Add {host}:{port} ({key_type} {fp}) to {path} too, so that ssh, scp and your editor trust this "
            "board without asking again?",
            default_yes=False,
        )

    async def ask_passphrase(self, key_path: str) -> tuple[str, bool] | None:
        """An encrypted SSH key: its passphrase, and whether to keep it in the keyring (tests replace this)."""
        dlg = QDialog(self)
        dlg.setWindowTitle("SSH key passphrase")
        lay = QVBoxLayout(dlg)
        lay.addWidget(
            note(
                f"The SSH key {key_path} is encrypted. Its passphrase opens it for this session only, "
                "unless you choose to keep it in the system keyring."
            )
        )
        pw = QLineEdit()
        pw.setEchoMode(QLineEdit.EchoMode.Password)
        lay.addWidget(pw)
        remember = QCheckBox("Remember the passphrase in the system keyring")
        lay.addWidget(remember)
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        bb.accepted.connect(dlg.accept)
        bb.rejected.connect(dlg.reject)
        lay.addWidget(bb)
        if await modal.answer(dlg) != QDialog.DialogCode.Accepted or not pw.text():
            return None
        return pw.text(), remember.isChecked()

    async def confirm_fix(self, plan: Any, stored_password: str | None) -> tuple[bool, str | None, bool]:
        """Show the fix's exact commands; ask for the sudo password when it needs one (tests replace this).
        Returns (run it, sudo password, remember the password in the keyring)."""
        dlg = QDialog(self)
        dlg.setWindowTitle(f"Fix: {plan.title}")
        lay = QVBoxLayout(dlg)
        lay.addWidget(
            note("These exact commands run on the board, in this order (steps already done are skipped):")
        )
        text = QPlainTextEdit(
            "\n".join(plan.commands) + ("\n\n" + "\n".join(plan.notes) if plan.notes else "")
        )
        text.setReadOnly(True)
        lay.addWidget(text)
        pw = QLineEdit()
        pw.setEchoMode(QLineEdit.EchoMode.Password)
        remember = QCheckBox("Remember the sudo password in the system keyring")
        if plan.needs_sudo:
            pw.setPlaceholderText(
                "sudo password on the board" + (" (stored one is used if empty)" if stored_password else "")
            )
            lay.addWidget(pw)
            lay.addWidget(remember)
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        bb.addButton("Run the fix", QDialogButtonBox.ButtonRole.AcceptRole)
        bb.accepted.connect(dlg.accept)
        bb.rejected.connect(dlg.reject)
        lay.addWidget(bb)
        dlg.resize(720, 360)
        ok = await modal.answer(dlg) == QDialog.DialogCode.Accepted
        return ok, (pw.text() or stored_password), remember.isChecked()

    async def choose_qairt_zip(self) -> Path | None:
        path = await modal.open_file(
            self, "The QAIRT SDK zip (from Qualcomm)", str(Path.home()), "QAIRT SDK (*.zip)"
        )
        return Path(path) if path else None

    async def choose_geniex_file(self) -> Path | None:
        path = await modal.open_file(
            self,
            "GenieX release file (the CLI tarball or the Python wheel)",
            str(Path.home()),
            "GenieX (geniex-cli-linux-arm64-*.tar.gz geniex-*.whl);;All files (*)",
        )
        return Path(path) if path else None

    async def choose_fix_file(self, fix_id: str) -> tuple[bool, dict[str, Path]]:
        """The file a fix installs from, picked on the workstation (the board needs no internet): (False, {})
        when the user closes the picker."""
        pickers = {
            "qairt_install": ("qairt_zip", self.choose_qairt_zip),
            "geniex_install": ("geniex_file", self.choose_geniex_file),
        }
        if fix_id not in pickers:
            return True, {}
        key, choose = pickers[fix_id]
        path = await choose()
        return (path is not None), ({key: path} if path is not None else {})

    async def open_selected(self) -> Any:
        """Connect to the selected board; on first contact ask to trust its host key, then connect again."""
        from hexstudio.core.device.board import open_board
        from hexstudio.core.device.connect import (
            HostKeyUnknown,
            KeyPassphrase,
            KeyPassphraseNeeded,
            trust_host_key,
            user_known_hosts_path,
        )

        name = self.selected_board()

        def on_state(state: str, detail: str) -> None:
            self.conn_label.setText(f"{html.escape(name)}: <b>{state}</b> {html.escape(detail)}")
            self.log(f"[{time.strftime('%H:%M:%S')}] {name}: {state} {detail}")
            self.set_board_state(name, state, detail)

        if name == "sim":
            self.set_board_state(name, "connecting", "local simulator")
            board = await open_board(name, self.c.settings, self.c.workspace.root, on_state=on_state)
            self.set_board_state(name, "ready", "local simulator (simulated board)")
            return board
        given: dict[str, KeyPassphrase] = {}

        def passphrase(path: str, attempt: int) -> KeyPassphrase | None:
            return given.get(path) if attempt == 0 else None

        for _ in range(6):  # each answer (a host key on the route, a key's passphrase) leads to one more try
            try:
                return await open_board(
                    name, self.c.settings, self.c.workspace.root, on_state=on_state, passphrase=passphrase
                )
            except HostKeyUnknown as exc:
                if not await self.confirm_trust(exc.host, exc.port, exc.key_type, exc.fingerprint):
                    raise
                cfg = self.c.settings.boards.get(name) or {}
                path = user_known_hosts_path(cfg)
                save = await self.offer_known_hosts(exc.host, exc.port, exc.key_type, exc.fingerprint, path)
                trust_host_key(exc.host, exc.port, exc.key, user_known_hosts=path if save else None)
                self.log(
                    f"trusted {exc.host}:{exc.port} {exc.key_type} {exc.fingerprint}"
                    + (f" (also added to {path})" if save else "")
                )
            except KeyPassphraseNeeded as exc:
                answer = await self.ask_passphrase(exc.key_path)
                if answer is None:
                    raise
                given[exc.key_path] = KeyPassphrase(answer[0], remember=answer[1])
        return await open_board(
            name, self.c.settings, self.c.workspace.root, on_state=on_state, passphrase=passphrase
        )

    def _error(self, exc: Any, board: str | None = None) -> None:
        if board is not None and self.board_states.get(board, ("",))[0] != "failed":
            self.set_board_state(board, "failed", exc.message)
        self.conn_label.setText(refused_html(exc.message, exc.hint))
        self.log(f"FAILED: {exc.message}")

    # -- doctor ---------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        self.console.appendPlainText(text)

    def show_doctor(self, items: list[dict[str, Any]]) -> None:
        self.doctor.clear()
        self.fix_buttons = {}
        for d in items:
            top = QTreeWidgetItem(
                [str(d.get("title") or d.get("id")), str(d.get("status")), str(d.get("message") or "")]
            )
            top.setData(0, 256, d.get("id"))
            top.setForeground(1, QColor(STATUS_COLORS.get(str(d.get("status")), "#8a8f98")))
            top.setToolTip(2, str(d.get("message") or ""))
            ev = d.get("evidence") or []
            if isinstance(ev, dict):
                for k, v in ev.items():
                    top.addChild(QTreeWidgetItem([str(k), "", str(v)[:2000]]))
            else:
                for e in ev:
                    child = QTreeWidgetItem(
                        [
                            f"$ {e.get('command')}",
                            f"exit {e.get('exit_status')}",
                            str(e.get("output") or "").strip()[:2000],
                        ]
                    )
                    child.setToolTip(2, str(e.get("output") or "")[:4000])
                    top.addChild(child)
            for x in d.get("explained") or []:
                top.addChild(QTreeWidgetItem(["explained", "", f"{x.get('cause')} — {x.get('fix')}"]))
            self.doctor.addTopLevelItem(top)
            fix = d.get("fix")
            if fix and d.get("status") in ("fail", "warn") and fix not in self.fix_buttons:
                b = button(
                    "Fix…",
                    f"fix_{fix}",
                    f"Show the commands of fix '{fix}' and run them",
                    lambda _=False, dd=d: self._start(self.run_fix(dd)),
                )
                self.doctor.setItemWidget(top, 3, b)
                self.fix_buttons[str(fix)] = b
        self._manage_enabled()

    def _start(self, coro: Any) -> None:
        self._task = asyncio.ensure_future(coro)
        self._task.add_done_callback(lambda _t: self._manage_enabled())
        self._manage_enabled()

    async def probe(self) -> list[dict[str, Any]]:
        from hexstudio.shared.errors import ActionableError

        self.probe_button.setEnabled(False)
        items: list[dict[str, Any]] = []
        name = self.selected_board()
        try:
            board = await self.open_selected()
            try:
                items = await self._run_doctor(board)
            finally:
                await board.transport.close()
            failing = [i for i in items if i.get("status") == "fail"]
            col = STATE_COLORS["failed" if failing else "done"]
            self.conn_label.setText(
                f"<span style='color:{col}'><b>{html.escape(board.label)}</b>: "
                f"{len(failing)} failing check(s) of {len(items)}</span>"
            )
        except ActionableError as exc:
            # a board, link (ConnectionLost mid-doctor) or keyring (SecretStoreError) failure: said, never a dead task
            self._error(exc, self.selected_board())
        finally:
            self.probe_button.setEnabled(not self.c.busy)
        self.show_doctor(items)
        self.doctor_of, self.live_doctor_at = name, time.time()
        return items

    async def _run_doctor(self, board: Any) -> list[dict[str, Any]]:
        if not board.simulated:
            from hexstudio.core.device.doctor import probe

            self._report = await probe(board)
            items = [c.to_dict() for c in self._report.checks]
        else:
            res = await board.transport.run([*board.genie_command, "--help"], timeout=60)
            items = [
                {
                    "id": "genie",
                    "title": "genie-t2t-run present and runnable",
                    "status": "ok" if res.exit_status == 0 else "fail",
                    "message": "The simulator's genie-t2t-run starts (simulated board).",
                    "evidence": [
                        {
                            "command": "genie-t2t-run --help",
                            "exit_status": res.exit_status,
                            "output": (res.stdout + res.stderr)[-600:],
                        }
                    ],
                },
                {
                    "id": "npu",
                    "title": "Hexagon NPU",
                    "status": "skip",
                    "message": "Simulator board: no Hexagon NPU, FastRPC or QAIRT; the doctor's device checks "
                    "apply to real boards.",
                    "evidence": [],
                },
            ]
        for i in items:
            for e in i.get("evidence") or []:
                if isinstance(e, dict):
                    self.log(
                        f"$ {e.get('command')}   (exit {e.get('exit_status')})\n"
                        f"{str(e.get('output') or '').rstrip()[-400:]}"
                    )
        return items

    async def run_fix(self, item: dict[str, Any]) -> Any:
        """Plan the item's fix, show its commands (and ask for sudo), run it, then show the re-run checks."""
        from hexstudio.core.device import fixes
        from hexstudio.core.secrets import get_secret, set_secret, sudo_password_key
        from hexstudio.shared.errors import ActionableError

        name = self.selected_board()
        fix_id = str(item.get("fix"))
        if self.doctor_of is not None and name != self.doctor_of:
            # the plan would mix the checked board's report (its user, Hexagon, QAIRT home) with another board
            self.conn_label.setText(
                f"These checks are {html.escape(self.doctor_of)}'s: select it to fix it, or run the doctor on "
                f"{html.escape(name)} first."
            )
            return None
        try:
            board = await self.open_selected()
        except ActionableError as exc:
            self._error(exc, name)
            return None
        try:
            picked, files = await self.choose_fix_file(fix_id)
            if not picked:
                self.log(f"# fix {fix_id}: no file chosen, nothing done")
                return None
            plan = await fixes.plan_fix(board, fix_id, getattr(self, "_report", None), **files)
            stored = get_secret(sudo_password_key(name))
            ok, password, remember = await self.confirm_fix(plan, stored)
            if not ok:
                self.log(f"# fix {fix_id}: cancelled")
                return None
            self.log(f"# fix {fix_id}: {plan.title}")
            res = await fixes.apply_fix(board, plan, sudo_password=password, on_log=self.log)
            # kept only once sudo took it
            if remember and password and res.password_taken:
                set_secret(sudo_password_key(name), password)
        except ActionableError as exc:
            # a board, link (ConnectionLost) or keyring (SecretStoreError) failure: said, never a dead task
            self._error(exc, name)
            return None
        finally:
            await board.transport.close()
        col = STATE_COLORS["done" if res.status in ("applied", "already") else "failed"]
        self.conn_label.setText(
            f"<span style='color:{col}'>Fix {html.escape(fix_id)}: {res.status}</span> — "
            f"{html.escape(res.message)}"
        )
        if res.manual_commands:
            self.log(
                "Run these as an administrator, on the board unless marked otherwise:\n  "
                + "\n  ".join(res.manual_commands)
            )
        if res.checks and hasattr(self, "_report"):
            done = {c["id"]: c for c in res.checks}
            items = [done.get(c.id, c.to_dict()) for c in self._report.checks]
            self.show_doctor(items)
        return res

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

    def _console_from_stage_log(self) -> None:
        """The console was empty after the Board stage ran (from another window, the CLI or an earlier studio):
        it shows what the stage did, from its log (logs/board.jsonl), once per opened run."""
        m = self.c.manifest
        if m is None or self.console.toPlainText() or getattr(self, "_console_run", None) == m.run_dir:
            return
        path = m.run_dir / "logs" / "board.jsonl"
        self._console_run = m.run_dir
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return
        out = []
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            msg = str(ev.get("message") or "")
            if not msg or (ev.get("type") == "progress" and msg.startswith("pushing ") and " MB)" in msg):
                continue  # one line per file pushed is the job dock's business, not the console's
            kind = ev.get("type")
            out.append(f"{'WARNING: ' if kind == 'warning' else 'ERROR: ' if kind == 'error' else ''}{msg}")
        if out:
            self.log(f"── what the Board stage did (from {path.relative_to(m.run_dir)}) ──")
            for text in out:
                self.log(text)

    def refresh_results(self) -> None:
        for i in range(self.boards.count()):  # the list agrees with the stage as it ends
            self._show_board_state(self.boards.item(i))
        self._console_from_stage_log()
        self._manage_enabled()  # a stage started or ended: what may change a board now
        doc = self.artifact_json("board.json")  # a damaged one: no results, not a refresh stopped midway
        path = self.artifact_path("board.json")
        # a doctor run from this page stays until the Board stage writes a newer one (a setting changed elsewhere
        # refreshes every page: it must not wipe the checks and their Fix buttons)
        keep_live = self.live_doctor_at > (
            path.stat().st_mtime if doc is not None and path is not None else 0.0
        )
        if doc is None:
            if not keep_live:
                self.doctor.clear()
            self.push_label.setText("")
            return
        if not keep_live:
            self.show_doctor(list(doc.get("doctor") or []))
            m = self.c.manifest
            self.doctor_of, self.live_doctor_at = (m.inputs.get("board") if m is not None else None), 0.0
        p = doc.get("push") or {}
        sim = " (simulator board: a local copy)" if doc.get("simulated") else ""
        self.push_label.setText(
            f"Bundle on the board at {doc.get('remote_bundle')}: sent {p.get('sent_files')} "
            f"file(s), {p.get('skipped_files')} unchanged, {p.get('mb_per_s')} MB/s{sim}."
        )
        self._push_t0 = 0.0
