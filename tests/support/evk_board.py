"""The EVK test board: a real OpenSSH sshd whose sessions see a Dragonwing IQ-9075 (QCS9075) board.

Built on tests.support.sshd.SshServer's private mount namespace. Inside that namespace only (this
machine's own /dev, /sys, /etc, /opt, /home, /run are never touched), the SSH sessions see:

- /sys/devices/soc0/{soc_id,machine,family}: 676 / QCS9075; /sys/class/remoteproc/remoteproc{0,1,2}
  with {name,state} = adsp, cdsp, cdsp1 (cdsp1 `offline`: the kernel tried it at boot before its firmware could
  be read, qualcomm-linux/kernel#923, and does so at every boot until a udev rule starts it);
- /dev (a tmpfs with null, zero, urandom, pts...): /dev/fastrpc-{adsp,cdsp,cdsp-secure,cdsp1}
  `crw------- root root` and /dev/dma_heap/system (the char nodes are /dev/null's, so "can this
  user open it" is a real permission check);
- /etc: a copy of this machine's /etc, as the EVK ships it: no fastrpc group, a user `evk` (uid 4242)
  in group sudo with a password (or without sudo), os-release of Ubuntu;
- /opt: empty (no QAIRT); /home: the board's homes; /run: a tmpfs;
- FastRPC userspace: a real ELF libcdsprpc.so.1 in /usr/local/lib, in the ld.so cache;
- /usr/local/sbin (first on PATH, also in sudo's secure_path): small stand-ins for what this machine
  cannot do for a namespace: `systemctl` (cdsprpcd/cdsp1rpcd/adsprpcd states; cdsp1rpcd `failed` at
  first), `udevadm` (applies OWNER/GROUP/MODE and the setfacl RUN of /etc/udev/rules.d/*fastrpc* to the
  /dev nodes, like udev at trigger or at boot), `tee` (a "start" written to an offline remoteproc's state
  boots it, as the kernel does; any other file is the real tee's), `reboot` (drops every SSH session; the
  supervisor brings sshd back after `reboot_delay` seconds, running on_boot: remoteprocs running but cdsp1
  without a rule that starts it, daemons active, udev rules applied), `uname` (machine aarch64).

The QAIRT SDK stand-in comes from `build_qairt_zip` (the SDK's layout; small shell scripts for
genie-t2t-run and qnn-platform-validator that test the same things the real ones need: the FastRPC
node opens for this user, the skel is in ADSP_LIBRARY_PATH, cdsprpcd is active).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.sshd import SshServer

if TYPE_CHECKING:
    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.settings import Settings

EVK_UID = 4242
FASTRPC_NODES = ("fastrpc-adsp", "fastrpc-cdsp", "fastrpc-cdsp-secure", "fastrpc-cdsp1")

SYSTEMCTL = r"""#!/usr/bin/python3
# EVK test board stand-in for systemctl: service states live in /run/evk/services/<name>.
import os, sys
D = "/run/evk/services"
args = [a for a in sys.argv[1:] if not a.startswith("-")]
if not args:
    sys.exit(0)
verb, units = args[0], [u[:-8] if u.endswith(".service") else u for u in args[1:]]
def state(u):
    try:
        return open(os.path.join(D, u)).read().strip()
    except OSError:
        return None
if verb == "is-active":
    rc = 0
    for u in units:
        s = state(u) or "inactive"
        print(s)
        rc = rc or (0 if s == "active" else 3)
    sys.exit(rc)
if verb in ("start", "restart", "try-restart", "reload-or-restart", "enable", "stop"):
    if os.geteuid() != 0:
        print("Failed to %s %s: Access denied" % (verb, " ".join(units)), file=sys.stderr)
        sys.exit(4)
    for u in units:
        if state(u) is None:
            print("Failed to %s %s.service: Unit %s.service not found." % (verb, u, u), file=sys.stderr)
            sys.exit(5)
        open(os.path.join(D, u), "w").write("inactive\n" if verb == "stop" else "active\n")
    sys.exit(0)
if verb == "status":
    for u in units:
        print("* %s.service - FastRPC daemon (EVK test board)\n     Active: %s" % (u, state(u) or "inactive"))
    sys.exit(0 if all(state(u) == "active" for u in units) else 3)
