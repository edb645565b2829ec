"""~/.ssh/config honoured as OpenSSH does, on real sshd servers on 127.0.0.1: HostName/Port/User and several
IdentityFiles, ProxyJump through a second sshd to the EVK test board, ProxyCommand (a small Python relay),
IdentitiesOnly with wrong keys in a real ssh-agent, an encrypted key with the right and the wrong passphrase,
and a trusted host key saved (only when the person says yes) to a known_hosts file that OpenSSH's own client
then accepts. HOME is a temp folder: the machine's own ~/.ssh is never read or written."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core import secrets
from hexstudio.core.device import connect
from hexstudio.core.device.connect import (
    HostKeyUnknown,
    KeyPassphrase,
    KeyPassphraseNeeded,
    KeyPassphraseWrong,
    connect_ssh,
)
from hexstudio.core.device.errors import BoardError
from tests.support.evk_board import EvkBoard
from tests.support.sshd import SshServer, _keygen
from tests.support.terminal import converse

pytestmark = pytest.mark.sshd

RELAY = r"""
import socket, sys, threading
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while True:
        b = sys.stdin.buffer.raw.read(65536)
        if not b:
            break
        s.sendall(b)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    b = s.recv(65536)
    if not b:
        break
    sys.stdout.buffer.write(b); sys.stdout.buffer.flush()
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    connect._OPENED.clear()
    return h


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[SshServer]:
    with SshServer(tmp_path / "board-sshd") as s:
        yield s


def write_config(home: Path, text: str) -> None:
    (home / ".ssh" / "config").write_text(text)


def yes(*_a: Any) -> bool:
    return True


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def echo(t: Any, text: str = "hello") -> str:
    res = await t.run(["echo", text], timeout=20)
    assert res.exit_status == 0, res.stderr
    return str(res.stdout.strip())


def use(cfg: dict[str, Any], **kw: Any) -> Any:
    async def go() -> Any:
        t = await connect_ssh("b", cfg, **kw)
        try:
            assert await echo(t) == "hello"
            return t
        finally:
            await t.close()

    return run(go())


