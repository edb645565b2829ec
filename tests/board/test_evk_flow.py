"""End to end against the EVK test board (a real sshd whose sessions see a QCS9075 board):
probe finds the shipped faults -> fixes (group, udev rule, daemon, reboot) -> QAIRT install from an
SDK-shaped zip -> probe clean -> bundle push -> a second push sends nothing; the Board stage writes the
doctor snapshot; the user's password (SSH and sudo) never appears in commands, logs, board.json or
run.json."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device import transport as tr
from hexstudio.core.device.board import open_board
from hexstudio.core.device.doctor import probe
from hexstudio.core.device.errors import BoardError
from hexstudio.core.device.fixes import apply_fix, plan_fix, plan_qairt_install
from hexstudio.core.device.push import push_bundle
from hexstudio.core.secrets import board_password_key, set_secret
from tests.board.conftest import CANARY, settings_with
from tests.support.evk_board import (
    EvkBoard,
    build_qairt_zip,
    make_device_bundle,
    run_board_stage_of_new_run,
    trust_once,
)

SHIPPED_FAULTS = {
    "remoteproc",
    "fastrpc_group",
    "fastrpc_member",
    "fastrpc_login",
    "udev_rule",
    "fastrpc_device",
    "dma_heap",
    "fastrpc_daemons",
    "qairt",
    "qairt_env",
}


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every command string sent to the board, and every stdin given to a command."""
    rec: dict[str, list[Any]] = {"commands": [], "stdin": []}
    open_channel = tr.SshTransport._open_channel
    run = tr.SshTransport.run

    def spy_open(self: tr.SshTransport, command: str) -> Any:
        rec["commands"].append(command)
        return open_channel(self, command)

    async def spy_run(self: tr.SshTransport, argv: list[str], **kw: Any) -> tr.CommandResult:
        if kw.get("stdin") is not None:
            rec["stdin"].append(kw["stdin"])
        return await run(self, argv, **kw)

    monkeypatch.setattr(tr.SshTransport, "_open_channel", spy_open)
    monkeypatch.setattr(tr.SshTransport, "run", spy_run)
    return rec


def _host_state() -> dict[str, Any]:
    return {
        "opt_qairt": Path("/opt/qairt").exists(),
        "fastrpc_group": "fastrpc:" in Path("/etc/group").read_text(),
        "udev_rules": sorted(p.name for p in Path("/etc/udev/rules.d").glob("*.rules"))
        if Path("/etc/udev/rules.d").is_dir()
        else [],
        "fastrpc_dev": Path("/dev/fastrpc-cdsp").exists(),
    }