if verb == "show":  # only --property=LoadState --value
    for u in units:
        print("loaded" if state(u) is not None else "not-found")
    sys.exit(0)
if verb == "daemon-reload":
    sys.exit(0)
print("systemctl (EVK test board): %s not supported" % verb, file=sys.stderr)
sys.exit(1)
"""

UDEVADM = r"""#!/usr/bin/python3
# EVK test board stand-in for udevadm: `trigger` applies the fastrpc/dma_heap rules to the /dev nodes.
import glob, grp, os, pwd, re, subprocess, sys
args = sys.argv[1:]
if not args or args[0] == "control" or args[0] == "settle":
    sys.exit(0)
if args[0] != "trigger":
    print("udevadm (EVK test board): %s not supported" % args[0], file=sys.stderr)
    sys.exit(1)
if os.geteuid() != 0:
    print("Failed to trigger: Permission denied", file=sys.stderr)
    sys.exit(1)
for path in sorted(glob.glob("/etc/udev/rules.d/*.rules")):
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kv = dict(re.findall(r'([A-Z_]+(?:\{[^}]*\})?)\+?==?"([^"]*)"', line))
        kernel, sub = kv.get("KERNEL"), kv.get("SUBSYSTEM")
        if not kernel:
            continue
        node = "/dev/dma_heap/" + kernel if sub == "dma_heap" else "/dev/" + kernel
        for dev in glob.glob(node):
            if "OWNER" in kv:
                os.chown(dev, pwd.getpwnam(kv["OWNER"]).pw_uid if kv["OWNER"] != "root" else 0, -1)
            if "GROUP" in kv:
                try:
                    os.chown(dev, -1, grp.getgrnam(kv["GROUP"]).gr_gid)
                except KeyError:
                    print("udev: unknown group %s in %s" % (kv["GROUP"], path), file=sys.stderr)
            if "MODE" in kv:
                os.chmod(dev, int(kv["MODE"], 8))
            run = kv.get("RUN")
            if run:
                subprocess.run(run.replace("$env{DEVNAME}", dev).split(), check=False)
sys.exit(0)
"""

REBOOT = """#!/bin/sh
# EVK test board stand-in for reboot: drop every SSH session; the supervisor boots sshd again.
[ "$(id -u)" = 0 ] || { echo "reboot: must be root" >&2; exit 1; }
setsid -f sh -c 'sleep 0.3; exec {sshd_reboot}' >/dev/null 2>&1 </dev/null
exit 0
"""

UNAME = """#!/bin/sh
# EVK test board: report the board's machine (aarch64), the rest from the real uname.
case "$*" in
  -m|-p|-i) echo aarch64 ;;
  *) /bin/uname "$@" | sed 's/x86_64/aarch64/g' ;;
