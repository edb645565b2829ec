"""Board doctor: checks an EVK (QCS9075 and kin) for what Genie on the HTP needs (facts/board.md).

    report = await probe(board)                       # every check
    report = await probe(board, only={"fastrpc_device"}) # some checks (after a fix)
    report.to_dict() -> {"board", "label", "simulated", "checks": [...], "summary", "facts"}

Each check: {id, title, status ok|warn|fail|skip, message, evidence: [{command, exit_status, output}],
fix (a fix id of hexstudio.core.device.fixes, or null), explained: [decoded errors]}.
Commands are argv lists run through the board's transport; the shell snippets below are constants
(never built from user text); the user name is passed as a positional argument.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import Board
from hexstudio.core.device.errors import BoardError
from hexstudio.core.device.explain import explain
from hexstudio.core.device.qairt import parse_version
from hexstudio.core.device.verify import verify_pushed
from hexstudio.shared.bundle import bundle_qairt_version
from hexstudio.shared.bundle.check import check_bundle, errors, report_text
from hexstudio.shared.bundle.geniex import CLI_VERSION, QAIRT_PLUGIN_VERSION

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"

# soc_id -> (chip, dsp_arch)
SOC_IDS: dict[str, tuple[str, str]] = {
    "676": ("QCS9075", "v73"),
    "667": ("QCS9100", "v73"),
    "534": ("SA8775P", "v73"),
}
QAIRT_ROOTS = ("/opt/qairt", "/opt/qcom/aistack/qairt")
ENV_SCRIPT = "qairt-env.sh"
# HexStudio's rule under its own name: one named as the fastrpc package's (its 60-fastrpc.rules, in /usr/lib/udev)
# would hide that file whole, with its adsp, gdsp, sdsp and -secure nodes (udev: a file in /etc replaces the file
# of the same name in /usr/lib). Earlier versions wrote OLD_UDEV_RULE: the udev_rule fix takes it away.
UDEV_RULE = "/etc/udev/rules.d/61-hexstudio-fastrpc.rules"
OLD_UDEV_RULE = "/etc/udev/rules.d/60-fastrpc.rules"
UDEV_MARK = "written by HexStudio"
# udev's rules folders, first the one whose file hides a file of the same name in the others
UDEV_DIRS = (
    "/etc/udev/rules.d",
    "/run/udev/rules.d",
    "/usr/local/lib/udev/rules.d",
    "/lib/udev/rules.d",
    "/usr/lib/udev/rules.d",
)
PACKAGE_UDEV_DIRS = (
    "/lib/udev/rules.d",
    "/usr/lib/udev/rules.d",
)  # where a distribution package puts its rules


def udev_rule_lines(pattern: str, dirs: tuple[str, ...] = UDEV_DIRS) -> str:
    """A shell script: the rule lines udev really reads that match `pattern` (grep -E), as `FILE:LINE`; commented
    lines left out, and a file hidden by one of the same name in an earlier folder (an administrator's, or a
    /dev/null link that turns a rule off) said as `FILE:#hidden` instead of read."""
    return (
        'seen=" "; for d in ' + " ".join(map(shlex.quote, dirs)) + '; do for f in "$d"/*.rules; do '
        '[ -e "$f" ] || [ -L "$f" ] || continue; n=${f##*/}; '
        'case "$seen" in *" $n "*) echo "$f:#hidden"; continue ;; esac; seen="$seen$n "; '
        f'grep -sE {shlex.quote(pattern)} "$f" | grep -v \'^[[:space:]]*#\' | sed "s|^|$f:|"; '
        "done; done"
    )


DAEMONS = ("cdsprpcd", "cdsp1rpcd")
DAEMON_DSP = {"cdsprpcd": "cdsp", "cdsp1rpcd": "cdsp1"}  # the remote processor each daemon serves
MIN_FREE_RAM = 4 << 30
MIN_FREE_DISK = 8 << 30
SBIN_PATH = 'PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"; '


@dataclass
class Evidence:
    command: str
    exit_status: int
    output: str


@dataclass
class Check:
    id: str
    title: str
    status: str = SKIP
    message: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    fix: str | None = None
    explained: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DoctorReport:
    board: str
    label: str
    simulated: bool
    checks: list[Check]
    facts: dict[str, Any]

    def by_id(self, check_id: str) -> Check:
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)

    @property
    def summary(self) -> dict[str, int]:
        out = {OK: 0, WARN: 0, FAIL: 0, SKIP: 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    @property
    def clean(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "board": self.board,
            "label": self.label,
            "simulated": self.simulated,
            "checks": [c.to_dict() for c in self.checks],
            "summary": self.summary,
            "clean": self.clean,
            "facts": self.facts,
        }


# The checks, in the order shown; `AFFECTS` (fixes.py) names which of them a fix changes.
CHECKS: tuple[tuple[str, str], ...] = (
    ("soc", "SoC and Hexagon arch"),
    ("os", "Operating system"),
    ("sudo", "sudo for fixes"),
    ("memory", "Free RAM and disk"),
    ("remoteproc", "DSP remote processors running"),
    ("fastrpc_userspace", "FastRPC userspace (libcdsprpc)"),
    ("fastrpc_group", "fastrpc group exists"),
    ("fastrpc_member", "User in the fastrpc group (/etc/group)"),
    ("fastrpc_login", "fastrpc group in the current login"),
    ("udev_rule", "FastRPC udev rule"),
    ("fastrpc_device", "/dev/fastrpc-cdsp* usable by this user"),
    ("dma_heap", "/dev/dma_heap/system usable by this user"),
    ("fastrpc_daemons", "cdsprpcd / cdsp1rpcd running"),
    ("qairt", "QAIRT runtime installed"),
    ("qairt_env", "QAIRT environment script"),
    ("qnn_libs_mixed", "No QNN libraries mixed from /usr/lib"),
    ("genie", "genie-t2t-run present and runnable"),
    ("htp_validator", "qnn-platform-validator (HTP backend)"),
    ("geniex", "GenieX and its QAIRT plugin (optional runtime)"),
)
CHECK_IDS = tuple(c for c, _ in CHECKS)


class _Probe:
    """Runs board commands once each (memoised), at most a few at a time (sshd's MaxSessions is 10)."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.t = board.transport
        self._memo: dict[str, asyncio.Task[Evidence]] = {}
        self._sem = asyncio.Semaphore(4)
        self.facts: dict[str, Any] = {}
        self.tasks: dict[str, asyncio.Task[Check]] = {}
        self.bundle_dir: Path | None = None  # the local bundle, when the probe is for one

    async def sh(self, script: str, *args: str, timeout: float = 60, shown: str | None = None) -> Evidence:
        """Run a constant shell snippet; user values go in as "$1"... (quoted by the transport)."""
        argv = ["sh", "-c", script, "hexstudio-doctor", *args]
        key = shlex.join(argv)
        if key not in self._memo:
            self._memo[key] = asyncio.ensure_future(self._run(argv, shown or script, timeout))
        return await self._memo[key]

    async def _run(self, argv: list[str], shown: str, timeout: float) -> Evidence:
        async with self._sem:
            r = await self.t.run(argv, timeout=timeout)
        out = (r.stdout + (("\n" if r.stdout and r.stderr else "") + r.stderr if r.stderr else "")).strip()
        return Evidence(shown, r.exit_status, out[-3000:])

    async def user(self) -> str:
        e = await self.sh("id -un")
        if e.exit_status != 0 or not e.output.strip():
            raise RuntimeError(f"`id -un` gave no user name (exit {e.exit_status}): {e.output[-300:]}")
        self.facts["user"] = e.output.strip()
        return str(self.facts["user"])

    async def home(self) -> str:
        return str(await self.t.home())


def _explained(*ev: Evidence) -> list[dict[str, Any]]:
    text = "\n".join(e.output for e in ev)
    return [m.to_dict() for m in explain(text) if m.severity != "info"]


# ---------------------------------------------------------------------------------------------
async def _soc(p: _Probe, c: Check) -> None:
    e = await p.sh("cat /sys/devices/soc0/soc_id /sys/devices/soc0/machine")
    c.evidence.append(e)
    lines = e.output.splitlines()
    if e.exit_status != 0 or not lines:
        c.status, c.message = (
            WARN,
            "Cannot read /sys/devices/soc0: not a Qualcomm SoC board, or an old kernel.",
        )
        return
    soc_id = lines[0].strip()
    machine = lines[1].strip() if len(lines) > 1 else ""
    chip, arch = SOC_IDS.get(soc_id, (machine or f"soc_id {soc_id}", ""))
    p.facts.update({"soc_id": soc_id, "machine": machine, "chip": chip, "dsp_arch": arch or None})
    if arch:
        c.status, c.message = OK, f"{chip} (soc_id {soc_id}), Hexagon {arch}."
    else:
        c.status, c.message = (
            WARN,
            (
                f"Unknown soc_id {soc_id} ({machine}): HexStudio knows QCS9075/QCS9100/SA8775P "
                "(v73). Check the bundle's dsp_arch by hand."
            ),
        )


async def _os(p: _Probe, c: Check) -> None:
    e = await p.sh('. /etc/os-release 2>/dev/null; echo "$PRETTY_NAME"; uname -m; uname -r')
    c.evidence.append(e)
    lines = ([*e.output.splitlines(), "", "", ""])[:3]
    p.facts.update({"os": lines[0], "machine_arch": lines[1], "kernel": lines[2]})
    if lines[1] != "aarch64":
        c.status, c.message = (
            WARN,
            (f"{lines[0]} on {lines[1]}: QAIRT's aarch64-oe-linux-gcc11.2 binaries need an aarch64 board."),
        )
    else:
        c.status, c.message = OK, f"{lines[0]}, {lines[1]}, kernel {lines[2]}."


async def _sudo(p: _Probe, c: Check) -> None:
    e = await p.sh("sudo -n true 2>&1 && echo NOPASSWD; id -nG")
    c.evidence.append(e)
    groups = e.output.splitlines()[-1].split() if e.output else []
    if "NOPASSWD" in e.output:
        p.facts["sudo"] = "nopasswd"
        c.status, c.message = OK, "sudo works without a password."
    elif {"sudo", "admin", "wheel"} & set(groups):
        p.facts["sudo"] = "password"
        c.status, c.message = OK, "sudo available (asks for the user's password)."
    elif "command not found" in e.output or "not found" in e.output:
        p.facts["sudo"] = "none"
        c.status, c.message = WARN, "sudo is not installed: fixes come as commands to run as root by hand."
    else:
        p.facts["sudo"] = "unknown"
        c.status, c.message = (
            WARN,
            (
                "This user is not in the sudo group: fixes come as commands to run by an "
                "administrator (HexStudio will try sudo if you give a password)."
            ),
        )


async def _memory(p: _Probe, c: Check) -> None:
    e = await p.sh("grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; df -Pk \"$HOME\" | tail -n 1")
    c.evidence.append(e)
    kv = dict(re.findall(r"^(\w+):\s+(\d+) kB", e.output, re.M))
    avail = int(kv.get("MemAvailable", 0)) * 1024
    total = int(kv.get("MemTotal", 0)) * 1024
    df = e.output.splitlines()[-1].split() if e.output else []
    disk = int(df[3]) * 1024 if len(df) >= 4 and df[3].isdigit() else 0
    p.facts.update({"mem_total_bytes": total, "mem_available_bytes": avail, "disk_free_bytes": disk})
    msg = f"{avail / 2**30:.1f} GiB RAM available of {total / 2**30:.1f} GiB; {disk / 2**30:.1f} GiB free in home."
    if avail < MIN_FREE_RAM or disk < MIN_FREE_DISK:
        c.status, c.message = WARN, msg + " Low: an 8B bundle needs about 5 GB of RAM and disk."
    else:
        c.status, c.message = OK, msg


async def _offline_dsps(p: _Probe) -> set[str]:
    """The cdsp remote processors the DSP check found offline (none when it could not tell)."""
    await _need(p, "remoteproc")
    states = p.facts.get("remoteproc") or {}
    return {n for n, st in states.items() if n.startswith("cdsp") and st == "offline"}


async def _remoteproc(p: _Probe, c: Check) -> None:
    e = await p.sh(
        'for r in /sys/class/remoteproc/remoteproc*; do [ -e "$r/name" ] || continue; '
        'echo "$(cat "$r/name") $(cat "$r/state") $r"; done'
    )
    c.evidence.append(e)
    rows = [ln.split() for ln in e.output.splitlines()]
    states = {r[0]: r[1] for r in rows if len(r) == 3}
    p.facts["remoteproc"] = states
    p.facts["remoteproc_paths"] = {r[0]: r[2] for r in rows if len(r) == 3}
    dsps = {n: s for n, s in states.items() if n.startswith("cdsp")}
    if not dsps:
        c.status, c.message = WARN, "No cdsp remote processor listed in /sys/class/remoteproc."
        return
    down = [n for n, s in dsps.items() if s != "running"]
    shown = ", ".join(down)
    if down and all(dsps[n] == "offline" for n in down):
        # qualcomm/fastrpc files/59-fastrpc-remoteproc.rules: the kernel boots a DSP before the root filesystem is
        # mounted, its firmware is not found, and it stays offline for that boot (qualcomm-linux/kernel#923)
        c.status, c.fix = FAIL, "dsp_start"
        c.message = (
            f"{shown} offline: the kernel did not start it. Often it tried at boot, before its firmware could be "
            "read, and a reboot does the same again (qualcomm-linux/kernel#923): start it now and install a udev "
            "rule that starts it at every boot."
        )
    elif down:
        c.status, c.fix = FAIL, "reboot"
        c.message = f"{shown} not running ({', '.join(dsps[n] for n in down)}): reboot the board."
    else:
        c.status, c.message = OK, ", ".join(f"{n} {s}" for n, s in sorted(states.items())) + "."


async def _fastrpc_userspace(p: _Probe, c: Check) -> None:
    e = await p.sh(SBIN_PATH + "ldconfig -p | grep -F libcdsprpc")
    c.evidence.append(e)
    if e.exit_status == 0 and "libcdsprpc" in e.output:
        c.status, c.message = OK, "libcdsprpc is resolvable: " + e.output.splitlines()[0].strip()
    else:
        c.status, c.fix = FAIL, "fastrpc_packages"
        c.message = "libcdsprpc.so is not installed (FastRPC userspace): Genie cannot reach the DSP."


async def _group(p: _Probe) -> tuple[Evidence, list[str] | None]:
    e = await p.sh("getent group fastrpc")
    if e.exit_status != 0 or not e.output.startswith("fastrpc:"):
        return e, None
    members = e.output.strip().split(":")[-1]
    return e, [m for m in members.split(",") if m]


async def _fastrpc_group(p: _Probe, c: Check) -> None:
    e, members = await _group(p)
    c.evidence.append(e)
    if members is None:
        c.status, c.fix, c.message = FAIL, "group_add", "There is no fastrpc group."
        await _not_needed(p, c)
    else:
        c.status, c.message = OK, "The fastrpc group exists."


async def _fastrpc_member(p: _Probe, c: Check) -> None:
    user = await p.user()
    e, members = await _group(p)
    c.evidence.append(e)
    if members is None:
        c.status, c.fix, c.message = (
            FAIL,
            "group_add",
            f"{user} cannot be in the fastrpc group: it does not exist.",
        )
    elif user in members:
        c.status, c.message = OK, f"{user} is a member of fastrpc in /etc/group."
    else:
        c.status, c.fix, c.message = FAIL, "group_add", f"{user} is not a member of the fastrpc group."
    await _not_needed(p, c)


async def _fastrpc_login(p: _Probe, c: Check) -> None:
    e = await p.sh("id")
    c.evidence.append(e)
    if re.search(r"\(fastrpc\)", e.output):
        c.status, c.message = OK, "This login has the fastrpc group."
    else:
        c.status, c.fix, why = FAIL, *await _membership(p)
        c.message = f"This login does not have the fastrpc group: {why}"
        await _not_needed(p, c)


async def _opens_already(p: _Probe) -> tuple[bool, str] | None:
    """(root, why) when this login needs no fastrpc group, for it opens the FastRPC nodes already (root does; so
    does a user a node's mode or ACL lets in); None when it does not."""
    dev, heap = await _run_check(p, "fastrpc_device"), await _run_check(p, "dma_heap")
    if dev.status != OK or heap.status == FAIL:  # a heap the kernel lacks (WARN) no group would give
        return None
    if re.match(r"uid=0\(", (await p.sh("id")).output):
        return True, "root opens the FastRPC nodes without it"
    return False, "this user opens the FastRPC nodes already"


async def _not_needed(p: _Probe, c: Check) -> None:
    """A failed group check passes when the login opens the nodes already: its fix would change nothing Genie
    needs, and a user who runs as root, or whom the nodes' mode or ACL lets in, must not be held at the Board
    stage by it."""
    if c.status == FAIL and (opens := await _opens_already(p)):
        c.status, c.fix, c.message = OK, None, f"Not needed: {opens[1]}. ({c.message})"


async def _udev_rule(p: _Probe, c: Check) -> None:
    e = await p.sh(
        udev_rule_lines("fastrpc-cdsp")
        + f"; grep -lsF {shlex.quote(UDEV_MARK)} {OLD_UDEV_RULE} | sed 's|$|:#ours|'"
    )
    c.evidence.append(e)
    out = e.output.splitlines()
    lines = [ln for ln in out if "KERNEL" in ln and "fastrpc-cdsp" in ln]
    name = posixpath.basename(OLD_UDEV_RULE)
    # an earlier HexStudio's rule, named as the package's: it hides the package's whole file
    hides = f"{OLD_UDEV_RULE}:#ours" in out and any(f"{d}/{name}:#hidden" in out for d in PACKAGE_UDEV_DIRS)
    if hides:
        c.status, c.fix = WARN, "udev_rule"
        c.message = (
            f"HexStudio's earlier rule {OLD_UDEV_RULE} hides the fastrpc package's own {name} (its adsp, gdsp, "
            f"sdsp and -secure nodes): the fix moves HexStudio's rule to {UDEV_RULE}."
        )
    elif any('GROUP="fastrpc"' in ln and "0660" in ln for ln in lines):
        c.status, c.message = OK, "A udev rule gives /dev/fastrpc-cdsp to the fastrpc group (0660)."
    elif any('MODE="0666"' in ln for ln in lines):
        c.status, c.message = OK, "A udev rule lets every user open /dev/fastrpc-cdsp (0666)."
    elif (opens := await _opens_already(p)) is not None and opens[
        0
    ]:  # root needs no rule, now or after a boot
        c.status, c.message = (
            OK,
            f"Not needed: {opens[1]}. (No udev rule gives /dev/fastrpc-cdsp* to the fastrpc group.)",
        )
    elif opens is not None:
        c.status, c.fix = WARN, "udev_rule"
        c.message = (
            "This user opens /dev/fastrpc-cdsp* now, but no udev rule gives the nodes to the fastrpc group: "
            "after a reboot they may be root-only again."
        )
    else:
        c.status, c.fix = FAIL, "udev_rule"
        c.message = (
            "No udev rule gives /dev/fastrpc-cdsp* to the fastrpc group: the nodes stay root-only "
            "after every boot."
        )


async def _fastrpc_device(p: _Probe, c: Check) -> None:
    e = await p.sh(
        'for f in /dev/fastrpc-cdsp*; do [ -e "$f" ] || continue; '
        'if ( : <> "$f" ) 2>/dev/null; then o=open; else o=denied; fi; '
        'echo "$f $(stat -c \'%A %U %G\' "$f") $o"; '
        'getfacl -cp "$f" 2>/dev/null | grep -E "^(user|group):[^:]+:" | sed "s|^|  acl |"; done'
    )
    c.evidence.append(e)
    nodes: dict[str, dict[str, Any]] = {}
    for ln in e.output.splitlines():
        parts = ln.split()
        if len(parts) == 5 and parts[0].startswith("/dev/"):
            nodes[parts[0]] = {
                "mode": parts[1],
                "owner": parts[2],
                "group": parts[3],
                "open": parts[4] == "open",
            }
    p.facts["fastrpc_nodes"] = nodes
    if "/dev/fastrpc-cdsp" not in nodes:
        c.status, c.fix = FAIL, "reboot"
        c.message = "/dev/fastrpc-cdsp does not exist: the cdsp remote processor or its driver is not up."
        if "cdsp" in await _offline_dsps(p):  # left offline at boot: a reboot leaves it so (kernel#923)
            c.fix = "dsp_start"
            c.message = "/dev/fastrpc-cdsp does not exist: the cdsp remote processor is offline. Start it."
        return
    # the -secure nodes are for signed protection domains; Genie (unsigned PD) needs the plain ones
    denied = [n for n, v in nodes.items() if not v["open"] and not n.endswith("-secure")]
    if denied:
        cd = nodes["/dev/fastrpc-cdsp"]
        shown = f"This user cannot open {', '.join(denied)} ({cd['mode']} {cd['owner']}:{cd['group']})"
        if all(nodes[d]["group"] == "fastrpc" and nodes[d]["mode"][4:6] == "rw" for d in denied):
            # the nodes are already the fastrpc group's (a udev rule did its part): what is missing is this login's
            # membership, which a new udev rule cannot give (it would be applied, and the check fail again)
            c.status, c.fix, why = FAIL, *await _membership(p)
            c.message = f"{shown}: the nodes are the fastrpc group's; {why}"
            return
        c.status, c.fix = FAIL, "udev_rule"
        c.message = f"{shown}: Genie fails with 14001 / 0x8000044f."
    else:
        c.status, c.message = (
            OK,
            "This user can open " + ", ".join(n for n in nodes if not n.endswith("-secure")) + ".",
        )


async def _membership(p: _Probe) -> tuple[str, str]:
    """(fix, words) for a node the fastrpc group may use that this login cannot open: not in the group yet
    (group_add), or in it since a login that started before (relogin)."""
    user = await p.user()
    _, members = await _group(p)
    if members is not None and user in members:
        return (
            "relogin",
            f"{user} is in the fastrpc group, but this login started before: log in again (or reboot).",
        )
    return "group_add", f"{user} is not in the fastrpc group."


async def _dma_heap(p: _Probe, c: Check) -> None:
    """FastRPC's buffers come from /dev/dma_heap/system: fastrpc udev rules older than 1.0.6-1 leave it root-only
    (facts/board.md), and Genie then fails for any user but root."""
    e = await p.sh(
        'f=/dev/dma_heap/system; [ -e "$f" ] || { echo "$f missing"; exit 0; }; '
        'if ( : <> "$f" ) 2>/dev/null; then o=open; else o=denied; fi; '
        'echo "$f $(stat -c \'%A %U %G\' "$f") $o"; getfacl -cp "$f" 2>/dev/null | sed "s|^|  acl |"'
    )
    c.evidence.append(e)
    head = (e.output.splitlines() or [""])[0].split()
    if head[-1:] == ["missing"]:
        c.status, c.message = (
            WARN,
            "/dev/dma_heap/system does not exist: this kernel gives FastRPC no system heap.",
        )
    elif head[-1:] == ["open"]:
        c.status, c.message = OK, "This user can open /dev/dma_heap/system."
    else:
        shown = f"This user cannot open /dev/dma_heap/system ({' '.join(head[1:4])})"
        if re.search(r"acl group:fastrpc:rw", e.output):  # the rule's ACL is there: the login lacks the group
            c.status, c.fix, why = FAIL, *await _membership(p)
            c.message = f"{shown}: the fastrpc group may use it; {why}"
        else:
            c.status, c.fix = FAIL, "udev_rule"
            c.message = f"{shown}: FastRPC cannot allocate its buffers (fastrpc udev rules before 1.0.6-1)."


async def _fastrpc_daemons(p: _Probe, c: Check) -> None:
    e = await p.sh(
        "for s in "
        + " ".join(DAEMONS)
        + "; do ls=$(systemctl show --property=LoadState --value $s.service 2>/dev/null); "
        'echo "$s ${ls:-unknown} $(systemctl is-active $s 2>&1)"; done'
    )
    c.evidence.append(e)
    rows = [ln.split(None, 2) for ln in e.output.splitlines()]
    states = {r[0]: r[2] for r in rows if len(r) == 3}
    p.facts["fastrpc_daemons"] = states
    # is-active says "inactive" for a unit that does not exist: a restart of it fails ("Unit ... not found")
    missing = [r[0] for r in rows if len(r) == 3 and r[1] == "not-found"]
    if missing:
        c.status, c.fix = FAIL, "fastrpc_packages"
        c.message = (
            f"{', '.join(s + '.service' for s in missing)} is not installed: the FastRPC daemons come with the "
            "FastRPC packages (fastrpc-support on Debian's split)."
        )
        return
    down = [s for s in DAEMONS if states.get(s) != "active"]
    if down:
        c.status, c.fix = FAIL, "daemon_restart"
        c.message = ", ".join(f"{s} is {states.get(s, 'unknown')}" for s in down) + "."
        offline = await _offline_dsps(p)
        if all(DAEMON_DSP.get(s) in offline for s in down):
            # their units start only with the DSP's node (ConditionPathExists): a restart does nothing meanwhile
            c.fix = "dsp_start"
            c.message += " Their DSP is offline: start it, and the daemons follow."
    else:
        c.status, c.message = OK, "cdsprpcd and cdsp1rpcd are active."


_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)*$")


