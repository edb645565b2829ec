"""`hexstudio runs list|show|delete`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hexstudio.cli.common import (
    CliError,
    add_actions,
    print_json,
    set_action,
    workspace_from,
)
from hexstudio.core.jobs import human_bytes
from hexstudio.core.runs import RunNotFound
from hexstudio.core.stage_state import display_state
from hexstudio.core.stages import STAGES
from hexstudio.core.status import legend, run_status, stage_statuses


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rs = add_actions(sub, "runs", help="list, show or delete runs")
    pl = rs.add_parser("list", help="list runs, newest first")
    set_action(pl, cmd_list, workspace=True)
    ps = rs.add_parser("show", help="show one run")
    ps.add_argument("run_id")
    set_action(ps, cmd_show, workspace=True)
    pd = rs.add_parser("delete", help="delete a run and its artifacts")
    pd.add_argument("run_id")
    pd.add_argument("--yes", action="store_true", help="do not ask")
    set_action(pd, cmd_delete, workspace=True)


def cmd_list(args: argparse.Namespace) -> int:
    ws = workspace_from(args)
    runs = ws.list_runs()
    if args.json:

        def status(
            run_id: str,
        ) -> dict[str, Any] | None:  # the one status model's words (hexstudio/core/status.py)
            try:
                return run_status(stage_statuses(ws.open_run(run_id))).as_json()
            except Exception:  # an unreadable run still gets listed
                return None

        print_json({"runs": [{**r.as_json(), "run_status": status(r.run_id)} for r in runs]})
        return 0
    if not runs:
        if ws.root.is_dir():
            print("no runs yet. Start one with: hexstudio run")
        else:  # a mistyped --workspace reads as "all my runs are gone"
            print(
                f"no workspace at {ws.root} (no runs). Check --workspace or $HEXSTUDIO_WORKSPACE; start a run with: hexstudio run"
            )
        return 0
    ws = workspace_from(args)
    for r in runs:
        try:
            word = run_status(stage_statuses(ws.open_run(r.run_id))).word
        except Exception:  # an unreadable run still gets listed
            word = "unreadable run.json"
        print(f"{r.run_id}  {r.model}  board={r.board}  {word}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        m = workspace_from(args).open_run(args.run_id)
    except RunNotFound as exc:
        raise CliError.of(exc) from None
    statuses = stage_statuses(m)
    if args.json:
        data = dict(m.data)
        data["display_states"] = {s.name: display_state(m, s.name) for s in STAGES}
        data["statuses"] = {s.stage: s.as_json() for s in statuses}
        data["run_status"] = run_status(statuses).as_json()
        print_json(data)
        return 0
    print(
        f"run {m.run_id}  ({run_status(statuses).word})\n  model {m.inputs['model']}  board {m.inputs['board']}"
        f"\n  folder {m.run_dir}"
    )
    for s, status in zip(STAGES, statuses, strict=True):
        st = m.stage(s.name).data
        line = f"  {s.name:10s} {status.line():14s}"
        if st.get("duration_s") is not None:
            line += f" {st['duration_s']:8.1f} s  peak RSS {human_bytes(st.get('peak_rss_bytes'))}"
        print(line)
        if status.key in ("gate_failed", "overridden"):
            print(f"             {status.detail}")
            if status.key == "gate_failed" and status.overridable:
                print(
                    f"             what to do: fix it and run the stage again, or continue anyway with "
                    f"`hexstudio run --resume {m.run_id} --override-gate {s.name}` (recorded in the run)"
                )
        out = st.get("outcome") or {}
        if status.key in ("failed", "cancelled", "interrupted") and out.get("kind") not in (None, "ok"):
            print(f"             {out.get('message')}")
            if out.get("hint"):
                print(f"             what to do: {out['hint']}")
    print(f"  legend: {legend()}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    ws = workspace_from(args)
    if not args.yes:
        # --json changes what is printed, never whether it asks: a script must say --yes to delete
        if args.json or sys.stdin is None or sys.stdin.closed or not sys.stdin.isatty():
            raise CliError(
                f"Not deleting run {args.run_id}: "
                + (
                    "--json does not ask (its output is JSON)."
                    if args.json
                    else "there is no terminal to ask on (stdin is closed or not a terminal)."
                ),
                f"Run `hexstudio runs delete {args.run_id} --yes` to delete it without asking.",
            )
        ans = input(f"Delete run {args.run_id} and all its artifacts? [y/N] ")
        if ans.strip().lower() not in ("y", "yes"):
            print("kept")
            return 1
    try:
        ws.delete_run(args.run_id)
    except RunNotFound as exc:
        raise CliError.of(exc) from None
    if args.json:
        print_json({"ok": True, "deleted": args.run_id})
    else:
        print(f"deleted {args.run_id}")
    return 0
