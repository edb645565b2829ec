"""A worker on a remote host, streaming the same events as a local job (hexstudio.core.jobs.LocalJob).

The `hexstudio.workers` package is copied to the host (hexstudio.core.remote.sync.install_workers) and started there as
`python3 -m hexstudio.workers.<stage> --spec spec.json` in a process group of its own (setsid). Its events come
back over the transport's channel and are read by the job runner's EventStream; the RSS of its process
group is sampled 4 times a second on the host (hexstudio.workers.remote.groupmem); cancel is the job runner's
cancel_ladder, its signals sent with `kill` on the host. The worker watches its stdin, the channel, and
dies with it (hexstudio.workers.runtime.die_with_parent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any

from hexstudio.core.device.transport import RemoteProcess, Transport
from hexstudio.core.jobs import EventHandler, EventStream, Job, JobResult, SampleHandler, cancel_ladder
from hexstudio.core.remote.sync import install_workers
from hexstudio.core.sampler import ResourceSample
from hexstudio.shared.protocol import LIVENESS_ENV
from hexstudio.workers.remote import host_command

PID_MARK = "HEXSTUDIO_PID:"


async def read_lines(read: Callable[[], Awaitable[bytes]]) -> AsyncIterator[bytes]:
    """The lines of a stream read in chunks (`read()` returns b"" at its end); a last line without its
    newline too."""
    pending = b""
    while True:
        chunk = await read()
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line
    if pending.strip():
        yield pending


class RemoteJob(Job):
    """A worker on a remote host. Same shape as hexstudio.core.jobs.LocalJob: start, wait, cancel."""

    def __init__(
        self,
        transport: Transport,
        module: str,
        spec: dict[str, Any],
        *,
        python: str = "python3",
        on_event: EventHandler | None = None,
        on_sample: SampleHandler | None = None,
        what: str | None = None,
        grace_s: float = 5.0,
        term_s: float = 3.0,
        env: dict[str, str] | None = None,
        log: IO[str] | None = None,
        workers_base: str | None = None,
    ) -> None:
        super().__init__(
            what=what or f"Worker {module} on {transport.label}",
            on_event=on_event,
            on_sample=on_sample,
            grace_s=grace_s,
            term_s=term_s,
        )
        self.transport = transport
        # LIVENESS_ENV: the worker watches its stdin, the SSH channel, and dies with it (hexstudio.workers.runtime)
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {}), LIVENESS_ENV: "stdin"}
        self.workers_base = workers_base
        self.module = module
        self.spec = spec
        self.python = python
        self.stream = EventStream(on_event, log)
        self.remote_pid: int | None = None
        self.remote_root: str | None = None
        self.peak_rss = 0
        self.samples: list[ResourceSample] = []
        self._stderr = ""
        self._pid_seen = asyncio.Event()
        self.remote_spec: str | None = None  # the spec's path on the host: in the worker's command line there

    async def start(self) -> None:
        if self.remote_root is None:  # a caller that installed them already (RemoteStageJob) sets it
            self.remote_root = await install_workers(self.transport, self.workers_base)
        spec_path = posixpath.join(
            self.remote_root, "specs", f"{self.spec.get('stage', 'job')}-{time.time_ns()}.json"
        )
        self.remote_spec = spec_path
        await self.transport.run(["mkdir", "-p", posixpath.dirname(spec_path)], timeout=30)
        await self.transport.write_bytes(spec_path, json.dumps(self.spec).encode())
        # A Python from packaging/install-workstation.sh has the libpython hook (AIMET's PtrToInt64 trap)
        # beside it: source it, as bin/activate would.
        argv = [
            "sh",
            "-c",
            f'h="$(dirname "$1")/hexstudio-env.sh"; [ -f "$h" ] && . "$h"; echo "{PID_MARK}$$"; exec "$@"',
            "sh",
            self.python,
            "-m",
            self.module,
            "--spec",
            spec_path,
        ]
        # setsid: the worker leads its own process group on the host, so cancel reaches its children
        proc = await self.transport.start(["setsid", "-w", *argv], cwd=self.remote_root, env=self.env)
        self._begin(self._run(proc))

    async def _read_events(self, proc: RemoteProcess) -> None:
        async for line in read_lines(proc.read_stdout):
            if self.remote_pid is None and line.startswith(PID_MARK.encode()):
                self.remote_pid = int(line[len(PID_MARK) :].strip())
                self._pid_seen.set()
                continue
            self.stream.feed(line)

    async def _read_stderr(self, proc: RemoteProcess) -> None:
        async for line in read_lines(proc.read_stderr):
            text = line.decode("utf-8", "replace")
            self._stderr = (self._stderr + text + "\n")[-8000:]
            self.stream.stderr_line(text)

    async def _sample(self) -> None:
        await self._pid_seen.wait()
        sampler = await self.transport.start(host_command(self.python, "groupmem", str(self.remote_pid)))
        try:
            async for line in read_lines(sampler.read_stdout):
                with contextlib.suppress(ValueError):
                    rss = int(line.strip())
                    s = ResourceSample(time.time(), rss, None, 0)
                    self.peak_rss = max(self.peak_rss, rss)
                    self.samples.append(s)
                    if self.on_sample is not None:
                        self.on_sample(s)
        finally:
            with contextlib.suppress(Exception):
                await sampler.terminate()

    async def _run(self, proc: RemoteProcess) -> JobResult:
        t0 = time.monotonic()
        sampling = asyncio.ensure_future(self._sample())
        try:
            await asyncio.gather(self._read_events(proc), self._read_stderr(proc))
            rc = await proc.wait()
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampling
        returncode = remote_returncode(rc, self._stderr, self.stream.done is not None)
        return self.stream.result(
            returncode,
            self._cancelled,
            self.peak_rss,
            self._stderr,
            self.what,
            duration_s=time.monotonic() - t0,
            stderr_tail=self._stderr[-2000:],
        )

    async def _signal(self, sig: signal.Signals, group: bool) -> None:
        """One rung of the cancel ladder, on the host: `kill -INT PID` / `kill -TERM -- -PGID`."""
        if self.remote_pid is None:
            return
        target = f"-{self.remote_pid}" if group else str(self.remote_pid)
        with contextlib.suppress(Exception):
            await self.transport.run(["kill", f"-{sig.name.removeprefix('SIG')}", "--", target], timeout=15)

    async def cancel(self) -> None:
        """SIGINT to the remote worker, then SIGTERM and SIGKILL to its process group (cancel_ladder)."""
        if not self.running():
            return
        self._cancelled = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._pid_seen.wait(), 10)
        assert self._task is not None
        await cancel_ladder(
            self._signal, self._task, grace_s=self.grace_s, term_s=self.term_s, what=self.what
        )

    async def group_alive(self) -> bool:
        if self.remote_pid is None:
            return False
        res = await self.transport.run(["kill", "-0", "--", f"-{self.remote_pid}"], timeout=15)
        return bool(res.exit_status == 0)


SETSID_SIGNALLED = "did not exit normally"


def remote_returncode(rc: int | None, stderr: str, reported_done: bool) -> int | None:
    """The worker's exit as a local one reads (-N for signal N). OpenSSH reports a signal death as exit-signal
    (the transport gives -1 or 128+N). Under `setsid -w`, util-linux's setsid exits with the child's raw wait
    status when it did not exit normally (SIGKILL: 9, SIGSEGV with a core: 139), and says "child N did not exit
    normally": without this, an out-of-memory kill on the host read as a worker that exited 9."""
    if rc is None or reported_done:
        return rc
    if SETSID_SIGNALLED in stderr and 0 < rc < 256:
        return -(rc & 0x7F)
    if rc > 128:
        return -(rc - 128)
    return rc
