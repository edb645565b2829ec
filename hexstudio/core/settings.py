"""Studio settings: a versioned JSON file with migrations. No secrets here (see hexstudio.core.secrets).

File: <config_dir>/settings.json, {"settings_version": N, ...}. Loading an older
version runs each migration in order and saves the result atomically (the old
file is kept as settings.json.v<N>.bak).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import write_json_atomic
from hexstudio.core.paths import config_dir
from hexstudio.shared import run_settings
from hexstudio.shared.bundle import KNOWN_DEVICES
from hexstudio.shared.bundle.speculative import settings_problem as speculative_settings_problem
from hexstudio.shared.errors import ActionableError

SETTINGS_VERSION = 3

# Per-run defaults, from the one registry of run settings (hexstudio/shared/run_settings.py: type, default,
# range or choices, unit, label, help, the stages that read each). Model-specific values (context length,
# parts) stay "auto" here and are resolved by the Model stage (run_settings.resolve_settings).
DEFAULT_RUN_SETTINGS: dict[str, Any] = run_settings.default_run_settings()


def check_run_setting(key: str, value: Any) -> str | None:
    """Why `value` is not acceptable for the run setting `key` (a sentence naming the setting, what was
    given and what is expected); None when it is, or when `key` is not a run setting."""
    return run_settings.check(key, value)


def check_run_settings(values: dict[str, Any]) -> None:
    """Raise SettingsError (every problem, one a line) when a run setting has the wrong type or is out
    of range, or context_length and ar_n cannot go together."""
    problems = run_settings.check_all(values)
    if not problems and (together := run_settings.shape_problem(values)):
        problems = [together]
    if not problems and (spec := speculative_settings_problem(run_settings.run_settings_of(values))):
        problems = [spec]  # the Compile stage would refuse it, after hours of quantizing
    if problems:
        raise SettingsError("Run setting(s) refused: " + " ".join(problems))


def form_fields(page: str) -> tuple[run_settings.FormField, ...]:
    """The run-setting fields the studio's stage page `page` shows (Qt-free; from the registry). A "device"
    field gets the devices HexStudio knows offline as its choices (AI Hub's live list replaces them)."""
    return tuple(
        dataclasses.replace(f, choices=tuple(KNOWN_DEVICES)) if f.widget == "device" else f
        for f in run_settings.form_fields(page)
    )


def settings_fields(page: str) -> tuple[tuple[str, str, Any], ...]:
    """form_fields as the stage pages' (key, label, kind) rows: kind "int" | "bool" | "text" | a list of
    choices (hexstudio.ui.pages.base.SettingSpec)."""
    kinds = {"spin": "int", "check": "bool", "line": "text"}
    return tuple(
        (f.key, f.label, list(f.choices or ()) if f.widget in ("choice", "device") else kinds[f.widget])
        for f in form_fields(page)
    )


DEFAULT_SETTINGS: dict[str, Any] = {
    "settings_version": SETTINGS_VERSION,
    "workspace": None,  # a folder, or None: ~/hexstudio-workspace (hexstudio.core.paths.default_workspace)
    "boards": {},  # name -> {host, port, user, auth, key_path, ssh_alias, qairt_home}
    "default_board": "sim",
    "worker_hosts": {},  # name -> {host, port, user, auth, key_path, python, root} (hexstudio.core.remote)
    "run_defaults": {},  # overrides of DEFAULT_RUN_SETTINGS
    "include_host_in_reports": False,
}


def _v0_to_v1(d: dict[str, Any]) -> dict[str, Any]:
    # v0 (unversioned) kept boards as a list of {"name": ...}.
    boards = d.get("boards", {})
    if isinstance(boards, list):
        d["boards"] = {b["name"]: {k: v for k, v in b.items() if k != "name"} for b in boards if "name" in b}
    d["settings_version"] = 1
    return d


def _v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
    # v1 stored the AI Hub URL as a flat key.
    url = d.pop("aihub_url", None)
    if url:
        d.setdefault("aihub", {})["api_url"] = url
        d["aihub"].setdefault("web_url", url)
    d["settings_version"] = 2
    return d


# Qualcomm's own AI Hub addresses: the run settings' default (unset) already means them
PUBLIC_AIHUB = ("https://app.aihub.qualcomm.com", "https://workbench.aihub.qualcomm.com")


def _v2_to_v3(d: dict[str, Any]) -> dict[str, Any]:
    # v2 kept AI Hub's addresses in an "aihub" section nothing read: the Compile stage reads the run settings
    # aihub_api_url / aihub_web_url, so a private hub's address set there was lost. It becomes a run default.
    hub = d.pop("aihub", None)
    defaults = d.get("run_defaults") or {}
    if os.environ.get("HEXSTUDIO_AIHUB_API_URL"):
        # the address in use comes from the environment: a run default would outrank it from now on
        hub = None
    for key, setting in (("api_url", "aihub_api_url"), ("web_url", "aihub_web_url")):
        url = hub.get(key) if isinstance(hub, dict) else None
        if isinstance(url, str) and url.strip() and url.rstrip("/") not in PUBLIC_AIHUB:
            defaults.setdefault(setting, url.strip())
    d["run_defaults"] = defaults
    d["settings_version"] = 3
    return d


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _v0_to_v1, 1: _v1_to_v2, 2: _v2_to_v3}


class SettingsError(ActionableError):
    pass


# sections of settings.json that are objects of named entries, or objects
_OBJECT_SECTIONS = ("boards", "worker_hosts", "aihub", "run_defaults")