@pytest.mark.slow
def test_probe_fix_install_push(evk: EvkBoard, tmp_path: Path, recorded: dict[str, list[Any]]) -> None:
    host_before = _host_state()
    set_secret(board_password_key("evk"), CANARY)  # SSH password auth (stored in the keyring)
    settings = settings_with("evk", evk.board_config(auth="password"))
    logs: list[str] = []
    results: list[dict[str, Any]] = []
    zip_path = build_qairt_zip(tmp_path / "v2.45.0.260326.zip")
    bundle = make_device_bundle(tmp_path / "bundle")

    async def flow() -> None:
        seen: list[str] = []

        def trust(host: str, port: int, key_type: str, fp: str) -> bool:
            seen.append(fp)
            return fp == evk.server.host_key_fingerprint

        board = await open_board("evk", settings, trust=trust)
        assert seen == [evk.server.host_key_fingerprint]  # first contact asked, with the SHA256 fingerprint

        # 1. the doctor finds the board's real faults, with evidence and a fix for each
        r1 = await probe(board)
        fails = {c.id for c in r1.checks if c.status == "fail"}
        assert fails == SHIPPED_FAULTS, [(c.id, c.status, c.message) for c in r1.checks]
        dev = r1.by_id("fastrpc_device")
        assert dev.fix == "udev_rule" and "crw------- root root denied" in dev.evidence[0].output
        assert r1.by_id("soc").message.startswith("QCS9075 (soc_id 676), Hexagon v73")
        assert r1.facts["dsp_arch"] == "v73" and r1.facts["sudo"] == "password"
        assert {c.fix for c in r1.checks if c.status == "fail"} == {
            # cdsp1 offline: started, not a reboot that leaves it offline again; its daemon (cdsp1rpcd failed)
            # asks for the same, since a restart does nothing while the DSP is offline
            "dsp_start",
            "group_add",
            "udev_rule",
            "qairt_install",
        }
        assert r1.by_id("fastrpc_daemons").fix == "dsp_start", r1.by_id("fastrpc_daemons").message
        assert all(c.evidence and c.evidence[0].command for c in r1.checks if c.status != "skip")

        # 2. QAIRT from the SDK zip: only what the board needs
        plan = await plan_qairt_install(board, zip_path, bundle_dir=bundle)
        assert any("tar -xf" in c for c in plan.commands) and any(
            "ln -sfn 2.45.0.260326" in c for c in plan.commands
        )
        uploads: list[tuple[int, int, str]] = []
        res = await apply_fix(
            board,
            plan,
            sudo_password=CANARY,
            on_log=logs.append,
            on_progress=lambda d, t, w: uploads.append((d, t, w)),
        )
        results.append(res.to_dict())
        assert res.status == "applied", res.message
        # the SDK upload reported its bytes (start and end at least; throttled in between)
        tar_size = uploads[-1][1]
        assert uploads[0][0] == 0 and uploads[-1][0] == tar_size > 0 and "uploading" in uploads[-1][2]
        assert all(a[0] <= b[0] for a, b in itertools.pairwise(uploads))
        again = await apply_fix(board, plan, sudo_password=CANARY)
        assert again.status == "already"
        # now the HTP validator runs (it always exits 0): its text is parsed and its error decoded
        val = {c["id"]: c for c in res.checks}["htp_validator"]
        assert val["status"] == "fail" and "Unit Test" in val["evidence"][0]["output"]
        assert val["explained"][0]["id"] == "fastrpc_ebadfd" and val["fix"] == "group_add"

        # 3. fixes, each re-checking what it affects
        fixed_by = {
            "dsp_start": ("remoteproc",),
            "group_add": ("fastrpc_group", "fastrpc_member", "fastrpc_login"),
            "udev_rule": ("udev_rule", "fastrpc_device", "dma_heap"),
            "daemon_restart": ("fastrpc_daemons",),
            # cdsp1 comes back running: the rule dsp_start installed starts it at boot
            "reboot": ("remoteproc", "fastrpc_device", "fastrpc_daemons", "fastrpc_login"),
        }
        for fid, checks in fixed_by.items():
            plan = await plan_fix(board, fid, r1)
            assert plan.commands
            res = await apply_fix(board, plan, sudo_password=CANARY, on_log=logs.append)
            results.append(res.to_dict())
            assert res.status == "applied", res.message
            after = {c["id"]: c["status"] for c in res.checks}  # re-checked right after the fix
            assert all(after[c] == "ok" for c in checks), (fid, res.checks)
        assert "plan: sudo groupadd --system fastrpc" in logs
        assert "plan: sudo usermod -aG fastrpc evk" in logs
        assert evk.reboot_count() >= 2  # the reboot really dropped sshd, and we reconnected
        # idempotent: a second run changes nothing
        again = await apply_fix(board, await plan_fix(board, "group_add"), sudo_password=CANARY)
        assert again.status == "already"

        # 4. the doctor passes, the HTP validator's text parsed
        r2 = await probe(board)
        assert r2.clean, [(c.id, c.status, c.message) for c in r2.checks if c.status != "ok"]
        # every check passes; GenieX (an optional runtime this board does not use) is skipped when absent
        assert all(c.status == "ok" or (c.id, c.status) == ("geniex", "skip") for c in r2.checks), [
            (c.id, c.message) for c in r2.checks if c.status != "ok"
        ]
        assert r2.facts["qairt_version"] == "2.45.0.260326"
        assert r2.facts["htp_validator"]["Unit Test"] == "Passed"

        # 5. push, then push again: nothing sent
        p1 = await push_bundle(board, bundle, "test-bundle")
        assert p1.sent_files == 7 and p1.skipped_files == 0 and p1.warnings == []
        p2 = await push_bundle(board, bundle, "test-bundle")
        assert (p2.sent_files, p2.sent_bytes, p2.skipped_files) == (0, 0, 7)
        sums = await board.transport.run(
            [
                "sha256sum",
                "--",
                *[
                    f"{p1.remote_dir}/{f['path']}"
                    for f in json.loads((bundle / "bundle.json").read_text())["files"]
                ],
            ]
        )
        for f in json.loads((bundle / "bundle.json").read_text())["files"]:
            assert f["sha256"] in sums.stdout

        # 6. refusals before anything is sent
        newer = make_device_bundle(tmp_path / "newer", qairt="2.46.0.260501000000", part_bytes=10)
        with pytest.raises(BoardError, match="err 5000"):
            await push_bundle(board, newer, "newer")
        with pytest.raises(BoardError, match=r"older than the QAIRT 2\.46"):
            await plan_qairt_install(board, zip_path, bundle_dir=newer)
        v79 = make_device_bundle(tmp_path / "v79", dsp_arch="v79", part_bytes=10)
        with pytest.raises(BoardError, match="pinned to its dsp_arch"):
            await push_bundle(board, v79, "v79")
        assert not await board.transport.exists(f"{await board.transport.home()}/hexstudio/bundles/newer")
        await board.transport.close()

    asyncio.run(flow())

    # the board's own files changed; this machine's did not
    assert "fastrpc:" in (evk.root / "etc" / "group").read_text()
    listing = evk.root_run(
        "find /opt/qairt -type f | sort; readlink /opt/qairt/current; ls -l /dev/fastrpc-cdsp"
    )
    files = listing.stdout
    assert "/opt/qairt/2.45.0.260326/lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so" in files
    assert "/opt/qairt/2.45.0.260326/bin/aarch64-oe-linux-gcc11.2/genie-t2t-run" in files
    assert (
        "hexagon-v75" not in files
        and "x86_64" not in files
        and "android" not in files
        and "docs" not in files
    )
    assert "\n2.45.0.260326\n" in files and "crw-rw---- 1 root fastrpc" in files
    assert _host_state() == host_before

    # the password went to sudo on stdin only: never in a command line, a log line or a result
    assert any(CANARY.encode() in s for s in recorded["stdin"])
    assert not [c for c in recorded["commands"] if CANARY in c]
    assert not [ln for ln in logs if CANARY in ln]
    assert CANARY not in json.dumps(results)


