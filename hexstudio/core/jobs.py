"""The job runner: starts a worker process, streams its events, samples its memory, cancels it,
and says plainly how it ended.

    runner = JobRunner()
    job = runner.start_local("hexstudio.workers.quantize", spec_path, on_event=..., on_sample=...)
    result = await job.wait()          # JobResult
    await job.cancel()                 # SIGINT -> SIGTERM(group) -> SIGKILL(group)

Workers run in their own process group (start_new_session), so cancel reaches
every child they started, and nothing is left behind.

It is also the one way the studio starts any child process of its own:

    python_command(module, *args)  `python -m MODULE ARGS`, or what a frozen (PyInstaller) build runs
                                   instead (cli_command, worker_command, code_command: the usual kinds)
    spawn(argv, what=...)          the one call to create_subprocess_exec: its own process group, logged
    run_child(argv, what=...)      a short command (the report export, the AI Hub device list): its
                                   output, a timeout, and the cancel ladder when it times out or its
                                   caller is cancelled
    cancel_ladder(send, ended)     SIGINT -> SIGTERM(group) -> SIGKILL(group), for local and remote
                                   jobs alike (hexstudio.core.remote.job sends the signals over SSH)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict

import psutil

from hexstudio.core.sampler import ResourceSample, TreeSampler, sample_periodically
from hexstudio.shared.protocol import LIVENESS_ENV, PARENT_ENV, ProtocolError, parse_event
from hexstudio.shared.python_command import python_command
from hexstudio.shared.records import fields_dict
from hexstudio.shared.wslconfig import target_limits

log = logging.getLogger(__name__)

EventHandler = Callable[[dict[str, Any]], None]
SampleHandler = Callable[[ResourceSample], None]


class JobHooks(TypedDict, total=False):
    """What a caller hands any job, wherever it runs: where its events, resource samples and log go, and
    what it is called in messages (start_worker_job and RemoteStageJob take these as keywords)."""

    on_event: EventHandler | None
    on_sample: SampleHandler | None
    log_path: Path | None
    what: str | None


def oom_hint(
    peak_rss: int, need_bytes: int | None = None, ram_bytes: int | None = None, swap_bytes: int | None = None
) -> str:
    """What to do after an out-of-memory kill, with limits computed for this job: the larger of what it
    reached and its estimate, with the same headroom preflight's .wslconfig fix uses."""
    if ram_bytes is None or swap_bytes is None:
        ram_bytes = int(psutil.virtual_memory().total)
        swap_bytes = int(psutil.swap_memory().total)
    need = max(int(peak_rss), int(need_bytes or 0))
    memory_gb, swap_gb = target_limits(need)
    est = f"; its estimate is {human_bytes(need_bytes)}" if need_bytes else ""
    return (
        f"The process was killed with SIGKILL while using {human_bytes(peak_rss)}{est} — most likely the "
        f"kernel's out-of-memory killer. This machine has {human_bytes(ram_bytes)} RAM + "
        f"{human_bytes(swap_bytes)} swap. On WSL2 the Linux VM has its own memory cap below the Windows RAM: "
        f"create or edit C:\\Users\\<you>\\.wslconfig with\n[wsl2]\nmemory={memory_gb}GB\nswap={swap_gb}GB\n"
        "then run `wsl --shutdown` in PowerShell and start HexStudio again (the Preflight page can write "
        "this file for you; `hexstudio preflight --write-wslconfig`). Elsewhere add swap or RAM. "
        "Or use more parts or fewer calibration samples."
    )


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class JobResult:
    kind: str  # ok | failed | cancelled | killed | oom
    exit_code: int | None
    signal: str | None
    message: str
    hint: str | None = None
    code: str | None = None  # the worker's error code, if it sent one
    summary: dict[str, Any] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    peak_vram_bytes: int | None = None
    duration_s: float = 0.0
    events: int = 0
    bad_lines: int = 0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    def outcome(self) -> dict[str, Any]:
        return fields_dict(self, ("kind", "code", "message", "hint", "exit_code", "signal"))


# -- how the studio starts a child process ------------------------------------------------------


# A frozen build runs a module that is neither the CLI nor a top-level worker (hexstudio.workers.genie_sim.t2t...)
# through its `-c` (hexstudio/__main__.py): argv[1] is the module, the rest its arguments.
def cli_command(*args: str) -> list[str]:
    """`hexstudio ARGS` in a child process (the report export, the AI Hub device list)."""
    return python_command("hexstudio", *args)


