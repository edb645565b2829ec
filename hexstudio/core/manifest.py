"""run.json: the manifest of one run (inputs, per-stage state, artifacts, metrics, environment).

Every write is atomic (hexstudio.core.atomic). The schema lives in
hexstudio/core/schemas/run.schema.json and is published in docs/.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import write_json_atomic
from hexstudio.core.stages import STAGE_NAMES
from hexstudio.shared.errors import ActionableError

MANIFEST_SCHEMA_VERSION = 1
SCHEMA_PATH = resources.files("hexstudio.core").joinpath("schemas", "run.schema.json")  # package data


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


class ManifestError(ActionableError):
    """run.json is missing, unreadable or does not match its schema."""


def empty_stage() -> dict[str, Any]:
    return {"state": "pending", "attempts": 0, "metrics": {}, "artifacts": [], "warnings": []}


@dataclass
class StageRecord:
    """A live view of one stage's entry in run.json."""

    name: str
    data: dict[str, Any]

    @property
    def state(self) -> str:
        return str(self.data.get("state", "pending"))

    @property
    def metrics(self) -> dict[str, Any]:
        m: dict[str, Any] = self.data.setdefault("metrics", {})
        return m

    def metric_value(self, name: str, default: Any = None) -> Any:
        m = self.metrics.get(name)
        if isinstance(m, dict):
            return m.get("value", default)
        return default

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        a: list[dict[str, Any]] = self.data.setdefault("artifacts", [])
        return a

    @property
    def outcome(self) -> dict[str, Any] | None:
        o = self.data.get("outcome")
        return o if isinstance(o, dict) else None