def test_board_stage_writes_doctor_snapshot_without_secrets(evk: EvkBoard, tmp_path: Path) -> None:
    """Runs after the flow above on the same (now fixed) board: the Board stage of a run probes, pushes and
    records the doctor in board.json; the password is in none of the run's files."""
    from hexstudio.core import logs as studio_logs
    from hexstudio.core.device.stage import run_board_stage
    from hexstudio.core.runs import Workspace
    from hexstudio.core.stage_api import StageContext
    from hexstudio.core.stages import get_stage

    studio_logs.setup_logging(
        "gui"
    )  # the studio's log: board connect and push are logged, never the password
    set_secret(board_password_key("evk"), CANARY)
    settings = settings_with("evk", evk.board_config(auth="password"))

    trust_once(evk, settings)
    m, out, events, doc_ret = run_board_stage_of_new_run(tmp_path)
    assert doc_ret["simulated"] is False
    doc = json.loads((out / "board.json").read_text())
    assert doc["simulated"] is False and doc["label"].startswith("ssh://evk@127.0.0.1:")
    ids = {c["id"]: c for c in doc["doctor"]}
    assert ids["htp_validator"]["status"] == "ok" and ids["soc"]["evidence"][0]["output"].startswith("676")
    assert doc["push"]["sent_files"] == 7
    m.save()
    everything = "\n".join(
        p.read_text(errors="replace")
        for p in Workspace().root.rglob("*")
        if p.is_file() and p.suffix in (".json", ".jsonl", ".log", ".txt")
    )
    assert CANARY not in everything and CANARY not in json.dumps(events)
    studio_log = studio_logs.log_path().read_text()
    assert "board evk: connected" in studio_log and "push to" in studio_log and CANARY not in studio_log
    studio_logs.close_logging()

    # an AI Hub EMULATOR bundle is refused by the stage on this (real, not allow-listed) board
    from hexstudio.core.stage_api import StageError

    emu_dir = make_device_bundle(tmp_path / "emulated" / "bundle", part_bytes=1000)
    emu_doc = json.loads((emu_dir / "bundle.json").read_text())
    (emu_dir / "bundle.json").write_text(json.dumps({**emu_doc, "emulated": True}))
    ctx = StageContext(
        m, get_stage("board"), out, {"compile": emu_dir.parent}, events.append, asyncio.Event()
    )
    with pytest.raises(StageError) as ei:
        asyncio.run(run_board_stage(ctx))
    assert ei.value.code == "emulated_bundle" and "EMULATOR" in ei.value.message
