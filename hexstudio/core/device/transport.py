"""Transports to a board (docs/CONTRACTS.md §4). Commands are argv lists, never shell strings
built from user text."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hexstudio.shared.errors import ActionableError

log = logging.getLogger("hexstudio.board")


@dataclass
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


class RemoteProcess(Protocol):
    async def read_stdout(self, n: int = 65536) -> bytes: ...
    async def read_stderr(self, n: int = 65536) -> bytes: ...
    async def write_stdin(self, data: bytes) -> None: ...
    async def close_stdin(self) -> None: ...
    async def wait(self) -> int: ...
    async def terminate(self) -> None: ...


class Transport(Protocol):
    label: str
    simulated: bool

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult: ...
    async def start(
        self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> RemoteProcess: ...
    async def put_file(
        self, local: Path, remote: str, progress: Callable[[int], None] | None = None
    ) -> int | None: ...
    async def get_file(self, remote: str, local: Path) -> None: ...
    async def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None: ...
    async def read_bytes(self, remote: str) -> bytes: ...
    async def exists(self, remote: str) -> bool: ...
    async def home(self) -> str: ...
    async def close(self) -> None: ...


def part_name(path: str) -> str:
    """Where write_bytes writes before its rename: a name of its own per write, so two writers of one file (two
    sessions pushing the same helper) never write into the same .part and the file is never seen half-written."""
    return f"{path}.{secrets.token_hex(6)}.part"


class LocalProcess:
    """A process on this machine (the simulator board), in its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def read_stdout(self, n: int = 65536) -> bytes:
        assert self.proc.stdout is not None
        return await self.proc.stdout.read(n)

    async def read_stderr(self, n: int = 65536) -> bytes:
        assert self.proc.stderr is not None
        return await self.proc.stderr.read(n)

    async def write_stdin(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    async def wait(self) -> int:
        rc = await self.proc.wait()
        return 128 - rc if rc < 0 else rc  # died by signal N -> 128+N, like a shell

    async def terminate(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            try:
                await asyncio.wait_for(self.proc.wait(), 3)
                return
            except asyncio.TimeoutError:
                continue


class LocalTransport:
    """The simulator board: commands run here, its 'home' is a folder in the workspace."""

    simulated = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = f"local simulator ({root})"
        root.mkdir(parents=True, exist_ok=True)

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        proc = await self.start(argv, cwd=cwd, env=env)
        try:
            out, err = await asyncio.wait_for(proc.proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            await proc.terminate()
            return CommandResult(124, "", f"timed out after {timeout} s")
        return CommandResult(
            await proc.wait(), out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )

    async def start(
        self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> LocalProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd or str(self.root),
            env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        return LocalProcess(proc)

    async def put_file(
        self, local: Path, remote: str, progress: Callable[[int], None] | None = None
    ) -> int | None:
        if progress is not None:
            progress(0)  # the starting offset, as SshTransport reports it

        def copy() -> None:
            dst = Path(remote)
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".part")
            shutil.copyfile(local, tmp)
            os.replace(tmp, dst)

        await asyncio.to_thread(copy)
        if progress is not None:
            progress(local.stat().st_size)
        return local.stat().st_size

    async def get_file(self, remote: str, local: Path) -> None:
        await asyncio.to_thread(shutil.copyfile, remote, local)

    async def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None:
        def write() -> None:
            p = Path(remote)
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(part_name(remote))
            try:
                tmp.write_bytes(data)
                os.chmod(tmp, mode)
                os.replace(tmp, p)
            finally:
                tmp.unlink(missing_ok=True)

        await asyncio.to_thread(write)

    async def read_bytes(self, remote: str) -> bytes:
        return await asyncio.to_thread(Path(remote).read_bytes)

    async def read_head(self, remote: str, size: int) -> bytes:
        """The file's first `size` bytes (a context binary may be gigabytes)."""

        def head() -> bytes:
            with open(remote, "rb") as fh:
                return fh.read(size)

        return await asyncio.to_thread(head)

    async def exists(self, remote: str) -> bool:
        return Path(remote).exists()

    async def home(self) -> str:
        return str(self.root)

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# SSH (paramiko). Every blocking paramiko call runs in asyncio.to_thread.

CHUNK = 256 * 1024
WINDOW = 64 * 1024 * 1024
PGID_MARK = b"HEXSTUDIO_PGID:"


def _pgid_line_at(err: bytes) -> int:
    """Where the line the command's shell wrote its process group on starts (-1: not there, or not whole yet). The
    shell's own start-up (a line of ~/.bashrc that fails, a locale warning) may write lines before it."""
    if err.startswith(PGID_MARK):
        at = 0
    elif (at := err.find(b"\n" + PGID_MARK)) < 0:
        return -1
    else:
        at += 1
    return at if b"\n" in err[at:] else -1


def _split_pgid(err: bytes) -> tuple[int | None, bytes]:
    """(the process group the command's shell wrote on stderr, stderr without that line)."""
    at = _pgid_line_at(err)
    if at < 0:
        return None, err
    end = err.index(b"\n", at)
    try:
        pgid: int | None = int(err[at + len(PGID_MARK) : end])
    except ValueError:
        pgid = None
    return pgid, err[:at] + err[end + 1 :]


# SFTP write size: OpenSSH's channel packets carry 32 KiB; a 32 KiB write plus its SFTP header would
# split into a full packet and a tiny one (measured: 73 -> 94 MB/s on loopback with this).
T = TypeVar("T")
SFTP_REPLY_TIMEOUT_S = 120.0  # no SFTP reply for this long: the board is gone
SFTP_WRITE = 32768 - 256


class ConnectionLost(ActionableError):
    """The SSH connection dropped (board rebooted, network gone)."""


def _q(argv: list[str]) -> str:
    return shlex.join([str(a) for a in argv])


def wrap_command(argv: list[str], cwd: str | None, env: dict[str, str] | None) -> str:
    """The one shell string sent to the board: every argument quoted (shlex), never user text inlined."""
    parts = []
    if cwd:
        parts.append(f"cd -- {shlex.quote(cwd)} &&")
    parts.append("exec")
    if env:
        parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
    parts.append(_q(argv))
    return " ".join(parts)


class SshProcess:
    """A command running on the board over one SSH channel (its own session = process group)."""

    def __init__(self, transport: SshTransport, channel: Any, pgid: int | None, stderr_buf: bytes) -> None:
        self._t = transport
        self.channel = channel
        self.pgid = pgid
        self._err_buf = stderr_buf

    async def read_stdout(self, n: int = 65536) -> bytes:
        return bytes(await asyncio.to_thread(self.channel.recv, n))

    async def read_stderr(self, n: int = 65536) -> bytes:
        if self._err_buf:
            out, self._err_buf = self._err_buf[:n], self._err_buf[n:]
            return out
        return bytes(await asyncio.to_thread(self.channel.recv_stderr, n))

    async def write_stdin(self, data: bytes) -> None:
        await asyncio.to_thread(self.channel.sendall, data)

    async def close_stdin(self) -> None:
        await asyncio.to_thread(self.channel.shutdown_write)

    async def wait(self) -> int:
        rc = await asyncio.to_thread(self.channel.recv_exit_status)
        return 255 if rc == -1 else int(rc)

    async def terminate(self) -> None:
        if self.pgid and not self.channel.exit_status_ready():
            for sig in ("TERM", "KILL"):
                with contextlib.suppress(Exception):
                    await self._t.run(["kill", f"-{sig}", "--", f"-{self.pgid}"], timeout=10)
                for _ in range(30):
                    if self.channel.exit_status_ready():
                        break
                    await asyncio.sleep(0.1)
                if self.channel.exit_status_ready():
                    break
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.channel.close)


class SshSession:
    """One authenticated SSH connection and what carries it: the jump hosts' connections (ProxyJump) under
    it, or a ProxyCommand as its socket. Closing it closes them all, innermost first. (The interface of
    paramiko's SSHClient that SshTransport uses: get_transport, close.)"""

    def __init__(self, transport: Any, jumps: list[Any] | None = None, via: str = "") -> None:
        self._transport = transport
        self.jumps = list(jumps or [])
        self.via = via

    def get_transport(self) -> Any:
        return self._transport

    def close(self) -> None:
        for t in (self._transport, *reversed(self.jumps)):
            with contextlib.suppress(Exception):
                t.close()  # a ProxyCommand socket is closed (its process ended) with its transport


class SshTransport:
    """A board over SSH. Build one with hexstudio.core.device.connect.connect_ssh (host-key checks, auth)."""

    simulated = False
    # seconds a board has to answer a new command's channel (a live board answers in milliseconds)
    answer_s = 30.0

    def __init__(self, client: Any, host: str, port: int, user: str) -> None:
        self.client = client
        self.host, self.port, self.user = host, port, user
        self.label = f"ssh://{user}@{host}:{port}"
        self.via = str(getattr(client, "via", "") or "")  # "via jump1,jump2" / "ProxyCommand ...": the route
        self._sftp: Any = None
        # paramiko's SFTPClient is not safe for requests from several threads at once: one thread can read
        # another's response and leave it waiting forever (seen as a hang in the doctor). One at a time.
        self._sftp_lock = threading.RLock()
        self._home: str | None = None
        self._dirs: set[str] = set()

    @property
    def connected(self) -> bool:
        t = self.client.get_transport()
        return bool(t is not None and t.is_active())

    def _transport(self) -> Any:
        t = self.client.get_transport()
        if t is None or not t.is_active():
            raise ConnectionLost(f"The SSH connection to {self.label} is closed.")
        return t

    def sftp(self) -> Any:
        import paramiko

        with self._sftp_lock:
            if self._sftp is None or self._sftp.sock.closed:
                self._sftp = paramiko.SFTPClient.from_transport(
                    self._transport(), window_size=WINDOW, max_packet_size=32768
                )
                # a reply that never comes (board gone, network cut) ends in an error, not a hang
                self._sftp.get_channel().settimeout(SFTP_REPLY_TIMEOUT_S)
            return self._sftp

    def makedirs_sync(self, path: str) -> None:
        """mkdir -p over SFTP (remembers folders already seen)."""
        import posixpath

        if not path or path in self._dirs or path == "/":
            return
        with self._sftp_lock:
            sftp = self.sftp()
            try:
                sftp.stat(path)
            except OSError:
                self.makedirs_sync(posixpath.dirname(path.rstrip("/")))
                try:
                    sftp.mkdir(path)
                except OSError:
                    sftp.stat(path)  # made meanwhile by someone else: fine; otherwise this raises
            self._dirs.add(path)

    def _open_channel(self, command: str) -> Any:
        """A channel running `command`. A board that stops answering with the TCP link still up (Wi-Fi gone, a
        cable pulled) would hold both steps for paramiko's hour-long channel time-out, or for ever (exec_command
        waits with none): each gets `answer_s`, then the link counts as lost."""
        import paramiko

        lost = f"The SSH connection to {self.label} dropped"
        silent = (
            f"{lost}: the board did not answer a command within {self.answer_s:g} s (the network or the board "
            "stopped answering)."
        )
        try:
            ch = self._transport().open_session(
                window_size=WINDOW, max_packet_size=32768, timeout=self.answer_s
            )
        except (EOFError, OSError, paramiko.SSHException) as exc:
            why = silent if "Timeout" in str(exc) else f"{lost}: {exc or type(exc).__name__}"
            raise ConnectionLost(why) from None
        # exec_command waits for the board's answer with no time-out: closing the channel ends the wait
        fired = threading.Event()

        def give_up() -> None:
            fired.set()
            ch.close()

        watchdog = threading.Timer(self.answer_s, give_up)
        watchdog.daemon = True
        watchdog.start()
        failure: BaseException | None = None
        try:
            ch.exec_command(command)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            failure = exc
        finally:
            watchdog.cancel()
        if fired.is_set():
            raise ConnectionLost(silent)
        if failure is not None:
            raise ConnectionLost(f"{lost}: {failure or type(failure).__name__}")
        return ch

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        # A command with no input reads /dev/null, and its channel's stdin is never closed from here:
        # paramiko builds a channel EOF under the channel's lock but sends it after, so a command that
        # ends at once (and whose CLOSE paramiko answers meanwhile) can see our EOF arrive after the
        # CLOSE, and OpenSSH then drops the whole connection ("ieof packet referred to nonexistent
        # channel"), seen on a loaded 2-core machine. With input, the command reads until our EOF.
        # the shell's pid (its process group: sshd makes it a session leader) first on stderr, so that a command
        # that runs past its time-out can be stopped on the board, not only given up on here
        cmd = (
            f"echo {PGID_MARK.decode()}$$ >&2; "
            + wrap_command(argv, cwd, env)
            + ("" if stdin is not None else " </dev/null")
        )

        def go() -> CommandResult:
            ch = self._open_channel(cmd)
            try:
                if stdin is not None:
                    ch.sendall(stdin)
                    if not ch.closed and not ch.exit_status_ready():
                        ch.shutdown_write()
                out, err = bytearray(), bytearray()
                deadline = None if timeout is None else time.monotonic() + timeout
                ch.settimeout(0.2)

                def drain() -> bool:
                    nonlocal out, err
                    got = False
                    with contextlib.suppress(socket.timeout):
                        while ch.recv_ready():
                            out += ch.recv(CHUNK)
                            got = True
                        while ch.recv_stderr_ready():
                            err += ch.recv_stderr(CHUNK)
                            got = True
                    return got

                while True:
                    got = drain()
                    if ch.exit_status_ready():
                        # sshd sends the exit status when the command exits, and output still in its pipe
                        # may follow it: read on until the end of the stream (EOF) before taking the status
                        end = time.monotonic() + 5.0
                        while not ch.eof_received and not ch.closed and time.monotonic() < end:
                            if not drain():
                                time.sleep(0.005)
                        drain()
                        break
                    if ch.closed or not self.connected:
                        drain()
                        if ch.exit_status_ready():
                            break
                        if ch.closed and self.connected:  # ended without a status: killed by a signal
                            err += f"\n{argv[0]} ended without an exit status (killed by a signal?)".encode()
                            break
                        raise ConnectionLost(
                            f"The SSH connection to {self.label} dropped while running {argv[0]}."
                        )
                    if deadline is not None and time.monotonic() > deadline:
                        pgid, err_rest = _split_pgid(bytes(err))
                        if pgid is not None:
                            self._kill_group_sync(pgid)
                        stopped = (
                            "stopped on the board"
                            if pgid is not None
                            else "not stopped on the board: its process group was not known; it may still run"
                        )
                        return CommandResult(
                            124,
                            out.decode("utf-8", "replace"),
                            err_rest.decode("utf-8", "replace")
                            + f"\ntimed out after {timeout} s ({stopped})",
                        )
                    if not got:
                        time.sleep(0.005)
                rc = ch.recv_exit_status()
                return CommandResult(
                    255 if rc == -1 else rc,
                    out.decode("utf-8", "replace"),
                    _split_pgid(bytes(err))[1].decode("utf-8", "replace"),
                )
            finally:
                ch.close()

        return await asyncio.to_thread(go)

    def _kill_group_sync(self, pgid: int) -> None:
        """TERM, then KILL a second later, to a process group on the board (a command past its time-out). The
        `kill -s SIG --` form: a login shell that is dash (or busybox) refuses `kill -TERM --`."""
        script = f"kill -s TERM -- -{pgid} 2>/dev/null || exit 0; sleep 1; kill -s KILL -- -{pgid} 2>/dev/null; exit 0"
        with contextlib.suppress(Exception):
            ch = self._open_channel(script + " </dev/null")
            try:
                ch.status_event.wait(10.0)
            finally:
                ch.close()

    async def start(
        self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> SshProcess:
        # The session's shell is a session (and process group) leader: its pid is the group to kill.
        cmd = f"echo {PGID_MARK.decode()}$$ >&2; " + wrap_command(argv, cwd, env)

        def go() -> SshProcess:
            ch = self._open_channel(cmd)
            buf = b""
            # the process group's line, after whatever the shell's start-up wrote first (kept as stderr)
            while _pgid_line_at(buf) < 0 and len(buf) < 65536:
                got = ch.recv_stderr(4096)
                if not got:
                    break
                buf += got
            pgid, rest = _split_pgid(buf)
            return SshProcess(self, ch, pgid, rest)

        return await asyncio.to_thread(go)

    # -- files -------------------------------------------------------------------------------
    def put_file_sync(
        self, local: Path, remote: str, progress: Callable[[int], None] | None = None, resume: bool = True
    ) -> int:
        """Write `remote` via `<remote>.part` then rename. An existing .part whose content matches the
        local file's start is continued (only the rest is sent). Returns the bytes sent."""
        import posixpath

        sftp = self.sftp()
        self.makedirs_sync(posixpath.dirname(remote))
        part = remote + ".part"
        size = local.stat().st_size
        offset = 0
        if resume:
            try:
                psize = sftp.stat(part).st_size or 0
            except OSError:
                psize = 0
            if 0 < psize <= size and self._prefix_matches(local, part, psize):
                offset = psize
        with open(local, "rb") as src, sftp.open(part, "ab" if offset else "wb") as dst:
            dst.set_pipelined(True)
            dst.MAX_REQUEST_SIZE = SFTP_WRITE  # one SSH packet per write request (not 32 KiB + a tiny one)
            src.seek(offset)
            done = offset
            if progress is not None:
                progress(done)  # first call: the starting offset (a continued .part), then bytes written
            while True:
                block = src.read(CHUNK)
                if not block:
                    break
                dst.write(block)
                done += len(block)
                if progress is not None:
                    progress(done)
        try:
            sftp.posix_rename(part, remote)
        except OSError:
            # an SFTP server without posix-rename: remove, then rename. Not when the .part is gone: another push
            # of the same file put it in place meanwhile, and the file there is not to be removed
            try:
                sftp.stat(part)
            except OSError:
                raise OSError(
                    f"{part} was moved away while it was written: another push of the same bundle ran at the "
                    "same time. Push again when it has ended."
                ) from None
            with contextlib.suppress(OSError):
                sftp.remove(remote)
            sftp.rename(part, remote)
        return size - offset

    def _prefix_matches(self, local: Path, remote: str, n: int) -> bool:
        """Whether the first `n` bytes of `local` are the board's `remote` (a .part to continue): its sha256 on
        the board, with a time-out (the hash of gigabytes takes a while; a link that died silently must not
        hang the push)."""
        h = hashlib.sha256()
        with open(local, "rb") as f:
            left = n
            while left:
                b = f.read(min(CHUNK * 4, left))
                if not b:
                    return False
                h.update(b)
                left -= len(b)
        ch = self._open_channel(_q(["sha256sum", "--", remote]) + " </dev/null")
        try:
            # 120 s, plus a second for every 50 MB the board reads
            ch.settimeout(120.0 + n / 50e6)
            out = b""
            while True:
                b = ch.recv(4096)
                if not b:
                    break
                out += b
            if ch.recv_exit_status() != 0:
                return False
        except TimeoutError:
            # a board whose storage reads slower than the allowance: the .part is sent again from its start (a
            # link that really died fails that upload, and says so); the time-out was reported as a dropped link,
            # and every later push hashed the same .part and timed out again
            log.info("the board took too long to hash %s (%d bytes): sending it from the start", remote, n)
            return False
        finally:
            ch.close()
        return out.split(b" ")[0].decode("ascii", "replace") == h.hexdigest()

    async def put_file(
        self, local: Path, remote: str, progress: Callable[[int], None] | None = None
    ) -> int | None:
        """Returns the bytes actually sent (less than the size when a .part was continued)."""
        return await asyncio.to_thread(self._locked, self.put_file_sync, local, remote, progress)

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._sftp_lock:
            return fn(*args)

    async def get_file(self, remote: str, local: Path) -> None:
        await asyncio.to_thread(self._locked, lambda: self.sftp().get(remote, str(local)))

    async def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None:
        def go() -> None:
            import posixpath

            sftp = self.sftp()
            self.makedirs_sync(posixpath.dirname(remote))
            part = part_name(remote)
            try:
                with sftp.open(part, "wb") as f:
                    f.set_pipelined(True)
                    f.write(data)
                sftp.chmod(part, mode)
                try:
                    sftp.posix_rename(part, remote)
                except OSError:
                    sftp.rename(part, remote)
            except BaseException:
                # the connection may be gone: the first error is the news, not the failed cleanup
                with contextlib.suppress(Exception):
                    sftp.remove(part)
                raise

        await asyncio.to_thread(self._locked, go)

    async def read_bytes(self, remote: str) -> bytes:
        def go() -> bytes:
            with self.sftp().open(remote, "rb") as f:
                f.prefetch()
                return bytes(f.read())

        return await asyncio.to_thread(self._locked, go)

    async def exists(self, remote: str) -> bool:
        def go() -> bool:
            try:
                self.sftp().stat(remote)
                return True
            except FileNotFoundError:
                return False
            except OSError as exc:
                if getattr(exc, "errno", None) == 2:
                    return False
                raise

        return await asyncio.to_thread(self._locked, go)

    async def home(self) -> str:
        if self._home is None:
            self._home = await asyncio.to_thread(self._locked, lambda: str(self.sftp().normalize(".")))
        return self._home

    async def close(self) -> None:
        def go() -> None:
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
            self.client.close()

        await asyncio.to_thread(go)
