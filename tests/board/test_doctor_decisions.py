"""The doctor's choice of fix from what a board answered: each check here runs on canned command output (a
_Probe whose shell answers from a table), so a rule can be read beside the answers that decide it."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device import doctor
from hexstudio.core.device.doctor import Check, Evidence


class CannedProbe(doctor._Probe):
    """A probe whose commands answer from `answers` (first matching prefix of the script)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.facts: dict[str, Any] = {}
        self.tasks: dict[str, asyncio.Task[Check]] = {}

    async def sh(self, script: str, *args: str, timeout: float = 60, shown: str | None = None) -> Evidence:
        out = next(v for k, v in self.answers.items() if script.startswith(k))
        return Evidence(script, 0, out)


def device_check(nodes: str, user_groups: str) -> Check:
    p = CannedProbe(
        {"for f in /dev/fastrpc-cdsp": nodes, "id -un": "evk", "getent group fastrpc": user_groups}
    )
    c = Check("fastrpc_device", "FastRPC device")
    asyncio.run(doctor._fastrpc_device(p, c))
    return c


@pytest.mark.parametrize(
    ("nodes", "members", "fix"),
    [
        # root-only nodes: only a udev rule gives them to the group
        ("/dev/fastrpc-cdsp crw------- root root denied", "fastrpc:x:990:evk", "udev_rule"),
        # the group's nodes (the package's rule did its part), the user not in the group: add them
        ("/dev/fastrpc-cdsp crw-rw---- root fastrpc denied", "fastrpc:x:990:", "group_add"),
        # in the group, but this login started before: log in again
        ("/dev/fastrpc-cdsp crw-rw---- root fastrpc denied", "fastrpc:x:990:evk", "relogin"),
    ],
    ids=["root-only", "not a member", "member, old login"],
)
def test_a_denied_node_gets_the_fix_its_cause_needs(nodes: str, members: str, fix: str) -> None:
    """Every denied node was sent to udev_rule: for nodes the fastrpc group already owns that fix was applied
    ("the rule differs"), changed nothing, and the check recommended it again, in a loop."""
    c = device_check(nodes, members)
    assert c.status == "fail" and c.fix == fix, (c.fix, c.message)
    assert "cannot open /dev/fastrpc-cdsp" in c.message


def test_an_open_node_passes() -> None:
    c = device_check("/dev/fastrpc-cdsp crw-rw---- root fastrpc open", "fastrpc:x:990:evk")
    assert c.status == "ok" and c.fix is None


async def choose(failing: dict[str, str], fix_ids: list[str]) -> str:
    """The validator's fix when the probe's cause checks ran: `failing` (check id: its fix) failed, the rest passed."""

    async def ran(c: Check) -> Check:
        return c

    p = CannedProbe({})
    for cid in doctor._CAUSE_CHECKS:
        c = Check(cid, cid, status="fail" if cid in failing else "ok", fix=failing.get(cid))
        p.tasks[cid] = asyncio.ensure_future(ran(c))
    return await doctor._first_failing_fix(p, fix_ids)


@pytest.mark.parametrize(
    ("failing", "fix"),
    [
        ({"fastrpc_device": "udev_rule"}, "udev_rule"),
        ({"fastrpc_daemons": "daemon_restart"}, "daemon_restart"),
        ({}, "fastrpc_packages"),  # nothing else failed: the error's own first fix
    ],
    ids=["device access", "daemons", "nothing else"],
)
def test_the_validators_fix_is_the_one_another_check_also_asks_for(failing: dict[str, str], fix: str) -> None:
    """14001 lists fastrpc_packages first; with libcdsprpc installed that fix says "nothing to do" while the cause
    (the device's access, the daemons) went unnamed."""
    from hexstudio.core.device.explain import explain

    fix_ids = list(next(m for m in explain("Failed to create device: 14001")).fix_ids)
    assert fix_ids[0] == "fastrpc_packages" and fix in fix_ids, fix_ids
    assert asyncio.run(choose(failing, fix_ids)) == fix


def daemons_check(answer: str) -> Check:
    p = CannedProbe({"for s in cdsprpcd cdsp1rpcd": answer})
    c = Check("fastrpc_daemons", "FastRPC daemons")
    asyncio.run(doctor._fastrpc_daemons(p, c))
    return c