async def _qairt(p: _Probe, c: Check) -> None:
    e = await p.sh(
        'for r in "$@"; do for d in "$r"/*/; do [ -d "$d" ] && [ ! -L "${d%/}" ] && echo "dir ${d%/}"; '
        'done; [ -L "$r/current" ] && echo "current $r/current $(readlink -f "$r/current")"; done; true',
        *QAIRT_ROOTS,
        shown="ls -d /opt/qairt/*/ /opt/qcom/aistack/qairt/*/; readlink -f /opt/qairt/current",
    )
    c.evidence.append(e)
    installs = []
    links: dict[str, str] = {}  # the target of each root's `current` link -> the link
    for ln in e.output.splitlines():
        kind, _, path = ln.partition(" ")
        if kind == "dir" and _VERSION_RE.match(path.rsplit("/", 1)[-1]):
            installs.append({"path": path, "version": path.rsplit("/", 1)[-1]})
        elif kind == "current":
            link, _, target = path.partition(" ")
            links.setdefault(target, link)
    p.facts["qairt_installs"] = installs
    linked = next((i for i in installs if i["path"] in links), None)
    # a `current` link only where it leads to an install (a link to a removed version leads nowhere): its own
    # path, under whichever root it is (/opt/qairt or /opt/qcom/aistack/qairt)
    p.facts["qairt_current"] = links[linked["path"]] if linked is not None else None
    chosen = linked or (installs[-1] if installs else None)
    p.facts["qairt_home"] = chosen["path"] if chosen else None
    p.facts["qairt_version"] = chosen["version"] if chosen else None
    if not installs:
        c.status, c.fix = FAIL, "qairt_install"
        c.message = "No QAIRT in /opt/qairt or /opt/qcom/aistack/qairt: install it from the SDK zip."
        return
    assert chosen is not None
    text = ", ".join(i["version"] for i in installs)
    if chosen["version"].startswith("2.38."):
        c.status, c.fix = WARN, "qairt_install"
        c.message = f"QAIRT {chosen['version']} has a known Genie issue: install another version ({text})."
    else:
        c.status, c.message = OK, f"QAIRT {chosen['version']} at {chosen['path']} (installed: {text})."


