"""Runs stages of a run in order: skip what is done and unchanged, restart what was interrupted,
stop at a failed gate. Used by the CLI (`hexstudio run`) and the GUI alike.

Stage outputs are written to artifacts/<stage>.partial/ and renamed to
artifacts/<stage>/ only after the stage succeeded, so a crash never leaves
half-written output that looks complete (hexstudio.core.stage_record keeps each attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from hexstudio.core import logs, stage_actions
from hexstudio.core.atomic import sync_tree
from hexstudio.core.jobs import EventHandler, JobResult, JobRunner, LocalJob, SampleHandler
from hexstudio.core.manifest import ManifestError, RunManifest, boot_id, now_iso
from hexstudio.core.remote import RemoteStageJob
from hexstudio.core.runs import RunBusy, RunLock, artifacts_dir, edit_run, stage_log_path
from hexstudio.core.sampler import ResourceSample
from hexstudio.core.stage_actions import Recheck
from hexstudio.core.stage_api import (
    WORKER_RUN_ENV,
    StageAction,
    StageContext,
    StageError,
    stage_spec,
    start_stage_worker,
)
from hexstudio.core.stage_record import StageAttempt
from hexstudio.core.stage_state import hash_tree, input_hash, stage_is_current
from hexstudio.core.stages import STAGES, Stage, get_stage
from hexstudio.shared.errors import ActionableError, disk_hint, why_not_written
from hexstudio.shared.run_settings import BadSettings

jobs_log = logging.getLogger("hexstudio.jobs")
T = TypeVar("T")


@dataclass
class PipelineResult:
    ok: bool
    stopped_at: str | None
    message: str
    hint: str | None = None
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def stop(self, stage: str, message: str, hint: str | None = None) -> PipelineResult:
        """The run stopped at `stage`: a failed result that keeps what ran and what was skipped so far."""
        return PipelineResult(False, stage, message, hint=hint, ran=self.ran, skipped=self.skipped)


class Pipeline:
    def __init__(
        self,
        manifest: RunManifest,
        runner: JobRunner | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        on_sample: Callable[[str, ResourceSample], None] | None = None,
        on_stage: Callable[[str, str], None] | None = None,
        stages: tuple[Stage, ...] = STAGES,
    ) -> None:
        self.m = manifest
        self.stages = stages
        self._by_name = {s.name: s for s in stages}
        # gates overridden through this pipeline: the override covers whatever the stage gives in this run
        self._granted: set[str] = set()
        self.runner = runner or JobRunner()
        self.on_event = on_event
        self.on_sample = on_sample
        self.on_stage = on_stage
        self.cancel_event = asyncio.Event()
        self.current_job: LocalJob | RemoteStageJob | None = None
        self.lock = RunLock(manifest.run_dir)

    # -- public -------------------------------------------------------------
    async def run(
        self, until: str = "report", only: str | None = None, force: bool = False
    ) -> PipelineResult:
        targets = self._targets(until, only)
        if self.lock.held:  # this very pipeline is already running (e.g. Start clicked twice)
            busy = RunBusy(self.m.run_id, os.getpid())
            return PipelineResult(False, targets[0].name if targets else None, busy.message, hint=busy.hint)
        try:
            self.lock.acquire()
        except RunBusy as exc:
            return PipelineResult(False, targets[0].name if targets else None, exc.message, hint=exc.hint)
        except (
            OSError
        ) as exc:  # its .lock cannot be made: the run folder is full, read-only, gone or not ours
            return PipelineResult(
                False,
                targets[0].name if targets else None,
                f"The run folder {self.m.run_dir} cannot be written: {why_not_written(exc) or exc}.",
                hint=disk_hint(exc, self.m.run_dir),
            )
        try:
            self._refresh()
            if self.lock.unsupported:
                # said where the person looks (the stage's log and warnings, the run's history), not only in a flag
                unguarded = (
                    f"The run folder's file system ({self.m.run_dir}) does not lock files (flock): nothing stops the "
                    "studio and a `hexstudio run` from running this run at once. Run it from one place at a time, or "
                    "keep the workspace on a local disk."
                )
                self._warn(targets[0].name if targets else "model", "run_unguarded", unguarded, once=True)
            stop_stale_workers(self.m)
            self.m.detect_interrupted(lock_held=not self.lock.unsupported)
            return await self._run(targets, force)
        finally:
            self.lock.release()

    def _refresh(self) -> None:
        """run.json as on disk, where another process wrote it since this manifest was read or saved (a run
        from the terminal: stages it finished, settings and gate overrides it recorded, its events). Only the
        lock holder or edit_run writes it, so the file is the truth once we hold the lock; a manifest nobody
        else wrote keeps what its holder changed and has not saved yet."""
        try:
            fresh = RunManifest.load(self.m.run_dir)
        except (ManifestError, OSError):  # unreadable: keep what we have, save() rewrites it
            return
        if fresh.data.get("updated") != self.m.data.get("updated"):
            self.m.data = fresh.data

    async def _run(self, targets: tuple[Stage, ...], force: bool) -> PipelineResult:
        res = PipelineResult(True, None, "")
        for stage in targets:
            if self.cancel_event.is_set():
                return res.stop(stage.name, "cancelled")
            for need in stage.needs:
                if self.m.stage(need).state != "done":
                    return res.stop(
                        stage.name,
                        f"{stage.title} needs {need}, which has not completed.",
                        f"Run the stages up to it: `hexstudio run --resume {self.m.run_id} --until {stage.name}`.",
                    )
                blocked = self._gate_blocks(need)
                if blocked is not None:
                    message, hint = blocked
                    return res.stop(stage.name, f"{stage.title} cannot run: {message}", hint)
                stale = self._stale_upstream(need, targets)
                if stale is not None:
                    self._warn(
                        stage.name, "upstream_out_of_date", f"{need} {stale}: {self._stale_hint(stage)}"
                    )
            if (
                not force
                and stage_is_current(self.m, stage)
                and not self._measure_again(stage)
                and await self._still_in_place(stage)
            ):
                res.skipped.append(stage.name)
                self._notify_stage(stage.name, "done")
            else:
                result = await self.run_stage(stage)
                res.ran.append(stage.name)
                if not result.ok:
                    return res.stop(stage.name, result.message, result.hint)
            gate = stage.gate(self.m)
            override = self._override_record(stage.name)
            self.m.stage(stage.name).data["gate"] = {
                "passed": gate.passed,
                "reason": gate.reason,
                "override": override,
            }
            self.m.save()
            if not gate.passed:
                # a recorded override (who, when, why), not the setting alone
                if gate.overridable and override is not None:
                    continue
                hint = (
                    f"Override the {stage.name} gate (`--override-gate {stage.name}`) to continue anyway; "
                    "the override is recorded in the run."
                    if gate.overridable
                    else None
                )
                return res.stop(stage.name, f"{stage.title} gate not passed: {gate.reason}", hint)
        res.message = f"completed up to {targets[-1].name}" if targets else "nothing to do"
        return res

    def _measure_again(self, stage: Stage) -> bool:
        """A current stage that measures the machine, whose gate failed and was not overridden: it runs again, for
        what it found may have been fixed since (the event says why it ran)."""
        if not stage.measure_again_after_failed_gate or stage.gate(self.m).passed:
            return False
        if self._override_record(stage.name) is not None:
            return False
        self.m.add_event(
            "recheck",
            f"{stage.title} runs again: its gate failed last time, and what it measures may have changed since",
            stage=stage.name,
            passed=False,
        )
        return True

    async def _still_in_place(self, stage: Stage) -> bool:
        """A current stage with a `recheck` (the Board stage: its bundle on the board) is asked before it is
        skipped; False, and the stage runs again, when what it produced is no longer as it left it."""
        if stage.recheck is None:
            return True
        jobs_log.info("run %s: %s is current: checking that it is still in place", self.m.run_id, stage.name)
        try:
            fn: Recheck = stage_actions.load(stage.recheck, stage_actions.RECHECKS)
            why = await fn(self.m)
        except Exception as exc:  # cannot tell: run it again rather than trust it
            why = f"it could not be checked ({type(exc).__name__}: {exc})"
        if why is None:
            jobs_log.info("run %s: %s is current and still in place: skipped", self.m.run_id, stage.name)
            self.m.add_event(
                "recheck", f"{stage.title}: still in place, skipped", stage=stage.name, passed=True
            )
            self.m.save()
            return True
        jobs_log.warning("run %s: %s runs again: %s", self.m.run_id, stage.name, why)
        self.m.add_event("recheck", f"{stage.title} runs again: {why}", stage=stage.name, passed=False)
        self.m.save()
        return False

    def _stale_upstream(self, need: str, targets: tuple[Stage, ...]) -> str | None:
        """Why the done stage `need`, outside this run's targets (`--only X`, the page's Run again), no longer
        describes its output, or None. X then runs on (or is skipped as current against) what the old inputs made:
        said as a warning, not refused (a person may mean it, and a test run copied and edited often does)."""
        if need in {t.name for t in targets}:
            return None
        st = self._by_name.get(need) or get_stage(need)
        if stage_is_current(self.m, st):
            return None
        if self.m.stage(need).data.get("input_hash") != input_hash(self.m, st):
            return "is out of date (its inputs changed since it ran)"
        return "is not as it was recorded (its output is missing or changed on disk)"

    def _stale_hint(self, stage: Stage) -> str:
        return (
            f"{stage.title} uses the output that is there. To redo what changed, run up to {stage.name} (the page's "
            f"Run button, or `hexstudio run --resume {self.m.run_id} --until {stage.name}`)."
        )

    def _warn(self, stage: str, code: str, message: str, once: bool = False) -> None:
        """A warning of the pipeline's own: in the run's history (`once`: a line the history does not hold yet),
        and to whoever watches the stage's events."""
        if not (once and any(e.get("kind") == code for e in self.m.data.get("events") or [])):
            self.m.add_event(code, message)
        if self.on_event is not None:
            self.on_event(stage, {"type": "warning", "code": code, "message": message})

    def _targets(self, until: str, only: str | None) -> tuple[Stage, ...]:
        if only:
            return (self._by_name[only],) if only in self._by_name else (get_stage(only),)
        names = [s.name for s in self.stages]
        if until not in names:
            get_stage(until)  # raises with the list of stages
        return self.stages[: names.index(until) + 1]

    def _gate_blocks(self, name: str) -> tuple[str, str | None] | None:
        """(message, hint) when the done stage `name` has a failed gate and no recorded override; else None.
        `run --only X` and resumed runs check every upstream gate here, not just that the stage is done."""
        stage = self._by_name.get(name) or get_stage(name)
        gate = stage.gate(self.m)
        if gate.passed:
            return None
        overridden = self._override_record(name) is not None
        if gate.overridable and overridden:
            return None
        msg = f"the {stage.title} gate did not pass ({gate.reason})."
        if not gate.overridable:
            return msg, f"Run the {name} stage again (hexstudio run --resume {self.m.run_id} --only {name})."
        return msg, (
            f"Fix what the {name} stage reported and run it again, or continue anyway with "
            f"`hexstudio run --resume {self.m.run_id} --override-gate {name}` "
            f"(the override is recorded in the run and shown in its report)."
        )

    def _override_record(self, name: str) -> dict[str, Any] | None:
        """The latest recorded override of `name`'s gate, while the run's settings still ask for it."""
        if name not in (self.m.settings.get("override_gates") or []):
            return None
        for ev in reversed(self.m.data.get("events", [])):
            if ev.get("kind") == "gate_override" and ev.get("stage") == name:
                return {"t": ev["t"], "reason": ev.get("message"), "by": ev.get("by") or "unknown"}
        return None

    def _lapse_override(self, name: str) -> None:
        """A stage that runs again replaces the result its gate was overridden for: an override given before
        this pipeline lapses (said in the run's history), so a new failed gate stops the run and asks again.
        One given for this run (`run --resume R --override-gate X`) covers what the stage gives now."""
        overrides = list(self.m.settings.get("override_gates") or [])
        if name not in overrides or name in self._granted:
            return
        overrides.remove(name)
        self.m.settings["override_gates"] = overrides
        self.m.add_event(
            "gate_override_lapsed",
            f"the {name} stage runs again: its gate override was for the result it replaces",
            stage=name,
        )
        self.m.save()

    def override_gate(self, name: str, reason: str) -> None:
        """Let the run go on past `name`'s failed gate, recorded in the run (who, when, why). Given while this
        pipeline runs, it is its own change; otherwise made through edit_run (RunBusy while another runs it)."""
        self._granted.add(name)
        if self.lock.held:
            self._record_override(name, reason)
        else:
            edit_run(self.m, lambda _m: self._record_override(name, reason), f"the {name} gate's override")

    def _record_override(self, name: str, reason: str) -> None:
        overrides = list(self.m.settings.get("override_gates") or [])
        if name not in overrides:
            overrides.append(name)
        self.m.settings["override_gates"] = overrides
        self.m.add_event("gate_override", reason, stage=name, by=_login_name())
        gate = self.m.stage(name).data.get("gate")
        if isinstance(gate, dict):  # the stored gate says so too, not only after the next run
            gate["override"] = self._override_record(name)
        if self.lock.held:
            self.m.save()

    async def cancel(self) -> None:
        self.cancel_event.set()
        if self.current_job is not None:
            await self.current_job.cancel()

    # -- one stage ----------------------------------------------------------
    def _notify_stage(self, name: str, state: str) -> None:
        if self.on_stage is not None:
            self.on_stage(name, state)

    def _upstream(self, stage: Stage) -> dict[str, Path]:
        up = {}
        for s in self.stages:
            if self.m.stage(s.name).state == "done" and artifacts_dir(self.m, s.name).is_dir():
                up[s.name] = artifacts_dir(self.m, s.name)
        return {k: v for k, v in up.items() if k != stage.name}

    async def run_stage(self, stage: Stage) -> JobResult:
        self._lapse_override(stage.name)
        attempt = StageAttempt(
            self.m,
            stage,
            on_event=lambda ev: self.on_event(stage.name, ev) if self.on_event is not None else None,
            on_sample=lambda s: self.on_sample(stage.name, s) if self.on_sample is not None else None,
        )
        try:
            partial = attempt.begin()
        except OSError as exc:  # the run folder cannot be written: a full disk, a folder that is root's
            result = attempt.fail_unwritten(exc)
            self._notify_stage(stage.name, "failed")
            return result
        self._notify_stage(stage.name, "running")
        run = self._run_worker if stage.worker is not None else self._run_action
        try:
            result = await run(
                stage, partial, attempt.handle, attempt.sample, stage_log_path(self.m, stage.name)
            )
        except Exception as exc:
            # a fault no stage expects (a full disk while its spec is written, a bug in an action): the stage
            # ends failed with what happened, never left "running" by this live process with its error only in
            # the log
            jobs_log.exception("run %s: %s: unexpected error", self.m.run_id, stage.name)
            result = JobResult(
                "failed",
                None,
                None,
                f"The {stage.title} stage stopped on an unexpected error: {type(exc).__name__}: {exc}",
                hint="If the message names a full disk or a file that cannot be written, fix that and resume "
                f"(`hexstudio run --resume {self.m.run_id}`); otherwise it is a HexStudio bug: the traceback is "
                f"in {logs.log_path()}, please report it with that file.",
                code="unexpected_error",
            )
        finally:
            attempt.close()
        try:
            try:
                # an 8B model's outputs are gigabytes: hashed off the event loop (the studio's window stays live)
                hashes = (
                    await asyncio.to_thread(_synced_hashes, partial, attempt.kinds, stage.name)
                    if result.ok
                    else None
                )
            except asyncio.CancelledError:
                # the studio is closing while a finished stage's output is hashed: it is recorded first (hashed
                # here, blocking the close a while) rather than lost to an "interrupted" and hours done again
                try:
                    attempt.finish(result)
                except OSError as exc:
                    attempt.fail_unwritten(exc, result)
                raise
            state = attempt.finish(result, hashes)
        except OSError as exc:  # the output could not be put in place, hashed or recorded
            result, state = attempt.fail_unwritten(exc, result), "failed"
        self._notify_stage(stage.name, state)
        return result

    async def _run_worker(
        self, stage: Stage, partial: Path, handle: EventHandler, sample: SampleHandler, log_path: Path
    ) -> JobResult:
        assert stage.worker is not None
        if importlib.util.find_spec(stage.worker) is None:
            return _not_implemented(stage)
        try:
            spec = stage_spec(self.m, stage.name, partial, self._upstream(stage))
        except BadSettings as exc:  # a run.json edited by hand, or from a version with other ranges
            return JobResult(
                "failed",
                None,
                None,
                f"The {stage.title} stage cannot start: {exc.message}",
                hint="Change it with `hexstudio run --resume RUN --set NAME=VALUE` (or on the stage's page), "
                "then run the stage again.",
                code="bad_setting",
            )
        job = await start_stage_worker(
            self.runner,
            self.m,
            stage,
            spec,
            on_event=handle,
            on_sample=sample,
            log_path=log_path,
            memory_need=self._memory_need(stage),
        )
        self.current_job = job
        if isinstance(job, LocalJob) and job.proc is not None:
            # where the worker runs, so a resume after a crash finds it if it is somehow still alive
            self.m.stage(stage.name).data["worker"] = {
                "pid": job.proc.pid,
                "pgid": job.pgid,
                "host": socket.gethostname(),
                "boot_id": boot_id(),
                "started": now_iso(),
            }
            # only a hint for a resume after a crash: a full disk now must not leave the worker running unowned
            # (its stage failed, its partial folder deleted under it, and no record to find it by)
            with contextlib.suppress(OSError):
                self.m.save()
        try:
            if self.cancel_event.is_set():
                await job.cancel()
            return await job.wait()
        finally:
            self.current_job = None

    def _memory_need(self, stage: Stage) -> int | None:
        """The stage's estimated peak RSS from the Model stage's model.json (quantize_peak_rss_bytes, ...)."""
        path = artifacts_dir(self.m, "model") / "model.json"
        try:
            est = json.loads(path.read_text(encoding="utf-8")).get("estimates") or {}
        except (OSError, ValueError):
            return None
        value = est.get(f"{stage.name}_peak_rss_bytes")
        return int(value) if isinstance(value, (int, float)) and value > 0 else None

    async def _run_action(
        self, stage: Stage, partial: Path, handle: EventHandler, sample: SampleHandler, log_path: Path
    ) -> JobResult:
        assert stage.action is not None
        t0 = time.monotonic()
        try:
            fn: StageAction = stage_actions.load(stage.action, stage_actions.ACTIONS)
        except LookupError:
            return _not_implemented(stage)
        except (ImportError, AttributeError) as exc:  # the module is there but broken: say what failed
            jobs_log.exception(
                "run %s: the %s stage's action %s cannot be loaded", self.m.run_id, stage.name, stage.action
            )
            return JobResult(
                "failed",
                None,
                None,
                f"The {stage.title} stage could not start: {type(exc).__name__}: {exc}",
                hint="This HexStudio installation is incomplete or broken (a missing package?): the traceback "
                f"is in {logs.log_path()}; `./dev setup` (or the installer) puts the packages back.",
                code="import_failed",
                duration_s=time.monotonic() - t0,
            )
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:

            def emit(ev: dict[str, Any]) -> None:
                log.write(json.dumps(ev, ensure_ascii=False) + "\n")
                handle(ev)

            ctx = StageContext(
                self.m, stage, partial, self._upstream(stage), emit, self.cancel_event, sample, self.runner
            )
            try:
                summary = await _until_cancelled(fn(ctx), self.cancel_event)
            except ActionableError as exc:  # StageError, or a board/session/bundle error that says what to do
                if not isinstance(exc, StageError):
                    jobs_log.warning("run %s: %s: %s", self.m.run_id, stage.name, exc.code, exc_info=True)
                ctx.emitter.error(exc.code, exc.message, exc.hint)
                return JobResult(
                    "failed",
                    None,
                    None,
                    exc.message,
                    hint=exc.hint,
                    code=exc.code,
                    duration_s=time.monotonic() - t0,
                )
            except asyncio.CancelledError:
                if not self.cancel_event.is_set():
                    raise
                return JobResult(
                    "cancelled",
                    None,
                    None,
                    f"The {stage.title} stage was cancelled.",
                    code="cancelled",
                    duration_s=time.monotonic() - t0,
                )
            ctx.emitter.done(True, summary or {})
        return JobResult(
            "ok",
            0,
            None,
            f"The {stage.title} stage finished.",
            summary=summary or {},
            duration_s=time.monotonic() - t0,
        )


