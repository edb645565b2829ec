"""The Board stage of a run on a board that lacks only QAIRT, whose settings name the SDK zip: the stage
installs QAIRT (sudo password from the keyring, commands logged), the doctor passes, the bundle is pushed."""

from __future__ import annotations

import json
from pathlib import Path

from hexstudio.core.secrets import set_secret, sudo_password_key
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard, build_qairt_zip, run_board_stage_of_new_run, trust_once

PW = "stage-sudo-canary-41"


def test_stage_installs_qairt_then_pushes(tmp_path: Path) -> None:
    with EvkBoard(tmp_path / "evk", sudo_password=PW, fastrpc_ready=True) as evk:
        zip_path = build_qairt_zip(tmp_path / "v2.45.0.260326.zip")
        settings = settings_with("evk", {**evk.board_config(), "qairt_zip": str(zip_path)})
        set_secret(sudo_password_key("evk"), PW)

        trust_once(evk, settings)
        ws = tmp_path / "run-ws"  # not the chosen workspace: the run's own holds the QAIRT payload cache
        _, out, events, _ = run_board_stage_of_new_run(tmp_path, workspace=ws)
        doc = json.loads((out / "board.json").read_text())
        assert all(
            c["status"] == "ok" or (c["id"], c["status"]) == ("geniex", "skip")  # GenieX: optional
            for c in doc["doctor"]
        ), [c for c in doc["doctor"] if c["status"] != "ok"]
        assert doc["facts"]["qairt_version"] == "2.45.0.260326" and doc["push"]["sent_files"] == 7
        logs = [e.get("message", "") for e in events if e.get("type") == "log"]
        assert any("sudo tar -xf" in ln for ln in logs)
        assert PW not in json.dumps(events) and PW not in (out / "board.json").read_text()
        assert any((ws / "cache" / "qairt").iterdir())


def test_a_qairt_payload_cut_short_is_built_again(tmp_path: Path) -> None:
    """The QAIRT payload tar (hundreds of MB) was renamed into the cache without an fsync and reused on its name
    alone: one a power cut left truncated failed every install on the board with tar's "Unexpected EOF"."""
    import tarfile

    from hexstudio.core.device.qairt import MARKER, build_payload
    from tests.support.evk_board import build_qairt_zip

    z = build_qairt_zip(tmp_path / "qairt.zip")
    _version, tar_path, _digest, _n = build_payload(z, "v73", tmp_path / "cache")
    whole = tar_path.read_bytes()
    tar_path.write_bytes(whole[: len(whole) // 2])  # the crash
    again = build_payload(z, "v73", tmp_path / "cache")[1]
    assert again == tar_path and tar_path.read_bytes() == whole
    with tarfile.open(tar_path) as tar:
        assert tar.getmembers()[-1].name == MARKER  # read to its end
    assert list((tmp_path / "cache").iterdir()) == [tar_path]  # no temp file left beside it