async def _qairt_env(p: _Probe, c: Check) -> None:
    await _need(p, "qairt")
    home = await p.home()
    e = await p.sh(
        'f="$1"; [ -f "$f" ] || { echo "missing $f"; exit 3; }; . "$f"; '
        'echo "QAIRT_HOME=$QAIRT_HOME"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; '
        'echo "ADSP_LIBRARY_PATH=$ADSP_LIBRARY_PATH"; echo "PATH=$PATH"; '
        '[ -d "$QAIRT_HOME/lib/aarch64-oe-linux-gcc11.2" ] && echo "QAIRT_HOME_HOLDS_QAIRT=yes"; true',
        f"{home}/{ENV_SCRIPT}",
        shown=f". ~/{ENV_SCRIPT}; env | grep -E 'QAIRT|LIBRARY_PATH'",
    )
    c.evidence.append(e)
    qhome = p.facts.get("qairt_home")
    if e.exit_status != 0:
        c.status, c.fix = FAIL, "qairt_env" if qhome else "qairt_install"
        c.message = f"~/{ENV_SCRIPT} is missing: Genie would not find QAIRT's libraries and skel."
        return
    env = dict(ln.split("=", 1) for ln in e.output.splitlines() if "=" in ln)
    adsp = env.get("ADSP_LIBRARY_PATH", "")
    arch = p.facts.get("dsp_arch") or "v73"
    problems = []
    if ":" in adsp and ";" not in adsp:
        problems.append("ADSP_LIBRARY_PATH uses ':' but it is SEMICOLON-separated")
    first = adsp.split(";")[0] if adsp else ""
    if not first.endswith(f"hexagon-{arch}/unsigned"):
        problems.append(f"ADSP_LIBRARY_PATH does not start with lib/hexagon-{arch}/unsigned")
    if qhome and not env.get("QAIRT_HOME", "").startswith((*QAIRT_ROOTS, str(qhome))):
        problems.append(f"QAIRT_HOME is {env.get('QAIRT_HOME')!r}")
    elif env.get("QAIRT_HOME_HOLDS_QAIRT") != "yes":
        # a link to a removed version, or /opt/qairt/current never made: the paths lead nowhere
        problems.append(
            f"QAIRT_HOME ({env.get('QAIRT_HOME')}) holds no QAIRT (no lib/aarch64-oe-linux-gcc11.2 in it)"
        )
    if "aarch64-oe-linux-gcc11.2" not in env.get("LD_LIBRARY_PATH", ""):
        problems.append("LD_LIBRARY_PATH lacks lib/aarch64-oe-linux-gcc11.2")
    p.facts["adsp_library_path"] = adsp
    if problems:
        c.status, c.fix, c.message = FAIL, "qairt_env", "; ".join(problems) + "."
    else:
        c.status, c.message = (
            OK,
            f"~/{ENV_SCRIPT} sets QAIRT_HOME={env.get('QAIRT_HOME')} and the library paths.",
        )


