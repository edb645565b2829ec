"""A board where the user has no sudo: the doctor says so, fixes return the commands to run by hand
(nothing half-done), and the CLI (add, probe, fix --dry-run, fix) works against it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexstudio.core.device.board import open_board
from hexstudio.core.device.doctor import probe
from hexstudio.core.device.fixes import Step, apply_fix, by_hand, plan_fix
from tests.board.conftest import settings_with
from tests.support.cli import python_m_hexstudio
from tests.support.evk_board import EvkBoard

PW = "no-sudo-pw"


@pytest.fixture(scope="module")
def nosudo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvkBoard]:
    with EvkBoard(tmp_path_factory.mktemp("nosudo"), sudo=False, sudo_password=PW) as b:
        yield b


def test_fixes_become_manual_commands(nosudo: EvkBoard) -> None:
    settings = settings_with("nos", nosudo.board_config())

    async def go() -> None:
        board = await open_board("nos", settings, trust=lambda *a: True)
        r = await probe(board)
        assert r.by_id("sudo").status == "warn" and r.facts["sudo"] == "unknown"
        plan = await plan_fix(board, "group_add", r)
        res = await apply_fix(board, plan)  # no password
        assert res.status == "manual"
        assert res.manual_commands == ["sudo groupadd --system fastrpc", "sudo usermod -aG fastrpc evk"]
        # how to make it work next time: the sudo password stored, named with the board's own name
        assert "`hexstudio board password nos --sudo`" in res.message, res.message
        # a copy by hand is run on this workstation, to the board's own address (not "BOARD:")
        t, cfg = board.transport, board.config
        step = Step("upload", path="/home/evk/q.tar", local=Path("/ws/q.tar"))
        key = f"-i {cfg['key_path']} " if cfg.get("key_path") else ""
        want = f"scp -P {t.port} {key}/ws/q.tar {t.user}@{t.host}:/home/evk/q.tar   # on this workstation"
        assert by_hand(step, board) == want, by_hand(step, board)
        # an IPv6 address in brackets (scp reads "fe80::1:/path" as host "fe80"), an ssh alias as it is
        board.config = {**cfg, "host": "fe80::1"}
        assert f"'{t.user}@[fe80::1]':/home/evk/q.tar" in by_hand(step, board)  # quoted: a shell globs [...]
        board.config = {**cfg, "user": "corp\\jdoe"}  # a domain user: its backslash survives the paste
        assert f"'corp\\jdoe@{t.host}':/home/evk/q.tar" in by_hand(step, board), by_hand(step, board)
        board.config = {**cfg, "ssh_alias": "evk-lab"}
        assert by_hand(step, board) == "scp /ws/q.tar evk-lab:/home/evk/q.tar   # on this workstation"
        board.config = cfg
        res = await apply_fix(board, plan, sudo_password=PW)  # the right password, but no sudo right
        assert res.status == "manual" and "may not use sudo" in res.message
        assert PW not in json.dumps(res.to_dict())
        udev = await apply_fix(board, await plan_fix(board, "udev_rule", r))
        assert udev.status == "manual"
        # one command writes the rule: an administrator may not write this user's home (~/.hexstudio/tmp)
        assert any(
            c.startswith("sudo tee /etc/udev/rules.d/61-hexstudio-fastrpc.rules >/dev/null <<'EOF'\n")
            and 'GROUP="fastrpc"' in c
            for c in udev.manual_commands
        ), udev.manual_commands
        assert not any(".hexstudio" in c for c in udev.manual_commands), udev.manual_commands
        dsp = await apply_fix(board, await plan_fix(board, "dsp_start", r))
        assert dsp.status == "manual" and dsp.manual_commands[0] == (
            "echo start | sudo tee /sys/class/remoteproc/remoteproc2/state"  # cdsp1 only: cdsp is running
        ), dsp.manual_commands
        assert dsp.manual_commands[1].startswith("sudo tee /etc/udev/rules.d/59-hexstudio-dsp-start.rules")
        assert 'SUBSYSTEM=="remoteproc"' in dsp.manual_commands[1] and len(dsp.manual_commands) == 2
        reboot = await apply_fix(board, await plan_fix(board, "reboot", r))
        assert reboot.status == "manual" and reboot.manual_commands[0].startswith("sudo reboot")
        pk = await plan_fix(board, "fastrpc_packages", r)
        assert (
            any(c.startswith("sudo apt-get install -y ") for c in pk.commands)
            and "sudo ldconfig" in pk.commands
        )
        pk_res = await apply_fix(board, pk)
        # libcdsprpc is already resolvable: nothing to do, so no sudo is needed and nothing is listed
        assert pk_res.status == "already" and pk_res.manual_commands == []
        after = await probe(board, only=["remoteproc", "fastrpc_group", "udev_rule"])
        assert [c.status for c in after.checks] == ["fail", "fail", "fail"]  # nothing was half-done
        await board.transport.close()

    asyncio.run(go())
    assert "fastrpc:" not in (nosudo.root / "etc" / "group").read_text()
    assert nosudo.reboot_count() == 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return python_m_hexstudio(*args, timeout=120, main=True)


def test_cli_add_probe_fix(nosudo: EvkBoard, tmp_path: Path) -> None:
    fp = nosudo.server.host_key_fingerprint
    add = ["board", "add", "cli", "--host", nosudo.host, "--port", str(nosudo.port), "--user", "evk"]
    add += ["--key", str(nosudo.server.client_key_path), "--json"]
    r = _cli(*add)
    assert r.returncode == 1 and fp in r.stderr  # unknown key: the fingerprint is shown
    r = _cli(*add, "--trust", fp)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "ready"
    r = _cli("board", "list", "--json")
    assert [b["name"] for b in json.loads(r.stdout)["boards"]] == ["sim", "cli"]
    r = _cli("board", "probe", "cli", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["clean"] is False and doc["simulated"] is False
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["fastrpc_device"]["status"] == "fail" and checks["fastrpc_device"]["fix"] == "udev_rule"
    assert checks["fastrpc_device"]["evidence"][0]["command"].startswith("for f in /dev/fastrpc-cdsp*")
    assert set(checks) >= {
        "soc",
        "os",
        "qairt",
        "genie",
        "fastrpc_userspace",
        "fastrpc_group",
        "fastrpc_member",
        "fastrpc_login",
        "udev_rule",
        "fastrpc_daemons",
        "remoteproc",
        "qairt_env",
        "qnn_libs_mixed",
        "htp_validator",
        "memory",
        "sudo",
    }
    r = _cli("board", "fix", "cli", "daemon_restart", "--dry-run", "--json")
    assert json.loads(r.stdout)["plan"]["commands"] == [
        "sudo systemctl restart cdsprpcd.service",
        "sudo systemctl restart cdsp1rpcd.service",
    ]
    r = _cli("board", "fix", "cli", "daemon_restart", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["status"] == "manual"
    assert doc["manual_commands"] == ["sudo systemctl restart cdsp1rpcd.service"]  # cdsprpcd is running
    r = _cli("board", "probe", "cli", "--only", "nonsense", "--json")
    assert r.returncode == 2
