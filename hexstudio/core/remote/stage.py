"""A pipeline stage on a worker host: the run setting `worker_host` names one (hexstudio.core.remote.hosts), and
its heavy stages (Stage.heavy: quantize, validate) and preflight run there.

`start_worker_job` is the pipeline's one way to start a stage's worker: a LocalJob on this machine, or a
RemoteStageJob, which connects, checks the host's Python and packages, uploads the stage's upstream
artifact folders and the model's Hugging Face folder into <root>/runs/<run_id>/ (hexstudio.core.remote.sync),
rewrites the spec's paths, runs the worker with RemoteJob and, on success only, downloads the remote output
folder into the local <stage>.partial folder. See docs/WORKER_PROTOCOL.md ("Remote workers").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import time
import traceback
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hexstudio.core.atomic import write_json_atomic
from hexstudio.core.device.transport import ConnectionLost, SshTransport
from hexstudio.core.jobs import (
    EventStream,
    Job,
    JobHooks,
    JobResult,
    JobRunner,
    LocalJob,
    cancelled_result,
    human_bytes,
    stderr_record,
)
from hexstudio.core.manifest import RunManifest
from hexstudio.core.paths import WORKERS_ROOT
from hexstudio.core.remote.hosts import (
    STAGE_PACKAGES,
    WorkerHostError,
    check_host,
    connect_worker_host,
    host_config,
)
from hexstudio.core.remote.job import RemoteJob
from hexstudio.core.remote.sync import (
    LocalHashes,
    SyncStats,
    download_tree,
    host_files,
    host_folder,
    host_python,
    install_workers,
    map_json_paths,
    upload_tree,
)
from hexstudio.core.settings import Settings
from hexstudio.core.stage_state import input_hash
from hexstudio.core.stages import Stage

if TYPE_CHECKING:
    from typing import Unpack  # 3.11; annotations only (the studio runs on 3.10 too)

# Run settings that name a file on this machine; the file is uploaded and the setting rewritten.
FILE_SETTINGS = ("calibration_text", "validation_text")

# The worker events a run records (the pipeline's handler): kept in the host's note of a finished stage, so the
# attempt that only downloads its output records what the worker said (the stage's gate reads its metrics)
REPLAYED = ("metric", "artifact", "warning", "done")

# Besides the heavy stages: preflight checks the machine that will do the heavy work (its memory, GPU,
# packages, AIMET smoke test and the free disk under the host's root), so a workstation too small for the
# model does not fail the gate for work it will not do.
HOST_CHECK_STAGES = ("preflight",)
# a cancel's wait on the link to the worker host, past the cancel ladder's own grace: a stalled link (a dropped VPN,
# a host deep in swap) does not answer, and TCP may take a quarter of an hour to give up
CANCEL_LINK_S = 30.0


def remote_host_for(manifest: RunManifest, stage: Stage) -> str | None:
    """The worker host this stage runs on, or None for this machine: heavy worker stages (and preflight) of
    a run whose `worker_host` setting names one ("" / "local" / none: this machine)."""
    name = str(manifest.settings.get("worker_host") or "").strip()
    if not name or name == "local" or stage.worker is None:
        return None
    return name if stage.heavy or stage.name in HOST_CHECK_STAGES else None


async def _drop_note(t: SshTransport, python: str, note: str) -> None:
    """Remove the host's note of a finished stage (missing is fine)."""
    await host_files(t, python, "prune", posixpath.dirname(note), data=[posixpath.basename(note)])