async def _qnn_libs_mixed(p: _Probe, c: Check) -> None:
    e = await p.sh("ls -1 /usr/lib/libQnn*.so /usr/lib/aarch64-linux-gnu/libQnn*.so 2>/dev/null; true")
    c.evidence.append(e)
    distro = [ln for ln in e.output.splitlines() if ln.strip()]
    if distro:
        c.status, c.fix = WARN, "qairt_env"
        c.message = (
            f"QNN libraries in /usr/lib ({len(distro)}): do not mix them with /opt/qairt's DSP libraries "
            "(stub/skel mismatch); the environment script puts /opt/qairt first."
        )
    else:
        c.status, c.message = OK, "No distro QNN libraries in /usr/lib."


async def _need(p: _Probe, check_id: str) -> None:
    """Wait for a check another one depends on (each check runs once per probe)."""
    await _run_check(p, check_id)


async def _qairt_tool(p: _Probe, c: Check, command: str, shown: str, timeout: float = 60) -> Evidence | None:
    """Run a QAIRT tool's `command` with the board's environment script sourced, its evidence added to the
    check (`shown` is how the evidence names it); None, and the check skipped, while QAIRT is missing."""
    await _need(p, "qairt")
    if not p.facts.get("qairt_home"):
        c.status, c.fix, c.message = SKIP, "qairt_install", "No QAIRT installed yet."
        return None
    home = await p.home()
    e = await p.sh(
        '[ -f "$1" ] && . "$1"; ' + command,
        f"{home}/{ENV_SCRIPT}",
        timeout=timeout,
        shown=f". ~/{ENV_SCRIPT}; {shown}",
    )
    c.evidence.append(e)
    return e


