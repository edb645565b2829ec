"""Security and faults over a real sshd: changed host key refused, hostile file names quoted, a push
dropped mid-file resumes with only the rest."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device import transport as tr
from hexstudio.core.device.board import open_board
from hexstudio.core.device.connect import HostKeyChanged, HostKeyUnknown, connect_ssh
from hexstudio.core.device.errors import ConnectionDropped, UnsafeBundle
from hexstudio.core.device.push import push_bundle
from tests.board.conftest import settings_with
from tests.support.evk_board import make_device_bundle
from tests.support.sshd import SshServer

FACTS = {
    "dsp_arch": "v73",
    "qairt_version": "2.45.0.260326",
    "mem_total_bytes": 16 << 30,
    "mem_available_bytes": 12 << 30,
}


def _cfg(srv: SshServer) -> dict[str, Any]:
    return srv.key_config()


def test_changed_host_key_is_refused(tmp_path: Path) -> None:
    with SshServer(tmp_path / "srv") as srv:
        cfg = _cfg(srv)
        with pytest.raises(HostKeyUnknown) as unknown:  # never added silently
            asyncio.run(connect_ssh("b", cfg))
        assert unknown.value.fingerprint == srv.host_key_fingerprint
        t = asyncio.run(connect_ssh("b", cfg, trust=lambda *a: True))
        asyncio.run(t.close())
        asyncio.run(connect_ssh("b", cfg)).client.close()  # trusted now: no question
        srv.rotate_host_key()
        srv.restart()
        states: list[tuple[str, str]] = []
        with pytest.raises(HostKeyChanged) as changed:
            asyncio.run(
                connect_ssh("b", cfg, trust=lambda *a: True, on_state=lambda s, d: states.append((s, d)))
            )
        assert "REFUSED" in changed.value.message and "CHANGED" in changed.value.message
        # the hint names the lines to remove, in the files really read, as ssh-keygen removes them
        assert f"ssh-keygen -R '[{srv.host}]:{srv.port}' -f" in (changed.value.hint or ""), changed.value.hint
        assert "'~" not in (changed.value.hint or "")  # a quoted ~ is no home folder to ssh-keygen
        assert changed.value.fingerprint == srv.host_key_fingerprint
        assert states[-1][0] == "failed"
        settings_with("b", cfg)
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from hexstudio.cli.main import main; sys.exit(main(sys.argv[1:]))",
                "board",
                "probe",
                "b",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and "REFUSED" in r.stderr and json.loads(r.stdout)["ok"] is False


HOSTILE = [
    "a b; touch PWNED1",
    "$(touch PWNED2)",
    "`touch PWNED3`",
    'it\'s "quoted"',
    "-rf",
    "*",
    "ünï cødé",
    "sub dir/x;y",
]


def test_hostile_names_are_quoted(ssh_server: SshServer, tmp_path: Path) -> None:
    """Hostile text in an argv reaches the board verbatim and runs nothing; hostile bundle file names and
    bundle names are refused before anything is sent (issue 18: names come from a safe set)."""
    settings = settings_with("root", _cfg(ssh_server))

    async def go() -> None:
        board = await open_board("root", settings, trust=lambda *a: True)
        t = board.transport
        r = await t.run(["printf", "%s\\n", *HOSTILE])
        assert r.stdout.splitlines() == HOSTILE
        home = await t.home()
        for i, n in enumerate(HOSTILE):
            bundle = make_device_bundle(tmp_path / f"bundle{i}", part_bytes=100, names=[n])
            with pytest.raises(UnsafeBundle) as ei:
                await push_bundle(board, bundle, f"hostile-{i}", facts=FACTS)
            assert "bundle.json files[" in ei.value.message and repr(n) in ei.value.message, ei.value.message
            assert not await t.exists(f"{home}/hexstudio/bundles/hostile-{i}")
        with pytest.raises(UnsafeBundle, match="bundle name"):
            await push_bundle(
                board,
                make_device_bundle(tmp_path / "ok", part_bytes=100),
                "b; touch PWNED4 $(touch PWNED5)",
                facts=FACTS,
            )
        r = await t.run(["sh", "-c", 'find "$1" /tmp -name "PWNED*" 2>/dev/null; true', "x", home])
        assert "PWNED" not in r.stdout
        await t.close()

    asyncio.run(go())
    assert not list(Path.cwd().glob("PWNED*"))


@pytest.mark.slow
def test_dropped_push_resumes_with_only_the_rest(
    ssh_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with("root", _cfg(ssh_server))
    bundle = make_device_bundle(tmp_path / "bundle", parts=2, part_bytes=24 << 20)
    big = json.loads((bundle / "bundle.json").read_text())["files"]
    total = sum(f["size"] for f in big)
    orig = tr.SshTransport.put_file_sync
    state = {"dropped": False}

    def dropping(
        self: tr.SshTransport, local: Path, remote: str, progress: Any = None, resume: bool = True
    ) -> int:
        def prog(done: int) -> None:
            if not state["dropped"] and local.name.startswith("evk_model_part_2") and done > 10 << 20:
                state["dropped"] = True
                self.client.get_transport().sock.close()  # the network goes away mid-file

        return orig(self, local, remote, prog, resume)

    monkeypatch.setattr(tr.SshTransport, "put_file_sync", dropping)

    async def go() -> None:
        board = await open_board("root", settings, trust=lambda *a: True)
        with pytest.raises(ConnectionDropped, match="dropped while pushing evk_model_part_2") as ei:
            await push_bundle(board, bundle, "resume-test", facts=FACTS)
        assert "push again" in (ei.value.hint or "")
        assert state["dropped"]
        board = await open_board("root", settings)  # reconnect
        res = await push_bundle(board, bundle, "resume-test", facts=FACTS)
        second = (bundle / "evk_model_part_2_of_2.bin").stat().st_size
        # the files sent before the drop are skipped; the interrupted one continues from its .part
        assert res.skipped_files >= 5
        assert 0 < res.sent_bytes < second - (4 << 20), (res.sent_bytes, second)
        assert res.sent_bytes < total / 2
        r = await board.transport.run(["sha256sum", "--", f"{res.remote_dir}/evk_model_part_2_of_2.bin"])
        want = hashlib.sha256((bundle / "evk_model_part_2_of_2.bin").read_bytes()).hexdigest()
        assert r.stdout.split()[0] == want
        again = await push_bundle(board, bundle, "resume-test", facts=FACTS)
        assert again.sent_bytes == 0
        await board.transport.run(["rm", "-rf", "--", res.remote_dir])
        await board.transport.close()

    asyncio.run(go())


def test_short_commands_never_lose_their_output(ssh_server: SshServer) -> None:
    """Output that arrives together with the exit status and the channel close is kept (a race that once
    gave an empty `id -un`)."""
    settings = settings_with("root", _cfg(ssh_server))

    async def go() -> list[str]:
        board = await open_board("root", settings, trust=lambda *a: True)
        sem = asyncio.Semaphore(8)

        async def one(i: int) -> str:
            async with sem:
                r = await board.transport.run(["printf", "%s", f"out-{i}"])
                assert r.exit_status == 0
                return r.stdout

        outs = await asyncio.gather(*(one(i) for i in range(64)))
        await board.transport.close()
        return list(outs)

    assert asyncio.run(go()) == [f"out-{i}" for i in range(64)]


def test_a_command_past_its_time_out_is_stopped_on_the_board(ssh_server: SshServer) -> None:
    """A command that runs past its time-out (a hung validator holding the DSP, a stuck install) is stopped on
    the board, its children too, not only given up on here: a retry must not race the first. Its stderr is
    the command's own (the process-group line the transport reads is not in it)."""
    settings = settings_with("root", _cfg(ssh_server))
    mark = f"hexstudio-hang-{secrets.token_hex(4)}"

    async def go() -> tuple[Any, Any, Any]:
        board = await open_board("root", settings, trust=lambda *a: True)
        t = board.transport
        try:
            hung = await t.run(
                ["sh", "-c", f"echo started >&2; sh -c 'sleep 60; : {mark}' & wait"], timeout=1.5
            )
            # [h]: the pattern does not match the shell that runs pgrep
            left = await t.run(["sh", "-c", f"pgrep -f '[h]{mark[1:]}' || true"])
            plain = await t.run(["sh", "-c", "echo to-stderr >&2; exit 3"])
        finally:
            await t.close()
        return hung, left, plain

    hung, left, plain = asyncio.run(go())
    assert hung.exit_status == 124 and "timed out after 1.5 s" in hung.stderr, hung
    assert hung.stderr.startswith("started"), hung.stderr
    assert left.stdout.strip() == "", f"still running on the board: {left.stdout}"
    assert plain.exit_status == 3 and plain.stderr == "to-stderr\n", plain


