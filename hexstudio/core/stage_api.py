"""The stage API: what a stage gets from the pipeline, how it fails, and how it starts a worker process.

Two kinds of stage (hexstudio/core/stages.py):

- a worker stage (`worker="hexstudio.workers.<name>"`): the pipeline writes its WorkerSpec and starts it through
  `start_stage_worker` (this machine, or the run's worker host for the heavy stages), with memory samples, the
  worker's process group recorded for a resume, and cancel;
- an action stage (`action="board"`, a name registered in hexstudio/core/stage_actions.py: board, chat, evaluate
  and report work that runs in the studio's process): an async function taking a `StageContext`. An action that needs a worker of its own (the
  Evaluate stage's host legs) starts it with `StageContext.run_worker`: the same spec, the same memory
  samples (into the stage's resources log and the studio's live plot), the same cancel.

Action modules import this module, never hexstudio.core.pipeline (an import-linter contract keeps it so: the
pipeline loads the actions, an action importing it back would be a cycle).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.jobs import EventHandler, JobResult, JobRunner, LocalJob, SampleHandler, worker_command
from hexstudio.core.manifest import RunManifest
from hexstudio.core.remote import RemoteStageJob, start_worker_job
from hexstudio.core.stages import Stage
from hexstudio.shared.errors import KEYRING_UNREAD_ENV, ActionableError
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.worker_spec import EvalWork, StageInputs, WorkerSpec

# "<run id>/<stage>" in a local worker's environment (and its children's): stop_stale_workers finds them by it
WORKER_RUN_ENV = "HEXSTUDIO_WORKER_RUN"


class StageError(ActionableError):
    """Raised by in-process stage actions: a failure a person can act on."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, code=code)


