"""A QAIRT unpacked by hand (no /opt/qairt/current link), or a link left to a removed version: the environment
fix writes the install that is there, and the doctor fails an environment whose QAIRT_HOME holds no QAIRT
(it said OK, and its fix wrote the same dead path again: "Nothing to do", in a loop)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import open_board
from hexstudio.core.device.doctor import ENV_SCRIPT, probe
from hexstudio.core.device.fixes import apply_fix, env_script_text, plan_fix
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard, build_qairt_zip

VERSION = "2.45.0.260326"


async def probed_with_env(board: Any, text: bytes) -> Any:
    """The board's QAIRT checks once its environment script holds `text`."""
    home = str(await board.transport.home())
    await board.transport.write_bytes(f"{home}/{ENV_SCRIPT}", text)
    return await probe(board, only=("soc", "qairt", "qairt_env"))


def unpack(home: Path) -> None:
    """A QAIRT unpacked by hand at `home`: the public SDK's layout (the EVK test board's stand-ins: the fix's
    re-checks run its genie-t2t-run and qnn-platform-validator)."""
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(build_qairt_zip(Path(tmp) / "qairt.zip", VERSION)) as z:
            z.extractall(tmp)
            for info in z.infolist():  # zipfile keeps no modes: the tools must run
                (Path(tmp) / info.filename).chmod((info.external_attr >> 16) & 0o777)
        home.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / "qairt" / VERSION), str(home))


def test_the_environment_points_at_a_qairt_that_is_there(evk: EvkBoard) -> None:
    qairt = evk.root / "opt" / "qairt"
    unpack(qairt / VERSION)
    (qairt / "current").symlink_to("2.40.0.250101")  # the version it named was removed
    settings = settings_with("evk", evk.board_config())

    async def flow() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        try:
            # the script an earlier fix wrote for the link
            r = await probed_with_env(board, env_script_text("/opt/qairt/current").encode())
            assert r.by_id("qairt").status == "ok" and r.facts["qairt_home"] == f"/opt/qairt/{VERSION}"
            env = r.by_id("qairt_env")
            assert env.status == "fail" and env.fix == "qairt_env", env.message
            assert "holds no QAIRT" in env.message and "/opt/qairt/current" in env.message
            plan = await plan_fix(board, "qairt_env", r)
            res = await apply_fix(board, plan)
            assert res.status == "applied", res.message
            after = await probe(board, only=("soc", "qairt", "qairt_env"))
            assert after.by_id("qairt_env").status == "ok", after.by_id("qairt_env").message
            assert f"QAIRT_HOME=/opt/qairt/{VERSION}" in after.by_id("qairt_env").message
        finally:
            await board.transport.close()

    asyncio.run(flow())


def test_a_current_link_under_the_aistack_root_is_the_one_written(evk: EvkBoard) -> None:
    """The probe finds a `current` link under either root; the fix wrote /opt/qairt/current whichever it was."""
    import shutil

    shutil.rmtree(evk.root / "opt" / "qairt", ignore_errors=True)
    root = evk.root / "opt" / "qcom" / "aistack" / "qairt"
    unpack(root / VERSION)
    (root / "current").symlink_to(VERSION)
    settings = settings_with("evk", evk.board_config())

    async def flow() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        try:
            r = await probed_with_env(board, b"# nothing yet\n")
            assert r.facts["qairt_current"] == "/opt/qcom/aistack/qairt/current"
            res = await apply_fix(board, await plan_fix(board, "qairt_env", r))
            assert res.status == "applied", res.message
            after = await probe(board, only=("soc", "qairt", "qairt_env"))
            env = after.by_id("qairt_env")
            assert env.status == "ok" and "QAIRT_HOME=/opt/qcom/aistack/qairt/current" in env.message, (
                env.message
            )
        finally:
            await board.transport.close()

    asyncio.run(flow())


def test_a_fix_whose_check_still_fails_is_not_done(evk: EvkBoard) -> None:
    """The environment script written, but the QAIRT it names has no genie-t2t-run (libraries only): the re-run
    checks still asked for the same fix, and the fix said "done" (the CLI exited 0)."""
    for earlier in ("opt/qairt", "opt/qcom"):  # the board's QAIRT installs of the tests before
        shutil.rmtree(evk.root / earlier, ignore_errors=True)
    qairt = evk.root / "opt" / "qairt"
    for lib in ("lib/aarch64-oe-linux-gcc11.2", "lib/hexagon-v73/unsigned"):
        (qairt / VERSION / lib).mkdir(parents=True)
    settings = settings_with("evk", evk.board_config())

    async def flow() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        try:
            r = await probed_with_env(board, b"# nothing yet\n")
            res = await apply_fix(board, await plan_fix(board, "qairt_env", r))
            assert res.status == "failed", res.message
            assert "its steps ran, but" in res.message and "still fails" in res.message, res.message
        finally:
            await board.transport.close()

    asyncio.run(flow())
