"""A fix whose link drops mid-step (the QAIRT upload of several hundred MB, SFTP's "Failure" on a full disk)
ends with a message that says what to do, not "a HexStudio bug"; a board that stops answering while the
checks run again after a fix leaves the fix applied."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device import transport as tr
from hexstudio.core.device.board import open_board
from hexstudio.core.device.errors import ConnectionDropped
from hexstudio.core.device.fixes import FixPlan, Step, apply_fix, plan_fix
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard


def test_a_dropped_upload_is_a_board_error_and_a_lost_recheck_keeps_the_fix(
    evk: EvkBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with("evk", evk.board_config())
    local = tmp_path / "payload.tar"
    local.write_bytes(b"x" * 100_000)

    async def failing_put(self: Any, *_a: Any, **_k: Any) -> None:
        raise OSError("Failure")

    async def flow() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        home = str(await board.transport.home())
        try:
            upload = FixPlan(
                "qairt_install", "Install QAIRT", [Step("upload", path=f"{home}/p.tar", local=local)], ()
            )
            with monkeypatch.context() as m:
                m.setattr(tr.SshTransport, "put_file", failing_put)
                with pytest.raises(ConnectionDropped) as err:
                    await apply_fix(board, upload, rerun=False)
            assert "could not finish" in err.value.message and "Failure" in err.value.message
            assert "run the fix again" in (err.value.hint or "")
            # the checks after a fix: the board stops answering; the fix stays applied, its checks unknown
            write = FixPlan(
                "qairt_env",
                "Write a file",
                [Step("write", path=f"{home}/f.txt", content=b"x\n")],
                ("qairt_env",),
            )

            async def lost(*_a: Any, **_k: Any) -> Any:
                raise tr.ConnectionLost("The SSH connection dropped")

            with monkeypatch.context() as m:
                m.setattr("hexstudio.core.device.fixes.probe", lost)
                res = await apply_fix(board, write)
            assert res.status == "applied" and res.checks == []
        finally:
            await board.transport.close()

    asyncio.run(flow())


def test_a_fix_whose_root_steps_are_done_runs_the_rest_without_sudo(evk: EvkBoard) -> None:
    """group_add with the user already in the group (by hand, or by an earlier fix) and only the log-in again left:
    it asked for sudo for steps it would skip, and without a password ended 'manual' with no command to run."""
    group = evk.root / "etc" / "group"
    lines = [ln for ln in group.read_text().splitlines() if not ln.startswith("fastrpc:")]
    settings = settings_with("evk", evk.board_config())

    async def flow() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        try:
            # the user joins the group while this login is open: only a new login has it
            group.write_text("\n".join([*lines, f"fastrpc:x:990:{evk.user}"]) + "\n")
            res = await apply_fix(board, await plan_fix(board, "group_add"), rerun=False)
            assert res.status == "applied", (res.status, res.message, res.manual_commands)
            assert (await board.transport.run(["id", "-nG"])).stdout.split().count("fastrpc") == 1
        finally:
            await board.transport.close()

    asyncio.run(flow())


def test_a_root_step_past_its_time_limit_is_stopped_on_the_board(evk: EvkBoard) -> None:
    """A sudo step (apt-get on a slow link) past its limit is stopped by root's own `timeout` on the board, and
    the result says so. Before, only this user's kill of the process group stopped it: on this test board sudo
    relays that signal to the command, but a review found no guarantee of it (a command sudo runs in a session of
    its own), and an apt-get left running holds the dpkg lock."""
    import json
    import subprocess

    from tests.board.conftest import CANARY

    marker = "31.25"  # a sleep nothing else on this machine runs
    settings = settings_with("evk", evk.board_config())

    async def flow() -> Any:
        board = await open_board("evk", settings, trust=lambda *a: True)
        try:
            step = Step("run", ["sleep", marker], sudo=True, timeout=2)
            plan = FixPlan("udev_rule", "a slow root step", [step], ())
            return await apply_fix(board, plan, sudo_password=CANARY, rerun=False)
        finally:
            await board.transport.close()

    res = asyncio.run(flow())
    assert res.status != "applied" and "stopped on the board after 2 s" in json.dumps(res.to_dict()), res
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.strip()
    assert not left, f"the root step still runs: {left}"
