"""Studio settings: a versioned JSON file with migrations. No secrets here (see app.core.secrets).

File: <config_dir>/settings.json, {"settings_version": N, ...}. Loading an older
version runs each migration in order and saves the result atomically (the old
file is kept as settings.json.v<N>.bak).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.atomic import write_json_atomic
from app.core.paths import config_dir

SETTINGS_VERSION = 2

# Per-run defaults. Model-specific defaults (context length, parts) are filled by the
# model stage from the model's size; these are the built-in model's.
DEFAULT_RUN_SETTINGS: dict[str, Any] = {
    "context_length": "auto",     # built-in model 512, others 4096 (the model stage resolves it)
    "ar_n": 128,
    "parts": "auto",
    "calibration_samples": 8,
    "calibration_seq_len": 128,
    "calibration_text": "builtin",
    "calibration_unit": "layer",  # one QuantSim per decoder layer ("part": one per part, more memory)
    "validation_text": "builtin",
    "weight_bits": 4,
    "activation_bits": 16,
    "kv_bits": 8,
    "device": "Dragonwing IQ-9075 EVK",
    "qairt_version": "2.42",
    "compile_target": "auto",
    "aihub_consent": False,
    "benchmark_prompt": "What is the capital of France?",
    "sampler": {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0},
    "thresholds": {},
    "override_gates": [],
}

# What a run setting may hold, beyond the type of its default (checked by check_run_settings). A separate
# typed settings registry will replace this small table; until then it keeps wrong values out of runs.
_AUTO = ("context_length", "parts")                       # "auto" or a positive int
_INT_RANGES: dict[str, tuple[int, int]] = {
    "context_length": (64, 131072), "ar_n": (1, 4096), "parts": (1, 64), "calibration_samples": (1, 100000),
    "calibration_seq_len": (2, 131072)}
_CHOICES: dict[str, tuple[Any, ...]] = {
    "weight_bits": (2, 4, 8), "activation_bits": (8, 16), "kv_bits": (8, 16),
    "calibration_unit": ("layer", "part"), "compile_target": ("auto", "sim", "aihub")}
_SAMPLER: dict[str, tuple[type, float, float]] = {
    "seed": (int, 0, 2**32 - 1), "temp": (float, 0.0, 100.0), "top_k": (int, 1, 1 << 20), "top_p": (float, 0.0, 1.0)}


def _type_name(v: Any) -> str:
    return {bool: "true/false", int: "a whole number", float: "a number", str: "text", dict: "a JSON object",
            list: "a JSON list"}.get(type(v), type(v).__name__)


def check_run_setting(key: str, value: Any) -> str | None:
    """Why `value` is not acceptable for the run setting `key` (a sentence naming the setting, what was
    given and what is expected); None when it is, or when `key` is not one of DEFAULT_RUN_SETTINGS."""
    if key not in DEFAULT_RUN_SETTINGS:
        return None
    default = DEFAULT_RUN_SETTINGS[key]
    given = json.dumps(value) if not isinstance(value, str) else repr(value)
    if key in _AUTO and value == "auto":
        return None
    if key in _INT_RANGES or (isinstance(default, int) and not isinstance(default, bool)):
        if isinstance(value, bool) or not isinstance(value, int):
            auto = ' or "auto"' if key in _AUTO else ""
            return f"{key} must be a whole number{auto}, not {given} ({_type_name(value)})."
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            return f"{key} must be true or false, not {given}."
    elif isinstance(default, str) and not isinstance(value, str):
        return f"{key} must be text, not {given} ({_type_name(value)})."
    elif isinstance(default, dict) and not isinstance(value, dict):
        return f"{key} must be a JSON object, not {given}."
    elif isinstance(default, list) and not isinstance(value, list):
        return f"{key} must be a JSON list, not {given}."
    if key in _INT_RANGES:
        lo, hi = _INT_RANGES[key]
        if not lo <= value <= hi:
            return f"{key} {value} is out of range ({lo} to {hi})."
    if key in _CHOICES and value not in _CHOICES[key]:
        return f"{key} {given} is not one of {', '.join(json.dumps(c) for c in _CHOICES[key])}."
    if key == "sampler":
        for k, v in value.items():
            if k not in _SAMPLER:
                return f"sampler.{k} is not a sampler setting (known: {', '.join(_SAMPLER)})."
            typ, lo_f, hi_f = _SAMPLER[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (typ is int and not isinstance(v, int)):
                return f"sampler.{k} must be {'a whole number' if typ is int else 'a number'}, not {json.dumps(v)}."
            if not lo_f <= v <= hi_f:
                return f"sampler.{k} {v} is out of range ({lo_f:g} to {hi_f:g})."
    if key == "override_gates" and not all(isinstance(x, str) for x in value):
        return "override_gates must be a list of stage names."
    if key in ("benchmark_prompt",) and not value.strip():
        return f"{key} is empty."
    return None


def check_run_settings(values: dict[str, Any]) -> None:
    """Raise SettingsError (every problem, one a line) when a run setting has the wrong type or is out
    of range."""
    problems = [p for k, v in values.items() if (p := check_run_setting(k, v)) is not None]
    if problems:
        raise SettingsError("Run setting(s) refused: " + " ".join(problems))


DEFAULT_SETTINGS: dict[str, Any] = {
    "settings_version": SETTINGS_VERSION,
    "workspace": None,            # None: app.core.paths.default_workspace()
    "boards": {},                 # name -> {host, port, user, auth, key_path, ssh_alias, qairt_home}
    "default_board": "sim",
    "worker_hosts": {},           # name -> {host, port, user, auth, key_path, python, root} (app.core.remote)
    "aihub": {"api_url": "https://app.aihub.qualcomm.com", "web_url": "https://app.aihub.qualcomm.com"},
    "run_defaults": {},           # overrides of DEFAULT_RUN_SETTINGS
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


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _v0_to_v1, 1: _v1_to_v2}


class SettingsError(Exception):
    pass


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    d = copy.deepcopy(data)
    version = int(d.get("settings_version", 0))
    if version > SETTINGS_VERSION:
        raise SettingsError(f"settings were written by a newer HexStudio (version {version}, this one reads "
                            f"up to {SETTINGS_VERSION}). Upgrade HexStudio or move the file away.")
    while version < SETTINGS_VERSION:
        d = MIGRATIONS[version](d)
        version = int(d["settings_version"])
    merged = copy.deepcopy(DEFAULT_SETTINGS)
    merged.update(d)
    return merged


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
        except (OSError, json.JSONDecodeError) as exc:
            raise SettingsError(f"{s.path} cannot be read ({exc}). Fix or delete it; HexStudio will "
                                "recreate it with defaults.") from None
        old = int(raw.get("settings_version", 0))
        s.data = migrate(raw)
        if old != SETTINGS_VERSION:
            shutil.copy2(s.path, s.path.with_name(f"{s.path.name}.v{old}.bak"))
            s.save()
        return s

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def run_defaults(self) -> dict[str, Any]:
        out = copy.deepcopy(DEFAULT_RUN_SETTINGS)
        out.update(self.data.get("run_defaults") or {})
        return out

    @property
    def boards(self) -> dict[str, dict[str, Any]]:
        b: dict[str, dict[str, Any]] = self.data.setdefault("boards", {})
        return b