def worker_command(module: str, spec_path: Path) -> list[str]:
    """How to start a worker: `python -m hexstudio.workers.X --spec FILE`, or the frozen app's --worker dispatch."""
    return python_command(module, "--spec", str(spec_path))


def code_command(code: str, *args: str) -> list[str]:
    """`python -c CODE ARGS`; a frozen build runs `hexstudio -c CODE ARGS` the same way."""
    return [sys.executable, "-c", code, *args]


def _argv_text(argv: Sequence[str]) -> str:
    return shlex.join(a if len(a) <= 200 else a[:200] + "…" for a in map(str, argv))


async def spawn(
    argv: Sequence[str],
    *,
    what: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    stdin: int = asyncio.subprocess.DEVNULL,
    limit: int = 1 << 16,
) -> asyncio.subprocess.Process:
    """Start a child process the way every one of the studio's is started: in a process group of its own
    (start_new_session; cancel reaches all it starts), stdout and stderr piped, logged with its pid."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd) if cwd else None,
        env=env,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        limit=limit,
    )
    log.info("%s: started pid %d: %s", what, proc.pid, _argv_text(argv))
    return proc


SignalSender = Callable[[signal.Signals, bool], Awaitable[None]]

CANCEL_STEPS = ((signal.SIGINT, False), (signal.SIGTERM, True), (signal.SIGKILL, True))
# after a worker has exited, how long the processes it started may keep its output pipes open
ORPHAN_PIPES_S = 2.0


async def cancel_ladder(
    send: SignalSender,
    ended: asyncio.Future[Any],
    *,
    grace_s: float = 5.0,
    term_s: float = 3.0,
    kill_s: float = 5.0,
    what: str = "A child process",
) -> bool:
    """The cancel ladder of every job, local or remote: SIGINT to the process (a worker stops cleanly and
    says `cancelled`), then SIGTERM to its process group, then SIGKILL to the group, each step given its time
    for `ended` to complete. `send(signal, whole_group)` delivers a signal: signal_local here, `kill` over
    SSH on a worker host. `ended`: the task (or future) that completes when the process has ended.
    Returns whether it ended."""
    for (sig, group), wait_s in zip(CANCEL_STEPS, (grace_s, term_s, kill_s), strict=True):
        log.info("%s: cancel: %s to the %s", what, sig.name, "process group" if group else "process")
        await send(sig, group)
        try:
            await asyncio.wait_for(asyncio.shield(ended), wait_s)
            return True
        except asyncio.TimeoutError:
            continue
    log.warning("%s: still running after SIGKILL", what)
    return False


def signal_local(proc: asyncio.subprocess.Process, sig: signal.Signals, group: bool) -> None:
    """One rung of the ladder on this machine: to the process, or to its whole group (its pid: spawn made it
    the leader of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        elif proc.returncode is None:
            proc.send_signal(sig)


@dataclass
class ChildResult:
    """How a short child process ended: exit status (None: it did not end), its output, and why it was
    stopped when it was."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


async def run_child(
    argv: Sequence[str],
    *,
    what: str,
    timeout: float | None = None,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    grace_s: float = 5.0,
    term_s: float = 3.0,
) -> ChildResult:
    """Run a short child process to its end and return its output. Past `timeout`, or when the calling task
    is cancelled (a window closing, a Stop button), it gets the cancel ladder; a cancelled caller then sees
    its CancelledError. Nothing the child started outlives it (its group is killed when it ends)."""
    t0 = time.monotonic()
    proc = await spawn(
        argv,
        what=what,
        cwd=cwd,
        env=env,
        limit=1 << 24,
        stdin=asyncio.subprocess.DEVNULL if input is None else asyncio.subprocess.PIPE,
    )
    talk = asyncio.ensure_future(proc.communicate(input))

    async def send(sig: signal.Signals, group: bool) -> None:
        signal_local(proc, sig, group)

    timed_out = False
    try:
        try:
            out, err = await asyncio.wait_for(asyncio.shield(talk), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            log.warning("%s: no end after %.0f s", what, timeout or 0)
            if await cancel_ladder(send, talk, grace_s=grace_s, term_s=term_s, what=what):
                out, err = talk.result()
            else:
                talk.cancel()
                out, err = b"", b""
        except asyncio.CancelledError:
            if not await cancel_ladder(send, talk, grace_s=grace_s, term_s=term_s, what=what):
                talk.cancel()
            raise
    finally:
        signal_local(proc, signal.SIGKILL, True)  # whatever it started ends with it
    res = ChildResult(
        list(argv),
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        timed_out,
        time.monotonic() - t0,
    )
    log.info(
        "%s: pid %d ended: exit %s%s (%.1f s)",
        what,
        proc.pid,
        res.returncode,
        ", timed out" if timed_out else "",
        res.duration_s,
    )
    return res


def _memory_total() -> int:
    """The memory a worker's RSS can reach before the OOM killer acts: RAM, or the cgroup's limit where one
    is lower (a container, a systemd slice). Not swap: RSS leaves out swapped-out pages, so with swap larger
    than about half of RAM (the .wslconfig advice) a real OOM kill never reached RAM + swap."""
    total = int(psutil.virtual_memory().total)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed: in this process's cgroup (cgroup v2 memory.events,
    where the workers run too), else on the whole machine (/proc/vmstat, Linux 4.13+); None where neither can be
    read. A count that rose while a worker ran, the worker dying by SIGKILL, says the OOM killer was at work."""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
        rel = next((ln.split(":", 2)[2].strip() for ln in lines if ln.startswith("0::")), None)
        if rel is not None:
            events = Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.events"
            for line in events.read_text(encoding="ascii").splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/vmstat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def stderr_record(text: str) -> str:
    """Text a worker wrote on stderr as a job's log keeps it: a debug log record, one JSON line."""
    rec = {"v": 1, "type": "log", "level": "debug", "t": time.time(), "stream": "stderr", "message": text}
    return json.dumps(rec, ensure_ascii=False) + "\n"


class EventStream:
    """Parses worker stdout lines into events and keeps the bookkeeping shared by local and remote jobs."""

    def __init__(self, on_event: EventHandler | None, log: IO[str] | None) -> None:
        self.on_event = on_event
        self.log = log
        self.events = 0
        self.bad_lines = 0
        self.last_error: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self._last_flush = time.monotonic()

    def feed(self, raw: bytes | str) -> None:
        try:
            ev = parse_event(raw)
        except ProtocolError as exc:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            text = text.rstrip("\r\n")
            if not text.strip():
                return
            self.bad_lines += 1
            ev = {
                "v": 1,
                "type": "log",
                "level": "warn",
                "t": time.time(),
                "message": f"[not a protocol line: {exc}] {text[:2000]}",
            }
        else:
            self.events += 1
            if ev["type"] == "error":
                self.last_error = ev
            elif ev["type"] == "done":
                self.done = ev
        if self.log is not None:
            self.log.write(json.dumps(ev, ensure_ascii=False) + "\n")
            now = time.monotonic()
            if now - self._last_flush > 0.25:  # the log on disk lags by at most ~¼ s (crash forensics)
                self.log.flush()
                self._last_flush = now
        if self.on_event is not None:
            self.on_event(ev)

    def stderr_line(self, text: str) -> None:
        """A line the worker wrote on stderr: kept in the job's log as a debug record, never parsed."""
        if self.log is not None:
            self.log.write(stderr_record(text))

    def result(
        self,
        returncode: int | None,
        cancelled: bool,
        peak_rss: int,
        stderr: str,
        what: str,
        memory_need: int | None = None,
        *,
        peak_vram: int | None = None,
        duration_s: float = 0.0,
        stderr_tail: str | None = None,
        oom_killed: bool = False,
    ) -> JobResult:
        """How the job ended (classify), with its figures: the one ending of local and remote jobs."""
        res = classify(returncode, self, cancelled, peak_rss, stderr, what, memory_need, oom_killed)
        res.peak_rss_bytes = peak_rss
        res.peak_vram_bytes = peak_vram
        res.duration_s = duration_s
        res.events = self.events
        res.bad_lines = self.bad_lines
        res.stderr_tail = stderr if stderr_tail is None else stderr_tail
        return res


def cancelled_result(what: str, returncode: int | None = None, sig: str | None = None) -> JobResult:
    return JobResult(
        "cancelled",
        returncode,
        sig,
        f"{what} was cancelled.",
        hint="Nothing from the cancelled attempt is kept. Start it again when ready.",
        code="cancelled",
    )


def classify(
    returncode: int | None,
    stream: EventStream,
    cancelled: bool,
    peak_rss: int,
    stderr_tail: str,
    what: str,
    memory_need: int | None = None,
    oom_killed: bool = False,
) -> JobResult:
    """How a worker ended. `oom_killed`: the kernel's OOM-kill count rose while it ran (oom_kills)."""
    sig = None
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            sig = signal.Signals(-returncode).name
    done = stream.done
    err = stream.last_error or {}
    if done is not None and done.get("ok") is True and returncode == 0:
        return JobResult("ok", returncode, None, f"{what} finished.", summary=done.get("summary") or {})
    if cancelled:
        return cancelled_result(what, returncode, sig)
    if sig == "SIGKILL" or returncode == 137:
        if oom_killed or peak_rss >= 0.6 * _memory_total():
            return JobResult(
                "oom",
                returncode,
                sig or "SIGKILL",
                f"{what} was killed (SIGKILL) at {human_bytes(peak_rss)} RSS while the kernel's out-of-memory "
                "killer was at work: out of memory."
                if oom_killed
                else f"{what} was killed (SIGKILL) at {human_bytes(peak_rss)} RSS: likely out of memory.",
                hint=oom_hint(peak_rss, memory_need),
                code="out_of_memory",
            )
        return JobResult(
            "killed",
            returncode,
            sig or "SIGKILL",
            f"{what} was killed by SIGKILL.",
            hint="Something outside HexStudio killed the worker (kill -9, a watchdog, or the "
            "OOM killer). Resume the run to restart the stage from a clean state.",
            code="killed",
        )
    if sig is not None:
        return JobResult(
            "killed",
            returncode,
            sig,
            f"{what} was killed by {sig}.",
            hint="Resume the run to restart the stage from a clean state.",
            code="killed",
        )
    if err:
        return JobResult(
            "failed",
            returncode,
            None,
            str(err.get("message", "failed")),
            hint=err.get("hint"),
            code=str(err.get("code", "failed")),
        )
    if done is None:
        tail = stderr_tail.strip().splitlines()[-3:] if stderr_tail.strip() else []
        detail = f" Last stderr: {' | '.join(tail)}" if tail else ""
        return JobResult(
            "failed",
            returncode,
            None,
            f"{what} ended (exit code {returncode}) without reporting 'done'.{detail}",
            hint="The worker crashed or printed something that is not the worker protocol. "
            "See the stage log for its output.",
            code="no_done",
        )
    return JobResult(
        "failed", returncode, None, f"{what} reported failure (exit code {returncode}).", code="failed"
    )


class Job:
    """What every job shares, here or on a worker host (LocalJob, hexstudio.core.remote's RemoteJob and
    RemoteStageJob): start(), wait() -> JobResult, cancel() (cancel_ladder), and the same options."""

    def __init__(
        self,
        *,
        what: str,
        on_event: EventHandler | None = None,
        on_sample: SampleHandler | None = None,
        grace_s: float = 5.0,
        term_s: float = 3.0,
    ) -> None:
        self.what = what
        self.on_event = on_event
        self.on_sample = on_sample
        self.grace_s = grace_s  # SIGINT -> SIGTERM: the worker's time to stop cleanly
        self.term_s = term_s  # SIGTERM -> SIGKILL
        self._cancelled = False
        self._task: asyncio.Task[JobResult] | None = None
        self._started = asyncio.Event()

    async def wait(self) -> JobResult:
        await self._started.wait()
        assert self._task is not None
        return await asyncio.shield(self._task)

    def _begin(self, run: Awaitable[JobResult]) -> None:
        self._task = asyncio.ensure_future(run)
        self._started.set()

    def running(self) -> bool:
        return self._task is not None and not self._task.done()


class LocalJob(Job):
    """A worker process on this machine."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        on_event: EventHandler | None = None,
        on_sample: SampleHandler | None = None,
        log_path: Path | None = None,
        sample_hz: float = 4.0,
        what: str = "The worker",
        grace_s: float = 5.0,
        term_s: float = 3.0,
        memory_need: int | None = None,
        liveness: bool = False,
    ) -> None:
        super().__init__(what=what, on_event=on_event, on_sample=on_sample, grace_s=grace_s, term_s=term_s)
        self.argv = list(argv)
        # a worker (hexstudio.workers.runtime.die_with_parent): its stdin is a pipe this process holds open while it
        # lives, and it arms a parent-death signal, so it never outlives us (kill -9 of the studio included)
        self.liveness = liveness
        self.memory_need = memory_need  # the stage's estimated peak RSS (for the out-of-memory hint)
        self.cwd = cwd
        self.env = env
        self.log_path = log_path
        self.sample_hz = sample_hz
        self._log: IO[str] | None = None
        self.stream = EventStream(on_event, None)
        self.proc: asyncio.subprocess.Process | None = None
        self.sampler: TreeSampler | None = None
        self._stderr: deque[str] = deque(maxlen=200)
        self.pgid: int | None = None

    async def start(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
            self.stream.log = self._log
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.liveness:
            env.update({PARENT_ENV: str(os.getpid()), LIVENESS_ENV: "stdin"})
        try:
            self.proc = await spawn(
                self.argv,
                what=self.what,
                cwd=self.cwd,
                env=env,
                limit=1 << 24,
                stdin=asyncio.subprocess.PIPE if self.liveness else asyncio.subprocess.DEVNULL,
            )
        except BaseException:  # no process to log (a side interpreter missing, no file descriptors left)
            if self._log is not None:
                self._log.close()
                self._log = self.stream.log = None
            raise
        self.pgid = self.proc.pid
        self.sampler = TreeSampler(self.proc.pid)
        self._begin(self._run())

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        reader = self.proc.stdout
        feed = self.stream.feed
        clock = time.monotonic
        since = clock()
        while True:
            line = await reader.readline()
            if not line:
                break
            feed(line)
            # readline() does not yield while its buffer holds lines: hand the loop back every few ms so
            # a fast worker never starves timers, the GUI or other jobs
            if clock() - since > 0.003:
                await asyncio.sleep(0)
                since = clock()

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                break
            text = line.decode("utf-8", "replace").rstrip("\n")
            self._stderr.append(text)
            self.stream.stderr_line(text)

    async def _run(self) -> JobResult:
        assert self.proc is not None and self.sampler is not None
        t0 = time.monotonic()
        kills_before = oom_kills()
        sampling = asyncio.ensure_future(sample_periodically(self.sampler, self.sample_hz, self.on_sample))
        orphans = asyncio.ensure_future(self._end_orphans())
        try:
            await asyncio.gather(self._read_stdout(), self._read_stderr())
            rc = await self.proc.wait()
        finally:
            for task in (sampling, orphans):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._reap_group()
            if self.proc.stdin is not None:  # the liveness pipe: its end tells a leftover watcher to go
                self.proc.stdin.close()
            if self._log is not None:
                self._log.close()
        stderr = "\n".join(self._stderr)
        return self.stream.result(
            rc,
            self._cancelled,
            self.sampler.peak_rss,
            stderr,
            self.what,
            self.memory_need,
            peak_vram=self.sampler.peak_vram,
            duration_s=time.monotonic() - t0,
            stderr_tail="\n".join(list(self._stderr)[-20:]),
            oom_killed=kills_before is not None and (oom_kills() or 0) > kills_before,
        )

    async def _end_orphans(self) -> None:
        """A worker killed from outside (the OOM killer, a crash) leaves the processes it started holding its
        stdout and stderr: the pipes, and the job with them, would stay open until those end, and Stop could
        not end them (the worker is gone). Once the worker has exited, what is left is read for a moment, then
        its group is ended."""
        assert self.proc is not None
        # the return code is known when the worker exits, before its pipes close
        while self.proc.returncode is None:
            await asyncio.sleep(0.2)
        await asyncio.sleep(ORPHAN_PIPES_S)
        self._reap_group()

    def _reap_group(self) -> None:
        """The worker has exited: make sure nothing it started outlives it."""
        if self.pgid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)

    def group_alive(self) -> bool:
        if self.pgid is None:
            return False
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def cancel(self) -> None:
        """SIGINT to the worker, then SIGTERM to its group, then SIGKILL to the group (cancel_ladder)."""
        if self.proc is None or self.proc.returncode is not None or self._task is None:
            return
        self._cancelled = True
        proc = self.proc

        async def send(sig: signal.Signals, group: bool) -> None:
            signal_local(proc, sig, group)

        await cancel_ladder(send, self._task, grace_s=self.grace_s, term_s=self.term_s, what=self.what)


class JobRunner:
    """Makes jobs. Keeps no global state, so tests and the GUI can have several."""

    def __init__(self, sample_hz: float = 4.0) -> None:
        self.sample_hz = sample_hz

    async def start_local(
        self,
        module: str,
        spec_path: Path,
        *,
        on_event: EventHandler | None = None,
        on_sample: SampleHandler | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        what: str | None = None,
        memory_need: int | None = None,
    ) -> LocalJob:
        job = LocalJob(
            worker_command(module, spec_path),
            cwd=cwd,
            env=env,
            on_event=on_event,
            on_sample=on_sample,
            log_path=log_path,
            sample_hz=self.sample_hz,
            what=what or f"Worker {module}",
            memory_need=memory_need,
            liveness=True,
        )
        await job.start()
        return job

    async def start_argv(self, argv: Sequence[str], **kw: Any) -> LocalJob:
        kw.setdefault("sample_hz", self.sample_hz)
        job = LocalJob(argv, **kw)
        await job.start()
        return job
