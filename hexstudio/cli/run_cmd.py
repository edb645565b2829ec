"""`hexstudio run`: make a run (or resume one) and take it through the stages."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from hexstudio.cli.common import (
    EXIT_USAGE,
    CliError,
    print_json,
    set_action,
    workspace_from,
)
from hexstudio.core.jobs import human_bytes
from hexstudio.core.paths import BUILTIN_MODEL_ID
from hexstudio.core.pipeline import Pipeline
from hexstudio.core.remote.hosts import WorkerHostError, host_config
from hexstudio.core.runs import RunNotFound, WorkspaceError, change_settings
from hexstudio.core.settings import SettingsError
from hexstudio.core.stage_state import display_state
from hexstudio.core.stages import STAGE_NAMES
from hexstudio.core.status import run_status, stage_status, stage_statuses
from hexstudio.shared import run_settings


def _parse_set(values: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items, read and checked as the registry of run settings says (hexstudio.shared.run_settings)."""
    out: dict[str, Any] = {}
    for item in values:
        if "=" not in item:
            raise CliError(
                f"--set expects KEY=VALUE, got '{item}'.",
                "Example: --set context_length=1024",
                code=EXIT_USAGE,
            )
        k, v = item.split("=", 1)
        k = k.strip()
        spec = run_settings.spec(k)
        if spec is None:
            near = run_settings.closest(k)
            raise CliError(
                f"--set {item}: {k} is not a run setting.",
                (f"Did you mean {near}? " if near else "") + "`hexstudio run --help` lists the run "
                "settings (docs/settings.md describes each).",
                code=EXIT_USAGE,
            )
        out[k] = run_settings.parse_cli_value(k, v)
        why = run_settings.check(k, out[k])
        if why is not None:
            raise CliError(
                f"--set {item}: {why}",
                f"{k} takes {spec.type_text()}; its default is written {json.dumps(spec.default)} "
                "(JSON: numbers bare, true/false in lower case, text in quotes if it looks like a number).",
                code=EXIT_USAGE,
            )
    return out


def _check_worker_host(name: str) -> None:
    """Refuse an unknown worker host before a run is made (connecting happens when a heavy stage starts)."""
    if name == "local":
        return
    try:
        host_config(name)
    except WorkerHostError as exc:
        raise CliError(exc.message, exc.hint) from None