class RemoteStageJob(Job):
    """A pipeline stage on a worker host: connect, check, upload, run (RemoteJob), download.
    Same shape as LocalJob for the pipeline: start(), wait() -> JobResult, cancel()."""

    def __init__(
        self,
        host: str,
        manifest: RunManifest,
        stage: Stage,
        spec_path: Path,
        *,
        settings: Settings | None = None,
        grace_s: float = 5.0,
        term_s: float = 3.0,
        **hooks: Unpack[JobHooks],
    ) -> None:
        super().__init__(
            what=hooks.get("what") or f"The {stage.title} stage",
            on_event=hooks.get("on_event"),
            on_sample=hooks.get("on_sample"),
            grace_s=grace_s,
            term_s=term_s,
        )
        self.host = host
        self.m = manifest
        self.stage = stage
        self.spec_path = spec_path
        self.log_path = hooks.get("log_path")
        self.settings = settings
        self.remote: RemoteJob | None = None
        self.transport: SshTransport | None = None
        self._log: IO[str] | None = None
        self._t0 = time.monotonic()
        self._kept: list[dict[str, Any]] = []  # the worker's events the run records (REPLAYED)

    # -- events from the studio's side of the job (labeled source "worker_host") -----------------
    def _emit(self, etype: str, **fields: Any) -> None:
        ev: dict[str, Any] = {
            "v": 1,
            "type": etype,
            "t": round(time.time(), 6),
            "source": "worker_host",
            **{k: v for k, v in fields.items() if v is not None},
        }
        if self._log is not None:
            self._log.write(json.dumps(ev, ensure_ascii=False) + "\n")
        if self.on_event is not None:
            self.on_event(ev)

    def _metric(self, name: str, value: Any, unit: str | None = None) -> None:
        self._emit("metric", name=name, value=value, unit=unit, scope="worker_host")

    def _say(self, message: str, phase: str) -> None:
        self._emit("log", message=message, level="info", phase=phase)

    async def start(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in _main
        self._t0 = time.monotonic()
        self._begin(self._main())

    async def cancel(self) -> None:
        if self._task is None or self._task.done():
            return
        self._cancelled = True
        remote = self.remote
        if remote is not None and remote.running():
            # the job runner's cancel ladder, on the host; a stalled link (no answer, TCP not given up) bounded
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(remote.cancel(), self.grace_s + self.term_s + CANCEL_LINK_S)
        else:
            self._task.cancel()  # connecting or syncing: stop at the next await
        done, _ = await asyncio.wait({self._task}, timeout=CANCEL_LINK_S)
        if not done:
            # the link stalled: the host's worker may run on unseen. Noted, so a resume waits for it rather than
            # starting a second one; the connection closed, which ends the reads the stage is blocked in
            if remote is not None and remote.remote_pid is not None:
                self._note_worker(remote.remote_pid, remote.remote_spec)
            if self.transport is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.transport.close(), 5)
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self._task), 5)

    def _fail(self, code: str, message: str, hint: str | None = None) -> JobResult:
        self._emit("error", code=code, message=message, hint=hint)
        return JobResult(
            "failed", None, None, message, hint=hint, code=code, duration_s=time.monotonic() - self._t0
        )

    async def _main(self) -> JobResult:
        try:
            return await self._steps()
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            res = cancelled_result(self.what)
            res.duration_s = time.monotonic() - self._t0
            return res
        except WorkerHostError as exc:
            return self._fail(
                exc.code, exc.message, exc.hint.replace("RUN_ID", self.m.run_id) if exc.hint else None
            )
        except Exception as exc:
            dropped = isinstance(
                exc, (ConnectionLost, OSError, EOFError)
            ) or exc.__class__.__module__.startswith("paramiko")
            if not dropped:
                if self._log is not None:
                    self._log.write(stderr_record(traceback.format_exc()))
                return self._fail(
                    "worker_host_failed",
                    f"Running {self.what.lower()} on worker host '{self.host}' failed: "
                    f"{type(exc).__name__}: {exc}",
                    "This is a HexStudio bug: the traceback is in the stage log; please report it. "
                    "Run the stage on this machine meanwhile (--worker-host local).",
                )
            connected = self.transport is not None and bool(getattr(self.transport, "connected", False))
            # a read that timed out (TimeoutError is an OSError) is a stalled link while TCP has not given up yet
            if (
                isinstance(exc, OSError)
                and not isinstance(exc, (ConnectionError, TimeoutError))
                and connected
            ):
                # the link is up: the host (its SFTP server answers a full disk with a bare "Failure") or this
                # machine refused a file, which resuming would only try again
                return self._fail(
                    "worker_host_write_failed",
                    f"Copying files to or from worker host '{self.host}' failed while the connection was up "
                    f"({exc or type(exc).__name__}).",
                    f"A full disk is the usual cause: check free space on the host (`df -h` there, under its "
                    f"worker folder) and on this machine, free some, then resume the run (`hexstudio run "
                    f"--resume {self.m.run_id}`): files already on the host are not sent again.",
                )
            return self._fail(
                "worker_host_disconnected",
                f"The connection to worker host '{self.host}' dropped ({exc or type(exc).__name__}).",
                f"Check the host and the network, then resume the run (`hexstudio run --resume "
                f"{self.m.run_id}`): files already on the host are not sent again.",
            )
        finally:
            if self.transport is not None:
                with contextlib.suppress(Exception):
                    await self.transport.close()
            if self._log is not None:
                self._log.close()
                self._log = None

    async def _steps(self) -> JobResult:
        cfg = host_config(self.host, self.settings)
        self._say(
            f"connecting to worker host '{self.host}' ({cfg.get('user') or ''}@{cfg.get('host')}:"
            f"{cfg.get('port') or 22})",
            "connect",
        )
        self.transport = t = await connect_worker_host(self.host, cfg)
        python = host_python(cfg.get("python"), await t.home())
        info = await check_host(t, self.host, python, STAGE_PACKAGES.get(self.stage.name, ()))
        self._metric("worker_host", self.host)
        self._metric("worker_host_memory_bytes", info.get("memory_bytes"), "bytes")
        self._metric("worker_host_cpu_count", info.get("cpu_count"))
        self._say(
            f"{t.label}: Python {'.'.join(map(str, info['python']))}, {info.get('cpu_count')} CPUs, "
            f"{(info.get('memory_bytes') or 0) / 2**30:.1f} GiB RAM",
            "connect",
        )
        base = host_folder(str(cfg.get("root") or "") or None, await t.home())
        workers_root = await install_workers(t, base)
        rrun = posixpath.join(base, "runs", self.m.run_id)
        spec = json.loads(self.spec_path.read_text(encoding="utf-8"))
        rout = posixpath.join(rrun, "artifacts", f"{self.stage.name}.partial")
        busy = await self._earlier_worker_running(t)
        if busy is not None:
            return busy
        key = input_hash(self.m, self.stage)
        note = posixpath.join(rrun, "artifacts", f"{self.stage.name}.finished.json")
        finished = await self._finished_there(t, note, rout, key)
        if finished is not None:
            res, back = self._replay(finished), [(str(a), str(b)) for a, b in finished["back"]]
        else:
            # the output is about to be emptied: a note kept for other inputs no longer describes it (set back to
            # those inputs later, it would replay their events over this attempt's output, or an empty folder)
            await _drop_note(t, python, note)
            res, back = await self._run_there(t, python, info, base, workers_root, rrun, rout, spec)
            if not res.ok:
                return res
            # the worker's output waits on the host: a link that drops while it comes home (gigabytes) resumes
            # with the download, not with the stage's hours of work again
            with contextlib.suppress(Exception):
                await t.write_bytes(
                    note,
                    json.dumps(
                        {
                            "input_hash": key,
                            "back": back,
                            "events": self._kept,
                            "peak_rss": res.peak_rss_bytes,
                        }
                    ).encode(),
                )
        # 3. bring the output home; the pipeline then renames <stage>.partial and hashes it
        t_down = time.monotonic()
        down = await download_tree(t, python, rout, Path(spec["out_dir"]))
        changed = map_json_paths(Path(spec["out_dir"]), back)
        self._metric("worker_host_download_bytes", down.sent_bytes, "bytes")
        self._say(
            f"download: {down.sent_files} file(s), {down.sent_bytes / 1e6:.1f} MB "
            f"({time.monotonic() - t_down:.1f} s)"
            + (f"; host paths mapped to this machine's in {', '.join(changed)}" if changed else ""),
            "download",
        )
        # the output is here: the note has done its work. Keep the host's copy as the stage's folder there: the
        # next stage's upload finds it and sends nothing. Only a saving: a link that drops now leaves a stage
        # that is done here.
        with contextlib.suppress(Exception):
            await _drop_note(t, python, note)
            await host_files(
                t, python, "promote", rout, posixpath.join(rrun, "artifacts", self.stage.name), timeout=300
            )
        res.duration_s = time.monotonic() - self._t0
        return res

    async def _finished_there(self, t: SshTransport, note: str, rout: str, key: str) -> dict[str, Any] | None:
        """The note an earlier attempt left when its worker finished on the host and the download did not end:
        its events and path maps, when it was for these inputs and the output is still there. None otherwise."""
        try:
            doc = json.loads(await t.read_bytes(note))
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("input_hash") != key or not await t.exists(rout):
            return None
        self._say(
            "the host finished this stage in an earlier attempt, whose download did not end: its output is "
            "brought home, not made again",
            "download",
        )
        return doc

    def _replay(self, finished: dict[str, Any]) -> JobResult:
        """The earlier attempt's worker events again (metrics, artifacts, warnings, done), for the run's record."""
        stream = EventStream(self.on_event, self._log)
        for ev in finished.get("events") or []:
            stream.feed(json.dumps(ev))
        return stream.result(0, False, int(finished.get("peak_rss") or 0), "", self.what)

    def _keep(self, ev: dict[str, Any]) -> None:
        """A worker event on its way to the pipeline; those the run records are kept for a later replay."""
        if ev.get("type") in REPLAYED:
            self._kept.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    async def _run_there(
        self,
        t: SshTransport,
        python: str,
        info: dict[str, Any],
        base: str,
        workers_root: str,
        rrun: str,
        rout: str,
        spec: dict[str, Any],
    ) -> tuple[JobResult, list[tuple[str, str]]]:
        """Upload what the stage reads and run its worker on the host: its result, and the (host, local) path
        pairs that map the output's host paths back."""
        await host_files(t, python, "reset", rout)  # never resume from half-written output, here either
        # 1. upload the upstream folders this stage reads, and the model's folder when it lives elsewhere
        hashes = LocalHashes()
        stats = SyncStats()
        t_up = time.monotonic()
        upstream: dict[str, str] = {}
        forward: list[tuple[str, str]] = [(str(self.m.run_dir), rrun)]
        back: list[tuple[str, str]] = [
            (rout, spec["out_dir"]),
            (rrun, str(self.m.run_dir)),
            (workers_root, str(WORKERS_ROOT)),
        ]
        for need in self.stage.needs:
            if need not in spec["upstream"]:
                continue
            local = Path(spec["upstream"][need])
            remote = posixpath.join(rrun, "artifacts", need)
            self._say(f"uploading the {need} stage's output", "upload")
            await upload_tree(
                t,
                python,
                local,
                remote,
                hashes,
                self._known(need),
                stats,
                log=lambda msg: self._say(msg, "upload"),
            )
            upstream[need] = remote
            hf = self._external_hf_dir(local)
            if hf is not None:
                key = hashlib.sha256(str(hf).encode()).hexdigest()[:12]
                rhf = posixpath.join(base, "models", f"{key}-{hf.name}")
                self._say(f"uploading the model folder {hf}", "upload")
                await upload_tree(
                    t, python, hf, rhf, hashes, None, stats, log=lambda msg: self._say(msg, "upload")
                )
                forward.append((str(hf), rhf))
                back.append((rhf, str(hf)))
        settings = dict(spec.get("settings") or {})
        for key in FILE_SETTINGS:
            value = settings.get(key)
            if value in (None, "", "builtin"):
                continue
            p = Path(str(value)).expanduser()
            if not p.is_file():
                continue  # the worker says clearly that the file is missing
            rfile = posixpath.join(rrun, "inputs", key, p.name)
            try:  # the same file there from an earlier attempt is not sent again
                there = await host_files(
                    t, python, "hash", posixpath.dirname(rfile), data=[p.name], timeout=300
                )
            except WorkerHostError:  # not there yet
                there = {}
            if isinstance(there, dict) and there.get(p.name) == hashes.sha(p):
                stats.skipped_files += 1
            else:
                sent = await t.put_file(p, rfile)
                stats.sent_files += 1
                stats.sent_bytes += p.stat().st_size if sent is None else sent  # a .part continued: the rest
            settings[key] = rfile
            back.append((rfile, str(p)))
        self._metric("worker_host_upload_bytes", stats.sent_bytes, "bytes")
        self._metric("worker_host_upload_skipped_files", stats.skipped_files)
        self._say(
            f"upload: {stats.sent_files} file(s), {stats.sent_bytes / 1e6:.1f} MB sent; "
            f"{stats.skipped_files} already there ({time.monotonic() - t_up:.1f} s)",
            "upload",
        )
        # 2. run the worker there, on remote paths
        rspec = {**spec, "run_dir": rrun, "out_dir": rout, "upstream": upstream, "settings": settings}
        env = {"HEXSTUDIO_PATH_MAP": json.dumps([list(p) for p in forward])}
        if os.environ.get("HEXSTUDIO_THREADS"):
            env["HEXSTUDIO_THREADS"] = os.environ["HEXSTUDIO_THREADS"]
        self.remote = RemoteJob(
            t,
            str(self.stage.worker),
            rspec,
            python=python,
            on_event=self._keep,
            on_sample=self.on_sample,
            what=f"{self.what} (on worker host '{self.host}')",
            grace_s=self.grace_s,
            term_s=self.term_s,
            env=env,
            log=self._log,
            workers_base=base,
        )
        self.remote.remote_root = workers_root  # the very copy the path maps name
        await self.remote.start()
        res = await self.remote.wait()
        if res.kind in ("killed", "oom") and res.signal == "SIGKILL":
            res = self._judge_kill(res, int(info.get("memory_bytes") or 0))
        if not res.ok:
            if not t.connected and self.remote.remote_pid is not None:
                # the host may not know yet that the link is gone: its worker may run on for minutes
                self._note_worker(self.remote.remote_pid, self.remote.remote_spec)
            if not t.connected and res.kind == "failed":
                res = JobResult(
                    "failed",
                    res.exit_code,
                    None,
                    f"The connection to worker host '{self.host}' dropped while {self.what.lower()} "
                    "ran there.",
                    hint=f"Resume the run when the host answers (`hexstudio run --resume "
                    f"{self.m.run_id}`): the stage starts again from a clean state.",
                    code="worker_host_disconnected",
                    peak_rss_bytes=res.peak_rss_bytes,
                    duration_s=res.duration_s,
                    events=res.events,
                    bad_lines=res.bad_lines,
                )
            with contextlib.suppress(Exception):
                await host_files(t, python, "reset", rout, timeout=120)
            res.duration_s = time.monotonic() - self._t0
        return res, back

    @property
    def _worker_note(self) -> Path:
        return self.m.run_dir / "logs" / f"{self.stage.name}.host-worker.json"

    def _note_worker(self, pid: int, spec: str | None) -> None:
        """The worker an attempt left on the host when the connection dropped (the host may take minutes to
        notice): the next attempt checks it has ended before it starts another there."""
        with contextlib.suppress(OSError):  # whole or not at all: a torn note would read as "no worker there"
            write_json_atomic(self._worker_note, {"host": self.host, "pid": pid, "spec": spec})

    async def _earlier_worker_running(self, t: Any) -> JobResult | None:
        """A failed result when the worker an earlier attempt left on this host still runs (a second one would
        share its memory and its output folder); else None, the note removed."""
        try:
            note = json.loads(self._worker_note.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        pid, spec = note.get("pid"), note.get("spec")
        if note.get("host") == self.host and isinstance(pid, int) and pid > 1 and isinstance(spec, str):
            # the process group alive, and its leader still the worker of that attempt (not a reused pid);
            # `kill -s 0 --`: dash's kill (sh on Ubuntu) refuses `kill -0 --`
            probe = (
                f"kill -s 0 -- -{pid} 2>/dev/null && tr '\\0' ' ' </proc/{pid}/cmdline | grep -qF -- \"$1\""
            )
            res = await t.run(["sh", "-c", probe, "sh", spec], timeout=30)
            if res.exit_status == 0:
                return self._fail(
                    "worker_host_busy",
                    f"The {self.what.lower()} worker of the attempt whose connection dropped still runs on "
                    f"worker host '{self.host}' (process group {pid}): the host has not noticed yet that the "
                    "connection is gone. A second one now would share its memory and its output folder.",
                    f"Wait a few minutes for it to end (sshd ends it once it notices), or stop it on the host "
                    f"(`kill -- -{pid}`), then resume the run (`hexstudio run --resume {self.m.run_id}`).",
                )
        with contextlib.suppress(OSError):
            self._worker_note.unlink()
        return None

    def _judge_kill(self, res: JobResult, host_memory: int) -> JobResult:
        """A SIGKILL on the host: out of memory judged against the HOST's RAM, not this machine's."""
        oom = bool(host_memory) and res.peak_rss_bytes >= 0.6 * host_memory
        res.kind = "oom" if oom else "killed"
        if oom:
            res.code = "out_of_memory"
            res.message = (
                f"{self.what} was killed (SIGKILL) on worker host '{self.host}' at "
                f"{human_bytes(res.peak_rss_bytes)} RSS: likely out of memory there "
                f"(the host has {human_bytes(host_memory)} RAM)."
            )
            res.hint = (
                "Use a worker host with more RAM or swap, or lower the stage's need: more parts "
                "(--set parts=N), fewer calibration samples or a shorter context length."
            )
        else:
            res.code = "killed"
            res.message = f"{self.what} was killed by SIGKILL on worker host '{self.host}'."
            res.hint = (
                "Something on the host killed the worker (kill -9, a watchdog, or the OOM killer). "
                "Resume the run to restart the stage from a clean state."
            )
        return res

    def _known(self, stage: str) -> dict[str, str]:
        prefix = f"artifacts/{stage}/"
        return {
            a["path"][len(prefix) :]: a["sha256"]
            for a in self.m.stage(stage).artifacts
            if str(a.get("path", "")).startswith(prefix) and a.get("sha256")
        }

    def _external_hf_dir(self, upstream_dir: Path) -> Path | None:
        """The model's Hugging Face folder when model.json points outside the run (a Hugging Face cache
        snapshot or a local folder); None when it is inside the model stage's folder (uploaded with it)."""
        try:
            doc = json.loads((upstream_dir / "model.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        raw = str(doc.get("hf_dir") or "")
        p = Path(raw)
        if not raw or not p.is_absolute() or not p.is_dir():
            return None
        try:
            p.resolve().relative_to(self.m.run_dir.resolve())
            return None
        except ValueError:
            return p

    async def group_alive(self) -> bool:
        return bool(self.remote is not None and await self.remote.group_alive())


async def start_worker_job(
    runner: JobRunner,
    manifest: RunManifest,
    stage: Stage,
    spec_path: Path,
    *,
    env: dict[str, str] | None = None,
    memory_need: int | None = None,
    **hooks: Unpack[JobHooks],
) -> LocalJob | RemoteStageJob:
    """The pipeline's one way to start a stage's worker: on the run's worker host for heavy stages when the
    run names one (RemoteStageJob), else on this machine (LocalJob). Both are started when returned."""
    assert stage.worker is not None
    host = remote_host_for(manifest, stage)
    if host is None:
        return await runner.start_local(stage.worker, spec_path, env=env, memory_need=memory_need, **hooks)
    job = RemoteStageJob(host, manifest, stage, spec_path, **hooks)
    await job.start()
    return job
