"""The Board page (device console) against the EVK test board: first contact asks to trust the host
key, the doctor's checklist shows the shipped faults with their evidence, a Fix shows its commands
and takes the sudo password, and the re-run checks pass. The password never reaches the console."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import wait_until
from tests.support.sshd import sshd_available

ok, why = sshd_available()
pytestmark = [pytest.mark.sshd, pytest.mark.slow, pytest.mark.skipif(not ok, reason=why)]
SUDO = "evk-sudo-canary-91d2"


def answers(value: Any) -> Any:
    """A board page's question (confirm_trust, offer_known_hosts), answered `value` at once."""

    async def ask(*_a: Any) -> Any:
        return value

    return ask


def board_page(qtbot: Any, tmp_path: Path, name: str, config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The studio at 1280x1000 on its Board page, with board `name` (config) in the settings and selected:
    (window, controller, page)."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.settings import Settings
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow

    s = Settings.load()
    s.boards[name] = config
    s.save()
    c = RunController(Workspace(tmp_path / "ws"), Settings.load())
    w = MainWindow(c)
    qtbot.addWidget(w)
    w.resize(1280, 1000)
    w.show()
    w.show_stage("board")
    page: Any = w.pages["board"]
    page.reload_boards()
    page.boards.setCurrentRow([page.boards.item(i).data(256) for i in range(page.boards.count())].index(name))
    return w, c, page


def test_doctor_and_fix_from_the_board_page(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    from PySide6.QtWidgets import QScrollArea

    from tests.support.evk_board import EvkBoard

    with EvkBoard(tmp_path / "evk", sudo_password=SUDO) as evk:
        w, c, page = board_page(qtbot, tmp_path, "evk", evk.board_config())
        asked: list[tuple[Any, ...]] = []

        async def trust(*a: Any) -> bool:
            asked.append(a)
            return True

        page.confirm_trust = trust
        offered: list[tuple[Any, ...]] = []

        async def offer(*a: Any) -> bool:  # also into ~/.ssh/known_hosts? not here (this machine's own file)
            offered.append(a)
            return False

        page.offer_known_hosts = offer
        shown: list[list[str]] = []

        async def confirm_fix(plan: Any, stored: str | None) -> tuple[bool, str | None, bool]:
            shown.append(plan.commands)
            return True, SUDO, False

        page.confirm_fix = confirm_fix

        # what the board list showed for each connection state, as it happened
        listed: list[tuple[str, str, str]] = []
        set_state = page.set_board_state

        def record(name: str, state: str, detail: str = "") -> None:
            set_state(name, state, detail)
            item = page.board_item(name)
            listed.append((name, state, item.text() if item is not None else ""))

        page.set_board_state = record

        async def scenario() -> None:
            evk_item = page.board_item("evk")
            assert evk_item is not None and "not connected yet" in evk_item.text()
            items = await page.probe()
            assert asked and asked[0][3] == evk.server.host_key_fingerprint
            assert len(offered) == 1 and offered[0][3] == evk.server.host_key_fingerprint  # offered, declined
            states = [st for n, st, _ in listed if n == "evk"]
            assert states[0] == "connecting" and states[-1] == "ready", listed
            assert "connecting…" in next(t for n, st, t in listed if n == "evk" and st == "connecting")
            assert "ready" in evk_item.text() and "FAILED" not in evk_item.text()
            by = {i["id"]: i for i in items}
            assert by["soc"]["status"] == "ok" and by["fastrpc_group"]["status"] == "fail"
            assert page.doctor.topLevelItemCount() == len(items)
            assert "group_add" in page.fix_buttons
            top = next(
                page.doctor.topLevelItem(i)
                for i in range(page.doctor.topLevelItemCount())
                if page.doctor.topLevelItem(i).data(0, 256) == "fastrpc_group"
            )
            assert top.childCount() >= 1 and top.child(0).text(0).startswith("$ ")
            page.fix_buttons["group_add"].click()
            await wait_until(lambda: page._task.done(), 120, "the group_add fix")
            res = page._task.result()
            assert res is not None and res.status == "applied", res
            assert shown and any("groupadd" in cmd or "usermod" in cmd for cmd in shown[0])
            after = {
                page.doctor.topLevelItem(i).data(0, 256): page.doctor.topLevelItem(i).text(1)
                for i in range(page.doctor.topLevelItemCount())
            }
            assert after["fastrpc_group"] == "ok" and after["fastrpc_member"] == "ok"
            keep = os.environ.get("HEXSTUDIO_SCREENSHOTS")
            if keep:
                for i in range(page.doctor.topLevelItemCount()):
                    item = page.doctor.topLevelItem(i)
                    if item.data(0, 256) in ("fastrpc_device", "udev_rule"):
                        page.doctor.expandItem(item)
                w.dock.hide()
                await asyncio.sleep(0.2)  # settle by awaiting: processEvents() inside a task re-enters qasync
                scroll = page.findChild(QScrollArea)
                scroll.ensureWidgetVisible(page.doctor)
                path = tmp_path / "06-board-evk.png"
                w.grab().save(str(path))
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, Path(keep) / path.name)

        gui_loop.run_until_complete(scenario())

        # a board that does not answer: the list says it failed, and why
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed_port = sock.getsockname()[1]
        c.settings.boards["evk-off"] = {**evk.board_config(), "port": closed_port}
        c.settings.save()
        page.reload_boards()
        assert "ready" in page.board_item("evk").text()  # known states survive a reload of the list
        page.boards.setCurrentRow(
            [page.boards.item(i).data(256) for i in range(page.boards.count())].index("evk-off")
        )
        gui_loop.run_until_complete(page.probe())
        off = page.board_item("evk-off")
        assert off is not None and "FAILED" in off.text()
        state, reason, _when = page.board_states["evk-off"]
        assert state == "failed" and reason and reason[:40] in off.text() + off.toolTip()
        assert (
            reason.startswith("Cannot connect to") and str(closed_port) in reason and reason in off.toolTip()
        )
        console = page.console.toPlainText()
        assert "groupadd" in console or "usermod" in console
        assert SUDO not in console and SUDO not in page.conn_label.text()


def test_geniex_fix_from_the_board_page_takes_the_release_file_the_user_picks(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """A board whose runtime is GenieX and has none: the doctor offers the GenieX fix; closing the file picker
    does nothing; picking the release tarball installs it (no sudo, commands shown) and the re-run check
    finds GenieX (what is left is its Python package, a warning)."""
    from tests.board.test_geniex_setup import geniex_tarball
    from tests.support.evk_board import EvkBoard

    tarball = geniex_tarball(tmp_path, "v0.7.0", "v2.45.0.260326")
    with EvkBoard(tmp_path / "evk", fastrpc_ready=True) as evk:
        _w, _c, page = board_page(qtbot, tmp_path, "evk-gx", {**evk.board_config(), "runtime": "geniex"})
        page.confirm_trust = answers(True)
        page.offer_known_hosts = answers(False)
        shown: list[list[str]] = []

        async def confirm_fix(plan: Any, stored: str | None) -> tuple[bool, str | None, bool]:
            shown.append(plan.commands)
            return True, None, False

        page.confirm_fix = confirm_fix
        picks: list[Path | None] = [None, tarball]

        async def pick() -> Path | None:
            return picks.pop(0)

        page.choose_geniex_file = pick

        def status(check: str) -> str:
            return next(
                page.doctor.topLevelItem(i).text(1)
                for i in range(page.doctor.topLevelItemCount())
                if page.doctor.topLevelItem(i).data(0, 256) == check
            )

        async def scenario() -> None:
            await page.probe()
            assert status("geniex") == "fail" and "geniex_install" in page.fix_buttons
            page.fix_buttons["geniex_install"].click()  # the picker closed: nothing is done
            await wait_until(lambda: page._task.done(), 60, "the cancelled pick")
            assert page._task.result() is None and not shown
            assert "no file chosen, nothing done" in page.console.toPlainText()
            page.fix_buttons["geniex_install"].click()  # the tarball picked
            await wait_until(lambda: page._task.done(), 120, "the geniex_install fix")
            res = page._task.result()
            assert res is not None and res.status == "applied", res
            assert shown and any(tarball.name in cmd for cmd in shown[0])
            assert status("geniex") == "warn"  # installed; its Python package is what is left

        gui_loop.run_until_complete(scenario())
        assert not picks
