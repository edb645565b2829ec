"""The run workspace: <workspace>/runs/<run-id>/{run.json, logs/, artifacts/}."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets as _secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hexstudio.core.environment import collect_environment, package_versions
from hexstudio.core.manifest import ManifestError, RunManifest
from hexstudio.core.paths import default_workspace
from hexstudio.core.settings import DEFAULT_RUN_SETTINGS, Settings, SettingsError, check_run_settings
from hexstudio.shared.errors import ActionableError, why_not_written
from hexstudio.shared.hub import model_spec_problem

T = TypeVar("T")

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RunNotFound(ActionableError):
    pass


class WorkspaceError(ActionableError):
    """The workspace cannot hold a new run (not a folder, read-only, full): `message` and `hint`."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class RunBusy(ActionableError):
    """Another process (or another pipeline in this one) is running this run's stages."""

    def __init__(self, run_id: str, pid: int | None, *, change: str | None = None) -> None:
        """`change`: what could not be changed (a setting, a gate override) while it runs; None: a second runner."""
        self.run_id = run_id
        self.pid = pid
        who = f"PID {pid}" if pid else "another process"
        wait = (
            f"Wait for it to finish, or cancel it (Cancel in the studio, Ctrl+C in its terminal, or "
            f"`kill -INT {pid}`)"
            if pid
            else "Wait for it to finish, or cancel it"
        )
        if change is None:
            super().__init__(
                f"Run {run_id} is being run by {who} on this machine.",
                wait + ", then resume. Starting it twice would delete the running stage's output.",
            )
        else:
            super().__init__(
                f"Run {run_id} is being run by {who} on this machine: {change} was not changed.",
                wait
                + ", then change it again: the runner keeps its own copy of the run and would overwrite it.",
            )

    def __str__(self) -> str:
        return f"{self.message} {self.hint}"


LOCK_NAME = ".lock"


def load_run(run_dir: Path) -> RunManifest:
    """run.json, its stages left "running" by a process that is gone marked interrupted. When the run's lock is
    free, no one runs it: every such stage is interrupted, saved under the lock. When another process holds it,
    a stage whose owner is on another host or boot (a container, a shared workspace) is taken as running, and
    one whose owner died on this machine is marked in memory only (the holder's newer run.json is never
    overwritten). On a file system without flock the lock says nothing, and owners are judged by pid."""
    m = RunManifest.load(run_dir)
    if any(m.stage(s).state == "running" for s in m.data["stages"]):
        try:
            with RunLock(run_dir) as lock:
                m = RunManifest.load(run_dir)
                m.detect_interrupted(lock_held=not lock.unsupported)
        except RunBusy:
            # a live process holds the lock (the kernel drops it when its holder dies): a stage whose owner is on
            # another host or boot (a container, a shared workspace) runs; a dead pid here is still dead
            m.detect_interrupted(save=False, others_alive=True)
        except OSError:
            m.detect_interrupted(save=False)
    return m


class RunLock:
    """An exclusive lock on a run folder, held by the process that runs its stages.

    fcntl.flock on <run>/.lock: the kernel drops it when the holder exits, however it ends (kill -9,
    crash), so a stale lock never needs cleaning up. The holder's PID is written into the file for the
    message a second runner gets. The descriptor is not inherited by workers (close-on-exec)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_NAME
        self._fd: int | None = None
        self.unsupported = False  # True when the filesystem refused flock: nothing guards this run

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid: int | None = int(os.pread(fd, 32, 0).decode().strip() or 0) or None
            except (OSError, ValueError):
                pid = None
            os.close(fd)
            raise RunBusy(self.run_dir.name, pid) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            # a filesystem without flock (some network/Windows mounts): run unguarded rather than not at all
            self.unsupported = True
        # the pid is for a second runner's message only: a disk too full to write it must not leak the lock
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def edit_run(m: RunManifest, change: Callable[[RunManifest], T], what: str) -> T:
    """Change a run that this process is not running (a setting, a gate override), as its run.json is on disk
    now: under the run's lock, read again, changed, saved. What another process wrote since `m` was read (a run
    from the terminal: its stages, events, overrides) is kept, never overwritten by this process's older copy.
    RunBusy (naming `what`) while a runner holds the run: its own copy would overwrite the change."""
    lock = RunLock(m.run_dir)
    try:
        lock.acquire()
    except RunBusy as exc:
        raise RunBusy(exc.run_id, exc.pid, change=what) from None
    with lock:
        # unreadable: what this process holds is written back whole
        with contextlib.suppress(ManifestError):
            m.reload()
        out = change(m)
        m.save()
    return out


def _combination_problem(settings: dict[str, Any]) -> str | None:
    """What check_run_settings refuses of these settings taken together, else None."""
    try:
        check_run_settings(settings)
    except SettingsError as exc:
        return exc.message.removeprefix("Run setting(s) refused: ")
    return None


# what a file setting holds that is no path: the built-in text, the model drafting for itself, unset
NOT_A_PATH = ("", "builtin", "self")


def absolute_files(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each file setting (calibration_text, validation_text, spd_draft) as an absolute path: a run
    is resumed from anywhere (the studio, a shell in another folder), and "cal.txt" would then name another file,
    or none, and make the stage stale (its input hash reads the file) or fail."""
    from hexstudio.shared.run_settings import SETTINGS

    out = dict(values)
    for key, value in values.items():
        if key in SETTINGS and SETTINGS[key].file and isinstance(value, str) and value not in NOT_A_PATH:
            out[key] = str(Path(value).expanduser().absolute())
    return out