def test_hostname_port_user_and_several_identity_files(home: Path, srv: SshServer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    _keygen(wrong)
    write_config(
        home,
        f"Host evk-alias\n  HostName {srv.host}\n  Port {srv.port}\n  User {srv.user}\n"
        f"  IdentityFile {wrong}\n  IdentityFile {srv.client_key_path}\n",
    )
    t = use({"host": "evk-alias", "auth": "ssh_config"}, trust=yes)
    assert (t.host, t.port, t.user) == (srv.host, srv.port, srv.user)
    # key auth without a key_path: the config's IdentityFiles, in order (the wrong one first is refused)
    use({"host": "evk-alias", "auth": "key"})
    # the board's own settings win where given
    with pytest.raises(BoardError) as err:
        run(connect_ssh("b", {"host": "evk-alias", "auth": "key", "key_path": str(wrong)}))
    assert "refused the login" in err.value.message and str(wrong) in err.value.message
    assert "authorized_keys" in (err.value.hint or "")


@pytest.mark.parametrize(
    ("config", "board", "named"),
    [
        (
            "Host evk\n  Port abc\n",
            {"host": "evk", "auth": "ssh_config"},
            "~/.ssh/config's Port for evk is 'abc'",
        ),
        (
            "Host evk\n  Port 70000\n",
            {"host": "evk", "auth": "key"},
            "~/.ssh/config's Port for evk is '70000'",
        ),
        ("", {"host": "evk", "auth": "key", "port": "ssh"}, "The port of board host evk is 'ssh'"),
        ("Host evk\n  ProxyJump gw:twenty\n", {"host": "evk", "auth": "key"}, "ProxyJump 'gw:twenty''s port"),
        (
            "Host evk\n  ProxyJump gw\nHost gw\n  Port x\n",
            {"host": "evk", "auth": "key"},
            "jump host gw is 'x'",
        ),
    ],
)
def test_a_port_that_is_no_number_is_named_where_it_was_written(
    home: Path, tmp_path: Path, config: str, board: dict[str, Any], named: str
) -> None:
    """`Port abc` in ~/.ssh/config (or a ProxyJump `gw:twenty`) raised int()'s ValueError, which the CLI and the
    studio report as an internal error with a traceback; it is the person's file, named with the fix."""
    write_config(home, config)
    _keygen(tmp_path / "key")
    with pytest.raises(BoardError) as err:
        run(connect_ssh("b", {**board, "key_path": str(tmp_path / "key")}))
    assert named in err.value.message and "not a port number" in err.value.message, err.value.message


def test_proxyjump_through_a_second_sshd_to_the_evk_board(home: Path, tmp_path: Path) -> None:
    board = EvkBoard(tmp_path / "evk")
    board.start()
    try:
        with SshServer(tmp_path / "jump-sshd") as jump:
            write_config(
                home,
                f"Host jumpbox\n  HostName {jump.host}\n  Port {jump.port}\n  User {jump.user}\n"
                f"  IdentityFile {jump.client_key_path}\n"
                f"Host evk\n  HostName {board.host}\n  Port {board.port}\n  User {board.user}\n"
                f"  IdentityFile {board.server.client_key_path}\n  ProxyJump jumpbox\n",
            )
            asked: list[tuple[str, int]] = []

            def trust(host: str, port: int, kind: str, fp: str) -> bool:
                asked.append((host, port))
                return True

            async def go() -> None:
                t = await connect_ssh("evk", {"host": "evk", "auth": "ssh_config"}, trust=trust)
                try:
                    assert (
                        await t.run(["cat", "/sys/devices/soc0/soc_id"], timeout=20)
                    ).stdout.strip() == "676"
                    assert t.via == "via jumpbox" and len(t.client.jumps) == 1
                    await t.write_bytes(f"{await t.home()}/through-the-jump.txt", b"pushed via the jump host")
                    assert (
                        await t.read_bytes(f"{await t.home()}/through-the-jump.txt")
                        == b"pushed via the jump host"
                    )
                finally:
                    await t.close()
                # both host keys were asked about, the jump host's first; trusted now, no more questions
                assert asked == [(jump.host, jump.port), (board.host, board.port)]
                t = await connect_ssh("evk", {"host": "evk", "auth": "ssh_config"})
                assert await echo(t) == "hello"
                t.client.jumps[0].close()  # the route is the jump host's connection: the session
                deadline = time.monotonic() + 15
                while t.connected and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert not t.connected  # goes with it
                await t.close()

            run(go())
            jump.stop()
            with pytest.raises(BoardError) as err:  # jump host down: the error names it and what to do
                run(connect_ssh("evk", {"host": "evk", "auth": "ssh_config"}, timeout=5))
            assert "jumpbox" in err.value.message and err.value.hint
    finally:
        board.stop()


def test_proxycommand_relay(home: Path, srv: SshServer, tmp_path: Path) -> None:
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    write_config(
        home,
        f"Host via-relay\n  HostName {srv.host}\n  Port {srv.port}\n  User {srv.user}\n"
        f"  IdentityFile {srv.client_key_path}\n  ProxyCommand {sys.executable} {relay} %h %p\n",
    )

    async def go() -> None:
        t = await connect_ssh("b", {"host": "via-relay", "auth": "ssh_config"}, trust=yes)
        sock = t.client.get_transport().sock
        try:
            assert await echo(t) == "hello" and t.via.startswith("ProxyCommand ")
            assert sock.process.poll() is None  # the relay carries the session
        finally:
            await t.close()
        sock.process.wait(10)  # and ends with it
        # its pipes closed too, not left to the garbage collector
        assert all(f.closed for f in (sock.process.stdin, sock.process.stdout, sock.process.stderr))

    run(go())
    write_config(home, f"Host broken\n  HostName {srv.host}\n  Port {srv.port}\n  ProxyCommand false %h %p\n")
    with pytest.raises(BoardError) as err:
        run(connect_ssh("b", {"host": "broken", "auth": "ssh_config"}, timeout=5))
    assert "false" in f"{err.value.message} {err.value.hint}" and err.value.hint


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        [shutil.which("ssh-agent") or "ssh-agent", "-D", "-a", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
    try:
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_identities_only_with_wrong_keys_in_the_agent(
    home: Path, srv: SshServer, agent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paramiko

    opened: list[paramiko.Agent] = []

    class RecordedAgent(paramiko.Agent):
        def __init__(self) -> None:
            super().__init__()
            opened.append(self)

    monkeypatch.setattr(paramiko, "Agent", RecordedAgent)
    for i in range(6):  # as many wrong keys as sshd's MaxAuthTries
        k = tmp_path / f"agent_key_{i}"
        _keygen(k)
        subprocess.run(
            ["ssh-add", "-q", str(k)],
            check=True,
            env={**os.environ, "SSH_AUTH_SOCK": str(agent)},
            capture_output=True,
        )
    entry = (
        f"Host evk\n  HostName {srv.host}\n  Port {srv.port}\n  User {srv.user}\n"
        f"  IdentityFile {srv.client_key_path}\n"
    )
    write_config(home, entry)
    with pytest.raises(BoardError) as err:  # the agent's keys use up the server's tries
        run(connect_ssh("b", {"host": "evk", "auth": "ssh_config"}, trust=yes))
    assert "refused the login" in err.value.message and "agent key" in err.value.message
    write_config(home, entry + "  IdentitiesOnly yes\n")
    use({"host": "evk", "auth": "ssh_config"})  # only the IdentityFile is offered: in
    # every connection to the agent is closed once the login is over, refused or not (none left to the GC)
    assert len(opened) == 2 and all(a._conn is None for a in opened)
    plan = connect._auth_plan("b", connect.resolve({"host": "evk", "auth": "ssh_config"}), None)
    assert [c.label for c in plan.candidates] == [f"key {srv.client_key_path}"]
    assert sum("IdentitiesOnly" in n for n in plan.notes) == 6
    plan.close()
    assert opened[-1]._conn is None


def test_encrypted_key_asks_for_its_passphrase(home: Path, srv: SshServer, tmp_path: Path) -> None:
    key = tmp_path / "enc_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "right horse", "-f", str(key)], check=True)
    with open(srv.authorized_keys, "a") as f:
        f.write(key.with_name("enc_key.pub").read_text())
    cfg = {"host": srv.host, "port": srv.port, "user": srv.user, "auth": "key", "key_path": str(key)}
    stored = secrets.key_passphrase_key(str(key.resolve()))
    secrets.delete_secret(stored)
    with pytest.raises(KeyPassphraseNeeded) as need:  # nobody to ask: say so, and what to do
        run(connect_ssh("b", cfg, trust=yes))
    assert need.value.key_path == str(key) and "ssh-add" in (need.value.hint or "")

    asked: list[int] = []

    def wrong(path: str, attempt: int) -> KeyPassphrase:
        asked.append(attempt)
        return KeyPassphrase("wrong horse")

    with pytest.raises(KeyPassphraseWrong) as bad:
        run(connect_ssh("b", cfg, passphrase=wrong))
    assert asked == [0, 1, 2] and "wrong" in bad.value.message and "ssh-keygen -y" in (bad.value.hint or "")
    assert "wrong horse" not in f"{bad.value.message} {bad.value.hint}"

    use(cfg, passphrase=lambda p, a: KeyPassphrase("right horse"))
    assert secrets.get_secret(stored) is None  # never stored unless the person chose the keyring
    use(cfg)  # opened in this process: a reconnect does not ask again
    connect._OPENED.clear()
    use(cfg, passphrase=lambda p, a: KeyPassphrase("right horse", remember=True))
    assert secrets.get_secret(stored) == "right horse"
    connect._OPENED.clear()
    use(cfg)  # from the keyring, as chosen
    secrets.delete_secret(stored)


def test_trusted_host_key_saved_to_known_hosts_only_when_accepted(
    home: Path, srv: SshServer, tmp_path: Path
) -> None:
    cfg = srv.key_config()
    kh = home / ".ssh" / "known_hosts"
    offered: list[Path] = []

    def decline(host: str, port: int, kind: str, fp: str, path: Path) -> bool:
        offered.append(path)
        return False

    with pytest.raises(HostKeyUnknown):  # not trusted: nothing offered, nothing written
        run(connect_ssh("b", cfg, offer_known_hosts=decline))
    assert not offered and not kh.exists()
    use(cfg, trust=yes, offer_known_hosts=decline)  # trusted in HexStudio only
    assert offered == [kh] and not kh.exists()

    connect.known_hosts_path().unlink()  # first contact again; this time the person says yes
    use(cfg, trust=yes, offer_known_hosts=lambda *a: True)
    assert kh.read_text() == srv.known_hosts_line + "\n"  # as `ssh-keyscan -p PORT 127.0.0.1` writes it
    openssh = subprocess.run(
        srv.ssh_argv("echo", "openssh-agrees", known_hosts=kh),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert openssh.stdout.strip() == "openssh-agrees", openssh.stderr
    connect.known_hosts_path().unlink()
    use(cfg)  # the user's known_hosts is read too: no question

    # hashed, as `ssh-keyscan -H` writes it, when ~/.ssh/config says HashKnownHosts yes
    kh.unlink()
    connect.known_hosts_path().unlink(missing_ok=True)
    write_config(home, f"Host {srv.host}\n  HashKnownHosts yes\n")
    use(cfg, trust=yes, offer_known_hosts=lambda *a: True)
    line = kh.read_text().strip()
    assert (
        line.startswith("|1|")
        and srv.host not in line
        and line.endswith(" ".join(srv.host_key_pub.split()[:2]))
    )
    found = subprocess.run(
        ["ssh-keygen", "-F", f"[{srv.host}]:{srv.port}", "-f", str(kh)], capture_output=True, text=True
    )
    assert found.returncode == 0 and "|1|" in found.stdout
    # a file already hashed stays hashed; a key already there is not written twice
    assert connect.save_to_user_known_hosts(kh, srv.host, srv.port, _server_key(srv)) is False


def _server_key(srv: SshServer) -> Any:
    import base64

    import paramiko

    kind, b64 = srv.host_key_pub.split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64))


def test_the_cli_asks_on_the_terminal(home: Path, srv: SshServer, tmp_path: Path) -> None:
    """`hexstudio board add` on a terminal (a pty): trust the fingerprint, decline the known_hosts offer, type
    the encrypted key's passphrase (getpass), do not keep it. Nothing is stored that was not chosen."""
    key = tmp_path / "enc_cli_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "cli pass", "-f", str(key)], check=True)
    with open(srv.authorized_keys, "a") as f:
        f.write(key.with_name("enc_cli_key.pub").read_text())
    argv = [
        sys.executable,
        "-m",
        "hexstudio",
        "board",
        "add",
        "enc",
        "--host",
        srv.host,
        "--port",
        str(srv.port),
    ]
    argv += ["--user", srv.user, "--auth", "key", "--key", str(key)]
    answers = [
        ("Trust it?", "y"),
        ("known_hosts", "n"),
        ("Passphrase for SSH key", "cli pass"),
        ("keyring", "n"),
    ]
    seen, code, answers = converse(argv, answers)
    text = seen.decode(errors="replace")
    assert not answers, text
    assert code == 0, text
    assert "connected: ssh://" in text and "cli pass" not in text  # getpass: no echo
    assert not (home / ".ssh" / "known_hosts").exists()
    assert secrets.get_secret(secrets.key_passphrase_key(str(key.resolve()))) is None


def test_a_symlinked_known_hosts_gets_the_key_in_its_target(tmp_path: Path) -> None:
    """~/.ssh/known_hosts a symlink (a dotfiles manager's): the key was written to a temp file renamed over the
    link, which became a plain file; the real file never got the key, nor any later one."""
    import paramiko

    from hexstudio.core.device.connect import save_to_user_known_hosts

    target = tmp_path / "dotfiles" / "known_hosts"
    target.parent.mkdir()
    target.write_text(
        "other-host ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    )
    link = tmp_path / "ssh" / "known_hosts"
    link.parent.mkdir()
    link.symlink_to(target)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "k"))
    assert save_to_user_known_hosts(link, "evk", 2222, key, hashed=False)
    assert link.is_symlink()
    lines = target.read_text().splitlines()
    assert (
        len(lines) == 2
        and lines[0].startswith("other-host")
        and lines[1].startswith("[evk]:2222 ssh-ed25519")
    )


def test_a_host_key_alias_is_looked_up_and_saved_as_openssh_does(home: Path, srv: SshServer) -> None:
    """With HostKeyAlias (and a port other than 22) HexStudio looked up and wrote `[evk]:PORT`, where ssh reads and
    writes the alias alone: a key the user already trusted in ssh was a "first connection", and the line HexStudio
    added was one ssh never reads."""
    write_config(home, f"Host evk\n  HostName {srv.host}\n  Port {srv.port}\n  HostKeyAlias evk-key\n")
    kh = home / ".ssh" / "known_hosts"
    cfg = {"host": "evk", "auth": "key", "key_path": str(srv.client_key_path), "user": srv.user}
    use(cfg, trust=yes, offer_known_hosts=lambda *a: True)
    assert kh.read_text().split()[0] == "evk-key"
    openssh = subprocess.run(
        [
            "ssh",
            "-F",
            str(home / ".ssh" / "config"),
            "-o",
            f"UserKnownHostsFile={kh}",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-i",
            str(srv.client_key_path),
            "-l",
            srv.user,
            "evk",
            "echo",
            "agrees",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert openssh.stdout.strip() == "agrees", openssh.stderr
    connect.known_hosts_path().unlink()
    use(cfg)  # ssh's line is read back: no question