def test_a_daemon_that_is_not_installed_asks_for_the_packages_not_a_restart() -> None:
    """Debian's split: libfastrpc1 without fastrpc-support. is-active says "inactive" for a unit that does not
    exist, so the doctor sent the user to daemon_restart, which failed with "Unit ... not found"."""
    c = daemons_check("cdsprpcd not-found inactive\ncdsp1rpcd not-found inactive")
    assert c.status == "fail" and c.fix == "fastrpc_packages", (c.fix, c.message)
    assert "cdsprpcd.service, cdsp1rpcd.service is not installed" in c.message, c.message
    c = daemons_check("cdsprpcd loaded active\ncdsp1rpcd loaded failed")
    assert c.fix == "daemon_restart" and "cdsp1rpcd is failed" in c.message, c.message
    c = daemons_check("cdsprpcd loaded active\ncdsp1rpcd loaded active")
    assert c.status == "ok"


@pytest.mark.parametrize(
    ("answer", "members", "status", "fix"),
    [
        ("/dev/dma_heap/system crw------- root root denied", "fastrpc:x:990:evk", "fail", "udev_rule"),
        (
            "/dev/dma_heap/system crw-rw---- root root denied\n  acl group:fastrpc:rw-",
            "fastrpc:x:990:",
            "fail",
            "group_add",
        ),
        ("/dev/dma_heap/system crw-rw-rw- root root open", "fastrpc:x:990:evk", "ok", None),
        ("/dev/dma_heap/system missing", "fastrpc:x:990:evk", "warn", None),
    ],
    ids=["root-only", "ACL, not a member", "open", "no heap"],
)
def test_the_dma_heap_is_checked_as_the_fastrpc_nodes_are(
    answer: str, members: str, status: str, fix: str | None
) -> None:
    """FastRPC's buffers come from /dev/dma_heap/system, root-only under fastrpc udev rules before 1.0.6-1
    (facts/board.md); nothing checked it, and the udev fix's part for it was never verified."""
    p = CannedProbe({"f=/dev/dma_heap/system": answer, "id -un": "evk", "getent group fastrpc": members})
    c = Check("dma_heap", "dma heap")
    asyncio.run(doctor._dma_heap(p, c))
    assert (c.status, c.fix) == (status, fix), c.message


def test_root_steps_run_without_a_time_limit_where_the_board_has_no_timeout_k() -> None:
    """An old BusyBox `timeout` has no -k: every root step failed with its usage text."""
    from types import SimpleNamespace

    from hexstudio.core.device.fixes import _Runner

    sent: list[list[str]] = []

    class Transport:
        async def run(self, argv: list[str], **_kw: Any) -> Any:
            sent.append(argv)
            code = 1 if argv[:1] == ["timeout"] else 0
            return SimpleNamespace(exit_status=code, stdout="", stderr="")

    rn = _Runner(SimpleNamespace(transport=Transport(), name="b"), None, None)  # type: ignore[arg-type]
    rn.sudo_mode = "nopasswd"
    assert asyncio.run(rn.run(["apt-get", "update"], True, 60)) == (0, "")
    assert sent[-1] == ["sudo", "-n", "--", "apt-get", "update"], sent


def remoteproc_check(answer: str) -> tuple[Check, dict[str, Any]]:
    p = CannedProbe({"for r in /sys/class/remoteproc": answer})
    c = Check("remoteproc", "DSP remote processors")
    asyncio.run(doctor._remoteproc(p, c))
    return c, p.facts


def test_an_offline_dsp_is_started_not_rebooted() -> None:
    """qualcomm-linux/kernel#923 (qualcomm/fastrpc 59-fastrpc-remoteproc.rules): a DSP the kernel booted before its
    firmware could be read stays offline, at every boot, so "reboot the board" never helped."""
    rp = "/sys/class/remoteproc/remoteproc"
    c, facts = remoteproc_check(f"adsp running {rp}0\ncdsp running {rp}1\ncdsp1 offline {rp}2")
    assert c.status == "fail" and c.fix == "dsp_start", (c.fix, c.message)
    assert "cdsp1 offline" in c.message and "kernel#923" in c.message
    assert facts["remoteproc_paths"]["cdsp1"] == f"{rp}2" and facts["remoteproc"]["cdsp1"] == "offline"
    c, _ = remoteproc_check(f"cdsp crashed {rp}1\ncdsp1 offline {rp}2")  # a crash: only a reboot recovers it
    assert c.fix == "reboot" and "cdsp, cdsp1 not running (crashed, offline)" in c.message, c.message
    c, _ = remoteproc_check(f"cdsp running {rp}1\ncdsp1 running {rp}2")
    assert c.status == "ok" and c.fix is None


def udev_check(answer: str, **login: str) -> Check:
    p = CannedProbe({'seen=" "; for d in': answer, **(login_answers(**login) if login else DENIED)})
    c = Check("udev_rule", "FastRPC udev rule")
    asyncio.run(doctor._udev_rule(p, c))
    return c


