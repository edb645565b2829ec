"""The Board stage of a run on a board that lacks only QAIRT, whose settings name the SDK zip: the stage
installs QAIRT (sudo password from the keyring, commands logged), the doctor passes, the bundle is pushed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import open_board
from hexstudio.core.device.stage import run_board_stage
from hexstudio.core.runs import Workspace
from hexstudio.core.secrets import set_secret, sudo_password_key
from hexstudio.core.stage_api import StageContext
from hexstudio.core.stages import get_stage
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard, build_qairt_zip, make_device_bundle

PW = "stage-sudo-canary-41"


def test_stage_installs_qairt_then_pushes(tmp_path: Path) -> None:
    with EvkBoard(tmp_path / "evk", sudo_password=PW, fastrpc_ready=True) as evk:
        zip_path = build_qairt_zip(tmp_path / "v2.45.0.260326.zip")
        settings = settings_with("evk", {**evk.board_config(), "qairt_zip": str(zip_path)})
        set_secret(sudo_password_key("evk"), PW)

        async def first_contact() -> None:
            b = await open_board(
                "evk", settings, trust=lambda h, p, kt, fp: fp == evk.server.host_key_fingerprint
            )
            await b.transport.close()

        asyncio.run(first_contact())
        m = Workspace().create_run("builtin:tiny-llama", "evk")
        upstream = tmp_path / "compile"
        make_device_bundle(upstream / "bundle", part_bytes=1000)
        out = m.run_dir / "artifacts" / "board.partial"
        out.mkdir(parents=True)
        events: list[dict[str, Any]] = []
        ctx = StageContext(m, get_stage("board"), out, {"compile": upstream}, events.append, asyncio.Event())
        asyncio.run(run_board_stage(ctx))
        doc = json.loads((out / "board.json").read_text())
        assert all(
            c["status"] == "ok" or (c["id"], c["status"]) == ("geniex", "skip")  # GenieX: optional
            for c in doc["doctor"]
        ), [c for c in doc["doctor"] if c["status"] != "ok"]
        assert doc["facts"]["qairt_version"] == "2.45.0.260326" and doc["push"]["sent_files"] == 7
        logs = [e.get("message", "") for e in events if e.get("type") == "log"]
        assert any("sudo tar -xf" in ln for ln in logs)
        assert PW not in json.dumps(events) and PW not in (out / "board.json").read_text()