async def _genie(p: _Probe, c: Check) -> None:
    # judged by what `-h` itself prints (its usage): the pipe's status is head's, and the path `command -v` prints
    # named the program even when it cannot start (libGenie.so or libatomic.so.1 not found)
    e = await _qairt_tool(
        p,
        c,
        'command -v genie-t2t-run >/dev/null || { echo "genie-t2t-run: not found"; exit 127; }; '
        "genie-t2t-run -h 2>&1 | head -n 5",
        "genie-t2t-run -h",
    )
    if e is None:
        return
    if e.exit_status == 0 and "usage" in e.output.lower() and not _explained(e):
        c.status, c.message = OK, "genie-t2t-run runs: " + e.output.splitlines()[0]
    else:
        c.status, c.fix = FAIL, "qairt_env"
        c.message = "genie-t2t-run is not on PATH after sourcing the environment script, or does not run."
        c.explained = _explained(e)


# the checks whose failure can make the HTP backend fail (an error's fix_ids name their fixes): FastRPC's and
# the QAIRT environment's
_CAUSE_CHECKS = tuple(
    c for c in CHECK_IDS if c.startswith("fastrpc_") or c in ("udev_rule", "dma_heap", "qairt_env")
)


async def _first_failing_fix(p: _Probe, fix_ids: list[str]) -> str:
    """Of an error's possible fixes (most likely first), the first one a check of this probe also asks for: 14001
    lists fastrpc_packages first, which only says "nothing to do" when the libraries are there and the cause is the
    device's access or the daemons. The first one when no check names any."""
    found = await asyncio.gather(*(_run_check(p, i) for i in _CAUSE_CHECKS))
    failing = {x.fix for x in found if x.status == FAIL and x.fix}
    return next((f for f in fix_ids if f in failing), fix_ids[0])