RULE = 'KERNEL=="fastrpc-cdsp", GROUP="fastrpc", MODE="0660"'
DENIED = {
    "for f in /dev/fastrpc-cdsp": "/dev/fastrpc-cdsp crw------- root root denied",
    "f=/dev/dma_heap/system": "",
}


def login_answers(user: str, uid: int, nodes: str = "open", members: str = "") -> dict[str, str]:
    """What a board answers the FastRPC checks for `user`, who can (or cannot) open the nodes."""
    mode = "crw-------" if user == "root" else "crw-rw-rw-"
    return {
        "for f in /dev/fastrpc-cdsp": f"/dev/fastrpc-cdsp {mode} root root {nodes}",
        "f=/dev/dma_heap/system": f"/dev/dma_heap/system {mode} root root {nodes}",
        "id -un": user,
        "id": f"uid={uid}({user}) gid={uid}({user}) groups={uid}({user})",
        "getent group fastrpc": f"fastrpc:x:990:{members}",
    }


@pytest.mark.parametrize("check", ["fastrpc_group", "fastrpc_member", "fastrpc_login", "udev_rule"])
@pytest.mark.parametrize(("user", "uid"), [("root", 0), ("evk", 1000)])
def test_a_login_that_opens_the_nodes_already_is_not_held_by_the_group_checks(
    check: str, user: str, uid: int
) -> None:
    """Root, or a user whom the nodes' mode lets in, opens /dev/fastrpc-cdsp without the fastrpc group: the group
    checks failed all the same, and the Board stage stopped at a doctor that asked for fixes Genie does not need."""
    answers = login_answers(user, uid)
    if check == "fastrpc_group":
        answers["getent group fastrpc"] = ""
    p = CannedProbe({'seen=" "; for d in': "", **answers})
    c = Check(check, check)
    asyncio.run(doctor._FUNCS[check](p, c))
    if check == "udev_rule" and user != "root":  # open now, but a reboot may make the nodes root-only again
        assert (c.status, c.fix) == ("warn", "udev_rule"), c.message
        assert "after a reboot" in c.message
        return
    assert (c.status, c.fix) == ("ok", None), c.message
    assert c.message.startswith("Not needed: ")
    assert ("root opens" if user == "root" else "this user opens") in c.message
    # the same login, denied: the checks fail and name their fix as before
    denied = CannedProbe({'seen=" "; for d in': "", **login_answers(user, uid, nodes="denied")})
    if check == "fastrpc_group":
        denied.answers["getent group fastrpc"] = ""
    c = Check(check, check)
    asyncio.run(doctor._FUNCS[check](denied, c))
    assert c.status == "fail" and c.fix in ("group_add", "relogin", "udev_rule"), c.message


def test_a_rule_that_opens_the_node_to_all_passes() -> None:
    assert udev_check('/usr/lib/udev/rules.d/60-x.rules:KERNEL=="fastrpc-cdsp", MODE="0666"').status == "ok"


def test_an_earlier_rule_that_hides_the_packages_rule_is_moved() -> None:
    """HexStudio wrote its rule as /etc/udev/rules.d/60-fastrpc.rules, the name of the fastrpc package's own file
    in /usr/lib/udev/rules.d: udev then reads only the one in /etc, and the package's adsp, gdsp, sdsp and -secure
    nodes lose their group."""
    old = "/etc/udev/rules.d/60-fastrpc.rules"
    ours = f"{old}:{RULE}\n{old}:#ours"
    hidden = "/usr/lib/udev/rules.d/60-fastrpc.rules:#hidden"
    package = f"/usr/lib/udev/rules.d/60-fastrpc.rules:{RULE}"
    c = udev_check(f"{ours}\n{hidden}")
    assert c.status == "warn" and c.fix == "udev_rule", (c.status, c.message)
    assert "hides the fastrpc package's own 60-fastrpc.rules" in c.message
    assert "61-hexstudio-fastrpc.rules" in c.message
    assert udev_check(ours).status == "ok"  # nothing of the package's to hide
    assert udev_check(package).status == "ok"  # the package's own rule
    assert udev_check(f"{old}:{RULE}\n{hidden}").status == "ok"  # an administrator's own file, not ours
    assert udev_check("").fix == "udev_rule"
    assert udev_check(hidden).fix == "udev_rule"  # the package's rule, turned off (a /dev/null link in /etc)


