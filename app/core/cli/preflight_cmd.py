"""`hexstudio preflight`: will this machine manage this model? (memory, disk, WSL, GPU, packages)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.core.cli.common import CliError, add_json_flag, add_workspace_flag, print_json, workspace_from
from app.core.paths import BUILTIN_MODEL_DIR, BUILTIN_MODEL_ID
from workers import modelinfo


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("preflight", help="check memory, disk, WSL, GPU and packages against a model's needs")
    p.add_argument("--model", default=BUILTIN_MODEL_ID, help="built-in model, Hugging Face id or folder")
    p.add_argument("--context-length", type=int, default=None, help="context length (default: 512 built-in, 4096)")
    p.add_argument("--ar-n", type=int, default=128)
    p.add_argument("--no-smoke-test", action="store_true", help="skip the AIMET smoke test")
    add_workspace_flag(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_preflight)


def model_config(model: str) -> dict[str, Any]:
    """config.json only: a user can check a model before downloading its weights."""
    if model == BUILTIN_MODEL_ID:
        return modelinfo.read_config(BUILTIN_MODEL_DIR)
    if Path(model).expanduser().is_dir():
        try:
            return modelinfo.read_config(Path(model).expanduser())
        except modelinfo.ModelInfoError as exc:
            raise CliError(str(exc)) from None
    try:
        import json

        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model, "config.json", token=os.environ.get("HF_TOKEN") or None)
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return data
    except Exception as exc:
        raise CliError(f"Cannot read config.json of '{model}': {type(exc).__name__}: {exc}",
                       "Check the model id and your network, or give a local folder.") from None


def preflight_report(model: str, context_length: int | None, ar_n: int, workspace: Path,
                     smoke: bool = True) -> dict[str, Any]:
    from workers.preflight import probe, run_checks

    t0 = time.time()
    info = modelinfo.inspect_config(model_config(model))
    if not info["supported"]:
        raise CliError(info["reason"], "Pick a dense Llama-family model (Llama 3.x, Nemotron-Nano-8B, Qwen2/3).")
    cl = context_length or (512 if model == BUILTIN_MODEL_ID else 4096)
    err = modelinfo.check_context(info, cl, ar_n)
    if err:
        raise CliError(err)
    needs = modelinfo.estimate(info, cl, ar_n)
    hf_cache = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    p = probe(workspace, hf_cache, smoke=smoke)
    checks = run_checks(p, needs)
    return {"model": model, "context_length": cl, "needs": needs, "probe": p, "checks": checks,
            "checks_failed": sum(c["status"] == "fail" for c in checks),
            "checks_warned": sum(c["status"] == "warn" for c in checks), "seconds": round(time.time() - t0, 2)}


def cmd_preflight(args: argparse.Namespace) -> int:
    rep = preflight_report(args.model, args.context_length, args.ar_n, workspace_from(args).root,
                           smoke=not args.no_smoke_test)
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