def change_settings(m: RunManifest, values: dict[str, Any], what: str) -> list[str]:
    """Change some of a run's settings as the studio's pages and `hexstudio run --resume --set` do: each change
    recorded in the run's events (setting_changed); the stages that read a changed setting go stale and run
    again on the next resume. Returns the keys that changed (a value already held changes nothing). BadSettings,
    with nothing changed, where a value is not one the setting takes."""
    from hexstudio.shared.run_settings import BadSettings, check_all

    problems = check_all(values)
    if problems:
        raise BadSettings(problems)
    values = absolute_files(values)

    def change(m: RunManifest) -> list[str]:
        # together with the run's other settings as they are on disk now (a `run --resume --set` may have changed
        # one since this copy was read), as when a run is made (context_length with ar_n, lade's step with the
        # prompt processor): a combination Compile would refuse after hours of quantizing, refused now. Only one
        # the change makes: a run that already held one (made before a rule) can still change its other settings
        combined = _combination_problem({**m.settings, **values})
        if combined is not None and combined != _combination_problem(dict(m.settings)):
            raise BadSettings([combined])
        changed = []
        for key, value in values.items():
            old = m.settings.get(key)
            if old == value:
                continue
            m.settings[key] = value
            m.add_event("setting_changed", f"{key}: {old!r} → {value!r}", key=key, old=old, new=value)
            changed.append(key)
        return changed

    return edit_run(m, change, what)


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text.split(":")[-1].split("/")[-1]).strip("-").lower()
    return s[:32] or "model"


@dataclass
class RunSummary:
    run_id: str
    path: Path
    model: str
    board: str
    created: str
    updated: str
    states: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "model": self.model,
            "board": self.board,
            "created": self.created,
            "updated": self.updated,
            "states": self.states,
        }


