"""Every fix is idempotent on the EVK test board: once applied, a second run reports "already", asks for no
sudo, and runs nothing on the board but its read-only done checks (udev_rule's udevadm steps, the
fastrpc_packages ldconfig, relogin's reconnect included)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hexstudio.core.device import transport as tr
from hexstudio.core.device.board import open_board
from hexstudio.core.device.doctor import probe
from hexstudio.core.device.fixes import apply_fix, plan_fix
from tests.board.conftest import CANARY, settings_with
from tests.support.evk_board import EvkBoard

FIXES = ("dsp_start", "group_add", "relogin", "udev_rule", "fastrpc_packages", "daemon_restart")
MUTATING = ("groupadd", "usermod", "udevadm", "ldconfig", "apt-get", "install", "reboot", "rm")


def _mutating(argv: list[str]) -> bool:
    return (
        argv[0] in MUTATING
        or (argv[0] == "systemctl" and argv[1] in ("restart", "start", "stop"))
        or (argv[0] == "sh" and any("| tee " in a for a in argv))  # dsp_start's write to a remoteproc's state
    )


@pytest.mark.slow
def test_a_second_run_of_each_fix_reports_already_and_runs_nothing(
    evk: EvkBoard, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with("evk", evk.board_config())
    ran: list[list[str]] = []
    run = tr.SshTransport.run

    async def spy_run(self: tr.SshTransport, argv: list[str], **kw: Any) -> tr.CommandResult:
        ran.append([str(a) for a in argv])
        return await run(self, argv, **kw)

    monkeypatch.setattr(tr.SshTransport, "run", spy_run)

    async def flow() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        report = await probe(board)
        # first runs: each fix applies (or finds the board already fixed by an earlier one, e.g. relogin)
        first = {}
        for fid in FIXES:
            res = await apply_fix(board, await plan_fix(board, fid, report), sudo_password=CANARY)
            assert res.status in ("applied", "already"), (fid, res.message)
            first[fid] = res.status
        assert first["group_add"] == "applied" and first["udev_rule"] == "applied"
        assert first["daemon_restart"] == "applied" and first["dsp_start"] == "applied"
        assert first["fastrpc_packages"] == "already"  # the board ships libcdsprpc: no apt-get, no ldconfig

        # second runs: nothing to do, nothing run, no sudo asked (no password given this time)
        for fid in FIXES:
            plan = await plan_fix(board, fid, report)
            transport = board.transport
            ran.clear()
            res = await apply_fix(board, plan, rerun=False)
            assert res.status == "already", (fid, res.status, res.message, res.manual_commands)
            assert res.manual_commands == [] and res.message.startswith("Nothing to do")
            assert res.log and all(entry.get("skipped") for entry in res.log), (fid, res.log)
            assert board.transport is transport  # relogin did not log in again
            assert not [a for a in ran if a[0] == "sudo"], (fid, ran)
            assert not [a for a in ran if _mutating(a)], (fid, ran)
        after = await probe(
            board,
            only=[
                "fastrpc_group",
                "fastrpc_member",
                "fastrpc_login",
                "udev_rule",
                "fastrpc_device",
                "fastrpc_userspace",
            ],
        )
        assert all(c.status == "ok" for c in after.checks), [
            (c.id, c.status, c.message) for c in after.checks
        ]
        await board.transport.close()

    asyncio.run(flow())
