"""The simulator board's commands run on this workstation: no fix runs on it, however it is asked for (a QAIRT
install's `sudo rm -rf /opt/qairt/...` would change this machine, not a board)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hexstudio.core.device.board import open_board
from hexstudio.core.device.errors import BoardError
from hexstudio.core.device.fixes import FixPlan, Step, apply_fix, plan_fix, plan_qairt_install
from tests.support.cli import python_m_hexstudio


def test_no_fix_is_planned_or_applied_on_the_simulator(tmp_path: Path) -> None:
    zip_path = tmp_path / "v2.45.0.260326.zip"
    zip_path.write_bytes(b"PK\x05\x06" + bytes(18))

    async def go() -> None:
        board = await open_board("sim", workspace=tmp_path / "ws")
        for plan in (plan_qairt_install(board, zip_path), plan_fix(board, "udev_rule")):
            with pytest.raises(BoardError, match="needs no fixes"):
                await plan
        step = Step("run", ["touch", str(tmp_path / "changed")], sudo=True)
        with pytest.raises(BoardError, match="change this machine"):
            await apply_fix(board, FixPlan("udev_rule", "a plan made elsewhere", [step], ()))
        await board.transport.close()

    asyncio.run(go())
    assert not (tmp_path / "changed").exists()
    # `board fix sim qairt_install --zip` went straight to the install plan, past plan_fix's refusal
    out = python_m_hexstudio(
        "board",
        "fix",
        "sim",
        "qairt_install",
        "--zip",
        str(zip_path),
        "--dry-run",
        env={"HEXSTUDIO_WORKSPACE": str(tmp_path / "ws")},
    )
    assert out.returncode != 0 and "needs no fixes" in out.stdout + out.stderr, out.stdout + out.stderr