def test_a_board_that_stops_answering_is_a_lost_link_not_a_hang(ssh_server: SshServer) -> None:
    """The TCP link stays up but the board answers nothing (Wi-Fi gone, the board hung; here: sshd's session
    processes stopped): a new command's channel waited for paramiko's hour-long channel time-out, or for ever in
    exec_command. Now ConnectionLost after `answer_s`."""
    import os
    import signal
    import time

    import psutil

    async def go() -> None:
        t = await connect_ssh("evk-test", ssh_server.key_config(), trust=lambda *_a: True)
        assert (await t.run(["true"], timeout=10)).exit_status == 0
        assert ssh_server.proc is not None
        sessions = psutil.Process(ssh_server.proc.pid).children(recursive=True)
        assert sessions
        t.answer_s = 1.0
        for p in sessions:
            os.kill(p.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(tr.ConnectionLost, match="did not answer a command within 1 s"):
                await t.run(["true"], timeout=20)
            assert time.monotonic() - t0 < 10
        finally:
            for p in sessions:
                os.kill(p.pid, signal.SIGCONT)
            await t.close()

    asyncio.run(go())


def test_a_command_the_board_never_answers_is_a_lost_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel opened, but the exec request got no answer: paramiko's exec_command waits with no time-out."""
    import threading
    from types import SimpleNamespace

    class Silent:
        def __init__(self) -> None:
            self.shut = threading.Event()

        def exec_command(self, _command: str) -> None:
            self.shut.wait(30)
            raise EOFError("Channel closed.")  # what paramiko raises once the channel is closed under it

        def close(self) -> None:
            self.shut.set()

    ch = Silent()
    link = SimpleNamespace(is_active=lambda: True, open_session=lambda **_kw: ch)
    t = tr.SshTransport(SimpleNamespace(get_transport=lambda: link), "board", 22, "evk")
    t.answer_s = 0.3
    with pytest.raises(tr.ConnectionLost, match=r"did not answer a command within 0\.3 s"):
        t._open_channel("true")
    assert ch.shut.is_set()


class _ShellWithNoise:
    """A paramiko channel whose shell's start-up writes a line to stderr before the process group's line (a
    failing line in ~/.bashrc), then runs for ever."""

    def __init__(self) -> None:
        self.err = b"bash: /opt/tool/env.sh: No such file or directory\nHEXSTUDIO_PGID:4242\nstarted\n"
        self.closed = False
        self.eof_received = False

    def settimeout(self, _s: float) -> None: ...
    def recv_ready(self) -> bool:
        return False

    def recv_stderr_ready(self) -> bool:
        return bool(self.err)

    def recv_stderr(self, n: int) -> bytes:
        got, self.err = self.err[:n], self.err[n:]
        return got

    def exit_status_ready(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def test_a_command_past_its_time_out_is_stopped_after_shell_start_up_noise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process group was read only from stderr's first line: a shell whose start-up wrote anything first
    left a timed-out command running on the board (holding the NPU), while the message said "stopped on the
    board"."""
    from types import SimpleNamespace

    from hexstudio.core.device.transport import SshTransport

    live = SimpleNamespace(is_active=lambda: True)
    t = SshTransport(SimpleNamespace(get_transport=lambda: live), "evk", 22, "u")
    killed: list[int] = []
    monkeypatch.setattr(t, "_open_channel", lambda _cmd: _ShellWithNoise())
    monkeypatch.setattr(t, "_kill_group_sync", killed.append)
    r = asyncio.run(t.run(["genie-t2t-run"], timeout=0.3))
    assert r.exit_status == 124 and killed == [4242], (r, killed)
    assert "(stopped on the board)" in r.stderr and "HEXSTUDIO_PGID" not in r.stderr
    assert r.stderr.startswith("bash: /opt/tool/env.sh: No such file") and "started" in r.stderr
    # a streaming command's process group, read past the same noise
    proc = asyncio.run(t.start(["genie-t2t-run"]))
    assert proc.pgid == 4242, proc.pgid


def test_a_host_key_of_another_type_is_refused_not_offered_as_new(tmp_path: Path) -> None:
    """A board trusted by its ed25519 key that answers with an ECDSA one was offered as a "First connection":
    the trust prompt an interceptor needs one "yes" to."""
    from hexstudio.core.device.connect import HostKeyOtherType

    with SshServer(tmp_path / "ed") as srv:
        cfg = _cfg(srv)
        asyncio.run(asyncio.run(connect_ssh("b", cfg, trust=lambda *a: True)).close())
        port = srv.port
    with SshServer(tmp_path / "ec", host_key_type="ecdsa", port=port) as other:
        other.authorized_keys.write_text((tmp_path / "ed" / "client_key.pub").read_text())
        asked: list[Any] = []
        with pytest.raises(HostKeyOtherType) as refused:
            asyncio.run(connect_ssh("b", cfg, trust=lambda *a: asked.append(a) or True))
        assert asked == [] and "REFUSED" in refused.value.message and "ssh-ed25519" in refused.value.message


def test_known_hosts_lines_paramiko_cannot_read_are_passed_over(tmp_path: Path) -> None:
    """One @cert-authority line (or one with bad base64) anywhere in ~/.ssh/known_hosts made paramiko raise on load,
    and every connection to every board ended in a raw error. OpenSSH passes such lines over; a @revoked key is
    refused."""
    import socket

    import paramiko

    from hexstudio.core.device.connect import (
        HostKeyRevoked,
        _check_host_key,
        _fast_transport,
        _load_host_keys,
    )

    key = paramiko.Ed25519Key.from_private_key_file(str(_keygen_ed25519(tmp_path)))
    line = f"board {key.get_name()} {key.get_base64()}"
    kh = tmp_path / "known_hosts"
    kh.write_text(
        f"@cert-authority *.corp.example {line.split(' ', 1)[1]}\nbroken ssh-ed25519 AAAA!!!\n{line}\n"
    )
    r: dict[str, Any] = {"known_hosts_files": [str(kh)], "host_key_alias": None, "host": "board", "port": 22}
    hk, revoked = _load_host_keys(r)
    assert hk.lookup("board") is not None and revoked == []
    kh.write_text(f"{line}\n@revoked * {line.split(' ', 1)[1]}\n")

    class Served:
        def get_remote_server_key(self) -> Any:
            return key

    with pytest.raises(HostKeyRevoked):
        _check_host_key(Served(), r, None, None)
    # a board HexStudio trusted under [alias]:port before it named HostKeyAlias boards as ssh does is still known
    kh.write_text(f"[evk-key]:2222 {line.split(' ', 1)[1]}\n")
    aliased = {**r, "host": "10.0.0.9", "port": 2222, "host_key_alias": "evk-key"}
    _check_host_key(Served(), aliased, None, None)  # no HostKeyUnknown
    # the trusted type is asked for first, as OpenSSH does (RSA by its SHA-2 signatures)
    a, b = socket.socketpair()
    t = _fast_transport(a, ["ecdsa-sha2-nistp256", "ssh-rsa"])
    assert t.get_security_options().key_types[:3] == ("ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")
    t.close()
    b.close()


def _keygen_ed25519(tmp_path: Path) -> Path:
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def test_a_resume_check_the_board_is_slow_to_answer_sends_the_file_again(tmp_path: Path) -> None:
    """The board hashes a leftover .part before the rest is sent; on slow storage that outlasted its time-out,
    which was reported as a dropped link ("check the board's power and network"), and every later push timed out
    on the same .part. It is now sent again from its start."""
    from hexstudio.core.device.transport import SshTransport

    local = tmp_path / "part.bin"
    local.write_bytes(b"x" * 4096)
    closed: list[bool] = []

    class SlowChannel:
        def settimeout(self, s: float) -> None:
            pass

        def recv(self, n: int) -> bytes:
            raise TimeoutError("timed out")

        def close(self) -> None:
            closed.append(True)

    t = object.__new__(SshTransport)
    t._open_channel = lambda command: SlowChannel()  # type: ignore[method-assign]
    assert t._prefix_matches(local, "/data/b/part.bin.part", 4096) is False and closed == [True]


def test_bundle_check_against_a_board_never_connected_to_takes_trust(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bundle check BUNDLE --board NAME` on a board never connected to stopped at its unknown host key, with a hint
    to "trust it" and no --trust to pass (board probe has one)."""
    from hexstudio.cli.main import main as cli

    fixture = (
        Path(__file__).parents[1]
        / "compile"
        / "fixtures"
        / "llama_v3_2_1b_instruct-genie-w4a16-qualcomm_qcs9075"
    )
    with SshServer(tmp_path / "srv") as srv:
        settings_with("fresh", _cfg(srv))
        assert cli(["bundle", "check", str(fixture), "--board", "fresh"]) != 0
        err = capsys.readouterr().err
        assert "First connection" in err and f"--trust {srv.host_key_fingerprint}" in err, err
        rc = cli(["bundle", "check", str(fixture), "--board", "fresh", "--trust", srv.host_key_fingerprint])
        out, err = capsys.readouterr()
        assert "First connection" not in err and "refused" not in err.lower(), err
        # it reached the board: the fixture's stand-in binaries fail, and the test board has no QAIRT
        assert rc == 1 and "qairt_missing" in out, out
