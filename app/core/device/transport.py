"""Transports to a board (docs/CONTRACTS.md §4). Commands are argv lists, never shell strings
built from user text."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


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

    async def run(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                  timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        proc = await self.start(argv, cwd=cwd, env=env)
        try:
            out, err = await asyncio.wait_for(proc.proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            await proc.terminate()
            return CommandResult(124, "", f"timed out after {timeout} s")
        return CommandResult(await proc.wait(), out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def start(self, argv: list[str], *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> LocalProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd or str(self.root), env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        return LocalProcess(proc)

    async def put_file(self, local: Path, remote: str, progress: Callable[[int], None] | None = None) -> None:
        def copy() -> None:
            dst = Path(remote)
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".part")
            shutil.copyfile(local, tmp)
            os.replace(tmp, dst)
        await asyncio.to_thread(copy)
        if progress is not None:
            progress(local.stat().st_size)

    async def get_file(self, remote: str, local: Path) -> None:
        await asyncio.to_thread(shutil.copyfile, remote, local)

    async def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None:
        def write() -> None:
            p = Path(remote)
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".part")
            tmp.write_bytes(data)
            os.chmod(tmp, mode)
            os.replace(tmp, p)
        await asyncio.to_thread(write)

    async def read_bytes(self, remote: str) -> bytes:
        return await asyncio.to_thread(Path(remote).read_bytes)

    async def exists(self, remote: str) -> bool:
        return Path(remote).exists()

    async def home(self) -> str:
        return str(self.root)

    async def close(self) -> None:
        return None
