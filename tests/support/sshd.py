"""A real OpenSSH sshd on 127.0.0.1 for tests (remote workers, board transport, the EVK test board).

    from tests.support.sshd import SshServer
    with SshServer(tmp_path) as srv:
        srv.host, srv.port, srv.user, srv.client_key_path, srv.host_key_fingerprint, srv.known_hosts_line

or the session fixture `ssh_server`: put `from tests.support.sshd import ssh_server  # noqa: F401` in
your tests/<area>/conftest.py (pytest_plugins is not allowed in non-root conftests).

Everything lives in the temp folder given: a generated host key, a client key pair authorised for
every user, sshd_config, pid file and log. sshd listens on a random free port of 127.0.0.1 and runs in
the foreground (-D) as a child of the test process.

`setup_script` (shell text): runs sshd inside a private mount namespace
(`unshare --mount --propagation private`), after the script has prepared that namespace (tmpfs or
bind mounts over /opt, /dev, /sys, /etc copies...). Sessions then see those files at their real
paths, while this machine's own files stay untouched. In that mode sshd runs under a small supervisor
loop: `sshd_reboot` (written to <dir>/bin/) kills every sshd of the namespace (dropping all sessions)
and the supervisor starts it again after `<dir>/state/reboot_delay` seconds: a board reboot.

Needs root and Debian's openssh-server (`apt-get install -y openssh-server`; the ./dev test script
installs it in CI).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_available() -> tuple[bool, str]:
    if not Path(SSHD).exists() or not Path(SSH_KEYGEN).exists():
        return False, "OpenSSH server is not installed: apt-get install -y openssh-server"
    if os.geteuid() != 0:
        return False, "the test sshd needs root (it serves other users and uses mount namespaces)"
    return _mount_namespaces()


@functools.cache
def _mount_namespaces() -> tuple[bool, str]:
    """Whether this root may make a mount namespace (the test board's reboot and /dev stand-ins need one): a root
    container without CAP_SYS_ADMIN may not, and every sshd test then errored instead of being skipped."""
    try:
        r = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare cannot run ({exc}): apt-get install -y util-linux"
    if r.returncode != 0:
        return False, (
            f"no mount namespaces here ({r.stderr.strip() or 'unshare failed'}): run the container with "
            "--privileged (or --cap-add SYS_ADMIN)"
        )
    return True, ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fingerprint_of_pub(pub_line: str) -> str:
    """OpenSSH's SHA256 fingerprint ('SHA256:base64-without-padding') of a public key line."""
    blob = base64.b64decode(pub_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _keygen(path: Path, kind: str = "ed25519") -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", kind, "-N", "", "-C", "hexstudio-test", "-f", str(path)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def namespace_pids(pid: int) -> list[int]:
    """Pids of the processes in the same mount namespace as `pid` (not this process's namespace)."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return []
    if ns == os.readlink("/proc/self/ns/mnt"):
        return []
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{d}/ns/mnt") == ns:
                    out.append(int(d))
    return out


class SshServer:
    def __init__(
        self,
        base_dir: Path,
        *,
        user: str = "root",
        setup_script: str | None = None,
        password_auth: bool = False,
        host_key_type: str = "ed25519",
        port: int | None = None,
    ) -> None:
        self.dir = Path(base_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.user = user
        self.setup_script = setup_script
        self.password_auth = password_auth
        self.host_key_type = host_key_type
        self.host_key_path = self.dir / f"ssh_host_{host_key_type}_key"
        self.client_key_path = self.dir / "client_key"
        self.authorized_keys = self.dir / "authorized_keys"
        self.config_path = self.dir / "sshd_config"
        self.pid_file = self.dir / "sshd.pid"
        self.log_path = self.dir / "sshd.log"
        self.state_dir = self.dir / "state"
        self.bin_dir = self.dir / "bin"
        self.proc: subprocess.Popen[bytes] | None = None
        if not self.host_key_path.exists():
            _keygen(self.host_key_path, host_key_type)
        if not self.client_key_path.exists():
            _keygen(self.client_key_path, "ed25519")
            shutil.copyfile(self.client_key_path.with_name("client_key.pub"), self.authorized_keys)
            os.chmod(self.authorized_keys, 0o644)

    # -- facts a client needs ---------------------------------------------------------------
    @property
    def host_key_pub(self) -> str:
        return self.host_key_path.with_name(self.host_key_path.name + ".pub").read_text().strip()

    @property
    def host_key_fingerprint(self) -> str:
        return fingerprint_of_pub(self.host_key_pub)

    @property
    def known_hosts_line(self) -> str:
        kind, b64 = self.host_key_pub.split()[:2]
        return f"[{self.host}]:{self.port} {kind} {b64}"

    def key_config(self, **extra: Any) -> dict[str, Any]:
        """A board's (or worker host's) connection settings for this server, by the client key; `extra` adds
        or overrides entries."""
        cfg: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user, "auth": "key"}
        return {**cfg, "key_path": str(self.client_key_path), **extra}

    @property
    def namespaced(self) -> bool:
        return self.setup_script is not None

    def ssh_argv(self, *remote: str, known_hosts: Path | None = None) -> list[str]:
        """An OpenSSH client command line for this server (for scp/ssh comparisons), no ssh_config read; the
        server's key known from `known_hosts` (a file the test wrote), else from a file written here."""
        kh = known_hosts
        if kh is None:
            kh = self.dir / "client_known_hosts"
            kh.write_text(self.known_hosts_line + "\n")
        return [
            "ssh",
            "-p",
            str(self.port),
            "-i",
            str(self.client_key_path),
            "-o",
            f"UserKnownHostsFile={kh}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-F",
            "/dev/null",
            f"{self.user}@{self.host}",
            *remote,
        ]

    # -- lifecycle ---------------------------------------------------------------------------
    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {self.host_key_path}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no",
            "UsePAM no",
            "PermitRootLogin yes",
            f"PasswordAuthentication {'yes' if self.password_auth else 'no'}",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "UseDNS no",
            "PrintMotd no",
            "ClientAliveInterval 0",
            "PermitUserEnvironment no",
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def rotate_host_key(self) -> None:
        """Give the server a new host key (the next start serves it): a 'changed host key'."""
        _keygen(self.host_key_path, self.host_key_type)

    def start(self, timeout: float = 20.0) -> SshServer:
        ok, why = sshd_available()
        if not ok:
            raise RuntimeError(why)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
        self._write_config()
        self.state_dir.mkdir(exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        if self.setup_script is None:
            argv = [SSHD, "-D", "-e", "-f", str(self.config_path)]
        else:
            self.bin_dir.mkdir(exist_ok=True)
            setup = self.dir / "setup.sh"
            setup.write_text("set -eu\n" + self.setup_script + "\n")
            reboot = self.bin_dir / "sshd_reboot"
            # Kill every sshd of this mount namespace: all sessions drop, the supervisor restarts sshd.
            reboot.write_text(
                "#!/bin/sh\nns=$(readlink /proc/self/ns/mnt)\n"
                "for p in /proc/[0-9]*; do\n"
                '  [ "$(readlink $p/ns/mnt 2>/dev/null)" = "$ns" ] || continue\n'
                '  [ "$(cat $p/comm 2>/dev/null)" = sshd ] && kill -9 "${p#/proc/}" 2>/dev/null\n'
                "done\nexit 0\n"
            )
            reboot.chmod(0o755)
            sup = self.dir / "supervisor.sh"
            st = shlex.quote(str(self.state_dir))
            sup.write_text(
                f"sh {shlex.quote(str(setup))} || exit 97\n"
                f"while :; do\n  {shlex.quote(SSHD)} -D -e -f {shlex.quote(str(self.config_path))}\n"
                f"  [ -e {st}/stop ] && exit 0\n"
                f'  d=$(cat {st}/reboot_delay 2>/dev/null || echo 1); sleep "$d"\n'
                f"  [ -e {st}/stop ] && exit 0\n"
                f"  [ -x {st}/on_boot ] && {st}/on_boot\n"
                "done\n"
            )
            (self.state_dir / "stop").unlink(missing_ok=True)
            argv = ["unshare", "--mount", "--propagation", "private", "sh", str(sup)]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited ({self.proc.returncode}); log:\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=1) as s,
            ):
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"sshd did not answer on {self.host}:{self.port} in {timeout} s; log:\n{self.log_tail()}"
        )

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.namespaced:
            (self.state_dir / "stop").write_text("")
            pids = namespace_pids(self.proc.pid)
            for pid in pids:
                if pid != self.proc.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> SshServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A plain sshd (no namespace) on 127.0.0.1, user root, key auth with `client_key_path`."""
    ok, why = sshd_available()
    if not ok:
        pytest.fail(why)
    srv = SshServer(tmp_path_factory.mktemp("sshd"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
