"""The bridge between hexstudio.core's run pipeline and the window: one run open at a time.

Stages run through hexstudio.core.pipeline.Pipeline on the qasync event loop; the worker processes
are started by the job runner. Everything the pipeline reports arrives here on the GUI thread
and is re-emitted as Qt signals that pages and the job dock listen to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from hexstudio.core import logs
from hexstudio.core.manifest import ManifestError, RunManifest
from hexstudio.core.pipeline import Pipeline, PipelineResult
from hexstudio.core.runs import RunSummary, Workspace, change_settings, load_run
from hexstudio.core.sampler import ResourceSample
from hexstudio.core.settings import Settings, SettingsError
from hexstudio.core.stage_state import display_state
from hexstudio.core.stages import get_stage
from hexstudio.core.status import KINDS, StageStatus, stage_status
from hexstudio.shared import run_settings
from hexstudio.shared.errors import ActionableError

log = logging.getLogger("hexstudio.gui")


def _file_stamp(path: Path) -> tuple[int, int] | None:
    """When and how big the file was last written (None: there is none)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class RunController(QObject):
    runChanged = Signal()  # a run was opened, created or deleted
    stageState = Signal(str, str)  # stage, display state
    stageEvent = Signal(str, dict)  # stage, worker-protocol event
    resourceSample = Signal(str, object)  # stage, ResourceSample
    busyChanged = Signal(bool)
    settingsChanged = Signal()  # a run setting changed: later stages may be stale now
    finished = Signal(str, bool, str, str)  # last stage, ok, message, hint
    runtimeLog = Signal(str, str)  # level, a line of the board runtime's own log (Genie's GenieLog)

    def __init__(self, workspace: Workspace | None = None, settings: Settings | None = None) -> None:
        super().__init__()
        self._settings = settings or Settings.load()
        self._settings_stamp = _file_stamp(self._settings.path)
        self.workspace = workspace or Workspace.chosen(self._settings)
        self.manifest: RunManifest | None = None
        self.pipeline: Pipeline | None = None
        self.task: asyncio.Task[PipelineResult] | None = None
        self.running_stage: str | None = None
        self.last_result: PipelineResult | None = None
        self.last_target: str | None = None  # the stage the latest start() was asked to reach
        self._busy = False
        self._run_stamp: tuple[int, int] | None = None  # run.json as this window last read it

    # -- settings.json ---------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """settings.json as it is now: read again when another process changed it (`hexstudio board add`,
        another studio), so a board added in a terminal is offered here and is not lost at the next save."""
        stamp = _file_stamp(self._settings.path)
        if stamp != self._settings_stamp:
            self._settings_stamp = stamp
            if stamp is not None:
                try:
                    self._settings = Settings.load(self._settings.path)
                except SettingsError as exc:
                    # damaged meanwhile: keep the copy read before; the next change says what is wrong
                    log.warning("settings.json changed and cannot be read: %s", exc.message)
        return self._settings

    def edit_settings(self, change: Callable[[Settings], object]) -> None:
        """Settings.edit on the studio's settings file; the studio then holds what was written."""
        fresh = Settings.edit(change, self._settings.path)
        self._settings, self._settings_stamp = fresh, _file_stamp(fresh.path)

    # -- runs ----------------------------------------------------------------------------------
    def list_runs(self) -> list[RunSummary]:
        return self.workspace.list_runs()

    def _not_while_working(self, what: str) -> None:
        """The studio shows one run, the one it works on: while a stage of it runs, another cannot be shown (its
        pages, the job dock and the gate bar would mix the two runs)."""
        if self.busy and self.manifest is not None:
            stage = f"its {self.running_stage} stage" if self.running_stage else "a stage"
            raise ActionableError(
                f"Run {self.manifest.run_id} is working ({stage} runs): {what} is not possible until it ends.",
                "Wait for the stage to end, or cancel it (Cancel in the job dock), then try again.",
            )

    def new_run(self, model: str, board: str = "sim", overrides: dict[str, Any] | None = None) -> RunManifest:
        self._not_while_working("a new run")
        settings = self.settings.run_defaults()
        settings.update(overrides or {})
        self.manifest = self.workspace.create_run(
            model, board, settings, include_host=bool(self.settings.data.get("include_host_in_reports"))
        )
        self._run_stamp = _file_stamp(self.manifest.path)
        self.runChanged.emit()
        return self.manifest

    def open_run(self, run_id: str) -> RunManifest:
        if self.manifest is None or run_id != self.manifest.run_id:
            self._not_while_working(f"opening run {run_id}")
        elif (
            self.busy
        ):  # the run that is working: it stays the one the pipeline updates (and the dock's plot)
            return self.manifest
        # load_run marks a stage a dead process left "running" interrupted, under the run's lock (never over a live
        # runner's newer run.json)
        self.manifest = self.workspace.open_run(run_id)
        self._run_stamp = _file_stamp(self.manifest.path)
        self.runChanged.emit()
        return self.manifest

    def delete_run(self, run_id: str) -> None:
        if self.busy and self.manifest is not None and self.manifest.run_id == run_id:
            raise ActionableError(
                f"Run {run_id} is working right now: it cannot be deleted.",
                "Cancel its stage first (Cancel in the job dock), then delete it.",
            )
        self.workspace.delete_run(run_id, background=True)  # its gigabytes removed off the window's thread
        if self.manifest is not None and self.manifest.run_id == run_id:
            self.manifest = None
        self.runChanged.emit()

    def reload_if_changed(self) -> bool:
        """The open run read again when another process wrote its run.json since (`hexstudio run --resume RUN`,
        `--set`, another studio): its stage states and settings as they are now, not as this window last read
        them. Not while this window runs it (its pipeline holds the newest copy). Returns whether it was read."""
        m = self.manifest
        if m is None or self.busy:
            return False
        stamp = _file_stamp(m.path)
        if stamp is None or stamp == self._run_stamp:
            return False
        try:
            fresh = load_run(m.run_dir)
        except ManifestError as exc:  # damaged meanwhile: keep this copy; the next change says what is wrong
            log.warning("run.json of %s changed and cannot be read: %s", m.run_id, exc)
            return False
        self.manifest, self._run_stamp = fresh, _file_stamp(m.path)  # as load_run left it (it may have saved)
        self.settingsChanged.emit()  # every page and the stage list shown again
        return True

    def state(self, stage: str) -> str:
        if self.manifest is None:
            return "pending"
        if self.running_stage == stage:
            return "running"
        return display_state(self.manifest, stage, get_stage(stage))

    def status(self, stage: str) -> StageStatus:
        """The stage's status in the one status model (hexstudio.core.status): what the stage list, the page and
        every other face say."""
        if self.manifest is None:
            return StageStatus(stage, get_stage(stage).title, KINDS["pending"], "No run is open.")
        return stage_status(self.manifest, stage, get_stage(stage), running=self.running_stage == stage)

    def stage_dir(self, stage: str) -> Path | None:
        if self.manifest is None:
            return None
        d = self.manifest.run_dir / "artifacts" / stage
        return d if d.is_dir() else None

    # -- running -------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, until: str, only: str | None = None, force: bool = False) -> asyncio.Task[PipelineResult]:
        """Run the stages up to `until` (skipping current ones), or just `only`."""
        if self.manifest is None:
            raise RuntimeError("Open or create a run first.")
        if self.busy:
            raise RuntimeError(f"The {self.running_stage} stage is still working: wait for it or cancel it.")
        self.last_target = only or until
        self.pipeline = Pipeline(
            self.manifest, on_event=self._on_event, on_sample=self._on_sample, on_stage=self._on_stage
        )
        self._busy = True
        self.task = asyncio.ensure_future(self._run(until, only, force))
        self.busyChanged.emit(True)
        return self.task

    async def _run(self, until: str, only: str | None, force: bool) -> PipelineResult:
        assert self.pipeline is not None
        try:
            res = await self.pipeline.run(until=until, only=only, force=force)
        except (
            Exception
        ) as exc:  # a bug, not a stage failure: still tell the person, the traceback in the log
            logs.log_exception(
                log, f"the {self.running_stage or until} stage crashed the studio's runner", exc
            )
            res = PipelineResult(
                False,
                self.running_stage,
                f"{type(exc).__name__}: {exc}",
                hint=f"This is a HexStudio bug: the studio log ({logs.log_path()}) has the "
                "traceback; please report it with that file.",
            )
        self.running_stage = None
        self.last_result = res
        self._busy = False
        # as on disk now, a stage whose end could not be written (a full disk) shown interrupted, not "running"
        self.manifest = load_run(self.manifest.run_dir) if self.manifest is not None else None
        self._run_stamp = _file_stamp(self.manifest.path) if self.manifest is not None else None
        self.busyChanged.emit(False)
        self.finished.emit(res.stopped_at or until, res.ok, res.message, res.hint or "")
        return res

    async def cancel(self) -> None:
        if self.pipeline is not None and self.busy:
            await self.pipeline.cancel()

    def set_setting(self, key: str, value: Any) -> bool:
        """Change one of the open run's settings (recorded in run.json); stages that depend on it become
        stale and run again on the next resume."""
        self.reload_if_changed()  # compared with the run as it is now, not as this window last read it
        m = self.manifest
        if m is None or self.busy or m.settings.get(key) == value:
            return False

        # RunBusy while the run runs from a terminal: the page says so
        sp = run_settings.spec(key)
        changed = change_settings(
            m, {key: value}, f"the setting {sp.label if sp is not None and sp.label else key}"
        )
        self._run_stamp = _file_stamp(m.path)  # this window's own write: nothing to read again
        self.settingsChanged.emit()
        return bool(changed)

    def override_gate(self, stage: str, reason: str) -> None:
        if self.manifest is None:
            return
        Pipeline(self.manifest).override_gate(stage, reason)
        self._run_stamp = _file_stamp(self.manifest.path)  # this window's own write: nothing to read again
        self.settingsChanged.emit()  # override_gates is a run setting: the stage list and gate bar follow it

    # -- pipeline callbacks (GUI thread: qasync runs the loop on it) ------------------------------
    def _on_stage(self, name: str, state: str) -> None:
        self.running_stage = (
            name if state == "running" else (None if self.running_stage == name else self.running_stage)
        )
        self.stageState.emit(name, state)

    def _on_event(self, stage: str, ev: dict[str, Any]) -> None:
        self.stageEvent.emit(stage, ev)

    def _on_sample(self, stage: str, s: ResourceSample) -> None:
        self.resourceSample.emit(stage, s)

    async def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            await self.cancel()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.task), 15)
