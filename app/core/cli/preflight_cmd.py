"""`hexstudio preflight`: will this machine manage this model? (memory, disk, WSL, GPU, packages)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from app.core.cli.common import CliError, add_json_flag, add_workspace_flag, print_json, workspace_from
from app.core.paths import BUILTIN_MODEL_DIR, BUILTIN_MODEL_ID
from workers import wslconfig
from workers.errors import error_fields
from workers.shared import modelinfo
from workers.shared.run_settings import ResolvedSettings, resolve_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("preflight", help="check memory, disk, WSL, GPU and packages against a model's needs")
    p.add_argument("--model", default=BUILTIN_MODEL_ID, help="built-in model, Hugging Face id or folder")
    p.add_argument("--context-length", type=int, default=None,
                   help="context length (default: the run default; auto = 512 built-in, 4096 others)")
    p.add_argument("--ar-n", type=int, default=None, help="prompt processor length (default: the run default)")
    p.add_argument("--parts", type=int, default=None, help="parts (default: the run default; auto by model size)")
    p.add_argument("--calibration-samples", type=int, default=None, help="default: the run default")
    p.add_argument("--calibration-seq-len", type=int, default=None, help="default: the run default")
    p.add_argument("--no-smoke-test", action="store_true", help="skip the AIMET smoke test")
    w = p.add_argument_group("WSL memory limits (%UserProfile%\\.wslconfig)")
    w.add_argument("--write-wslconfig", action="store_true",
                   help="raise [wsl2] memory=/swap= for this model: shows the diff, asks, backs up, writes")
    w.add_argument("--yes", action="store_true", help="write without asking (after printing the diff)")
    w.add_argument("--wslconfig", type=Path, default=None, metavar="PATH",
                   help="the .wslconfig to edit (default: found with wslvar/cmd.exe + wslpath)")
    w.add_argument("--memory-gb", type=int, default=None, help="memory= to set instead of this model's need")
    w.add_argument("--swap-gb", type=int, default=None, help="swap= to set instead of this model's need")
    add_workspace_flag(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_preflight)


def model_config(model: str, revision: str | None = None) -> dict[str, Any]:
    """config.json only: a user can check a model before downloading its weights (a Hugging Face id at
    `revision`, with HexStudio's one Hugging Face token: app.core.hf)."""
    if model == BUILTIN_MODEL_ID:
        return modelinfo.read_config(BUILTIN_MODEL_DIR)
    if Path(model).expanduser().is_dir():
        try:
            return modelinfo.read_config(Path(model).expanduser())
        except modelinfo.ModelInfoError as exc:
            raise CliError(str(exc)) from None
    local = Path(model).expanduser()
    if model.startswith(("/", "./", "../", "~")) or local.exists() or model.count("/") > 1 or "\\" in model:
        # a path, not a Hugging Face id (those are `name` or `owner/name`): say so, not a hub error
        what = "is a file, not a model folder" if local.exists() else "does not exist"
        raise CliError(f"The model folder {local} {what}.",
                       "Give a folder holding config.json, the tokenizer files and *.safetensors, or a Hugging "
                       f"Face id such as meta-llama/Llama-3.2-1B-Instruct (or {BUILTIN_MODEL_ID}).")
    from app.core.hf import HubConfigError, fetch_config

    try:
        return fetch_config(model, revision)
    except HubConfigError as exc:
        raise CliError(exc.message, exc.hint) from None


ESTIMATE_SETTINGS = ("context_length", "ar_n", "parts", "calibration_samples", "calibration_seq_len")


def run_settings(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings a new run would get (DEFAULT_RUN_SETTINGS + the user's run_defaults), with the
    command line's values on top: preflight estimates with exactly what a run would use."""
    from app.core.settings import DEFAULT_RUN_SETTINGS, Settings, SettingsError

    try:
        s = Settings.load().run_defaults()
    except (SettingsError, OSError, ValueError):
        s = dict(DEFAULT_RUN_SETTINGS)
    s.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return s


def resolve_estimate_settings(info: dict[str, Any], model: str, settings: dict[str, Any]) -> ResolvedSettings:
    """context_length/parts "auto" resolved as the Model stage resolves them (run_settings.resolve_settings)."""
    resolved, _plan = resolve_settings(info, settings, builtin=model == BUILTIN_MODEL_ID)
    return resolved


def model_needs(model: str, settings: dict[str, Any]) -> tuple[dict[str, Any], ResolvedSettings]:
    info = modelinfo.inspect_config(model_config(model))
    if not info["supported"]:
        raise CliError(info["reason"], "Pick a dense Llama-family model (Llama 3.x, Nemotron-Nano-8B, Qwen2/3).")
    r = resolve_estimate_settings(info, model, settings)
    err = modelinfo.check_context(info, r["context_length"], r["ar_n"])
    if err:
        raise CliError(err)
    needs = modelinfo.estimate(info, r["context_length"], r["ar_n"], r["parts"], r["calibration_samples"],
                               r["calibration_seq_len"])
    return needs, r


def preflight_report(model: str, context_length: int | None, ar_n: int | None, workspace: Path,
                     smoke: bool = True, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    from workers.shared.preflight_checks import probe, run_checks

    t0 = time.time()
    s = run_settings({**(settings or {}), "context_length": context_length, "ar_n": ar_n})
    needs, resolved = model_needs(model, s)
    from app.core.hf import hub_cache

    p = probe(workspace, hub_cache(), smoke=smoke)
    checks = run_checks(p, needs)
    return {"model": model, "context_length": resolved["context_length"], "settings": resolved, "needs": needs,
            "probe": p, "checks": checks,
            "checks_failed": sum(c["status"] == "fail" for c in checks),
            "checks_warned": sum(c["status"] == "warn" for c in checks), "seconds": round(time.time() - t0, 2)}


def wslconfig_plan(model: str, context_length: int | None, ar_n: int | None, path: Path | None,
                   memory_gb: int | None = None, swap_gb: int | None = None,
                   settings: dict[str, Any] | None = None) -> tuple[wslconfig.Plan, dict[str, Any]]:
    """What `--write-wslconfig` would write, plus what it is based on (live memory, this model's need)."""
    from workers.shared.preflight_checks import MEMORY_MARGIN, meminfo

    path = path or wslconfig.locate()
    if path is None:
        raise CliError("Cannot find the Windows user's .wslconfig: this does not look like WSL "
                       "(no wslvar/cmd.exe/wslpath).",
                       "Give its path: --wslconfig /mnt/c/Users/<you>/.wslconfig")
    mem = meminfo()
    basis: dict[str, Any] = {"mem_total_bytes": mem.get("MemTotal", 0), "swap_total_bytes": mem.get("SwapTotal", 0)}
    enough = False
    if memory_gb is None and swap_gb is None:
        needs, _ = model_needs(model, run_settings({**(settings or {}), "context_length": context_length,
                                                    "ar_n": ar_n}))
        need = int(needs["quantize_peak_rss_bytes"])
        basis["quantize_peak_rss_bytes"] = need
        # the same margin as the memory check: when it passes there is nothing to raise
        enough = basis["mem_total_bytes"] + basis["swap_total_bytes"] >= need * MEMORY_MARGIN
        if not enough:
            memory_gb, swap_gb = wslconfig.target_limits(need)
    for name, v in (("--memory-gb", memory_gb), ("--swap-gb", swap_gb)):
        if v is not None and v <= 0:
            raise CliError(f"{name} must be a positive number of GB, not {v}.")
    try:
        pl = wslconfig.plan(path, memory_gb, swap_gb)
        if enough:
            pl.notes.append("WSL already has enough RAM + swap for this model (the memory check passes).")
        return pl, basis
    except OSError as exc:
        raise CliError(f"Cannot read {path}: {exc.strerror or exc}.", "Check the path and its permissions.") from None


def _confirm(question: str) -> bool:
    if not sys.stdin or not sys.stdin.isatty():
        return False
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def cmd_write_wslconfig(args: argparse.Namespace) -> int:
    pl, basis = wslconfig_plan(args.model, args.context_length, args.ar_n, args.wslconfig or None,
                               args.memory_gb, args.swap_gb, settings=_cli_settings(args))
    out: dict[str, Any] = {**pl.to_json(), "basis": basis, "written": False, "backup": None}
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    cur = pl.current
    say(f".wslconfig: {pl.path}{'' if pl.exists else ' (does not exist yet)'}")
    say(f"  now: memory={cur['memory'] or '(default: half the Windows RAM)'}, swap={cur['swap'] or '(default)'}; "
        f"Linux sees {basis['mem_total_bytes'] / 1024**3:.1f} GiB RAM + {basis['swap_total_bytes'] / 1024**3:.1f} GiB swap")
    if "quantize_peak_rss_bytes" in basis:
        say(f"  this model's quantization needs about {basis['quantize_peak_rss_bytes'] / 1024**3:.1f} GiB")
    for n in pl.notes:
        say(f"  {n}")
    if not pl.changed:
        say("Nothing to change.")
        if args.json:
            print_json(out)
        return 0
    say(pl.diff().rstrip("\n"))
    if not args.yes and not _confirm(f"Write {pl.path} (the old file is kept as a backup)?"):
        msg, hint = (f"Did not write {pl.path}.",
                     "Re-run with --yes to write it, or edit the file yourself as the diff shows.")
        if args.json:  # one JSON document on stdout, whatever happens
            print_json({**out, "ok": False, "error": error_fields("not_written", msg, hint)})
            print(f"error: {msg}\n  what to do: {hint}", file=sys.stderr)
            return 1
        raise CliError(msg, hint)
    try:
        backup = wslconfig.write(pl)
    except OSError as exc:
        raise CliError(f"Cannot write {pl.path}: {exc.strerror or exc}.",
                       "Check that the Windows drive is mounted read-write; nothing was changed.") from None
    out.update(written=True, backup=str(backup) if backup else None)
    say(f"Wrote {pl.path}" + (f" (backup: {backup})" if backup else ""))
    say("Now run `wsl --shutdown` in Windows PowerShell or cmd and reopen your WSL terminal: "
        "WSL applies the new limits only after it restarts (this closes every WSL window).")
    if args.json:
        print_json(out)
    return 0


def _cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"parts": args.parts, "calibration_samples": args.calibration_samples,
            "calibration_seq_len": args.calibration_seq_len}


def cmd_preflight(args: argparse.Namespace) -> int:
    if args.write_wslconfig:
        return cmd_write_wslconfig(args)
    rep = preflight_report(args.model, args.context_length, args.ar_n, workspace_from(args).root,
                           smoke=not args.no_smoke_test, settings=_cli_settings(args))
    if args.json:
        print_json(rep)
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
        for c in rep["checks"]:
            print(f"[{marks[c['status']]}] {c['id']:22s} {c['message']}")
            if c.get("fix") and c["status"] in ("warn", "fail"):
                print(f"       fix: {c['fix']}")
        print(f"{rep['checks_failed']} failed, {rep['checks_warned']} warnings ({rep['seconds']:.1f} s)",
              file=sys.stderr)
    return 1 if rep["checks_failed"] else 0