def check_settings_shape(raw: Any, path: Path) -> None:
    """settings.json as HexStudio wrote it: an object whose sections have their types (issue 27: `[]`,
    `{"boards": "x"}` or a board entry `5` ended in a traceback). Raises SettingsError naming what is wrong."""
    fix = f"Fix {path} or move it away; HexStudio then starts from defaults (boards must be added again)."
    if not isinstance(raw, dict):
        raise SettingsError(f"{path} holds a JSON {type(raw).__name__}, not an object of settings.", fix)
    v = raw.get("settings_version", 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SettingsError(f"{path}: settings_version is {v!r}, not a whole number from 0.", fix)
    for key in _OBJECT_SECTIONS:
        # a section must be an object (v0 kept boards as a list)
        if (
            key in raw
            and raw[key] is not None
            and not isinstance(raw[key], dict)
            and not (key == "boards" and isinstance(raw[key], list) and v == 0)
        ):
            raise SettingsError(
                f'{path}: "{key}" is {type(raw[key]).__name__} {raw[key]!r:.40}, not an object.', fix
            )
    workspace = raw.get("workspace")
    if workspace is not None and not (isinstance(workspace, str) and workspace.strip()):
        raise SettingsError(
            f'{path}: "workspace" is {workspace!r:.40}, not a folder\'s path (or null for the default).', fix
        )
    for key in ("boards", "worker_hosts"):
        for name, entry in (raw.get(key) or {}).items() if isinstance(raw.get(key), dict) else ():
            what = f"{path}: the {key[:-1].replace('_', ' ')} {name!r}"
            if not isinstance(entry, dict):
                raise SettingsError(
                    f"{what} is {entry!r:.40}, not an object {{host, port, user, auth, ...}}.", fix
                )
            port = entry.get("port")
            # a hand-edited "port": "abc" (or 0, 99999) failed later as a ValueError in the middle of a probe
            if port is not None and not (
                not isinstance(port, bool) and isinstance(port, int) and 1 <= port <= 65535
            ):
                raise SettingsError(
                    f"{what} has port {port!r:.40}, not a whole number from 1 to 65535.",
                    f"Fix the port in {path} (22 is SSH's own), or remove the entry and add it again.",
                )


BOARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_machine_name(name: object, what: str = "board", example: str = "evk-lab2") -> str:
    """The name of a machine HexStudio reaches (`what`: a board, a worker host) as it goes into settings, keyring
    entries and file names: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""
    if not isinstance(name, str) or not BOARD_NAME.match(name):
        raise SettingsError(
            f"The {what} name {name!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit (e.g. {example}).",
            f"Pick another name for the {what}.",
        )
    return name


def check_board_name(name: object) -> str:
    """A board's name (check_machine_name), and not "sim" (the simulator board)."""
    name = check_machine_name(name)
    if name == "sim":
        raise SettingsError(
            "The board name 'sim' is the simulator board's.", "Pick another name for the board."
        )
    return name


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    d = copy.deepcopy(data)
    version = int(d.get("settings_version", 0))
    if version > SETTINGS_VERSION:
        raise SettingsError(
            f"settings were written by a newer HexStudio (version {version}, this one reads "
            f"up to {SETTINGS_VERSION}). Upgrade HexStudio or move the file away."
        )
    while version < SETTINGS_VERSION:
        d = MIGRATIONS[version](d)
        version = int(d["settings_version"])
    merged = copy.deepcopy(DEFAULT_SETTINGS)
    merged.update(d)
    return merged


@contextlib.contextmanager
def _edit_lock(path: Path) -> Iterator[None]:
    """settings.json's read-change-write, one at a time across processes: an exclusive flock on
    settings.json.lock (released by the kernel if the holder dies). Where flock is missing, no lock."""
    try:
        import fcntl
    except ImportError:  # not Linux or WSL: as before, without a lock
        yield
        return
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # an edit takes milliseconds
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Settings:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or (config_dir() / "settings.json")
        self.data: dict[str, Any] = copy.deepcopy(DEFAULT_SETTINGS)

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        s = cls(path)
        if not s.path.exists():
            return s
        try:
            raw = json.loads(s.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
            raise SettingsError(
                f"{s.path} cannot be read ({exc}). Fix or delete it; HexStudio will "
                "recreate it with defaults."
            ) from None
        check_settings_shape(raw, s.path)
        # a section written as null holds nothing: as if it were absent (a None section crashed its readers)
        for key in _OBJECT_SECTIONS:
            if key in raw and raw[key] is None:
                del raw[key]
        old = int(raw.get("settings_version", 0))
        s.data = migrate(raw)
        if old != SETTINGS_VERSION:
            shutil.copy2(s.path, s.path.with_name(f"{s.path.name}.v{old}.bak"))
            s.save()
        return s

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    @classmethod
    def edit(cls, change: Callable[[Settings], object], path: Path | None = None) -> Settings:
        """Change settings.json as it is on disk now (read, change, write), keeping whatever another process
        (the studio, a terminal) wrote since this one last read it; the settings as written. One edit at a time
        across processes (a lock file beside it): two edits at once no longer lose one. Raises SettingsError
        when the file cannot be read."""
        with _edit_lock(path or cls().path):
            fresh = cls.load(path)
            change(fresh)
            fresh.save()
        return fresh

    def run_defaults(self) -> dict[str, Any]:
        out = copy.deepcopy(DEFAULT_RUN_SETTINGS)
        out.update(self.data.get("run_defaults") or {})
        return out

    @property
    def boards(self) -> dict[str, dict[str, Any]]:
        b: dict[str, dict[str, Any]] = self.data.setdefault("boards", {})
        return b
