"""How one attempt of a stage is kept in run.json while it runs and when it ends.

While it runs: its metrics, warnings and the kinds of the artifacts it names, from the job's JSON-line events,
and its resource samples in logs/<stage>.resources.jsonl. When it ends: how (outcome, peak RSS/VRAM, duration)
and, only on success, its output folder put in place (artifacts/<stage>.partial/ renamed to artifacts/<stage>/,
hashed), so a crash never leaves half-written output that looks complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from hexstudio.core.atomic import fsync_dir, sync_tree
from hexstudio.core.jobs import JobResult, human_bytes
from hexstudio.core.manifest import RunManifest, now_iso
from hexstudio.core.runs import artifacts_dir
from hexstudio.core.sampler import ResourceSample
from hexstudio.core.stage_state import hash_tree, input_hash, output_digest, summary_digest
from hexstudio.core.stages import Stage
from hexstudio.shared.errors import disk_hint, why_not_written

jobs_log = logging.getLogger("hexstudio.jobs")

# how a job that did not succeed leaves its stage
ENDED_STATE = {"cancelled": "cancelled", "killed": "interrupted", "oom": "failed"}


class StageAttempt:
    """One attempt of `stage` in run `m`: begin(), then handle()/sample() for the job's events, then finish()."""

    def __init__(
        self,
        m: RunManifest,
        stage: Stage,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        on_sample: Callable[[ResourceSample], None] | None = None,
    ) -> None:
        self.m = m
        self.stage = stage
        self.on_event = on_event
        self.on_sample = on_sample
        self.final = artifacts_dir(m, stage.name)
        self.partial = self.final.with_name(f"{stage.name}.partial")
        # the inputs the stage starts from (begin): a file setting or suite edited while it runs is not in its output
        self.inputs_at_start: str | None = None
        self.kinds: dict[
            str, dict[str, Any]
        ] = {}  # artifact path -> its kind and role, as the job named them
        self._resources: IO[str] | None = None

    @property
    def record(self) -> dict[str, Any]:
        return self.m.stage(self.stage.name).data

    def begin(self) -> Path:
        """A fresh output folder (never resumed from half-written output) and the stage marked running."""
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        self.inputs_at_start = input_hash(self.m, self.stage)
        st = self.record
        st.update(
            {
                "metrics": {},
                "warnings": [],
                "summary": None,
                "gate": None,
                "peak_rss_bytes": None,
                "peak_vram_bytes": None,
            }
        )
        self.m.mark_running(self.stage.name)
        res_path = self.m.run_dir / "logs" / f"{self.stage.name}.resources.jsonl"
        res_path.parent.mkdir(parents=True, exist_ok=True)
        self._resources = open(res_path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        jobs_log.info(
            "run %s: %s stage started (attempt %s, %s)",
            self.m.run_id,
            self.stage.name,
            st.get("attempts"),
            f"worker {self.stage.worker}" if self.stage.worker else f"action {self.stage.action}",
        )
        return self.partial

    def handle(self, ev: dict[str, Any]) -> None:
        """One JSON-line event of the job: kept where run.json keeps it, logged, and handed on."""
        st, run, name = self.record, self.m.run_id, self.stage.name
        t = ev.get("type")
        if t == "metric":
            # the emitter leaves out a None field: a metric without a value was not measured
            st["metrics"][ev["name"]] = {
                "value": ev.get("value"),
                "unit": ev.get("unit"),
                "scope": ev.get("scope"),
            }
            if (
                ev.get("scope") == "job"
            ):  # a remote job's id (AI Hub): on disk at once, so a killed studio keeps it
                self.m.save()
                jobs_log.info("run %s: %s: %s = %s", run, name, ev["name"], ev.get("value"))
        elif t == "artifact":
            self.kinds[ev["path"]] = {"kind": ev.get("kind"), "role": ev.get("role")}
        elif t == "warning":
            st["warnings"].append({k: ev.get(k) for k in ("message", "hint", "code")})
            jobs_log.warning(
                "run %s: %s: warning %s: %s", run, name, ev.get("code") or "-", ev.get("message")
            )
        elif t == "error":
            jobs_log.warning("run %s: %s: error %s: %s", run, name, ev.get("code"), ev.get("message"))
        elif t == "log":
            jobs_log.debug("run %s: %s: %s", run, name, ev.get("message"))
        if self.on_event is not None:
            self.on_event(ev)

    def sample(self, s: ResourceSample) -> None:
        """One resource sample of the job's process tree: in logs/<stage>.resources.jsonl, and handed on."""
        if self._resources is not None:
            self._resources.write(json.dumps(s.as_json()) + "\n")
        if self.on_sample is not None:
            self.on_sample(s)

    def close(self) -> None:
        if self._resources is not None:
            self._resources.close()
            self._resources = None

    def fail_unwritten(self, exc: OSError, job: JobResult | None = None) -> JobResult:
        """The attempt could not write its own record or output (a full disk, a run folder someone else owns):
        the stage ends failed, in run.json where it can still be saved, in this process's manifest always (and a
        "running" left on disk with this process's pid reads as interrupted once the run's lock is free again).
        A failed `job` keeps its own message (an out-of-memory stays one). Returns the failure the caller shows."""
        self.close()
        where = f" ({exc.strerror}: {exc.filename})" if exc.filename else f" ({exc})"
        said = f"{why_not_written(exc) or exc.strerror or exc}{where}"
        if job is not None and not job.ok:
            result = dataclasses.replace(
                job, message=f"{job.message} Its record could not be written either: {said}."
            )
        else:
            result = JobResult(
                "failed",
                None,
                None,
                f"The {self.stage.title} stage could not write to the run folder: {said}.",
                hint=disk_hint(exc, self.m.run_dir),
                code="run_folder_not_written",
            )
        st = self.record
        st.update(state="failed", ended=now_iso(), outcome=result.outcome(), owner=None, worker=None)
        st["input_hash"] = None
        with contextlib.suppress(OSError):
            shutil.rmtree(self.partial, ignore_errors=True)
            self.m.save()
        jobs_log.warning(
            "run %s: %s stage could not write its record: %s", self.m.run_id, self.stage.name, exc
        )
        return result

    def finish(self, result: JobResult, artifacts: list[dict[str, Any]] | None = None) -> str:
        """The attempt's end in run.json (saved); on success the output folder is put in place and hashed (or
        given its `artifacts`, hashed before: hash_tree of the partial folder). Returns the stage's new state."""
        self.close()
        st = self.record
        st["ended"] = now_iso()
        st["duration_s"] = round(result.duration_s, 3)
        st["peak_rss_bytes"] = result.peak_rss_bytes or None
        st["peak_vram_bytes"] = result.peak_vram_bytes
        if not result.ok:
            # the attempt's log files outlive its output folder, which goes: the error names where they are kept
            # (the result the caller shows, and run.json's outcome)
            for old_path, kept in keep_logs(
                self.partial, self.m.run_dir / "logs" / f"{self.stage.name}-failed"
            ):
                result.message = result.message.replace(str(old_path), str(kept))
                result.hint = result.hint.replace(str(old_path), str(kept)) if result.hint else result.hint
        st["outcome"] = result.outcome()
        st["owner"] = None
        st["worker"] = None
        if result.ok:
            st["summary"] = result.summary
            old = self.final.with_name(f"{self.stage.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            if self.final.exists():
                self.final.rename(old)
            self.partial.rename(self.final)
            fsync_dir(self.final.parent)  # the rename on disk before run.json says "done"
            shutil.rmtree(old, ignore_errors=True)
            if (
                artifacts is None
            ):  # not hashed by the pipeline (a cancel while it hashed): forced to disk here
                sync_tree(self.final)
            st["artifacts"] = artifacts if artifacts is not None else hash_tree(self.final, self.kinds)
            st["input_hash"] = self.inputs_at_start or input_hash(self.m, self.stage)
            st["output_digest"] = (
                summary_digest(result.summary, st["input_hash"])
                if self.stage.digest_from_summary and result.summary
                else output_digest(st["artifacts"])
            )
            st["state"] = "done"
        else:
            shutil.rmtree(self.partial, ignore_errors=True)
            st["state"] = ENDED_STATE.get(result.kind, "failed")
            st["input_hash"] = None
        self.m.save()
        jobs_log.log(
            logging.INFO if result.ok else logging.WARNING,
            "run %s: %s stage ended: %s (code %s, exit %s) in %.1f s%s: %s",
            self.m.run_id,
            self.stage.name,
            result.kind,
            result.code or "-",
            result.exit_code,
            result.duration_s,
            f", peak RSS {human_bytes(result.peak_rss_bytes)}" if result.peak_rss_bytes else "",
            result.message,
        )
        return str(st["state"])


def keep_logs(partial: Path, dest: Path) -> list[tuple[Path, Path]]:
    """A failed attempt's log files (`*.log`: QNN's compile output, the bundle checks' findings) moved out of its
    output folder, which is deleted, to `dest` (the last failed attempt's, by their paths inside the folder): the
    error's hint names them, and they must still be there to read. (where each was, where it is now)"""
    logs = [p for p in partial.rglob("*.log") if p.is_file()] if partial.is_dir() else []
    shutil.rmtree(dest, ignore_errors=True)
    moved = []
    for p in logs:
        to = dest / p.relative_to(partial)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), to)
        moved.append((p, to))
    return moved
