"""Preflight services: will this machine manage this model (the probe and checks of
hexstudio.shared.preflight_checks against the model's estimated needs, with the settings a new run would get),
and what raising WSL's memory limits in .wslconfig would change (`hexstudio preflight`, the Preflight page's
Fix dialog)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hexstudio.core.hf import cached_blob_bytes, hub_cache, weights_cached
from hexstudio.core.services import ServiceError
from hexstudio.core.services.model import model_config
from hexstudio.core.settings import DEFAULT_RUN_SETTINGS, Settings, SettingsError
from hexstudio.shared import modelinfo, wslconfig
from hexstudio.shared.preflight_checks import MEMORY_MARGIN, meminfo, probe, run_checks
from hexstudio.shared.run_settings import ResolvedSettings, genie_cl_problem, resolve_settings


def run_settings(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings a new run would get (DEFAULT_RUN_SETTINGS + the user's run_defaults), with the
    command line's values on top: preflight estimates with exactly what a run would use."""
    try:
        s = Settings.load().run_defaults()
    except (SettingsError, OSError, ValueError):
        s = dict(DEFAULT_RUN_SETTINGS)
    s.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return s


def resolve_estimate_settings(info: dict[str, Any], model: str, settings: dict[str, Any]) -> ResolvedSettings:
    """context_length/parts "auto" resolved as the Model stage resolves them (run_settings.resolve_settings)."""
    resolved, _plan = resolve_settings(info, settings, builtin=model.startswith("builtin:"))
    return resolved


def context_variants(settings: dict[str, Any]) -> int:
    """How many context lengths the bundle will hold (context_length and the smaller `context_lengths`); a bad
    value counts as none here (the setting check and the Quantize stage say what is wrong with it)."""
    from hexstudio.shared.run_settings import extra_context_lengths

    try:
        return 1 + len(extra_context_lengths(settings.get("context_lengths", "")))
    except ValueError:
        return 1


def ar_variants(settings: dict[str, Any]) -> int:
    """How many more prompt-processor lengths (`ar_sizes`) each context length holds; a bad value counts as none
    here (the setting check and the Model stage say what is wrong with it)."""
    from hexstudio.shared.run_settings import extra_ar_sizes

    try:
        return len(extra_ar_sizes(settings.get("ar_sizes", "")))
    except ValueError:
        return 0


def model_needs(model: str, settings: dict[str, Any]) -> tuple[dict[str, Any], ResolvedSettings]:
    info = modelinfo.inspect_config(model_config(model, settings.get("revision") or None))
    if info.get("error"):  # a number out of any real model's range (hexstudio.shared.config_bounds)
        raise ServiceError(info["error"]["message"], info["error"].get("hint"))
    if not info["supported"]:
        raise ServiceError(
            info["reason"], "Pick a dense Llama-family model (Llama 3.x, Nemotron-Nano-8B, Qwen2/3)."
        )
    r = resolve_estimate_settings(info, model, settings)
    err = modelinfo.check_context(info, r["context_length"], r["ar_n"]) or genie_cl_problem(
        r["context_length"], r["ar_n"]
    )
    if err:
        raise ServiceError(err)
    needs = modelinfo.estimate(
        info,
        r["context_length"],
        r["ar_n"],
        r["parts"],
        r["calibration_samples"],
        r["calibration_seq_len"],
        context_variants=context_variants(settings),
        ar_variants=ar_variants(settings),
        calibration_unit=str(settings.get("calibration_unit") or "layer"),
    )
    return needs, r


def preflight_report(
    model: str, workspace: Path, *, smoke: bool = True, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The checks for `model` with a new run's settings and `settings` (the caller's values, None for unset) on
    top."""
    t0 = time.time()
    s = run_settings(settings)
    needs, resolved = model_needs(model, s)
    # nothing to download for the built-in model, a local folder, or weights already in the cache (at the run's
    # revision); a download that stopped part-way has its bytes there already, and resumes from them
    revision = s.get("revision") or None
    needs["hf_downloaded"] = (
        model.startswith("builtin:") or Path(model).expanduser().is_dir() or weights_cached(model, revision)
    )
    if not needs["hf_downloaded"]:
        needs["hf_cached_bytes"] = cached_blob_bytes(model)
    p = probe(workspace, hub_cache(), smoke=smoke)
    checks = run_checks(p, needs)
    return {
        "model": model,
        "context_length": resolved["context_length"],
        "settings": resolved,
        "needs": needs,
        "probe": p,
        "checks": checks,
        "checks_failed": sum(c["status"] == "fail" for c in checks),
        "checks_warned": sum(c["status"] == "warn" for c in checks),
        "seconds": round(time.time() - t0, 2),
    }


def wslconfig_plan(
    model: str,
    path: Path | None,
    *,
    settings: dict[str, Any] | None = None,
    memory_gb: int | None = None,
    swap_gb: int | None = None,
) -> tuple[wslconfig.Plan, dict[str, Any]]:
    """What `--write-wslconfig` would write, plus what it is based on (live memory, this model's need with a new
    run's settings and `settings` on top, as preflight_report)."""
    path = path or wslconfig.locate()
    if path is None:
        raise ServiceError(
            "Cannot find the Windows user's .wslconfig: this does not look like WSL "
            "(no wslvar/cmd.exe/wslpath).",
            "Give its path: --wslconfig /mnt/c/Users/<you>/.wslconfig",
        )
    mem = meminfo()
    basis: dict[str, Any] = {
        "mem_total_bytes": mem.get("MemTotal", 0),
        "swap_total_bytes": mem.get("SwapTotal", 0),
    }
    enough = False
    if memory_gb is None and swap_gb is None:
        needs, _ = model_needs(model, run_settings(settings))
        need = int(needs["quantize_peak_rss_bytes"])
        basis["quantize_peak_rss_bytes"] = need
        # the same margin as the memory check: when it passes there is nothing to raise
        enough = basis["mem_total_bytes"] + basis["swap_total_bytes"] >= need * MEMORY_MARGIN
        if not enough:
            memory_gb, swap_gb = wslconfig.target_limits(need)
    for name, v in (("--memory-gb", memory_gb), ("--swap-gb", swap_gb)):
        if v is not None and v <= 0:
            raise ServiceError(f"{name} must be a positive number of GB, not {v}.")
    try:
        pl = wslconfig.plan(path, memory_gb, swap_gb)
        if enough:
            pl.notes.append("WSL already has enough RAM + swap for this model (the memory check passes).")
        return pl, basis
    except OSError as exc:
        raise ServiceError(
            f"Cannot read {path}: {exc.strerror or exc}.", "Check the path and its permissions."
        ) from None