async def _htp_validator(p: _Probe, c: Check) -> None:
    validator = "qnn-platform-validator --backend dsp --coreVersion --libVersion --testBackend"
    e = await _qairt_tool(p, c, validator, validator, timeout=120)
    if e is None:
        return
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in e.output.splitlines() if ":" in ln)
    )
    p.facts["htp_validator"] = {
        k: fields.get(k) for k in ("Backend Hardware", "Backend Libraries", "Core Version", "Unit Test")
    }
    hw, libs = fields.get("Backend Hardware", ""), fields.get("Backend Libraries", "")
    core, unit = fields.get("Core Version", ""), fields.get("Unit Test", "")
    # It ALWAYS exits 0: the text says whether it worked.
    if hw == "Supported" and libs == "Found" and unit == "Passed":
        c.status, c.message = OK, f"HTP backend works: {core or 'core version not reported'}."
        return
    c.status = FAIL
    c.explained = _explained(e)
    if not libs or libs != "Found":
        c.fix = "qairt_env"
    elif c.explained and c.explained[0]["fix_ids"]:
        c.fix = await _first_failing_fix(p, c.explained[0]["fix_ids"])
    c.message = (
        f"HTP backend test failed (hardware: {hw or '?'}, libraries: {libs or '?'}, unit test: "
        f"{unit or '?'})."
    )
    if c.explained:
        c.message += " " + c.explained[0]["cause"]


