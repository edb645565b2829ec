"""Board fixes: each shows its exact commands before it runs them, is idempotent, and re-checks.

    plan = await plan_fix(board, "group_add", report)   # FixPlan: .commands (shell lines to show), .files
    result = await apply_fix(board, plan, sudo_password=pw, on_log=print)
    result.status   # "applied" | "already" | "manual" | "failed"
    result.checks   # the doctor checks the fix affects, re-run afterwards

sudo: the password goes to `sudo -S -k -p ''` on stdin only (never in argv, logs or results; any
echo of it is redacted). A board where this user has no sudo gets `status="manual"` and
`manual_commands` to run as root by hand, instead of a failure.

Fix ids (the doctor's `fix` field): group_add, relogin, udev_rule, fastrpc_packages, qairt_env,
daemon_restart, dsp_start, reboot, qairt_install (hexstudio.core.device.qairt; needs the SDK zip), geniex_install (needs
GenieX's release tarball geniex-cli-linux-arm64-vX.Y.Z.tar.gz, or its Python wheel geniex-X.Y.Z-*.whl: the
board is not assumed to reach the internet).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import Board
from hexstudio.core.device.doctor import (
    CHECK_IDS,
    DAEMONS,
    ENV_SCRIPT,
    OLD_UDEV_RULE,
    UDEV_MARK,
    UDEV_RULE,
    DoctorReport,
    probe,
    udev_rule_lines,
)
from hexstudio.core.device.errors import BoardError, ConnectionDropped, SudoRefused, link_failure
from hexstudio.core.device.explain import explain
from hexstudio.core.device.qairt import ABI, MARKER, QAIRT_BASE, build_payload, compare_qairt, parse_version
from hexstudio.core.paths import default_workspace
from hexstudio.core.secrets import remember_secret
from hexstudio.shared.bundle import bundle_qairt_version
from hexstudio.shared.errors import ActionableError
from hexstudio.shared.records import fields_dict

FIX_IDS = (
    "group_add",
    "relogin",
    "udev_rule",
    "fastrpc_packages",
    "qairt_env",
    "daemon_restart",
    "dsp_start",
    "reboot",
    "qairt_install",
    "geniex_install",
)
TITLES = {
    "group_add": "Create the fastrpc group and add the user to it",
    "relogin": "Log in again (new group membership)",
    "udev_rule": "Install the FastRPC udev rule, reload and trigger",
    "fastrpc_packages": "Install the FastRPC userspace packages",
    "qairt_env": "Write the QAIRT environment script",
    "daemon_restart": "Restart the FastRPC daemons",
    "dsp_start": "Start the offline DSP, and install a udev rule that starts it at boot",
    "reboot": "Reboot the board and wait for it",
    "qairt_install": "Install QAIRT from the SDK zip",
    "geniex_install": "Install or update GenieX from its release file",
}
# which doctor checks each fix changes (re-run afterwards)
AFFECTS: dict[str, tuple[str, ...]] = {
    "group_add": ("fastrpc_group", "fastrpc_member", "fastrpc_login", "fastrpc_device", "dma_heap"),
    "relogin": ("fastrpc_login", "fastrpc_device", "dma_heap", "htp_validator"),
    "udev_rule": ("udev_rule", "fastrpc_device", "dma_heap", "htp_validator"),
    "fastrpc_packages": ("fastrpc_userspace", "htp_validator"),
    "qairt_env": ("qairt_env", "genie", "htp_validator"),
    "daemon_restart": ("fastrpc_daemons", "htp_validator"),
    "dsp_start": ("remoteproc", "fastrpc_device", "fastrpc_daemons", "htp_validator"),
    "reboot": CHECK_IDS,
    "qairt_install": ("qairt", "qairt_env", "genie", "htp_validator"),
    "geniex_install": ("geniex",),
}
REMOTE_TMP = ".hexstudio/tmp"
UPLOAD_PROGRESS_INTERVAL_S = 0.1
UDEV_RULES_TEXT = """\
# FastRPC device nodes for the fastrpc group (written by HexStudio; as qualcomm/fastrpc's 60-fastrpc.rules)
ACTION=="add", SUBSYSTEM=="misc", KERNEL=="fastrpc-cdsp", GROUP="fastrpc", MODE="0660", \
TAG+="systemd", ENV{SYSTEMD_WANTS}+="cdsprpcd.service"
ACTION=="add", SUBSYSTEM=="misc", KERNEL=="fastrpc-cdsp1", GROUP="fastrpc", MODE="0660", \
TAG+="systemd", ENV{SYSTEMD_WANTS}+="cdsp1rpcd.service"
ACTION=="add", SUBSYSTEM=="dma_heap", KERNEL=="system", MODE="0660", RUN+="/bin/setfacl -m g:fastrpc:rw $env{DEVNAME}"
"""
# A DSP the kernel left offline at boot, started when udev sees it (qualcomm/fastrpc files/59-fastrpc-remoteproc.rules
# does the same for qualcomm-linux/kernel#923: the firmware was read before the root filesystem was mounted)
DSP_START_RULE = "/etc/udev/rules.d/59-hexstudio-dsp-start.rules"
DSP_START_RULE_TEXT = """\
# Start a Hexagon DSP the kernel left offline at boot (written by HexStudio; qualcomm-linux/kernel#923)
ACTION=="add", SUBSYSTEM=="remoteproc", ATTR{name}=="cdsp|cdsp1", ATTR{state}=="offline", ATTR{state}="start"
"""
# a rule that starts an offline remote processor is there already (HexStudio's, or the fastrpc package's)
HAS_DSP_START_RULE = [
    "sh",
    "-c",
    udev_rule_lines('SUBSYSTEM=="remoteproc".*ATTR\\{state\\}="start"')
    + " | grep -v ':#hidden$' | grep -q .",
]
# the cdsp cores by name (remoteprocN is numbered in probe order: it may differ after a boot), and an offline one
# among them; started by a "start" written to its state (Documentation/ABI sysfs-class-remoteproc)
_OFFLINE_DSPS = (
    'for r in /sys/class/remoteproc/remoteproc*; do case "$(cat "$r/name" 2>/dev/null)" in cdsp|cdsp1) ;; '
    '*) continue ;; esac; [ "$(cat "$r/state")" = offline ] || continue; '
)
START_OFFLINE_DSPS = _OFFLINE_DSPS + 'echo start | tee "$r/state" >/dev/null || rc=1; done; exit ${rc:-0}'
NO_OFFLINE_DSP = _OFFLINE_DSPS + "exit 1; done; exit 0"
# done_if checks (no root needed): what the udev rule does is already true of the device nodes
NODES_APPLIED = (
    'for f in /dev/fastrpc-cdsp /dev/fastrpc-cdsp1; do [ -e "$f" ] || continue; '
    '[ "$(stat -c %G:%a "$f")" = fastrpc:660 ] || exit 1; done; true'
)
HEAP_APPLIED = (
    "! [ -e /dev/dma_heap/system ] || getfacl -cp /dev/dma_heap/system 2>/dev/null "
    '| grep -q "^group:fastrpc:rw"'
)
# this login already has the fastrpc group (nothing to gain from logging in again)
IN_GROUP_NOW = ["sh", "-c", "id -nG | tr ' ' '\\n' | grep -qx fastrpc"]
PPA_PACKAGES = ("qcom-fastrpc1", "qcom-fastrpc-dev", "qcom-libdmabufheap-dev")
DEBIAN_PACKAGES = ("libfastrpc1", "libfastrpc-dev", "fastrpc-support")


@dataclass
class Step:
    """One command. kind: run (argv, maybe with sudo) | write (a file in the user's home, via SFTP) |
    upload (a local file, resumable) | reconnect (log in again) | reboot (sudo reboot, wait, reconnect)."""

    kind: str
    argv: list[str] = field(default_factory=list)
    sudo: bool = False
    done_if: list[str] | None = None  # exit 0 of this (no sudo) = already done: skip the step
    path: str = ""  # write/upload: the remote path
    content: bytes = b""  # write: the file's content
    mode: int = 0o644
    local: Path | None = None  # upload: the local file
    timeout: float = 600
    # what an administrator types instead, by hand (None: `shown`; "": nothing, another step's text covers it)
    manual: str | None = None

    @property
    def shown(self) -> str:
        if self.kind == "run":
            return ("sudo " if self.sudo else "") + shlex.join(self.argv)
        if self.kind == "reboot":
            return "sudo reboot   # then wait for the board to come back"
        if self.kind == "reconnect":
            return "# log out and log in again (HexStudio reconnects)"
        if self.kind == "write":
            return f"cat > {shlex.quote(self.path)} <<'EOF'\n{self.content.decode()}EOF"
        if self.kind == "upload":
            return f"scp {shlex.quote(str(self.local))} BOARD:{shlex.quote(self.path)}"
        return self.kind


def by_hand(step: Step, board: Board) -> str:
    """A step as a person runs it by hand: an upload is a copy from this workstation, to the board as the studio
    reaches it (its ~/.ssh/config alias, else user@host with its port and key; an IPv6 address in brackets)."""
    if step.manual is not None:
        return step.manual
    if step.kind != "upload":
        return step.shown
    cfg, t = board.config or {}, board.transport
    flags = ""
    if cfg.get("ssh_alias"):
        # ~/.ssh/config gives scp the user, port, key and jump hosts, as it gives them to the studio
        where = shlex.quote(str(cfg["ssh_alias"]))
    else:
        host = str(cfg.get("host") or getattr(t, "host", "") or "BOARD")
        user = cfg.get("user") or getattr(t, "user", None)
        where = shlex.quote((f"{user}@" if user else "") + (f"[{host}]" if ":" in host else host))
        port = int(cfg.get("port") or getattr(t, "port", 22) or 22)
        flags += f"-P {port} " if port != 22 else ""
        flags += f"-i {shlex.quote(str(cfg['key_path']))} " if cfg.get("key_path") else ""
    return (
        f"scp {flags}{shlex.quote(str(step.local))} {where}:{shlex.quote(step.path)}   # on this workstation"
    )


@dataclass
class FixPlan:
    fix_id: str
    title: str
    steps: list[Step]
    affects: tuple[str, ...]
    notes: list[str] = field(default_factory=list)

    @property
    def needs_sudo(self) -> bool:
        return any(s.sudo or s.kind == "reboot" for s in self.steps)

    @property
    def commands(self) -> list[str]:
        """The exact commands, as a person would type them on the board, in order."""
        return [s.shown for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        shown = fields_dict(self, ("fix_id", "title", "commands", "needs_sudo"))
        return {**shown, "affects": list(self.affects), "notes": self.notes}


@dataclass
class FixResult:
    fix_id: str
    status: str  # applied | already | manual | failed
    message: str
    commands: list[str]
    log: list[dict[str, Any]] = field(default_factory=list)
    manual_commands: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    explained: list[dict[str, Any]] = field(default_factory=list)
    # sudo took the password given (a password is worth keeping only then)
    password_taken: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
async def _facts(board: Board, report: DoctorReport | None) -> dict[str, Any]:
    if report is not None and report.facts.get("user"):
        return report.facts
    r = await probe(board, only=("soc", "qairt", "fastrpc_member"))
    return r.facts


def _root_file_steps(tmp: str, target: str, text: str, done_if: list[str] | None = None) -> list[Step]:
    """A root-owned file (a udev rule): written to `tmp` in the user's home, then installed with sudo; by hand, an
    administrator writes it in one command (they may not write this user's home). Done when the installed file is
    the same (or `done_if`)."""
    src = posixpath.join(tmp, posixpath.basename(target))
    return [
        Step("run", ["mkdir", "-p", tmp], done_if=done_if or ["test", "-d", tmp], manual=""),
        Step("write", path=src, content=text.encode(), manual="", done_if=done_if),
        Step(
            "run",
            ["install", "-D", "-m", "0644", "-o", "root", "-g", "root", src, target],
            sudo=True,
            done_if=done_if or ["cmp", "-s", src, target],
            manual=f"sudo tee {shlex.quote(target)} >/dev/null <<'EOF'\n{text}EOF",
        ),
    ]


def _in_group(user: str) -> list[str]:
    return [
        "sh",
        "-c",
        'getent group fastrpc | cut -d: -f4 | tr , "\\n" | grep -qx -- "$1"',
        "in-group",
        user,
    ]


def env_script_text(qairt_home: str, dsp_arch: str = "v73") -> str:
    q = shlex.quote(qairt_home)
    return (
        "# QAIRT environment for Genie on this board (written by HexStudio). Use: . ~/qairt-env.sh\n"
        f"export QAIRT_HOME={q}\n"
        'export QNN_SDK_ROOT="$QAIRT_HOME"\n'
        'export PATH="$QAIRT_HOME/bin/aarch64-oe-linux-gcc11.2:$PATH"\n'
        "# gcc8.2 libraries after gcc11.2: libatomic.so.1 (getQnnSystemInterface FAILED otherwise)\n"
        'export LD_LIBRARY_PATH="$QAIRT_HOME/lib/aarch64-oe-linux-gcc11.2:$QAIRT_HOME/lib/aarch64-oe-linux-gcc8.2'
        '${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n'
        "# ADSP_LIBRARY_PATH is SEMICOLON-separated; the skel of this board's arch first\n"
        f'export ADSP_LIBRARY_PATH="$QAIRT_HOME/lib/hexagon-{dsp_arch}/unsigned;/usr/lib/rfsa/adsp;/dsp"\n'
    )


GENIEX_PREFIX = ".local/share/geniex"  # GenieX's install.sh for a non-root user
GENIEX_MARKER = ".hexstudio-install-sha256"
GENIEX_PYDIR = ".local/share/geniex-python"  # the geniex wheel, installed with pip --target
# GenieX's install.sh steps, for a file already on the board (it can only download): check the digest, unpack
# with the top folder stripped beside the old install, link the host FastRPC libraries in, swap, mark.
GENIEX_INSTALL_SCRIPT = (
    'set -e; tar="$1"; prefix="$2"; sha="$3"\n'
    'echo "$sha  $tar" | sha256sum -c - >/dev/null || { echo "checksum mismatch for $tar" >&2; exit 1; }\n'
    'new="$prefix.new"; rm -rf "$new"; mkdir -p "$new"\n'
    'tar -xzf "$tar" -C "$new" --strip-components=1\n'
    '[ -f "$new/geniex" ] || { echo "tarball does not contain \'geniex\' binary" >&2; rm -rf "$new"; exit 1; }\n'
    'chmod +x "$new/geniex"\n'
    "for l in libcdsprpc.so libadsprpc.so; do\n"
    '  r=$(PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | awk -v n="$l" \'$1 ~ "^"n"\\\\." '
    '{ sub(/.*=> /, ""); print; exit }\')\n'
    '  if [ -n "$r" ]; then ln -sf "$r" "$new/$l"; else echo "warning: $l not found: NPU inference may fail"; fi\n'
    "done\n"
    'rm -rf "$prefix.old"; if [ -e "$prefix" ]; then mv "$prefix" "$prefix.old"; fi\n'
    'mv "$new" "$prefix"; rm -rf "$prefix.old"\n'
    'echo "$sha" > "$prefix/' + GENIEX_MARKER + '"; rm -f "$tar"\n'
)


def geniex_launcher(prefix: str) -> bytes:
    """~/.local/bin/geniex, as GenieX's install.sh writes it: the binary finds its libraries and plugins
    through LD_LIBRARY_PATH."""
    return (
        "#!/bin/sh\n# GenieX launcher (written by HexStudio as GenieX's install.sh writes it)\n"
        f"GENIEX_PREFIX={shlex.quote(prefix)}\n"
        'LD_LIBRARY_PATH="${GENIEX_PREFIX}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \\\n'
        '    exec "${GENIEX_PREFIX}/geniex" "$@"\n'
    ).encode()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


async def plan_geniex_install(board: Board, file: Path, report: DoctorReport | None = None) -> FixPlan:
    """Install or update GenieX from a file the user provides: the CLI release tarball (into ~/.local/share/geniex
    with the launcher ~/.local/bin/geniex, as GenieX's installer does for a user) or its Python wheel
    (`pip install --user --no-index`). Idempotent: a file already installed is not sent or unpacked again."""
    file = Path(file)
    if not file.is_file():
        raise BoardError(
            f"{file} does not exist.", "Pass the GenieX release file you downloaded on the workstation."
        )
    name = file.name
    sha = _sha256(file)
    side = file.with_name(name + ".sha256")
    if side.is_file():
        expected = (side.read_text().split() or [""])[0].lower()
        if expected != sha:
            raise BoardError(
                f"{name} does not match its {side.name} (expected {expected[:16]}..., got {sha[:16]}...).",
                "Download the release file again: it is damaged or not the one the checksum is for.",
            )
    home = str(await board.transport.home())
    tmp = posixpath.join(home, REMOTE_TMP)
    remote = posixpath.join(tmp, name)
    mk_tmp = Step("run", ["mkdir", "-p", tmp], done_if=["test", "-d", tmp])
    notes = [f"sha256 of {name}: {sha}"]
    if name.endswith(".whl"):
        cfg = board.config or {}
        py = str(cfg.get("geniex_python") or cfg.get("python") or "python3")
        ver = name.split("-")[1] if name.count("-") >= 2 else ""
        target = posixpath.join(home, GENIEX_PYDIR)
        same = [
            "env",
            f"PYTHONPATH={target}",
            py,
            "-c",
            f"import geniex, sys; sys.exit(0 if geniex.__version__ == {ver!r} else 1)",
        ]
        steps = [
            Step("run", mk_tmp.argv, done_if=same),
            Step("upload", path=remote, local=file, done_if=same),
            Step(
                "run",
                [
                    py,
                    "-m",
                    "pip",
                    "install",
                    "--no-index",
                    "--no-deps",
                    "--upgrade",
                    "--target",
                    target,
                    remote,
                ],
                done_if=same,
                timeout=900,
            ),
        ]
        notes.append(
            f"The wheel goes into ~/{GENIEX_PYDIR} (pip --target: no index, no internet, the system's Python "
            "left alone); HexStudio's helper puts it on PYTHONPATH. GenieX's own dependency tqdm must already "
            "be importable."
        )
        return FixPlan("geniex_install", TITLES["geniex_install"], steps, AFFECTS["geniex_install"], notes)
    if not (name.endswith(".tar.gz") or name.endswith(".tgz")):
        raise BoardError(
            f"{name} is not a GenieX release file.",
            "Pass geniex-cli-linux-arm64-vX.Y.Z.tar.gz (the CLI) or geniex-X.Y.Z-*.whl (Python package).",
        )
    prefix = posixpath.join(home, GENIEX_PREFIX)
    bindir = posixpath.join(home, ".local", "bin")
    marker = posixpath.join(prefix, GENIEX_MARKER)
    installed = ["sh", "-c", '[ "$(cat "$1" 2>/dev/null)" = "$2" ]', "installed", marker, sha]
    steps = [
        Step("run", mk_tmp.argv, done_if=installed),
        Step(
            "upload",
            path=remote,
            local=file,
            done_if=[
                "sh",
                "-c",
                '[ "$(cat "$1" 2>/dev/null)" = "$3" ] || echo "$3  $2" | sha256sum -c - >/dev/null 2>&1',
                "uploaded",
                marker,
                remote,
                sha,
            ],
        ),
        Step(
            "run",
            ["sh", "-c", GENIEX_INSTALL_SCRIPT, "geniex-install", remote, prefix, sha],
            done_if=installed,
            timeout=900,
        ),
        Step("run", ["mkdir", "-p", bindir], done_if=["test", "-d", bindir]),
        Step("write", path=posixpath.join(bindir, "geniex"), content=geniex_launcher(prefix), mode=0o755),
    ]
    notes.append(
        f"Installs into ~/{GENIEX_PREFIX} (an older install is moved aside and removed) with the launcher "
        "~/.local/bin/geniex, as GenieX's install.sh does for a user; no sudo."
    )
    return FixPlan("geniex_install", TITLES["geniex_install"], steps, AFFECTS["geniex_install"], notes)


async def plan_fix(
    board: Board,
    fix_id: str,
    report: DoctorReport | None = None,
    *,
    qairt_zip: Path | None = None,
    geniex_file: Path | None = None,
) -> FixPlan:
    """The steps of a fix for this board (nothing is changed). `report` gives facts (user, arch,
    QAIRT home); without it a short probe gets them."""
    if fix_id not in FIX_IDS:
        raise BoardError(f"Unknown fix '{fix_id}'.", f"Known fixes: {', '.join(FIX_IDS)}.")
    _not_the_simulator(board)
    if fix_id == "qairt_install":
        if qairt_zip is None:
            raise BoardError(
                "Installing QAIRT needs the QAIRT SDK zip (v<version>.zip from Qualcomm).",
                "Download it on the workstation and pass its path.",
            )
        return await plan_qairt_install(board, qairt_zip, report)
    if fix_id == "geniex_install":
        if geniex_file is None:
            raise BoardError(
                "Installing GenieX needs its release file: geniex-cli-linux-arm64-vX.Y.Z.tar.gz (from "
                "GenieX's releases) or the geniex Python wheel.",
                "Download it on the workstation and pass its path (the board needs no internet).",
            )
        return await plan_geniex_install(board, geniex_file, report)
    facts = await _facts(board, report)
    user = str(facts.get("user"))
    home = str(await board.transport.home())
    tmp = posixpath.join(home, REMOTE_TMP)
    steps: list[Step] = []
    notes: list[str] = []
    group = Step(
        "run", ["groupadd", "--system", "fastrpc"], sudo=True, done_if=["getent", "group", "fastrpc"]
    )
    if fix_id == "group_add":
        steps = [
            group,
            Step("run", ["usermod", "-aG", "fastrpc", user], sudo=True, done_if=_in_group(user)),
            Step("reconnect", done_if=IN_GROUP_NOW),
        ]
        notes.append("The new group counts for new logins only: HexStudio logs in again afterwards.")
    elif fix_id == "relogin":
        steps = [Step("reconnect", done_if=IN_GROUP_NOW)]
    elif fix_id == "udev_rule":
        # an earlier HexStudio's rule under the package's name hides the package's file (doctor.UDEV_RULE): once it
        # is gone, udev reads the rules again and applies them, even where the cdsp nodes look right already (the
        # package's adsp, gdsp, sdsp and -secure nodes do not)
        old = await board.transport.run(["grep", "-qsF", UDEV_MARK, OLD_UDEV_RULE], timeout=60)
        moved = old.exit_status == 0
        steps = [
            group,
            *_root_file_steps(tmp, UDEV_RULE, UDEV_RULES_TEXT),
            *([Step("run", ["rm", "-f", OLD_UDEV_RULE], sudo=True)] if moved else []),
            Step(
                "run",
                ["udevadm", "control", "--reload-rules"],
                sudo=True,
                done_if=None if moved else ["sh", "-c", f"{NODES_APPLIED} && {HEAP_APPLIED}"],
            ),
            Step(
                "run",
                ["udevadm", "trigger", "--action=add", "--subsystem-match=misc"],
                sudo=True,
                done_if=None if moved else ["sh", "-c", NODES_APPLIED],
            ),
            Step(
                "run",
                ["udevadm", "trigger", "--action=add", "--subsystem-match=dma_heap"],
                sudo=True,
                done_if=["sh", "-c", HEAP_APPLIED],
            ),
        ]
    elif fix_id == "fastrpc_packages":
        r = await board.transport.run(["apt-cache", "show", "fastrpc-support"], timeout=60)
        pkgs = DEBIAN_PACKAGES if r.exit_status == 0 else PPA_PACKAGES
        # done: libcdsprpc resolvable and cdsprpcd's unit there (Debian's split installs the library alone:
        # libfastrpc1 without fastrpc-support, whose daemons the doctor then finds "not-found")
        has = [
            "sh",
            "-c",
            'PATH="$PATH:/usr/sbin:/sbin"; ldconfig -p | grep -qF libcdsprpc && '
            '[ "$(systemctl show --property=LoadState --value cdsprpcd.service 2>/dev/null)" != not-found ]',
        ]
        steps = [
            Step("run", ["apt-get", "update"], sudo=True, done_if=has),
            Step("run", ["apt-get", "install", "-y", *pkgs], sudo=True, done_if=has),
            Step("run", ["ldconfig"], sudo=True, done_if=has),
        ]  # only while that is not so
        if pkgs == PPA_PACKAGES:
            notes.append(
                "The qcom-* packages come from the Qualcomm IoT PPA: `sudo add-apt-repository "
                "ppa:ubuntu-qcom-iot/qcom-ppa` first if apt cannot find them."
            )
    elif fix_id == "qairt_env":
        # the link where it leads to an install (a later QAIRT install moves it), else the install itself
        qhome = facts.get("qairt_current") or facts.get("qairt_home")
        if not qhome:
            raise BoardError(
                "No QAIRT is installed on the board, so there is no environment to write.",
                "Install QAIRT first (fix qairt_install with the SDK zip).",
            )
        steps = [
            Step(
                "write",
                path=posixpath.join(home, ENV_SCRIPT),
                content=env_script_text(str(qhome), str(facts.get("dsp_arch") or "v73")).encode(),
            )
        ]
    elif fix_id == "daemon_restart":
        for d in DAEMONS:
            steps.append(
                Step(
                    "run",
                    ["systemctl", "restart", f"{d}.service"],
                    sudo=True,
                    done_if=["systemctl", "is-active", "--quiet", f"{d}.service"],
                )
            )
    elif fix_id == "dsp_start":
        # by hand: one line a core, from the doctor's report where it has them
        paths = facts.get("remoteproc_paths") or {}
        states = facts.get("remoteproc") or {}
        shown = [
            f"echo start | sudo tee {shlex.quote(posixpath.join(str(paths[n]), 'state'))}"
            for n in sorted(paths)
            if n in ("cdsp", "cdsp1") and states.get(n) == "offline"
        ]
        steps.append(
            Step(
                "run",
                ["sh", "-c", START_OFFLINE_DSPS],
                sudo=True,
                done_if=["sh", "-c", NO_OFFLINE_DSP],
                manual="\n".join(shown) or None,
            )
        )
        steps += _root_file_steps(tmp, DSP_START_RULE, DSP_START_RULE_TEXT, done_if=HAS_DSP_START_RULE)
        notes.append(
            "The rule starts the DSP at every boot, as the fastrpc package's 59-fastrpc-remoteproc.rules does; "
            "it is not installed where a rule already does so."
        )
    elif fix_id == "reboot":
        steps = [Step("reboot")]
        notes.append("Every connection to the board drops; HexStudio waits for it to come back.")
    return FixPlan(fix_id, TITLES[fix_id], steps, AFFECTS[fix_id], notes)


# ---------------------------------------------------------------------------------------------
class _Runner:
    def __init__(self, board: Board, password: str | None, on_log: Callable[[str], None] | None) -> None:
        self.board = board
        self.password = password
        self.on_log = on_log
        self.log: list[dict[str, Any]] = []
        self.sudo_mode: str | None = None  # "nopasswd" | "password"
        self._has_timeout: bool | None = None  # the board's coreutils `timeout -k` (asked once)

    def redact(self, text: str) -> str:
        return text.replace(self.password, "********") if self.password else text

    def emit(self, line: str) -> None:
        if self.on_log is not None:
            self.on_log(self.redact(line))

    async def run(self, argv: list[str], sudo: bool, timeout: float = 600) -> tuple[int, str]:
        stdin = None
        limit = timeout
        if sudo and argv[:1] != ["reboot"] and await self.has_timeout():
            # root's own time limit (coreutils timeout, run by sudo): the transport's stop on a time-out is this
            # user's kill, which cannot stop a root process (an apt-get left holding the dpkg lock)
            argv = ["timeout", "-k", "10", str(int(timeout)), *argv]
            limit = timeout + 30
        if sudo:
            if self.sudo_mode == "password":
                argv = ["sudo", "-S", "-k", "-p", "", "--", *argv]
                stdin = (self.password or "").encode() + b"\n"
            else:
                argv = ["sudo", "-n", "--", *argv]
        t0 = time.monotonic()
        r = await self.board.transport.run(argv, timeout=limit, stdin=stdin)
        out = self.redact((r.stdout + r.stderr).strip())
        # root's timeout fired (124, or 137 after its -k): not an OOM kill or the transport's own time-out
        fired = limit > timeout and r.exit_status in (124, 137) and time.monotonic() - t0 >= timeout - 1
        if fired and "timed out after" not in out:
            out = f"{out}\n(stopped on the board after {int(timeout)} s: the step's time limit)".strip()
        return r.exit_status, out

    async def has_timeout(self) -> bool:
        """Whether the board has a `timeout` that takes -k (coreutils; an old BusyBox one does not)."""
        if self._has_timeout is None:
            try:
                r = await self.board.transport.run(["timeout", "-k", "1", "5", "true"], timeout=30)
                self._has_timeout = r.exit_status == 0
            except Exception:
                self._has_timeout = False
        return self._has_timeout

    async def sudo_access(self) -> tuple[bool, str]:
        """Can this user run commands as root? Sets sudo_mode. (ok, why-not)."""
        r = await self.board.transport.run(["sudo", "-n", "true"], timeout=30)
        if r.exit_status == 0:
            self.sudo_mode = "nopasswd"
            return True, ""
        if "not found" in r.stderr:
            return False, "sudo is not installed on the board."
        if not self.password:
            return False, (
                "sudo asks for a password and none was given (or this user may not use sudo). Store it with "
                f"`hexstudio board password {self.board.name} --sudo` (or give it when the Board page asks), "
                "or run the commands below as root by hand."
            )
        r = await self.board.transport.run(
            ["sudo", "-S", "-k", "-p", "", "--", "true"], timeout=30, stdin=self.password.encode() + b"\n"
        )
        if r.exit_status == 0:
            self.sudo_mode = "password"
            return True, ""
        err = self.redact(r.stderr.strip())
        if "not in the sudoers" in err or "may not run sudo" in err or "not allowed" in err:
            return False, f"This user may not use sudo on the board ({err.splitlines()[-1]})."
        raise SudoRefused(
            f"sudo on {self.board.name} refused the password.",
            "Type the board user's password again (the one for sudo). A stored one is changed with "
            f"`hexstudio board password {self.board.name} --sudo` or on the Board page.",
        )


async def _step_done(board: Board, step: Step) -> bool:
    """Already done (checked without root): its done_if exits 0, or a write's file has this content."""
    if step.done_if is not None and (await board.transport.run(step.done_if, timeout=60)).exit_status == 0:
        return True
    return step.kind == "write" and await _has_content(board, step)


BOOT_SETTLE_S = 20.0  # after a reboot, services (cdsprpcd, udev) may come up a little after sshd
DSP_SETTLE_S = 8.0  # after dsp_start, udev makes the DSP's device node and starts its daemon


async def _rerun_checks(board: Board, plan: FixPlan, res: FixResult) -> None:
    rebooted = any(st.kind == "reboot" for st in plan.steps)
    # a board that has just booted may still be starting its DSP daemons, and a DSP just started gets its
    # /dev/fastrpc-cdsp* node and daemon from udev a moment later: look again for a while
    settle = BOOT_SETTLE_S if rebooted else DSP_SETTLE_S if plan.fix_id == "dsp_start" else 0.0
    deadline = time.monotonic() + settle
    try:
        while True:
            report = await probe(board, only=plan.affects)
            res.checks = [c.to_dict() for c in report.checks]
            if all(c["status"] != "fail" for c in res.checks) or time.monotonic() >= deadline:
                return
            await asyncio.sleep(2.0)
    except Exception as exc:
        # the fix is done either way: a board that stops answering now leaves its checks unknown
        if not (isinstance(exc, ActionableError) or link_failure(exc)):
            raise


def _upload_progress(
    label: str, size: int, on_progress: Callable[[int, int, str], None] | None
) -> Callable[[int], None] | None:
    """put_file's byte callback (called in the transport's thread) -> on_progress(done, total, label) on the
    event loop, at most every UPLOAD_PROGRESS_INTERVAL_S and once at the end."""
    if on_progress is None:
        return None
    loop = asyncio.get_running_loop()
    last = [0.0]

    def cb(n: int) -> None:
        now = time.monotonic()
        if now - last[0] < UPLOAD_PROGRESS_INTERVAL_S and n < size:
            return
        last[0] = now
        loop.call_soon_threadsafe(on_progress, n, size, label)

    return cb


async def _run_step(
    board: Board,
    rn: _Runner,
    step: Step,
    on_progress: Callable[[int, int, str], None] | None,
    reboot_timeout: float,
) -> tuple[int, str]:
    """One step of a fix: (exit status, output)."""
    if step.kind == "run":
        return await rn.run(step.argv, step.sudo, step.timeout)
    if step.kind == "write":
        return await _write(board, step)
    if step.kind == "upload":
        assert step.local is not None
        size = step.local.stat().st_size
        await board.transport.put_file(
            step.local, step.path, _upload_progress(f"uploading {step.local.name}", size, on_progress)
        )
        return 0, f"uploaded {size} bytes"
    if step.kind == "reconnect":
        await board.reconnect(timeout=60)
        return 0, f"reconnected to {board.label}"
    if step.kind == "reboot":
        return await _reboot(board, rn, reboot_timeout)
    raise BoardError(f"unknown step kind {step.kind}")  # pragma: no cover - plans are built above


async def apply_fix(
    board: Board,
    plan: FixPlan,
    *,
    sudo_password: str | None = None,
    on_log: Callable[[str], None] | None = None,
    rerun: bool = True,
    reboot_timeout: float = 300.0,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> FixResult:
    """Run the plan's steps (skipping those already done), then re-run the affected doctor checks. A plan
    whose every step is already done reports "already" and runs nothing (no sudo asked). `on_progress`
    (done bytes, total bytes, what) follows uploads (the QAIRT install), at most 10 times a second."""
    _not_the_simulator(board)
    remember_secret(sudo_password)  # typed once and not kept: the studio log scrubs it all the same
    rn = _Runner(board, sudo_password, on_log)
    res = FixResult(plan.fix_id, "applied", "", plan.commands, rn.log)
    for line in plan.commands:
        rn.emit(f"plan: {line}")
    pending = [step for step in plan.steps if not await _step_done(board, step)]
    if not pending:
        for step in plan.steps:
            rn.log.append({"command": step.shown, "skipped": True, "why": "already done"})
        res.status, res.message = "already", "Nothing to do: the board already had this fix."
        rn.emit(res.message)
        if rerun:
            await _rerun_checks(board, plan, res)
        return res
    # root only for what is still to do (group_add with only its log-in again left needs none)
    if any(step.sudo or step.kind == "reboot" for step in pending):
        ok, why = await rn.sudo_access()
        if not ok:
            res.status, res.message = (
                "manual",
                (
                    f"{why} Run these commands as an administrator, on the board unless marked otherwise, then "
                    "probe again."
                ),
            )
            # only what is still to do (the checks need no root)
            res.manual_commands = [
                text for step in pending if step.kind != "reconnect" and (text := by_hand(step, board))
            ]
            rn.emit(res.message)
            return res
        res.password_taken = rn.sudo_mode == "password"
    did_something = False
    for step in plan.steps:
        if step.done_if is not None:
            r = await board.transport.run(step.done_if, timeout=60)
            if r.exit_status == 0:
                rn.log.append({"command": step.shown, "skipped": True, "why": "already done"})
                rn.emit(f"already done: {step.shown}")
                continue
        if step.kind == "write" and await _has_content(board, step):
            rn.log.append({"command": step.shown, "skipped": True, "why": "already has this content"})
            rn.emit(f"already done: {step.path} has this content")
            continue
        did_something = True
        rn.emit(f"$ {step.shown}")
        try:
            rc, out = await _run_step(board, rn, step, on_progress, reboot_timeout)
        except BoardError:
            raise
        except Exception as exc:
            if not link_failure(exc):
                raise
            raise ConnectionDropped(
                f"`{step.shown.splitlines()[0]}` could not finish on {board.label}: the connection dropped or the "
                f"board refused a write ({exc or type(exc).__name__}).",
                "Check the board's power and network, and its free space (`df -h`), then run the fix again: "
                "the steps already done are skipped.",
            ) from exc
        rn.log.append({"command": step.shown, "exit_status": rc, "output": out[-4000:]})
        if out:
            rn.emit(out)
        if rc != 0:
            res.status = "failed"
            res.explained = [m.to_dict() for m in explain(out) if m.severity != "info"]
            res.message = (
                f"`{step.shown}` failed (exit {rc}): {out.strip().splitlines()[-1] if out.strip() else ''}"
            )
            if res.explained:
                res.message += f" {res.explained[0]['cause']} {res.explained[0]['fix']}"
            break
    if res.status == "applied":
        if not did_something:
            res.status = "already"
        res.message = (
            "Nothing to do: the board already had this fix."
            if res.status == "already"
            else f"{plan.title}: done."
        )
    if rerun:
        await _rerun_checks(board, plan, res)
        # a check that still fails and still asks for this very fix: the steps ran, the board is not fixed (a
        # daemon restart systemd skipped, a group the login does not have yet); said, never "done"
        still = [c for c in res.checks if c.get("status") == "fail" and c.get("fix") == plan.fix_id]
        if still and res.status in ("applied", "already"):
            res.status = "failed"
            res.message = (
                f"{plan.title}: its steps ran, but {still[0].get('title') or still[0].get('id')} still fails: "
                f"{still[0].get('message') or ''}".rstrip()
            )
    return res


async def _has_content(board: Board, step: Step) -> bool:
    with contextlib.suppress(OSError):
        return bool(
            await board.transport.exists(step.path)
            and await board.transport.read_bytes(step.path) == step.content
        )
    return False


async def _write(board: Board, step: Step) -> tuple[int, str]:
    await board.transport.write_bytes(step.path, step.content, step.mode)
    return 0, f"wrote {step.path} ({len(step.content)} bytes)"


async def _reboot(board: Board, rn: _Runner, timeout: float) -> tuple[int, str]:
    t0 = time.monotonic()
    try:
        rc, out = await rn.run(["reboot"], True, timeout=30)
    except Exception as exc:  # the connection may drop under the command itself
        if exc.__class__.__name__ != "ConnectionLost":
            raise
        rc, out = 0, "connection dropped (rebooting)"
    if rc not in (0, 255, -1):
        return rc, out
    rn.emit("waiting for the board to go down...")
    t = board.transport
    deadline = time.monotonic() + 120
    while getattr(t, "connected", False) and time.monotonic() < deadline:
        try:
            await t.run(["true"], timeout=5)
        except Exception:
            break
        await asyncio.sleep(0.5)
    rn.emit("waiting for the board to come back...")
    await board.reconnect(timeout=timeout)
    return 0, f"the board rebooted and is back after {time.monotonic() - t0:.1f} s"


def _not_the_simulator(board: Board) -> None:
    """The simulator board's commands run on this workstation: a fix's sudo steps (rm -rf /opt/qairt/..., udev
    rules, groups) would change this machine, not a board."""
    if board.simulated:
        raise BoardError(
            "The simulator board needs no fixes: it runs on this workstation, and a fix's commands would "
            "change this machine, not a board.",
            "Fix a real board (`hexstudio board fix NAME FIX` with the board's name).",
        )


def _chosen_workspace() -> Path:
    """The workspace the studio and the CLI use (settings.json's "workspace" counts; a settings file that cannot
    be read is said where it is read for the run, not here)."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.settings import SettingsError

    try:
        return Workspace.chosen().root
    except (SettingsError, OSError):
        return default_workspace()


async def plan_qairt_install(
    board: Board,
    zip_path: Path,
    report: DoctorReport | None = None,
    *,
    bundle_dir: Path | None = None,
    cache_dir: Path | None = None,
) -> FixPlan:
    """A FixPlan that installs QAIRT from `zip_path`. With `bundle_dir`, refuses
    a QAIRT older than the one that compiled the bundle."""
    _not_the_simulator(board)
    if report is None or "dsp_arch" not in report.facts:
        report = await probe(board, only=("soc",))
    arch = str(report.facts.get("dsp_arch") or "v73")
    cache = cache_dir or (_chosen_workspace() / "cache" / "qairt")
    version, tar_path, digest, count = await asyncio.to_thread(build_payload, zip_path, arch, cache)
    notes = [
        f"QAIRT {version}: {count} files for {ABI} and hexagon-{arch} "
        f"({tar_path.stat().st_size / 1e6:.1f} MB of the {zip_path.stat().st_size / 1e6:.1f} MB zip)."
    ]
    if bundle_dir is not None:
        status, msg = compare_qairt(version, bundle_qairt_version(bundle_dir))
        if status == "refuse":
            raise BoardError(
                msg.replace("The board's QAIRT", "This QAIRT SDK"),
                "Use the QAIRT SDK zip of the version that compiled the bundle, or newer.",
            )
        if status == "warn":
            notes.append(msg)
    elif parse_version(version)[:2] == (2, 38):
        notes.append(f"QAIRT {version} has a known Genie issue: prefer another version.")
    home = str(await board.transport.home())
    tmp = posixpath.join(home, ".hexstudio", "tmp")
    remote_tar = posixpath.join(tmp, tar_path.name)
    dest = posixpath.join(QAIRT_BASE, version)
    partial = dest + ".partial"
    installed = ["grep", "-qF", digest, posixpath.join(dest, MARKER)]
    steps = [
        Step("run", ["mkdir", "-p", tmp], done_if=installed),
        Step("upload", path=remote_tar, local=tar_path, done_if=installed),
        Step("run", ["rm", "-rf", partial], sudo=True, done_if=installed),
        Step("run", ["mkdir", "-p", partial], sudo=True, done_if=installed),
        Step(
            "run", ["tar", "-xf", remote_tar, "-C", partial, "--no-same-owner"], sudo=True, done_if=installed
        ),
        Step("run", ["chmod", "-R", "a+rX", partial], sudo=True, done_if=installed),
        Step("run", ["rm", "-rf", dest], sudo=True, done_if=installed),
        Step("run", ["mv", partial, dest], sudo=True, done_if=installed),
        Step(
            "run",
            ["ln", "-sfn", version, posixpath.join(QAIRT_BASE, "current")],
            sudo=True,
            done_if=[
                "sh",
                "-c",
                '[ "$(readlink "$1")" = "$2" ]',
                "is-current",
                posixpath.join(QAIRT_BASE, "current"),
                version,
            ],
        ),
        Step("run", ["rm", "-f", remote_tar], done_if=["sh", "-c", '! [ -e "$1" ]', "gone", remote_tar]),
        Step(
            "write",
            path=posixpath.join(home, "qairt-env.sh"),
            content=env_script_text(posixpath.join(QAIRT_BASE, "current"), arch).encode(),
        ),
    ]
    return FixPlan(
        "qairt_install", f"{TITLES['qairt_install']} ({version})", steps, AFFECTS["qairt_install"], notes
    )