class Workspace:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root or default_workspace()).expanduser().resolve()

    @classmethod
    def chosen(cls, settings: Settings | None = None) -> Workspace:
        """The workspace when none is given, the same for the studio and the CLI: $HEXSTUDIO_WORKSPACE, else
        settings.json's "workspace", else ~/hexstudio-workspace (hexstudio.core.paths.default_workspace)."""
        s = settings or Settings.load()
        return cls(default_workspace(s.data.get("workspace")))

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID_RE.match(run_id):
            raise RunNotFound(f"'{run_id}' is not a valid run id.")
        return self.runs_dir / run_id

    def create_run(
        self, model: str, board: str, settings: dict[str, Any] | None = None, include_host: bool = True
    ) -> RunManifest:
        merged = dict(DEFAULT_RUN_SETTINGS)
        merged.update(absolute_files(settings or {}))
        check_run_settings(merged)  # SettingsError: wrong type or out of range, before any folder is made
        # a run's model cannot change on resume: one that names no model would be a run that could never start
        problem = model_spec_problem(model)
        if problem is not None:
            raise WorkspaceError(f"No run was made: {problem[0]}", problem[1])
        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            for _attempt in range(8):
                run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(model)}-{_secrets.token_hex(2)}"
                if self._made(run_id, model, board, merged, include_host):
                    return RunManifest.load(self.runs_dir / run_id)
            raise FileExistsError(errno.EEXIST, "no free run id after 8 tries", str(self.runs_dir))
        except OSError as exc:
            why = why_not_written(exc) or exc.strerror or str(exc)
            raise WorkspaceError(
                f"Cannot make a run in the workspace {self.root}: {why} ({exc.strerror}: {exc.filename}).",
                "Free disk space there, or choose another workspace (--workspace DIR, $HEXSTUDIO_WORKSPACE or "
                "the studio's settings); keep it inside the WSL file system, not under /mnt/c.",
            ) from None

    def _made(
        self, run_id: str, model: str, board: str, settings: dict[str, Any], include_host: bool
    ) -> bool:
        """The run built in a hidden temp folder, then renamed into place (never a half-made run). False when
        another maker (the studio and a terminal in the same second) drew the same id: its folders are left alone."""
        tmp = self.runs_dir / f".creating-{run_id}"
        try:
            tmp.mkdir()
        except FileExistsError:
            return False
        try:
            (tmp / "logs").mkdir()
            (tmp / "artifacts").mkdir()
            RunManifest.new(
                tmp,
                run_id,
                {"model": model, "board": board, "settings": settings},
                collect_environment(include_host),
                package_versions(),
            ).save()
            tmp.rename(self.runs_dir / run_id)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)  # ours: nothing half-made is left behind
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        return True

    def open_run(self, run_id: str) -> RunManifest:
        d = self.run_dir(run_id)
        if not d.is_dir():
            raise RunNotFound(f"No run '{run_id}' in {self.runs_dir}. `hexstudio runs list` shows the runs.")
        return load_run(d)

    def list_runs(self) -> list[RunSummary]:
        out: list[RunSummary] = []
        if not self.runs_dir.is_dir():
            return out
        for d in sorted(self.runs_dir.iterdir(), reverse=True):
            if d.name.startswith(".") or not (d / "run.json").is_file():
                continue
            out.append(_summary(d))
        return out

    def delete_run(self, run_id: str, *, background: bool = False) -> None:
        """The run gone: renamed away under its lock at once (no runner can take it, no list shows it), then its
        files removed, tens of GB for an 8B run: `background` in a thread of their own (the studio's window is not
        held meanwhile; the process waits for it before it exits). A delete a crash cut short is finished too."""
        d = self.run_dir(run_id)
        if not (d / "run.json").is_file():
            raise RunNotFound(f"No run '{run_id}' in {self.runs_dir}.")
        # RunBusy while a runner holds the lock: never delete a live stage's folder. Held until the folder is
        # renamed away, so no runner can take the run between the check and the delete.
        with RunLock(d):
            # renamed first so a half-deleted run never looks like a run
            trash = self.runs_dir / f".deleting-{run_id}-{_secrets.token_hex(2)}"
            d.rename(trash)

        def remove() -> None:
            for t in self.runs_dir.glob(".deleting-*"):  # this one, and any an earlier crash left
                shutil.rmtree(t, ignore_errors=True)

        if background:
            threading.Thread(target=remove, name=f"delete-{run_id}").start()
        else:
            remove()


def _summary(d: Path) -> RunSummary:
    """A run's line in the list. A damaged run.json (not JSON, not UTF-8, fields of other types) is listed with
    what can be read, never dropped or allowed to break the list: opening it says what is wrong."""
    try:
        data = json.loads((d / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    doc: dict[str, Any] = data if isinstance(data, dict) else {}

    def obj(key: str) -> dict[str, Any]:
        v = doc.get(key)
        return v if isinstance(v, dict) else {}

    def text(v: Any, default: str) -> str:
        return v if isinstance(v, str) else default

    return RunSummary(
        run_id=d.name,
        path=d,
        model=text(obj("inputs").get("model"), "?"),
        board=text(obj("inputs").get("board"), "?"),
        created=text(doc.get("created"), ""),
        updated=text(doc.get("updated"), ""),
        states={
            str(k): text(v.get("state"), "?") if isinstance(v, dict) else "?"
            for k, v in obj("stages").items()
        },
    )


def stage_log_path(manifest: RunManifest, stage: str) -> Path:
    return manifest.run_dir / "logs" / f"{stage}.jsonl"


def artifacts_dir(manifest: RunManifest, stage: str) -> Path:
    return manifest.run_dir / "artifacts" / stage


__all__ = [
    "ManifestError",
    "RunBusy",
    "RunLock",
    "RunNotFound",
    "RunSummary",
    "Workspace",
    "artifacts_dir",
    "edit_run",
    "stage_log_path",
]