esac
"""

TEE = """#!/bin/sh
# EVK test board stand-in for tee: "start" written to the state of an offline remoteproc boots it, as the kernel
# does (a running one answers EBUSY); every other file goes to the real tee.
case "$#:$1" in
  1:/sys/class/remoteproc/*/state)
    read -r word
    if [ "$word" = start ] && [ "$(cat "$1")" = offline ]; then echo running > "$1"; echo start; exit 0; fi
    echo "tee: $1: Device or resource busy" >&2; exit 1 ;;
esac
exec /usr/bin/tee "$@"
"""

ON_BOOT = """#!/bin/sh
# What the board does at boot: DSPs up (cdsp1 only where a udev rule starts it: qualcomm-linux/kernel#923), FastRPC
# daemons started, udev rules applied to /dev.
for r in /sys/class/remoteproc/remoteproc*; do
  if [ "$(cat "$r/name")" = cdsp1 ] && ! grep -qs 'SUBSYSTEM=="remoteproc"' /etc/udev/rules.d/*.rules; then
    echo offline > "$r/state"
  else
    echo running > "$r/state"
  fi
done
for s in /run/evk/services/*; do echo active > "$s"; done
/usr/local/sbin/udevadm trigger --subsystem-match=misc >/dev/null 2>&1 || true
/usr/local/sbin/udevadm trigger --subsystem-match=dma_heap >/dev/null 2>&1 || true
exit 0
"""

VALIDATOR = r"""#!/bin/sh
# QAIRT SDK stand-in (test): qnn-platform-validator's output. Like the real one it always exits 0.
echo "PF_VALIDATOR: DEBUG: Calling PlatformValidator->setBackend"
ok=1; why=""
if ! ( : <> /dev/fastrpc-cdsp ) 2>/dev/null; then ok=0; why="Unable to create FastRPC session 0x8000044f"; fi
skel=""
IFS=';'; for d in $ADSP_LIBRARY_PATH; do [ -e "$d/libQnnHtpV73Skel.so" ] && skel="$d"; done; unset IFS
[ -n "$skel" ] || { ok=0; why="${why:-apps_dev_init failed 0x80000406}"; }
[ "$(systemctl is-active cdsprpcd 2>/dev/null)" = active ] || { ok=0; why="${why:-Failed to create device: 14001}"; }
echo "Backend = DSP"
echo "Backend Hardware  : Supported"
if [ -n "$skel" ]; then echo "Backend Libraries : Found"; else echo "Backend Libraries : Not Found"; fi
echo "Library Version   : 2.45.0"
if [ $ok = 1 ]; then
  echo "Core Version      : Hexagon Architecture V73"
  echo "Unit Test         : Passed"
else
  echo "$why" >&2
  echo "Core Version      : Not Queried"
  echo "Unit Test         : Failed"
fi
echo "Error in saving the results"
exit 0
"""

GENIE = r"""#!/bin/sh
# QAIRT SDK stand-in (test): genie-t2t-run answers -h like the real one.
case "$1" in
  -h|--help) echo "Usage: genie-t2t-run [-c CONFIG] [-p PROMPT | --prompt_file FILE] [--profile FILE] [--log LEVEL]"
             exit 0 ;;
esac
echo "Using libGenie.so version 1.17.0"
echo "ERROR:: Please provide prompt using --prompt or --prompt_file."
exit 1
"""


def build_qairt_zip(path: Path, version: str = "2.45.0.260326") -> Path:
    """A zip with the public QAIRT SDK's layout (qairt/<ver>/...): the parts a board needs plus parts it
    does not (x86_64 host tools, Android libraries, other Hexagon arches, docs) that must not be sent."""
    root = f"qairt/{version}"
    bin_a = f"{root}/bin/aarch64-oe-linux-gcc11.2"
    lib_a = f"{root}/lib/aarch64-oe-linux-gcc11.2"
    files: dict[str, tuple[bytes, int]] = {
        f"{root}/sdk.yaml": (f"name: qairt\nversion: {version}\n".encode(), 0o644),
        f"{bin_a}/genie-t2t-run": (GENIE.encode(), 0o755),
        f"{bin_a}/qnn-platform-validator": (VALIDATOR.encode(), 0o755),
        f"{bin_a}/qnn-net-run": (b"#!/bin/sh\necho qnn-net-run stand-in\n", 0o755),
        f"{root}/bin/x86_64-linux-clang/qnn-context-binary-generator": (b"\x7fELF host tool" * 4000, 0o755),
        f"{root}/lib/x86_64-linux-clang/libQnnHtp.so": (b"\x7fELF x86" * 20000, 0o644),
        f"{root}/lib/aarch64-android/libQnnHtp.so": (b"\x7fELF android" * 20000, 0o644),
        f"{root}/lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so": (b"\x7fELF v75" * 20000, 0o644),
        f"{root}/lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so": (b"\x7fELF v73 skel" * 8000, 0o644),
        f"{root}/docs/index.html": (b"<html>docs</html>" * 1000, 0o644),
    }
    for lib in (
        "libGenie.so",
        "libQnnHtp.so",
        "libQnnHtpV73Stub.so",
        "libQnnSystem.so",
        "libQnnHtpPrepare.so",
    ):
        files[f"{lib_a}/{lib}"] = (f"\x7fELF aarch64 {lib}".encode() * 5000, 0o644)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 3, 26, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return path


class EvkBoard:
    """An IQ-9075 EVK as its SSH sessions see it (see the module doc). Use as a context manager."""

    def __init__(
        self,
        base_dir: Path,
        *,
        sudo: bool = True,
        sudo_password: str = "evk-sudo-pw",
        user: str = "evk",
        fastrpc_userspace: bool = True,
        reboot_delay: float = 1.0,
        ssh_password_auth: bool = False,
        fastrpc_ready: bool = False,
    ) -> None:
        self.dir = Path(base_dir)
        self.root = self.dir / "board"
        self.user = user
        self.sudo = sudo
        self.sudo_password = sudo_password
        self.fastrpc_userspace = fastrpc_userspace
        self.fastrpc_ready = fastrpc_ready  # as after the FastRPC fixes: only QAIRT is missing
        self.server = SshServer(
            self.dir / "sshd", user=user, setup_script=self._setup_script(), password_auth=ssh_password_auth
        )
        self.host, self.port = self.server.host, self.server.port  # sshd's address, chosen before it starts
        self.server.state_dir.mkdir(parents=True, exist_ok=True)
        (self.server.state_dir / "reboot_delay").write_text(f"{reboot_delay}\n")
        self._orig_write_config = self.server._write_config
        self.server._write_config = self._write_config  # type: ignore[method-assign]

    # -- sshd config: the board's PATH puts /usr/local/sbin (the stand-ins) first --------------
    def _write_config(self) -> None:
        self._orig_write_config()
        text = self.server.config_path.read_text().replace(
            "AuthorizedKeysFile ", "AuthorizedKeysFile .ssh/authorized_keys "
        )
        self.server.config_path.write_text(
            text + "SetEnv PATH=/usr/local/sbin:/usr/local/bin:/usr/bin:/bin\n"
        )

    def board_config(self, auth: str = "key") -> dict[str, Any]:
        """The board's entry for Settings().boards (auth "password": the user's password, which is also
        its sudo password, must be in the keyring under hexstudio.core.secrets.board_password_key)."""
        if auth == "password":
            return {"host": self.host, "port": self.port, "user": self.user, "auth": "password"}
        return self.server.key_config(user=self.user)

    # -- preparation (as root, on this machine's files under self.root only) ------------------
    def _prepare(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        r = self.root
        for d in ("sys/devices/soc0", "opt", "home", "sbin", "lib", "etc"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "sys/devices/soc0/soc_id").write_text("676\n")
        (r / "sys/devices/soc0/machine").write_text("QCS9075\n")
        (r / "sys/devices/soc0/family").write_text("Snapdragon\n")
        for i, (name, state) in enumerate((("adsp", "running"), ("cdsp", "running"), ("cdsp1", "offline"))):
            rp = r / f"sys/class/remoteproc/remoteproc{i}"
            rp.mkdir(parents=True)
            (rp / "name").write_text(name + "\n")
            (rp / "state").write_text(state + "\n")
        # /etc as the EVK ships it
        subprocess.run(["cp", "-a", "/etc/.", str(r / "etc")], check=True)
        etc = r / "etc"
        (etc / "os-release").unlink(missing_ok=True)
        (etc / "os-release").write_text(
            'PRETTY_NAME="Ubuntu 24.04.2 LTS (HexStudio EVK test board)"\nNAME="Ubuntu"\n'
            'VERSION_ID="24.04"\nID=ubuntu\n'
        )
        for fname in ("group", "gshadow"):
            p = etc / fname
            if p.exists():
                lines = [ln for ln in p.read_text().splitlines() if not ln.startswith("fastrpc:")]
                if self.sudo:
                    lines = [
                        self._add_member(ln, self.user) if ln.startswith("sudo:") else ln for ln in lines
                    ]
                lines.append(f"{self.user}:x:{EVK_UID}:" if fname == "group" else f"{self.user}:!::")
                if self.fastrpc_ready:
                    lines.append(
                        f"fastrpc:x:990:{self.user}" if fname == "group" else f"fastrpc:!::{self.user}"
                    )
                p.write_text("\n".join(lines) + "\n")
        pw_hash = subprocess.run(
            ["openssl", "passwd", "-6", "-stdin"],
            input=self.sudo_password,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        with open(etc / "passwd", "a") as f:
            f.write(f"{self.user}:x:{EVK_UID}:{EVK_UID}:EVK user:/home/{self.user}:/bin/bash\n")
        with open(etc / "shadow", "a") as f:
            f.write(f"{self.user}:{pw_hash}:20000:0:99999:7:::\n")
        (etc / "udev" / "rules.d").mkdir(parents=True, exist_ok=True)
        if self.fastrpc_ready:
            from hexstudio.core.device.fixes import (
                DSP_START_RULE,
                DSP_START_RULE_TEXT,
                UDEV_RULE,
                UDEV_RULES_TEXT,
            )

            (r / UDEV_RULE.lstrip("/")).write_text(UDEV_RULES_TEXT)
            (r / DSP_START_RULE.lstrip("/")).write_text(DSP_START_RULE_TEXT)
        (etc / "sudoers.d" / "hexstudio-evk").write_text("Defaults lecture=never\n")
        os.chmod(etc / "sudoers.d" / "hexstudio-evk", 0o440)
        (etc / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 " + os.uname().nodename + "\n")
        home = r / "home" / self.user
        home.mkdir(parents=True)
        (home / ".profile").write_text("# EVK test board\n")
        (home / ".ssh").mkdir(mode=0o700)
        shutil.copyfile(self.server.authorized_keys, home / ".ssh" / "authorized_keys")
        for p in (home, home / ".profile", home / ".ssh", home / ".ssh" / "authorized_keys"):
            os.chown(p, EVK_UID, EVK_UID)
        # stand-ins on PATH
        sbin = r / "sbin"
        for name, text in (
            ("systemctl", SYSTEMCTL),
            ("udevadm", UDEVADM),
            ("tee", TEE),
            ("uname", UNAME),
            (
                "reboot",
                REBOOT.replace("{sshd_reboot}", shlex.quote(str(self.server.bin_dir / "sshd_reboot"))),
            ),
        ):
            (sbin / name).write_text(text)
            (sbin / name).chmod(0o755)
        on_boot = self.server.state_dir / "on_boot"
        on_boot.write_text(ON_BOOT)
        on_boot.chmod(0o755)
        services = r / "services"
        services.mkdir()
        (services / "adsprpcd").write_text("active\n")
        (services / "cdsprpcd").write_text("active\n")
        (services / "cdsp1rpcd").write_text("active\n" if self.fastrpc_ready else "failed\n")
        if self.fastrpc_ready:
            (r / "sys/class/remoteproc/remoteproc2/state").write_text("running\n")
        if self.fastrpc_ready:
            (r / "fastrpc_ready").write_text("")
        if self.fastrpc_userspace:
            src = r / "lib" / "cdsprpc.c"
            src.write_text("int remote_handle_open(const char *n, void *h) { (void)n; (void)h; return 0; }\n")
            subprocess.run(
                [
                    "gcc",
                    "-shared",
                    "-fPIC",
                    "-Wl,-soname,libcdsprpc.so.1",
                    "-o",
                    str(r / "lib" / "libcdsprpc.so.1.0.0"),
                    str(src),
                ],
                check=True,
            )
            os.symlink("libcdsprpc.so.1.0.0", r / "lib" / "libcdsprpc.so.1")
            src.unlink()
        (etc / "ld.so.conf.d" / "zz-evk-test-board.conf").write_text("/usr/local/lib/evk\n")

    @staticmethod
    def _add_member(line: str, user: str) -> str:
        head, _, members = line.rpartition(":")
        names = [m for m in members.split(",") if m]
        return head + ":" + ",".join([*names, user])

    def _setup_script(self) -> str:
        r = shlex.quote(str(self.dir / "board"))
        nodes = "\n".join(f"mknod -m 600 /dev/{n} c 1 3" for n in FASTRPC_NODES)
        return f"""
R={r}
mount --bind "$R/etc" /etc
mount --bind "$R/sys" /sys
mount --bind "$R/opt" /opt
mount --bind "$R/home" /home
mount --bind "$R/sbin" /usr/local/sbin
mount -t tmpfs -o mode=755 evk-lib /usr/local/lib
mkdir -p /usr/local/lib/evk
cp -a "$R/lib/." /usr/local/lib/evk/
mount -t tmpfs -o mode=755 evk-dev /dev
mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/tty c 5 0
mkdir /dev/pts /dev/shm /dev/dma_heap
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts; ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777 evk-shm /dev/shm
ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
{nodes}
mknod -m 600 /dev/dma_heap/system c 1 3
mount -t tmpfs -o mode=755 evk-run /run
mkdir -p /run/sshd /run/evk/services
cp "$R/services/"* /run/evk/services/
ldconfig
if [ -e "$R/fastrpc_ready" ]; then /usr/local/sbin/udevadm trigger >/dev/null 2>&1; fi
"""

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> EvkBoard:
        self._prepare()
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> EvkBoard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- looking at the board from the test (as root over the same sshd) -----------------------
    def root_run(self, script: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        argv = self.server.ssh_argv()
        argv[-1] = f"root@{self.host}"
        return subprocess.run([*argv, script], capture_output=True, text=True, timeout=timeout)

    def reboot_count(self) -> int:
        return self.server.log_tail(10**7).count("Server listening on")


def _genie_config(bins: list[str]) -> dict[str, Any]:
    from hexstudio.shared import bundle as gb

    hf = {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "head_dim": 64,
        "vocab_size": 512,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "max_position_embeddings": 4096,
    }
    return gb.genie_config(hf, 4096, bins, 64)


def make_device_bundle(
    path: Path,
    *,
    qairt: str = "2.45.0.260326154327",
    dsp_arch: str = "v73",
    parts: int = 2,
    part_bytes: int = 256 * 1024,
    names: list[str] | None = None,
) -> Path:
    """A bundle folder shaped like a device bundle (docs/CONTRACTS.md §3): genie_config.json, context
    binaries (random bytes: the test board never runs them), tool-versions.yaml, bundle.json with sha256s.
    `names`: extra file names (e.g. hostile ones) to include."""
    import hashlib
    import json

    path.mkdir(parents=True, exist_ok=True)
    bins = [f"evk_model_part_{k}_of_{parts}.bin" for k in range(1, parts + 1)]  # qai-hub-models names
    files: dict[str, bytes] = {
        # a genie_config.json Genie's schema accepts (push checks the contract: hexstudio/shared/bundle/check.py)
        "genie_config.json": json.dumps(_genie_config(bins)).encode(),
        "htp_backend_ext_config.json": json.dumps(
            {"devices": [{"soc_model": 77, "dsp_arch": dsp_arch}]}
        ).encode(),
        "tokenizer.json": b"{}",
        "tool-versions.yaml": f"qairt: {qairt}\n".encode(),
    }
    for i, b in enumerate(bins):
        files[b] = os.urandom(part_bytes + i)
    for n in names or []:
        files[n] = f"hostile file {n!r}".encode()
    entries = []
    for rel, data in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        entries.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    doc = {
        "bundle_version": 1,
        "model": "test",
        "simulated": False,
        "emulated": False,
        "device": {"name": "Dragonwing IQ-9075 EVK", "soc_model": 77, "dsp_arch": dsp_arch, "attributes": []},
        "qairt_version": qairt,
        "context_length": 512,
        "ar_n": 128,
        "parts": parts,
        "aihub_jobs": [],
        "files": entries,
    }
    (path / "bundle.json").write_text(json.dumps(doc, indent=2))
    return path


def trust_once(evk: EvkBoard, settings: Settings, name: str = "evk") -> None:
    """The person's first contact with the board: its fingerprint trusted once (stored in known_hosts)."""
    import asyncio

    from hexstudio.core.device.board import open_board

    async def first_contact() -> None:
        b = await open_board(name, settings, trust=lambda h, p, kt, fp: fp == evk.server.host_key_fingerprint)
        await b.transport.close()

    asyncio.run(first_contact())


def run_board_stage_of_new_run(
    tmp_path: Path, board: str = "evk", workspace: Path | None = None
) -> tuple[RunManifest, Path, list[dict[str, Any]], dict[str, Any]]:
    """The Board stage of a new run of the built-in model on `board` (in `workspace`, else the chosen one), a small
    device bundle upstream: (the run, the stage's output folder, its events, what it returned)."""
    import asyncio

    from hexstudio.core.device.stage import run_board_stage
    from hexstudio.core.runs import Workspace
    from hexstudio.core.stage_api import StageContext
    from hexstudio.core.stages import get_stage

    m = Workspace(workspace).create_run("builtin:tiny-llama", board)
    upstream = tmp_path / "compile"
    make_device_bundle(upstream / "bundle", part_bytes=1000)
    out = m.run_dir / "artifacts" / "board.partial"
    out.mkdir(parents=True)
    events: list[dict[str, Any]] = []
    ctx = StageContext(m, get_stage("board"), out, {"compile": upstream}, events.append, asyncio.Event())
    return m, out, events, asyncio.run(run_board_stage(ctx))