def test_the_rule_reader_reads_what_udev_reads(tmp_path: Path) -> None:
    """A file in /etc hides the file of the same name in /usr/lib (an administrator's, or a /dev/null link that
    turns a rule off), and a commented line is no rule: the checks read the rules as udev does."""
    etc, lib = tmp_path / "etc", tmp_path / "lib"
    etc.mkdir()
    lib.mkdir()
    (lib / "60-fastrpc.rules").write_text(f"{RULE}\n")
    (lib / "59-fastrpc-remoteproc.rules").write_text(
        'ACTION=="add", SUBSYSTEM=="remoteproc", ATTR{state}="start"\n'
    )
    (etc / "59-fastrpc-remoteproc.rules").symlink_to("/dev/null")  # turned off
    (etc / "70-mine.rules").write_text(f"# {RULE}\n")  # a comment only

    def read(pattern: str) -> list[str]:
        script = doctor.udev_rule_lines(pattern, (str(etc), str(lib)))
        return subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, check=True
        ).stdout.splitlines()

    hidden = f"{lib}/59-fastrpc-remoteproc.rules:#hidden"  # every hidden file is named, whatever the pattern
    assert read("fastrpc-cdsp") == [hidden, f"{lib}/60-fastrpc.rules:{RULE}"]
    assert read('SUBSYSTEM=="remoteproc"') == [hidden]  # no rule udev reads starts a DSP


def genie_check(output: str) -> Check:
    """The genie check on canned output of `genie-t2t-run -h`, QAIRT found."""

    async def go() -> Check:
        async def ran(c: Check) -> Check:
            return c

        async def home() -> str:
            return "/home/evk"

        p = CannedProbe({'[ -f "$1" ]': output})
        p.facts["qairt_home"] = "/opt/qairt/2.45.0"
        p.tasks["qairt"] = asyncio.ensure_future(ran(Check("qairt", "QAIRT", status="ok")))
        p.home = home  # type: ignore[method-assign]
        c = Check("genie", "genie-t2t-run")
        await doctor._genie(p, c)
        return c

    return asyncio.run(go())


def test_a_genie_that_cannot_start_fails_its_check() -> None:
    """`command -v genie-t2t-run && genie-t2t-run -h | head` exits with head's status, and `command -v` prints
    the path: a genie-t2t-run whose libraries cannot be loaded passed as "runs: /opt/qairt/.../genie-t2t-run"."""
    broken = (
        "genie-t2t-run: error while loading shared libraries: libatomic.so.1: cannot open shared object file: "
        "No such file or directory"
    )
    c = genie_check(broken)
    assert c.status == "fail" and c.fix == "qairt_env", (c.status, c.message)
    ok = genie_check("Usage: genie-t2t-run [-c CONFIG] [-p PROMPT | --prompt_file FILE] [--profile FILE]")
    assert ok.status == "ok" and "Usage: genie-t2t-run" in ok.message, ok.message


def test_with_a_dsp_offline_its_node_and_daemon_ask_for_it_to_be_started() -> None:
    """With cdsp1 left offline at boot (kernel#923), the daemons check asked for a restart, which systemd skips
    while the DSP's node is missing (ConditionPathExists), and a missing node asked for a reboot, which leaves the
    DSP offline again: both ask for dsp_start now, as the DSP check does."""
    rp = "/sys/class/remoteproc/remoteproc"
    offline = {"for r in /sys/class/remoteproc": f"cdsp offline {rp}1\ncdsp1 offline {rp}2"}
    p = CannedProbe(
        {**offline, "for s in cdsprpcd cdsp1rpcd": "cdsprpcd loaded inactive\ncdsp1rpcd loaded inactive"}
    )
    c = Check("fastrpc_daemons", "FastRPC daemons")
    asyncio.run(doctor._fastrpc_daemons(p, c))
    assert c.status == "fail" and c.fix == "dsp_start" and "DSP is offline" in c.message, (c.fix, c.message)
    p = CannedProbe(
        {**offline, "for f in /dev/fastrpc-cdsp": "", "id -un": "evk", "getent group fastrpc": ""}
    )
    c = Check("fastrpc_device", "FastRPC device")
    asyncio.run(doctor._fastrpc_device(p, c))
    assert c.status == "fail" and c.fix == "dsp_start", (c.fix, c.message)
    # the DSPs running: a daemon that is down is restarted, as before
    up = {"for r in /sys/class/remoteproc": f"cdsp running {rp}1\ncdsp1 running {rp}2"}
    p = CannedProbe({**up, "for s in cdsprpcd cdsp1rpcd": "cdsprpcd loaded failed\ncdsp1rpcd loaded active"})
    c = Check("fastrpc_daemons", "FastRPC daemons")
    asyncio.run(doctor._fastrpc_daemons(p, c))
    assert c.fix == "daemon_restart", c.message