class RunManifest:
    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    # -- construction -------------------------------------------------------
    @classmethod
    def new(
        cls,
        run_dir: Path,
        run_id: str,
        inputs: dict[str, Any],
        environment: dict[str, Any],
        versions: dict[str, Any],
    ) -> RunManifest:
        data: dict[str, Any] = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "run_id": run_id,
            "created": now_iso(),
            "updated": now_iso(),
            "inputs": inputs,
            "environment": environment,
            "versions": versions,
            "stages": {name: empty_stage() for name in STAGE_NAMES},
            "events": [],
        }
        return cls(run_dir / "run.json", data)

    @classmethod
    def load(cls, run_dir: Path) -> RunManifest:
        path = run_dir / "run.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ManifestError(f"{path} does not exist: this folder is not a HexStudio run.") from None
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
            raise ManifestError(
                f"{path} cannot be read ({exc}). run.json is written atomically, so this "
                "file was changed by something else; restore it from a backup or delete "
                f"the run (`hexstudio runs delete {run_dir.name}`)."
            ) from None
        damaged = (
            f"{path} is damaged: "
            + "{}. run.json is written atomically, so something else changed it; restore it "
            f"from a backup or delete the run (`hexstudio runs delete {run_dir.name}`)."
        )
        if not isinstance(data, dict):
            raise ManifestError(damaged.format(f"it holds a JSON {type(data).__name__}, not an object"))
        version = data.get("schema_version")
        if version != MANIFEST_SCHEMA_VERSION:
            if isinstance(version, int) and version > MANIFEST_SCHEMA_VERSION:
                raise ManifestError(
                    f"{path} was written by a newer HexStudio (run format {version}; this one reads "
                    f"{MANIFEST_SCHEMA_VERSION}).",
                    "Upgrade HexStudio (`hexstudio --version` shows this one), or open the run with the HexStudio "
                    "that made it (the studio on Windows and the CLI in WSL may be different installs).",
                )
            raise ManifestError(
                damaged.format(
                    f"its schema_version is {version!r:.40}"
                    if "schema_version" in data
                    else "it has no schema_version"
                )
            )
        for key in ("inputs", "stages"):
            if not isinstance(data.get(key), dict):
                raise ManifestError(damaged.format(f'"{key}" is {data.get(key)!r:.40}, not an object'))
        if not isinstance(data["inputs"].get("settings", {}), dict):
            raise ManifestError(damaged.format('"inputs.settings" is not an object'))
        # what every face reads and formats (runs list/show, reports, the stage list): the run's id, model and
        # board as text, a stage's figures as numbers; the rest is read where it is used
        for key, value in (
            ("run_id", data.get("run_id")),
            ("inputs.model", data["inputs"].get("model")),
            ("inputs.board", data["inputs"].get("board")),
        ):
            if not isinstance(value, str) or not value:
                raise ManifestError(damaged.format(f'"{key}" is {value!r:.40}, not a name'))
        for name, stage in data["stages"].items():
            if not isinstance(stage, dict):
                raise ManifestError(damaged.format(f'the stage "{name}" is {stage!r:.40}, not an object'))
            for key in ("duration_s", "peak_rss_bytes", "peak_vram_bytes"):
                v = stage.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise ManifestError(
                        damaged.format(f'the stage "{name}" has {key} {v!r:.40}, not a number')
                    )
        for name in STAGE_NAMES:
            data["stages"].setdefault(name, empty_stage())
        return cls(path, data)

    # -- access -------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.path.parent

    @property
    def run_id(self) -> str:
        return str(self.data["run_id"])

    @property
    def inputs(self) -> dict[str, Any]:
        i: dict[str, Any] = self.data["inputs"]
        return i

    @property
    def settings(self) -> dict[str, Any]:
        s: dict[str, Any] = self.data["inputs"].setdefault("settings", {})
        return s

    def stage(self, name: str) -> StageRecord:
        return StageRecord(name, self.data["stages"].setdefault(name, empty_stage()))

    def add_event(self, kind: str, message: str, **extra: Any) -> None:
        """A short run-level history line (resume, override, delete of artifacts...)."""
        self.data.setdefault("events", []).append({"t": now_iso(), "kind": kind, "message": message, **extra})

    # -- persistence --------------------------------------------------------
    def reload(self) -> None:
        """Read run.json again: another process (the CLI, a runner) may have written it since."""
        self.data = RunManifest.load(self.run_dir).data

    def save(self) -> None:
        self.data["updated"] = now_iso()
        write_json_atomic(self.path, self.data)

    def mark_running(self, name: str) -> None:
        st = self.stage(name).data
        st.update(
            {
                "state": "running",
                "started": now_iso(),
                "ended": None,
                "outcome": None,
                "owner": {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id()},
            }
        )
        st["attempts"] = int(st.get("attempts", 0)) + 1
        self.save()

    def detect_interrupted(
        self, save: bool = True, lock_held: bool = False, others_alive: bool = False
    ) -> list[str]:
        """Stages left 'running' by a process that no longer exists become 'interrupted' (saved unless `save` is
        False: only the run's lock holder may write run.json, Workspace.open_run). With `lock_held` (the caller
        holds the run's lock, so no pipeline runs it), every stage left "running" is: its owner's pid, this
        process's own (a stage whose end could not be written, a full disk) or one reused since, proves nothing.
        With `others_alive` (a live process holds the lock), an owner on another host or boot, whose pid cannot be
        judged from here (a container, a shared workspace), is taken as running."""
        found = []
        for name in STAGE_NAMES:
            st = self.stage(name).data
            if st.get("state") != "running":
                continue
            owner = st.get("owner") or {}
            pid = owner.get("pid")
            # the caller holding the run's lock proves that no one runs it (a runner holds it throughout, and the
            # kernel drops it when the runner dies): a live pid is then another process that reused it
            here = owner.get("boot_id") == boot_id() and owner.get("host") == socket.gethostname()
            alive = (others_alive and not here) or (
                not lock_held and here and isinstance(pid, int) and _pid_alive(pid)
            )
            if not alive:
                st["state"] = "interrupted"
                st["ended"] = st.get("ended") or None
                st["outcome"] = {
                    "kind": "interrupted",
                    "message": "The studio stopped while this stage was running (crash, kill or reboot).",
                    "hint": "Resume the run: the stage restarts from a clean state.",
                }
                found.append(name)
        if found:
            self.add_event("interrupted", f"found interrupted stage(s): {', '.join(found)}")
            if save:
                self.save()
        return found


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def validate_manifest(data: dict[str, Any]) -> None:
    """Raise ManifestError if `data` does not match run.schema.json."""
    import jsonschema

    try:
        jsonschema.validate(data, load_schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ManifestError(f"run.json does not match its schema at '{where}': {exc.message}") from None