GENIEX_PATH = 'PATH="$HOME/.local/bin:/usr/local/bin:$PATH"; '
_GENIEX_VERSION = re.compile(r"^(GenieX CLI Version|QAIRT Runtime Version|LlamaCPP Runtime Hash):\s*(.*)$")


def geniex_versions(text: str) -> dict[str, str]:
    """`geniex version`'s three lines (cli/cmd/geniex/version.go) -> {cli, qairt_plugin, llama_cpp}."""
    keys = {
        "GenieX CLI Version": "cli",
        "QAIRT Runtime Version": "qairt_plugin",
        "LlamaCPP Runtime Hash": "llama_cpp",
    }
    out: dict[str, str] = {}
    for ln in text.splitlines():
        m = _GENIEX_VERSION.match(ln.strip())
        if m and m.group(2).strip():
            out[keys[m.group(1)]] = m.group(2).strip()
    return out


async def _geniex(p: _Probe, c: Check) -> None:
    """GenieX (docs/genie.md): its CLI, the qairt plugin's QAIRT (it runs bundles compiled with that QAIRT or
    earlier), and the Python package HexStudio's helper uses to keep a model loaded. Optional unless the
    board's runtime is geniex (then what is missing fails)."""
    wanted = str((p.board.config or {}).get("runtime") or "genie") == "geniex"
    missing = FAIL if wanted else SKIP  # an optional runtime the board does not use is not a problem
    py = str((p.board.config or {}).get("geniex_python") or (p.board.config or {}).get("python") or "python3")
    e = await p.sh(
        GENIEX_PATH + "command -v geniex && geniex version --skip-update",
        shown="command -v geniex && geniex version",
    )
    ep = await p.sh(
        'PYTHONPATH="$HOME/.local/share/geniex-python${PYTHONPATH:+:$PYTHONPATH}" '
        '"$1" -c "import geniex; print(geniex.__version__)"',
        py,
        shown=f"{py} -c 'import geniex; print(geniex.__version__)'",
    )
    c.evidence += [e, ep]
    v = geniex_versions(e.output) if e.exit_status == 0 else {}
    pyver = ep.output.strip().splitlines()[-1] if ep.exit_status == 0 and ep.output.strip() else None
    p.facts["geniex"] = {**v, "python": pyver}
    c.fix = "geniex_install"
    if not v.get("cli"):
        c.status = missing
        c.message = (
            "GenieX is not installed (no `geniex` on PATH or in ~/.local/bin). Only needed to run bundles "
            "through GenieX: install it from its release tarball (geniex-cli-linux-arm64-vX.Y.Z.tar.gz)."
        )
        return
    plugin = v.get("qairt_plugin")
    if not plugin:
        c.status = missing
        c.message = (
            f"GenieX {v['cli']} has no QAIRT plugin (a --cpu-only build?): it cannot run AI Hub bundles. "
            "Install the full linux-arm64 release."
        )
        return
    bundle_q = bundle_qairt_version(p.bundle_dir) if p.bundle_dir is not None else None
    try:
        too_old = bool(bundle_q) and parse_version(str(bundle_q))[:3] > parse_version(plugin)[:3]
    except ValueError:
        too_old = False
    if too_old:
        c.status = FAIL if wanted or p.bundle_dir is not None else WARN
        c.message = (
            f"GenieX {v['cli']}'s QAIRT plugin is {plugin}, older than the QAIRT {bundle_q} that compiled "
            "the bundle: it would not load (it runs bundles compiled with its QAIRT or earlier). Install a "
            "newer GenieX release."
        )
        return
    if pyver is None:
        c.status = WARN
        c.message = (
            f"GenieX {v['cli']} (QAIRT plugin {plugin}) is installed, but not its Python package for {py}: "
            "HexStudio needs it to keep the model loaded between turns. Install the geniex wheel."
        )
        return
    c.fix = None
    c.status = OK
    c.message = (
        f"GenieX {v['cli']}, QAIRT plugin {plugin}"
        + (
            f" (runs this bundle's QAIRT {bundle_q})"
            if bundle_q
            else " (runs bundles compiled with it or earlier)"
        )
        + f", Python package {pyver}."
    )


