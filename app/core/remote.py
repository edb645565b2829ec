"""Run a worker on a remote Linux host over SSH, streaming the same events as a local job.

For users whose workstation is too small for the model: the heavy stage runs on a
bigger Linux box. The `workers` package is self-contained (stdlib + its ML deps), so it
is copied to the host (content-addressed, once per version) and started there as
`python3 -m workers.<stage> --spec spec.json`. Events stream back over the SSH channel;
RSS of the remote process group is sampled at 4 Hz by a small shell loop on the host;
cancel sends SIGINT, then SIGTERM and SIGKILL to the remote process group.

The transport is app.core.device's Transport (docs/CONTRACTS.md §4): host keys are
verified there, never auto-added silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import posixpath
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from app.core.jobs import EventHandler, EventStream, JobResult, SampleHandler, classify
from app.core.sampler import ResourceSample

WORKERS_DIR = Path(__file__).resolve().parents[2] / "workers"
PID_MARK = "HEXSTUDIO_PID:"

# Prints the RSS (KiB) of the remote process group 4 times a second while it lives.
_SAMPLER_SH = ('while kill -s 0 -- "-$1" 2>/dev/null; do '
               'ps -eo pgid=,rss= | awk -v g="$1" \'$1 == g {s += $2} END {print s + 0}\'; sleep 0.25; done')


class _CommandResult(Protocol):
    exit_status: int
    stdout: str
    stderr: str


class _RemoteProcess(Protocol):
    async def read_stdout(self, n: int = 65536) -> bytes: ...
    async def read_stderr(self, n: int = 65536) -> bytes: ...
    async def wait(self) -> int: ...
    async def terminate(self) -> None: ...


class _Transport(Protocol):
    label: str

    async def run(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                  timeout: float | None = None, stdin: bytes | None = None) -> Any: ...
    async def start(self, argv: list[str], *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> Any: ...
    async def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None: ...
    async def read_bytes(self, remote: str) -> bytes: ...
    async def exists(self, remote: str) -> bool: ...
    async def home(self) -> str: ...


def workers_bundle() -> tuple[str, bytes]:
    """The workers package as a tar.gz and its content hash (the remote folder's name)."""
    files = sorted(p for p in WORKERS_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(WORKERS_DIR).as_posix().encode() + b"\0" + p.read_bytes())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in files:
            tar.add(p, arcname=f"workers/{p.relative_to(WORKERS_DIR).as_posix()}")
    return h.hexdigest()[:16], buf.getvalue()


async def install_workers(transport: _Transport, base: str | None = None) -> str:
    """Copy the workers package to the host once per version; return the folder holding it."""
    digest, blob = workers_bundle()
    home = await transport.home()
    root = posixpath.join(base or posixpath.join(home, ".cache", "hexstudio"), f"workers-{digest}")
    if await transport.exists(posixpath.join(root, "workers", "protocol.py")):
        return root
    tmp_tar = posixpath.join(posixpath.dirname(root), f".workers-{digest}.tar.gz")
    staging = f"{root}.partial"
    await transport.run(["mkdir", "-p", posixpath.dirname(root)], timeout=30)
    await transport.write_bytes(tmp_tar, blob)
    res = await transport.run(["sh", "-c", 'rm -rf "$1" && mkdir -p "$1" && tar -xzf "$2" -C "$1" && '
                               'rm -rf "$3" && mv "$1" "$3" && rm -f "$2"', "sh", staging, tmp_tar, root],
                              timeout=120)
    if res.exit_status != 0:
        raise RuntimeError(f"Could not unpack the workers on {transport.label}: {res.stderr.strip()}")
    return root


class RemoteJob:
    """A worker on a remote host. Same shape as app.core.jobs.LocalJob: start, wait, cancel."""

    def __init__(self, transport: _Transport, module: str, spec: dict[str, Any], *,
                 python: str = "python3", on_event: EventHandler | None = None,
                 on_sample: SampleHandler | None = None, what: str | None = None,
                 grace_s: float = 5.0, term_s: float = 3.0) -> None:
        self.transport = transport
        self.module = module
        self.spec = spec
        self.python = python
        self.on_sample = on_sample
        self.what = what or f"Worker {module} on {transport.label}"
        self.grace_s = grace_s
        self.term_s = term_s
        self.stream = EventStream(on_event, None)
        self.remote_pid: int | None = None
        self.remote_root: str | None = None
        self.peak_rss = 0
        self.samples: list[ResourceSample] = []
        self._cancelled = False
        self._stderr = ""
        self._task: asyncio.Task[JobResult] | None = None
        self._pid_seen = asyncio.Event()

    async def start(self) -> None:
        self.remote_root = await install_workers(self.transport)
        spec_path = posixpath.join(self.remote_root, "specs", f"{self.spec.get('stage', 'job')}-{time.time_ns()}.json")
        await self.transport.run(["mkdir", "-p", posixpath.dirname(spec_path)], timeout=30)
        await self.transport.write_bytes(spec_path, json.dumps(self.spec).encode())
        argv = ["sh", "-c", f'echo "{PID_MARK}$$"; exec "$@"', "sh",
                self.python, "-m", self.module, "--spec", spec_path]
        # setsid: the worker leads its own process group on the host, so cancel reaches its children
        proc = await self.transport.start(["setsid", "-w", *argv], cwd=self.remote_root,
                                          env={"PYTHONUNBUFFERED": "1"})
        self._task = asyncio.ensure_future(self._run(proc))

    async def _read_events(self, proc: _RemoteProcess) -> None:
        pending = b""
        while True:
            chunk = await proc.read_stdout()
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if self.remote_pid is None and line.startswith(PID_MARK.encode()):
                    self.remote_pid = int(line[len(PID_MARK):].strip())
                    self._pid_seen.set()
                    continue
                self.stream.feed(line)
        if pending.strip():
            self.stream.feed(pending)

    async def _read_stderr(self, proc: _RemoteProcess) -> None:
        while True:
            chunk = await proc.read_stderr()
            if not chunk:
                break
            self._stderr = (self._stderr + chunk.decode("utf-8", "replace"))[-8000:]

    async def _sample(self) -> None:
        await self._pid_seen.wait()
        sampler = await self.transport.start(["sh", "-c", _SAMPLER_SH, "sh", str(self.remote_pid)])
        pending = b""
        try:
            while True:
                chunk = await sampler.read_stdout()
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        rss = int(line.strip()) * 1024
                        s = ResourceSample(time.time(), rss, None, 0)
                        self.peak_rss = max(self.peak_rss, rss)
                        self.samples.append(s)
                        if self.on_sample is not None:
                            self.on_sample(s)
        finally:
            with contextlib.suppress(Exception):
                await sampler.terminate()

    async def _run(self, proc: _RemoteProcess) -> JobResult:
        t0 = time.monotonic()
        sampling = asyncio.ensure_future(self._sample())
        try:
            await asyncio.gather(self._read_events(proc), self._read_stderr(proc))
            rc = await proc.wait()
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampling
        # OpenSSH reports a signal death as exit-signal (no status): the transport gives -1 or 128+N
        returncode: int | None = rc
        if rc is not None and rc > 128 and self.stream.done is None:
            returncode = -(rc - 128)
        res = classify(returncode, self.stream, self._cancelled, self.peak_rss, self._stderr, self.what)
        res.peak_rss_bytes = self.peak_rss
        res.duration_s = time.monotonic() - t0
        res.events = self.stream.events
        res.bad_lines = self.stream.bad_lines
        res.stderr_tail = self._stderr[-2000:]
        return res

    async def wait(self) -> JobResult:
        assert self._task is not None, "start() first"
        return await asyncio.shield(self._task)

    async def _signal(self, sig: str, group: bool) -> None:
        if self.remote_pid is None:
            return
        target = f"-{self.remote_pid}" if group else str(self.remote_pid)
        with contextlib.suppress(Exception):
            await self.transport.run(["kill", f"-{sig}", "--", target], timeout=15)

    async def cancel(self) -> None:
        """SIGINT to the remote worker, then SIGTERM and SIGKILL to its process group."""
        if self._task is None or self._task.done():
            return
        self._cancelled = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._pid_seen.wait(), 10)
        for sig, group, timeout in (("INT", False, self.grace_s), ("TERM", True, self.term_s),
                                    ("KILL", True, 5.0)):
            await self._signal(sig, group)
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
                return
            except asyncio.TimeoutError:
                continue

    async def group_alive(self) -> bool:
        if self.remote_pid is None:
            return False
        res = await self.transport.run(["kill", "-0", "--", f"-{self.remote_pid}"], timeout=15)
        return bool(res.exit_status == 0)


async def run_remote_worker(transport: _Transport, module: str, spec: dict[str, Any],
                            on_event: Callable[[dict[str, Any]], None] | None = None,
                            python: str = "python3") -> JobResult:
    job = RemoteJob(transport, module, spec, python=python, on_event=on_event)
    await job.start()
    return await job.wait()
