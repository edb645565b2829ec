"""The Compile page's AI Hub device picker and token field, against the AI Hub emulator: the token goes
to the keyring only; Refresh from AI Hub lists the account's devices live in a child process (Hexagon
arch, soc-model, weight sharing, OS), defaults to the IQ-9075 EVK, and says clearly what to do when
there is no token or no network."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.aihub_emulator.fixtures import aihub_emulator  # noqa: F401
from tests.gui.conftest import keep_screenshot

pytestmark = pytest.mark.slow


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_device_picker_lists_aihub_devices_live(
    qtbot: Any,
    gui_loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
    aihub_emulator: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QScrollArea

    from hexstudio.core.runs import Workspace
    from hexstudio.core.secrets import AIHUB_TOKEN, get_secret
    from hexstudio.core.settings import Settings
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow

    emu = aihub_emulator
    # the token must come from the keyring (not the emulator's environment, not a client.ini in $HOME)
    monkeypatch.delenv("HEXSTUDIO_AIHUB_TOKEN")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    c = RunController(Workspace(tmp_path / "ws"))
    w = MainWindow(c)
    qtbot.addWidget(w)
    w.show_stage("compile")
    page: Any = w.pages["compile"]
    assert page.device_combo.currentText() == "Dragonwing IQ-9075 EVK"  # offline list, the EVK first
    assert page.token_edit.echoMode() == page.token_edit.EchoMode.Password
    qtbot.waitUntil(lambda: "No AI Hub token" in page.token_state.text(), timeout=3000)  # read once shown
    # a token in the qai_hub client's own file is one the Compile stage uses: the page says so (as the CLI does)
    ini = tmp_path / "home" / ".qai_hub" / "client.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text("[api]\napi_token = from-client-ini\n")
    w.show_stage("board")  # a token stored elsewhere meanwhile is said when the page is shown again
    w.show()
    w.show_stage("compile")
    assert "token used is the one in" in page.token_state.text() and "client.ini" in page.token_state.text()
    assert "from-client-ini" not in page.token_state.text()
    ini.unlink()
    page._show_token_state()

    # no token: a clear error with what to do, and the offline list stays
    assert gui_loop.run_until_complete(page.refresh_devices()) is None
    msg = page.devices_message.text()
    assert "No Qualcomm AI Hub API token" in msg and "What to do:" in msg and "token field" in msg, msg
    assert page.device_combo.count() >= 1 and page.refresh_devices_button.isEnabled()

    # a keyring that keeps nothing: refused with what to do, and the pasted token stays in the field
    import keyring
    from keyring.backends.null import Keyring as NullKeyring

    before = keyring.get_keyring()
    keyring.set_keyring(NullKeyring())
    try:
        page.token_edit.setText(emu.token)
        page.token_button.click()
    finally:
        keyring.set_keyring(before)
    assert "did not keep" in page.token_state.text() and "What to do:" in page.token_state.text()
    assert page.token_edit.text() == emu.token and get_secret(AIHUB_TOKEN) is None

    # the token typed in the field goes to the keyring, and nowhere else; where it went is said as it is
    page.token_button.click()
    assert get_secret(AIHUB_TOKEN) == emu.token
    assert page.token_edit.text() == "" and "stored in a PLAIN-TEXT file at" in page.token_state.text()
    settings_text = Settings.load().path.read_text() if Settings.load().path.exists() else ""
    assert emu.token not in settings_text
    assert all(emu.token not in lab.text() for lab in page.findChildren(type(page.token_state)))

    listing = gui_loop.run_until_complete(page.refresh_devices())
    assert listing is not None and listing.devices, page.devices_message.text()
    by = {d.name: d for d in listing.devices}
    evk = by["Dragonwing IQ-9075 EVK"]
    assert (evk.dsp_arch, evk.soc_model, evk.weight_sharing, evk.supported) == (
        "v73",
        77,
        True,
        True,
    )
    assert not by["Snapdragon 8 Gen 1 QRD"].supported  # v69 without weight sharing is refused
    table = {
        page.devices_table.item(r, 0).text(): [page.devices_table.item(r, k).text() for k in range(6)]
        for r in range(page.devices_table.rowCount())
    }
    assert table["Dragonwing IQ-9075 EVK"][1:5] == ["v73", "77", "yes", f"Qualcomm Linux {evk.os}"]
    assert table["Snapdragon 8 Gen 3 QRD"][4] == f"Android {by['Snapdragon 8 Gen 3 QRD'].os}"
    assert table["Snapdragon 8 Gen 1 QRD"][5].startswith("no — ")
    assert "EMULATED" in page.devices_message.text()
    combo = [page.device_combo.itemText(i) for i in range(page.device_combo.count())]
    assert page.device_combo.currentText() == "Dragonwing IQ-9075 EVK"
    assert "Snapdragon 8 Gen 3 QRD" in combo and "Snapdragon 8 Gen 1 QRD" not in combo  # only usable ones
    assert "v73" in page.device_combo.itemData(0, 3)
    assert "qai_hub" not in page.devices_message.text()

    # choosing a device in the table picks it for the run
    c.new_run("builtin:tiny-llama")
    w.refresh()
    page.show_devices(listing)
    w.resize(1280, 900)
    w.show()
    w.dock.hide()
    QApplication.processEvents()
    page.findChild(QScrollArea).ensureWidgetVisible(page.devices_table)
    keep_screenshot(w, "09-compile-aihub-devices", tmp_path)
    w.dock.show()
    row = next(
        r
        for r in range(page.devices_table.rowCount())
        if page.devices_table.item(r, 0).text() == "Snapdragon 8 Gen 3 QRD"
    )
    # the arrow keys walk the list and change nothing: each choice is a recorded change that makes Quantize stale
    table = page.devices_table
    table.setFocus()
    table.setCurrentCell(0, 0)
    events_before = len(c.manifest.data["events"])
    for _ in range(min(4, table.rowCount() - 1)):
        QTest.keyClick(table, Qt.Key.Key_Down)
    assert c.manifest.settings.get("device") in (None, "Dragonwing IQ-9075 EVK")
    assert len(c.manifest.data["events"]) == events_before
    # a click on a row chooses it, and so does Enter
    rect = table.visualRect(table.model().index(row, 0))
    QTest.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert c.manifest is not None and c.manifest.settings["device"] == "Snapdragon 8 Gen 3 QRD"
    evk_row = next(r for r in range(table.rowCount()) if table.item(r, 0).text() == "Dragonwing IQ-9075 EVK")
    table.setCurrentCell(evk_row, 0)
    QTest.keyClick(table, Qt.Key.Key_Return)
    assert c.manifest.settings["device"] == "Dragonwing IQ-9075 EVK"

    # no network: AI Hub cannot be reached
    monkeypatch.setenv("HEXSTUDIO_AIHUB_API_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HEXSTUDIO_AIHUB_WEB_URL", f"http://127.0.0.1:{_closed_port()}")
    assert gui_loop.run_until_complete(page.refresh_devices()) is None
    msg = page.devices_message.text()
    assert "Could not list the AI Hub devices" in msg and "What to do:" in msg, msg
    assert emu.token not in msg


def test_recorded_device_list_through_the_shared_reader(tmp_path: Path) -> None:
    """devices.json as the worker writes it, read back by the studio's typed reader; a malformed one is refused
    with what is wrong, not shown half-read."""
    from hexstudio.shared.aihub_devices import DeviceListing, DeviceListingError, offline_listing

    path = tmp_path / "devices.json"
    path.write_text(
        '{"devices": [{"name": "Dragonwing IQ-9075 EVK", "os": "1.5", "dsp_arch": "v73", "soc_model": 77, '
        '"chipset": "qualcomm-qcs9075", "weight_sharing": true, "attributes": ["os:qc_linux"], '
        '"supported": true, "reason": "", "emulated": false}], "emulated": false}'
    )
    listing = DeviceListing.read(path)
    d = listing.devices[0]
    assert (d.soc_model, d.attributes, listing.emulated, listing.usable) == (
        77,
        ("os:qc_linux",),
        False,
        (d,),
    )
    assert DeviceListing.from_json(listing.to_json()) == listing
    offline = offline_listing()
    assert offline.devices[0].name == "Dragonwing IQ-9075 EVK" and all(x.supported for x in offline.devices)
    for bad, why in (
        ('{"devices": [{"name": "X", "os": "1", "dsp_arch": "v73", "soc_model": "77"}]}', "'soc_model'"),
        ('{"devices": [{"name": "X", "os": "1", "dsp_arch": "v73", "soc_model": true}]}', "'soc_model'"),
        ('{"devices": 3}', "no 'devices' list"),
        ("not json", "cannot be read"),
    ):
        path.write_text(bad)
        with pytest.raises(DeviceListingError) as e:
            DeviceListing.read(path)
        assert why in str(e.value), (bad, str(e.value))


def test_the_token_is_looked_for_off_the_window_thread(
    qtbot: Any, tmp_path: Path, gui_loop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Compile page read the keyring on the window's thread when it was built (before the window appeared) and
    on every visit: a locked Secret Service keyring held the studio at its unlock prompt."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.services import aihub_token
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow
    from tests.support.threads import record_threads

    looked = record_threads(monkeypatch, aihub_token, "token_status")
    w = MainWindow(RunController(Workspace(tmp_path / "ws")))
    qtbot.addWidget(w)
    page: Any = w.pages["compile"]
    assert looked == [] and "Looking for" in page.token_state.text()  # not while the window is built

    async def shown() -> None:
        page._show_token_state()  # as showEvent does, the loop running
        assert page._token_task is not None
        await page._token_task

    gui_loop.run_until_complete(shown())
    assert looked and looked[-1] != "MainThread" and "token" in page.token_state.text().lower()