_FUNCS = {
    "soc": _soc,
    "os": _os,
    "sudo": _sudo,
    "memory": _memory,
    "remoteproc": _remoteproc,
    "fastrpc_userspace": _fastrpc_userspace,
    "fastrpc_group": _fastrpc_group,
    "fastrpc_member": _fastrpc_member,
    "fastrpc_login": _fastrpc_login,
    "udev_rule": _udev_rule,
    "fastrpc_device": _fastrpc_device,
    "dma_heap": _dma_heap,
    "fastrpc_daemons": _fastrpc_daemons,
    "qairt": _qairt,
    "qairt_env": _qairt_env,
    "qnn_libs_mixed": _qnn_libs_mixed,
    "genie": _genie,
    "htp_validator": _htp_validator,
    "geniex": _geniex,
}
_TITLES = dict(CHECKS)


async def _run_check(p: _Probe, check_id: str) -> Check:
    if check_id not in p.tasks:
        p.tasks[check_id] = asyncio.ensure_future(_do_check(p, check_id))
    return await p.tasks[check_id]


async def _do_check(p: _Probe, check_id: str) -> Check:
    c = Check(check_id, _TITLES[check_id])
    try:
        await _FUNCS[check_id](p, c)
    except Exception as exc:  # a check that cannot run says so; the others still run
        if exc.__class__.__name__ == "ConnectionLost":
            raise
        c.status, c.message = FAIL, f"The check could not run: {exc}"
    if c.status == FAIL and not c.explained:
        c.explained = _explained(*c.evidence)
    return c


async def probe(
    board: Board, only: Iterable[str] | None = None, bundle: tuple[Path, str] | None = None
) -> DoctorReport:
    """Check the board (all checks, or `only` those ids). Simulated boards get no hardware checks.
    `bundle`: (local bundle folder, its name on the board): adds the check "bundle", which compares the
    sha256 of every file, computed on the board, with the local bundle.json."""
    ids = list(CHECK_IDS) if only is None else [i for i in CHECK_IDS if i in set(only)]
    unknown = set(only or ()) - set(CHECK_IDS)
    if unknown:
        raise ValueError(f"unknown doctor checks: {sorted(unknown)}")
    if board.simulated:
        c = Check(
            "soc",
            "Simulator board",
            OK,
            "Simulated board: runs the QDQ ONNX parts with onnxruntime on this "
            "CPU; no Hexagon NPU, no FastRPC (simulated).",
        )
        gx = Check(
            "geniex",
            _TITLES["geniex"],
            OK,
            f"Simulated GenieX {CLI_VERSION} with QAIRT plugin "
            f"{QAIRT_PLUGIN_VERSION} (the simulator, hexstudio.workers.genie_sim.geniex): both runtimes available (simulated).",
        )
        report = DoctorReport(
            board.name,
            board.label,
            True,
            [c, gx],
            {
                "simulated": True,
                "geniex": {"cli": CLI_VERSION, "qairt_plugin": QAIRT_PLUGIN_VERSION, "simulated": True},
            },
        )
    else:
        p = _Probe(board)
        p.bundle_dir = bundle[0] if bundle is not None else None
        checks = await asyncio.gather(*(_run_check(p, i) for i in ids))
        report = DoctorReport(board.name, board.label, False, list(checks), dict(p.facts))
    if bundle is not None:
        report.checks.append(await bundle_check(board, *bundle))
        report.checks.append(contract_check(bundle[0], report.facts))
    return report


def contract_check(bundle_dir: Path, facts: dict[str, Any]) -> Check:
    """The local bundle against Genie's contract and this board (hexstudio/shared/bundle/check.py)."""
    found = [f for f in check_bundle(bundle_dir, facts) if f.severity != "info"]
    c = Check(
        "bundle_contract",
        "Bundle meets Genie's contract",
        OK,
        "genie_config.json, graphs, rope, quantization and tokens pass `hexstudio bundle check`.",
    )
    if found:
        c.status = FAIL if errors(found) else WARN
        c.message = (
            f"{len(errors(found))} error(s), {len(found) - len(errors(found))} warning(s): {found[0].message}"
        )
        c.evidence.append(
            Evidence(f"hexstudio bundle check {bundle_dir}", 1 if errors(found) else 0, report_text(found))
        )
    return c


async def bundle_check(board: Board, bundle_dir: Path, name: str) -> Check:
    """The bundle on the board against the local one: sha256 of every file computed on the board."""
    c = Check("bundle", "Bundle on the board matches the local one")
    try:
        bad = await verify_pushed(board, bundle_dir, name, hashes=True)
    except BoardError as exc:
        c.status, c.message = FAIL, f"{exc.message} {exc.hint or ''}".strip()
        return c
    c.evidence.append(
        Evidence(
            f"sha256sum (on the board) of every file of bundle {name}",
            0,
            "\n".join(f"{b['path']}: {b['why']}" for b in bad) or "all files match",
        )
    )
    if bad:
        c.status, c.fix = WARN, "push"
        c.message = (
            f"{len(bad)} file(s) of bundle {name} differ on the board (first: {bad[0]['path']}: "
            f"{bad[0]['why']}). Push again (`hexstudio board push {board.name} DIR --as {name}`): "
            "only those are sent."
        )
    else:
        c.status, c.message = OK, f"Every file of bundle {name} on the board has the local sha256."
    return c