def _check_board(name: str, boards: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse a board name no board has before a run is made: otherwise the typo is found at the Board stage,
    after the hours of Quantize and Compile (a run that stops before the Board stage may name any board)."""
    last = args.only or args.until or "report"
    if name == "sim" or name in boards or STAGE_NAMES.index(last) < STAGE_NAMES.index("board"):
        return
    known = ", ".join(["sim", *sorted(boards)])
    raise CliError(
        f"No board named '{name}' (boards here: {known}); no run was made.",
        f"Add it first: `hexstudio board add {name} --host HOST --user USER` (or the studio's Board page), "
        "or pick one from `hexstudio board list`.",
        code=EXIT_USAGE,
    )


def _check_suites(settings: dict[str, Any], workspace_root: Path) -> None:
    """Refuse an eval_suites name no suite has before a stage runs (else it is found at the Evaluate stage)."""
    from hexstudio.core.eval.suites import available

    names = settings.get("eval_suites")
    if not isinstance(names, list):
        return  # unset, or a wrong type check_run_settings refuses
    found = available(workspace_root)
    unknown = [str(n) for n in names if n not in found]
    if unknown:
        raise CliError(
            f"No evaluation suite named {', '.join(map(repr, unknown))} (suites here: {', '.join(sorted(found))}).",
            "Fix --set eval_suites=[...], or add the suite first with `hexstudio eval add FILE`.",
            code=EXIT_USAGE,
        )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="create or resume a run and take it through the stages",
        epilog=run_settings.cli_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", default=None, help=f"model: {BUILTIN_MODEL_ID} (default), a Hugging Face id, or a folder"
    )
    p.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="Hugging Face revision of --model: a branch, tag or commit hash (default: main); "
        "recorded in the run and in model.json",
    )
    p.add_argument(
        "--board", default=None, help="board: sim (default, the simulator) or a configured board name"
    )
    # one or the other: --only with --until ran the one stage and said nothing of the other
    last = p.add_mutually_exclusive_group()
    last.add_argument(
        "--until", default=None, choices=STAGE_NAMES, help="last stage to run (default: report)"
    )
    last.add_argument("--only", default=None, choices=STAGE_NAMES, help="run just this stage")
    p.add_argument(
        "--resume", metavar="RUN_ID", default=None, help="resume this run instead of making a new one"
    )
    p.add_argument("--force", action="store_true", help="re-run stages even when they are current")
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run setting (listed below), e.g. --set context_length=1024 (repeatable); with --resume it changes "
        "the run's setting, and the stages that read it run again",
    )
    p.add_argument(
        "--override-gate",
        action="append",
        default=[],
        choices=STAGE_NAMES,
        metavar="STAGE",
        help="continue past this stage's failed gate (recorded in the run)",
    )
    p.add_argument(
        "--worker-host",
        default=None,
        metavar="NAME",
        help="run the heavy stages (quantize, validate) on this worker host over SSH "
        "(`hexstudio worker add`); 'local' runs them here. Recorded in the run, so a resume "
        "uses it; with --resume it changes the host",
    )
    p.add_argument("--quiet", action="store_true", help="print only the outcome")
    set_action(p, cmd_run, workspace=True)


def cmd_run(args: argparse.Namespace) -> int:
    ws = workspace_from(args)
    if args.resume is not None and not args.resume.strip():
        raise CliError(
            "--resume needs a run id; it was given empty (a shell variable that was not set?).",
            "`hexstudio runs list` shows the run ids; leave --resume out to start a new run.",
            code=EXIT_USAGE,
        )
    if args.resume:
        if args.model or args.board or args.revision:
            raise CliError(
                "--resume continues a run with its own model and board; --model, --revision and --board cannot "
                "change them.",
                "Start a new run for another model or board (its settings can change on resume: --set KEY=VALUE).",
                code=EXIT_USAGE,
            )
        changes = _parse_set(args.settings)
        if "revision" in changes:  # the model's own input, as --revision
            raise CliError(
                "--resume continues a run with its own model; --set revision=... cannot change it.",
                "Start a new run for another revision of the model (--model M --revision REV).",
                code=EXIT_USAGE,
            )
        if args.worker_host is not None:  # --worker-host X is --set worker_host=X
            changes["worker_host"] = args.worker_host
        if changes.get("worker_host"):
            # where a stage runs is none of its results' inputs, so done stages stay done; but Preflight measures
            # the machine, and measures the new one
            _check_worker_host(str(changes["worker_host"]))
            if changes["worker_host"] == "local":  # this machine
                changes["worker_host"] = None
        try:
            m = ws.open_run(args.resume)
        except RunNotFound as exc:
            raise CliError.of(exc) from None
        _check_suites(changes, ws.root)
        if changes:
            # as the studio's pages change them: recorded in the run; the stages that read them run again
            changed = change_settings(m, changes, "its settings (--set, --worker-host)")
            if changed and not (args.quiet or args.json):
                print(f"changed {', '.join(changed)}: the stages that read them run again", file=sys.stderr)
    else:
        from hexstudio.core.settings import Settings

        config = Settings.load()
        defaults = config.run_defaults()
        defaults.update(_parse_set(args.settings))
        _check_board(args.board or "sim", config.boards, args)
        _check_suites(defaults, ws.root)
        if args.revision:
            defaults["revision"] = args.revision  # the Model stage's input (hexstudio/core/stages.py)
        if args.worker_host is not None:
            _check_worker_host(args.worker_host)
            defaults["worker_host"] = None if args.worker_host == "local" else args.worker_host
        if defaults.get("worker_host"):
            _check_worker_host(str(defaults["worker_host"]))
        try:
            m = ws.create_run(args.model or BUILTIN_MODEL_ID, args.board or "sim", defaults)
        except SettingsError as exc:
            raise CliError(
                str(exc),
                "Fix the value (`--set KEY=VALUE`, or run_defaults in the settings file); no run was made.",
            ) from None
        except WorkspaceError as exc:
            raise CliError(exc.message, exc.hint) from None
    quiet = args.quiet or args.json
    if not quiet:
        print(f"run {m.run_id}  ({m.run_dir})", file=sys.stderr)

    last_fraction: dict[str, float] = {}

    def on_event(stage: str, ev: dict[str, Any]) -> None:
        if quiet:
            return
        t = ev["type"]
        if t == "progress":
            f = float(ev["fraction"])
            if f - last_fraction.get(stage, -1.0) >= 0.05 or f >= 1.0:
                last_fraction[stage] = f
                print(f"  [{stage}] {f * 100:5.1f}%  {ev.get('message', '')}", file=sys.stderr)
        elif t in ("warning", "error"):
            print(f"  [{stage}] {t}: {ev['message']}", file=sys.stderr)
            if ev.get("hint"):
                print(f"           what to do: {ev['hint']}", file=sys.stderr)

    def on_stage(stage: str, state: str) -> None:
        if not quiet:
            print(f"{stage}: {state}", file=sys.stderr)

    pipe = Pipeline(m, on_event=on_event, on_stage=on_stage)
    for st in args.override_gate:
        pipe.override_gate(st, "override requested on the command line (--override-gate)")

    async def go() -> Any:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(pipe.cancel()))
        return await pipe.run(until=args.until or "report", only=args.only, force=args.force)

    res = asyncio.run(go())
    states = {n: display_state(m, n) for n in STAGE_NAMES}
    if args.json:
        # "statuses" and "run_status": the one status model's words (hexstudio/core/status.py), as `runs show --json`
        # prints them; "states" keeps the pipeline's raw states (done, failed, ...) for scripts that read them
        statuses = stage_statuses(m)
        print_json(
            {
                "ok": res.ok,
                "run_id": m.run_id,
                "run_dir": str(m.run_dir),
                "stopped_at": res.stopped_at,
                "message": res.message,
                "hint": res.hint,
                "ran": res.ran,
                "skipped": res.skipped,
                "statuses": {s.stage: s.as_json() for s in statuses},
                "run_status": run_status(statuses).as_json(),
                "states": states,
            }
        )
    else:
        for name in [] if args.quiet else res.ran:  # --quiet: only the outcome
            st = m.stage(name).data
            peak = st.get("peak_rss_bytes")
            print(
                f"  {name:10s} {stage_status(m, name).line():14s} {st.get('duration_s') or 0:8.1f} s  peak RSS "
                f"{human_bytes(peak)}",
                file=sys.stderr,
            )
        if res.ok:
            print(f"ok: {res.message} (run {m.run_id})")
        else:
            print(f"stopped at {res.stopped_at}: {res.message}", file=sys.stderr)
            if res.hint:
                print(f"  what to do: {res.hint}", file=sys.stderr)
            if res.stopped_at is None or stage_status(m, res.stopped_at).key != "gate_failed":
                # after a failed gate a plain resume only stops at the same gate: the hint above says what to do
                print(f"  resume with: hexstudio run --resume {m.run_id}", file=sys.stderr)
    return 0 if res.ok else 1