@dataclass
class StageContext:
    """What an in-process stage action gets (board, chat, evaluate, report stages)."""

    manifest: RunManifest
    stage: Stage
    out_dir: Path
    upstream: dict[str, Path]
    emit: EventHandler
    cancel_event: asyncio.Event
    sample: SampleHandler | None = None  # the stage's memory samples (resources log, live plot)
    runner: JobRunner = field(default_factory=JobRunner)
    emitter: Emitter = field(init=False)

    def __post_init__(self) -> None:
        ctx = self

        class _Sink:
            def write(self, line: str) -> None:
                ctx.emit(json.loads(line))

            def flush(self) -> None:
                pass

        self.emitter = Emitter(_Sink())  # type: ignore[arg-type]

    @property
    def settings(self) -> dict[str, Any]:
        """run.json's settings as the run holds them."""
        return self.manifest.settings

    def check_cancelled(self) -> None:
        if self.cancel_event.is_set():
            raise asyncio.CancelledError()

    def worker_spec(self, out_dir: Path, *, evaluate: EvalWork | None = None) -> WorkerSpec:
        """A spec for a worker of this stage, from the run (settings, inputs) and the completed stages."""
        return stage_spec(self.manifest, self.stage.name, out_dir, self.upstream, evaluate=evaluate)

    async def run_worker(
        self,
        module: str,
        spec: WorkerSpec,
        *,
        name: str,
        what: str,
        on_event: EventHandler | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> JobResult:
        """Run `module` (a hexstudio.workers entry) on `spec` to its end on this machine: the spec in
        specs/<name>.json, the log in logs/<name>.jsonl, memory samples to the stage, stopped when the stage is
        cancelled or the awaiting task is (a sibling failed). `python`: another interpreter (the workstation
        installer's side environment)."""
        run_dir = self.manifest.run_dir
        spec_path = spec.write(run_dir / "specs" / f"{name}.json")
        log_path = run_dir / "logs" / f"{name}.jsonl"
        env = {
            **(env or await worker_env_async()),
            WORKER_RUN_ENV: f"{self.manifest.run_id}/{self.stage.name}",
        }
        argv = worker_command(module, spec_path)
        if python is not None:  # another interpreter runs the module itself, from a source or a frozen studio
            argv = [python, "-m", module, "--spec", str(spec_path)]
            what = f"{what} in {python}"
        job = await self.runner.start_argv(
            argv,
            on_event=on_event,
            on_sample=self.sample,
            log_path=log_path,
            env=env,
            what=what,
            liveness=True,
        )
        return await wait_or_cancel(job, self.cancel_event)


StageAction = Callable[[StageContext], Awaitable[dict[str, Any] | None]]


async def wait_or_cancel(job: LocalJob | RemoteStageJob, cancel_event: asyncio.Event) -> JobResult:
    """The job's result; the job is stopped first when `cancel_event` is set or the awaiting task is cancelled
    (then CancelledError goes on up)."""
    waiter = asyncio.ensure_future(job.wait())
    cancel = asyncio.ensure_future(cancel_event.wait())
    try:
        await asyncio.wait({waiter, cancel}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            raise asyncio.CancelledError()
    except asyncio.CancelledError:
        if not waiter.done():
            await job.cancel()
            with contextlib.suppress(Exception):
                await waiter
        raise
    finally:
        cancel.cancel()
    return waiter.result()


def stage_spec(
    m: RunManifest,
    stage: str,
    out_dir: Path,
    upstream: dict[str, Path],
    *,
    evaluate: EvalWork | None = None,
) -> WorkerSpec:
    """The one place a stage's WorkerSpec is built from a run."""
    return WorkerSpec.build(
        stage,
        m.run_dir,
        out_dir,
        m.settings,
        upstream=upstream,
        inputs=StageInputs(model=m.inputs.get("model"), board=m.inputs.get("board")),
        evaluate=evaluate,
    )


async def start_stage_worker(
    runner: JobRunner,
    m: RunManifest,
    stage: Stage,
    spec: WorkerSpec,
    *,
    on_event: EventHandler,
    on_sample: SampleHandler,
    log_path: Path,
    memory_need: int | None,
) -> LocalJob | RemoteStageJob:
    """A worker stage started where it runs: the run's worker host for the heavy stages (and preflight) when
    `worker_host` names one, else this machine."""
    assert stage.worker is not None
    spec_path = spec.write(m.run_dir / "specs" / f"{stage.name}.json")
    what = f"The {stage.title} stage"
    return await start_worker_job(
        runner,
        m,
        stage,
        spec_path,
        on_event=on_event,
        on_sample=on_sample,
        log_path=log_path,
        what=what,
        env={**await worker_env_async(), WORKER_RUN_ENV: f"{m.run_id}/{stage.name}"},
        memory_need=memory_need,
    )


async def worker_env_async() -> dict[str, str]:
    """worker_env off the event loop: the keyring it reads may block on an unlock prompt (Secret Service), and the
    studio's window is that loop."""
    return await asyncio.to_thread(worker_env)


def worker_env() -> dict[str, str]:
    """The worker's environment: ours, plus secrets from the keyring passed by environment (never in
    the spec file, the logs or run.json)."""
    from hexstudio.core import secrets
    from hexstudio.core.hf import worker_env_token

    env = dict(os.environ)
    env.pop(KEYRING_UNREAD_ENV, None)
    # the one Hugging Face token (keyring from `hexstudio hf login`, else huggingface_hub's own login)
    env.update(worker_env_token())
    for var, name in (("HEXSTUDIO_AIHUB_TOKEN", secrets.AIHUB_TOKEN),):
        try:
            value = secrets.get_secret(name)
        except secrets.SecretStoreError as exc:
            # a locked or broken keyring: the worker that finds no token says this, not "not in the keyring"
            env[KEYRING_UNREAD_ENV] = f"{exc.message} {exc.hint or ''}".strip()
            value = None
        if value:  # the keyring's wins over the environment (services.aihub_token.TOKEN_ORDER)
            env[var] = value
    return env


__all__ = [
    "WORKER_RUN_ENV",
    "StageAction",
    "StageContext",
    "StageError",
    "stage_spec",
    "start_stage_worker",
    "wait_or_cancel",
    "worker_env",
    "worker_env_async",
]
