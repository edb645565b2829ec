"""`hexstudio preflight`: will this machine manage this model? (memory, disk, WSL, GPU, packages)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hexstudio.cli.common import (
    EXIT_USAGE,
    CliError,
    add_shape_flags,
    int_in,
    print_json,
    set_action,
    workspace_from,
)
from hexstudio.core.paths import BUILTIN_MODEL_ID
from hexstudio.core.services.preflight import preflight_report, wslconfig_plan
from hexstudio.shared import wslconfig
from hexstudio.shared.errors import error_fields


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("preflight", help="check memory, disk, WSL, GPU and packages against a model's needs")
    p.add_argument("--model", default=BUILTIN_MODEL_ID, help="built-in model, Hugging Face id or folder")
    add_shape_flags(p, "context length (default: the run default; auto = 512 built-in, 4096 others)")
    p.add_argument("--calibration-samples", type=int, default=None, help="default: the run default")
    p.add_argument("--calibration-seq-len", type=int, default=None, help="default: the run default")
    p.add_argument("--no-smoke-test", action="store_true", help="skip the AIMET smoke test")
    w = p.add_argument_group("WSL memory limits (%UserProfile%\\.wslconfig)")
    w.add_argument(
        "--write-wslconfig",
        action="store_true",
        help="raise [wsl2] memory=/swap= for this model: shows the diff, asks, backs up, writes",
    )
    w.add_argument("--yes", action="store_true", help="write without asking (after printing the diff)")
    w.add_argument(
        "--wslconfig",
        type=Path,
        default=None,
        metavar="PATH",
        help="the .wslconfig to edit (default: found with wslvar/cmd.exe + wslpath)",
    )
    w.add_argument(
        "--memory-gb",
        type=int_in(1, 1 << 16),
        default=None,
        help="memory= to set instead of this model's need",
    )
    w.add_argument(
        "--swap-gb", type=int_in(1, 1 << 16), default=None, help="swap= to set instead of this model's need"
    )
    set_action(p, cmd_preflight, workspace=True)


def _confirm(question: str) -> bool:
    if not sys.stdin or not sys.stdin.isatty():
        return False
    # the question on stderr: stdout holds the one JSON document under --json
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        return input().strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _check_wslconfig_path(path: Path) -> None:
    """--wslconfig names a file in a folder that exists: said before the plan, not as a drive that is read-only."""
    if path.is_dir():
        raise CliError(
            f"--wslconfig {path} is a folder.",
            f"Give the file's path, e.g. {path / '.wslconfig'} (Windows keeps it in %UserProfile%).",
            exit_code=EXIT_USAGE,
        )
    if not path.parent.is_dir():
        raise CliError(
            f"The folder {path.parent} does not exist, so {path.name} cannot be written there.",
            "Give --wslconfig a file in your Windows user folder (e.g. /mnt/c/Users/NAME/.wslconfig), or leave it "
            "out to have it found.",
            exit_code=EXIT_USAGE,
        )


def cmd_write_wslconfig(args: argparse.Namespace) -> int:
    if args.wslconfig:
        _check_wslconfig_path(Path(args.wslconfig).expanduser())
    pl, basis = wslconfig_plan(
        args.model,
        args.wslconfig or None,
        settings=_cli_settings(args),
        memory_gb=args.memory_gb,
        swap_gb=args.swap_gb,
    )
    out: dict[str, Any] = {**pl.to_json(), "basis": basis, "written": False, "backup": None}
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    cur = pl.current
    say(f".wslconfig: {pl.path}{'' if pl.exists else ' (does not exist yet)'}")
    say(
        f"  now: memory={cur['memory'] or '(default: half the Windows RAM)'}, swap={cur['swap'] or '(default)'}; "
        f"Linux sees {basis['mem_total_bytes'] / 1024**3:.1f} GiB RAM + {basis['swap_total_bytes'] / 1024**3:.1f} GiB swap"
    )
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
        msg, hint = (
            f"Did not write {pl.path}.",
            "Re-run with --yes to write it, or edit the file yourself as the diff shows.",
        )
        if args.json:  # one JSON document on stdout, whatever happens
            print_json({**out, "ok": False, "error": error_fields("not_written", msg, hint)})
            print(f"error: {msg}\n  what to do: {hint}", file=sys.stderr)
            return 1
        raise CliError(msg, hint)
    try:
        backup = wslconfig.write(pl)
    except wslconfig.ChangedMeanwhile as exc:
        raise CliError(
            exc.message, "Run the command again: it plans the change from the file as it is now."
        ) from None
    except OSError as exc:
        raise CliError(
            f"Cannot write {pl.path}: {exc.strerror or exc}.",
            "Check that the Windows drive is mounted read-write; nothing was changed.",
        ) from None
    out.update(written=True, backup=str(backup) if backup else None)
    say(f"Wrote {pl.path}" + (f" (backup: {backup})" if backup else ""))
    say(
        "Now run `wsl --shutdown` in Windows PowerShell or cmd and reopen your WSL terminal: "
        "WSL applies the new limits only after it restarts (this closes every WSL window)."
    )
    if args.json:
        print_json(out)
    return 0


def _cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "context_length": args.context_length,
        "ar_n": args.ar_n,
        "parts": args.parts,
        "calibration_samples": args.calibration_samples,
        "calibration_seq_len": args.calibration_seq_len,
    }


def cmd_preflight(args: argparse.Namespace) -> int:
    if args.write_wslconfig:
        return cmd_write_wslconfig(args)
    only_writing = {"--memory-gb": args.memory_gb, "--swap-gb": args.swap_gb, "--wslconfig": args.wslconfig}
    if given := [f for f, v in {**only_writing, "--yes": args.yes or None}.items() if v is not None]:
        raise CliError(  # ignored, they would let a person think their .wslconfig was changed
            f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --write-wslconfig: nothing is written "
            "without it.",
            "Add --write-wslconfig to change .wslconfig, or leave "
            + ("that flag" if len(given) == 1 else "those flags")
            + " out to only check.",
            exit_code=EXIT_USAGE,
        )
    rep = preflight_report(
        args.model, workspace_from(args).root, smoke=not args.no_smoke_test, settings=_cli_settings(args)
    )
    if args.json:
        print_json(rep)
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
        for c in rep["checks"]:
            print(f"[{marks[c['status']]}] {c['id']:22s} {c['message']}")
            if c.get("fix") and c["status"] in ("warn", "fail"):
                print(f"       fix: {c['fix']}")
        print(
            f"{rep['checks_failed']} failed, {rep['checks_warned']} warnings ({rep['seconds']:.1f} s)",
            file=sys.stderr,
        )
    return 1 if rep["checks_failed"] else 0
