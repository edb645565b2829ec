"""An earlier HexStudio wrote its FastRPC rule as /etc/udev/rules.d/60-fastrpc.rules, the name of the fastrpc
package's own file, which it then hid whole. The udev_rule fix moves it to 61-hexstudio-fastrpc.rules and has udev
read and apply the rules again, even where the cdsp nodes already look right (the package's other nodes do not);
run again, it finds nothing to do. On the EVK test board (a real sshd; its /etc only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hexstudio.core.device.board import open_board
from hexstudio.core.device.fixes import UDEV_RULE, UDEV_RULES_TEXT, apply_fix, plan_fix
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard
from tests.support.sshd import sshd_available

ok, why = sshd_available()
pytestmark = [pytest.mark.sshd, pytest.mark.skipif(not ok, reason=why)]
PW = "udev-move-pw"
OLD = "/etc/udev/rules.d/60-fastrpc.rules"


def test_the_earlier_rule_is_moved_and_the_rules_applied_again(tmp_path: Path) -> None:
    with EvkBoard(tmp_path / "evk", fastrpc_ready=True, sudo_password=PW) as evk:
        rules = evk.root / "etc" / "udev" / "rules.d"
        (rules / "60-fastrpc.rules").write_text(
            UDEV_RULES_TEXT
        )  # as HexStudio wrote it before ("written by ...")
        settings = settings_with("evk", evk.board_config())

        async def go() -> None:
            board = await open_board("evk", settings, trust=lambda *a: True)
            plan = await plan_fix(board, "udev_rule")
            assert f"sudo rm -f {OLD}" in plan.commands, plan.commands
            res = await apply_fix(board, plan, sudo_password=PW)
            assert res.status == "applied", res.message
            ran = [e["command"] for e in res.log if not e.get("skipped")]
            # the rules read and applied again, though the cdsp nodes were fastrpc 0660 already
            assert "sudo udevadm control --reload-rules" in ran, res.log
            assert "sudo udevadm trigger --action=add --subsystem-match=misc" in ran, res.log
            again = await apply_fix(board, await plan_fix(board, "udev_rule"))  # no password: nothing to run
            assert again.status == "already", (again.status, again.message, again.manual_commands)
            await board.transport.close()

        asyncio.run(go())
        assert not (rules / "60-fastrpc.rules").exists()
        assert (rules / Path(UDEV_RULE).name).read_text() == UDEV_RULES_TEXT
        # an administrator's own 60-fastrpc.rules (no HexStudio mark) is left alone
        (rules / "60-fastrpc.rules").write_text('KERNEL=="fastrpc-cdsp", GROUP="fastrpc", MODE="0660"\n')

        async def mine() -> None:
            board = await open_board("evk", settings, trust=lambda *a: True)
            plan = await plan_fix(board, "udev_rule")
            assert not any(OLD in c for c in plan.commands), plan.commands
            await board.transport.close()

        asyncio.run(mine())