def _synced_hashes(partial: Path, kinds: dict[str, dict[str, Any]], stage: str) -> list[dict[str, Any]]:
    """A finished attempt's output forced to disk, then hashed: run.json (fsynced) never vouches for a file a power
    cut would bring back empty."""
    sync_tree(partial)
    return hash_tree(partial, kinds, stage)


def _run_processes(pgid: int, tag: str) -> list[psutil.Process]:
    """Live processes of process group `pgid` whose environment carries WORKER_RUN_ENV == tag."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) != pgid or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(WORKER_RUN_ENV) == tag:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _login_name() -> str:
    """Who overrode a gate (recorded beside the reason; the studio and the CLI show it)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no login name (some containers)
        return "unknown"


def stop_stale_workers(m: RunManifest, term_s: float = 3.0) -> list[str]:
    """Before a run goes on: stop any worker of it still alive from an earlier studio (its pid, process group
    and boot id are in run.json; only processes whose environment names this run and stage are touched).
    SIGTERM to them, then SIGKILL after `term_s`. Returns the stages whose worker was stopped."""
    stopped = []
    changed = False
    for name in list(m.data.get("stages", {})):
        st = m.stage(name).data
        w = st.get("worker")
        if not isinstance(w, dict):
            continue
        changed = True
        st["worker"] = None
        if w.get("boot_id") != boot_id() or w.get("host") != socket.gethostname():
            continue  # another boot or machine: that process is gone
        try:
            pgid = int(w.get("pgid") or w.get("pid") or 0)
        except (TypeError, ValueError):
            continue
        if pgid <= 1 or pgid == os.getpgid(0):
            continue
        procs = _run_processes(pgid, f"{m.run_id}/{name}")
        if not procs:
            continue
        for sig, wait in ((signal.SIGTERM, term_s), (signal.SIGKILL, 5.0)):
            for p in procs:
                with contextlib.suppress(psutil.Error, OSError):
                    p.send_signal(sig)
            _gone, procs = psutil.wait_procs(procs, timeout=wait)
            if not procs:
                break
        stopped.append(name)
        m.add_event(
            "stale_worker_stopped",
            f"stopped the {name} worker (pid {w.get('pid')}) that an earlier "
            "studio left running, before starting again",
            stage=name,
        )
    if changed:
        m.save()
    return stopped


def _not_implemented(stage: Stage) -> JobResult:
    return JobResult(
        "not_implemented",
        None,
        None,
        f"The {stage.title} stage is not implemented yet.",
        hint="This HexStudio build cannot run this stage yet; earlier stages' results are kept.",
        code="not_implemented",
    )


async def _until_cancelled(action: Awaitable[T], cancel: asyncio.Event) -> T:
    """An in-process stage action, stopped at once by the run's cancel: a Board push of gigabytes, a QAIRT
    install or a chat benchmark runs in a task the cancel stops (each closes its board connection on the way
    out, which ends a transfer in flight), instead of each action polling for it."""
    work = asyncio.ensure_future(action)
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        done, _ = await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done and not cancel.is_set():
            # the wait on the event failed (an event bound to another loop): the action runs on without it
            await asyncio.wait({work})
    finally:
        waiter.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    # a cancelled action raises CancelledError here, which the caller reports as the stage cancelled
    return work.result()
