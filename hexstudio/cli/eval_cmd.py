"""`hexstudio eval add FILE | list | show RUN`: evaluation suites and a run's three-way scores.

The Evaluate stage itself runs with `hexstudio run ... --until evaluate` (or `--only evaluate`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hexstudio.cli.common import (
    CliError,
    add_actions,
    print_json,
    set_action,
    workspace_from,
)
from hexstudio.core.eval.compare import scores_not_current
from hexstudio.core.eval.suites import DEFAULT_SUITES, SuiteError, add_suite, available, load_found
from hexstudio.core.manifest import ManifestError, RunManifest


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    esub = add_actions(sub, "eval", help="evaluation suites: add your own, list them, show a run's scores")
    a = esub.add_parser("add", help="check a suite (JSONL) and add it to the workspace's suites")
    a.add_argument("file", type=Path)
    a.add_argument("--replace", action="store_true", help="replace an added suite of the same name")
    set_action(a, cmd_add, workspace=True)
    ls = esub.add_parser("list", help="the suites available (shipped and added)")
    set_action(ls, cmd_list, workspace=True)
    sh = esub.add_parser("show", help="a run's evaluation: every suite float -> simulated -> board")
    sh.add_argument("run", help="run id or folder")
    set_action(sh, cmd_show, workspace=True)


def cmd_add(args: argparse.Namespace) -> int:
    ws = workspace_from(args)
    try:
        s = add_suite(args.file, ws.root, replace=args.replace)
    except SuiteError as exc:
        raise CliError(exc.message, exc.hint) from None
    if args.json:
        print_json({"ok": True, **s.summary()})
    else:
        print(f"added suite {s.name!r}: {len(s.cases)} case(s), scorer {s.scorer} -> {s.path}")
        print(
            f"run it: hexstudio run --resume RUN --only evaluate with the run setting eval_suites "
            f'[..., "{s.name}"] (or tick it on the Evaluate page)'
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    ws = workspace_from(args)
    rows: list[dict[str, Any]] = []
    for name, path in available(ws.root).items():
        try:
            s = load_found(path)
            rows.append(
                {**s.summary(), "default": name in DEFAULT_SUITES, "replaces_shipped": s.replaces_shipped}
            )
        except SuiteError as exc:
            rows.append({"name": name, "path": str(path), "error": exc.message})
    if args.json:
        print_json({"ok": True, "suites": rows})
        return 0
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<24} BROKEN: {r['error']}")
        else:
            tag = "default" if r["default"] else ("shipped" if r["shipped"] else "added")
            if r.get("replaces_shipped"):
                tag += ", replaces shipped"
            print(f"{r['name']:<24} {r['cases']:>4} cases  {r['scorer']:<12} {tag:<8}  {r['title']}")
    return 0


def _run_dir(args: argparse.Namespace) -> Path:
    p = Path(args.run)
    if (p / "run.json").is_file():
        return p
    d = workspace_from(args).run_dir(args.run)
    if not d.is_dir():
        raise CliError(f"No run '{args.run}'.", "`hexstudio runs list` shows the runs.")
    return d


def table_lines(doc: dict[str, Any]) -> list[str]:
    legs = doc.get("legs") or ["float", "sim", "board"]
    titles = doc.get("leg_titles") or {}
    suites = doc.get("suites") or []

    def cell(t: dict[str, Any], leg: str) -> str:
        return str((t["legs"].get(leg) or {}).get("text", "—"))

    # each column as wide as its title or its widest cell: a title is never cut ("host quantized (simulation")
    width = {
        leg: 2 + max([len(str(titles.get(leg, leg)))] + [len(cell(t, leg)) for t in suites]) for leg in legs
    }
    head = f"{'suite':<24}" + "".join(f"{titles.get(leg, leg):>{width[leg]}}" for leg in legs) + "   drop"
    out = [head, "-" * len(head)]
    for t in suites:
        cells = "".join(f"{cell(t, leg):>{width[leg]}}" for leg in legs)
        drops = ", ".join(f"{k} {v:+.3f}" for k, v in (t.get("drops") or {}).items())
        out.append(f"{t['suite']:<24}{cells}   {drops}")
    if doc.get("source") == "host":
        out.append("host only: no board leg; every score was computed on this workstation, not on a device")
    elif doc.get("simulated"):
        out.append(
            "board: the SIMULATOR board (this CPU: real Genie on Qualcomm's HTP simulator, or the onnxruntime "
            "twin): simulated, not a device result"
        )
    return out


def cmd_show(args: argparse.Namespace) -> int:
    d = _run_dir(args)
    p = d / "artifacts" / "evaluate" / "evaluate.json"
    if not p.is_file():
        raise CliError(
            f"Run {d.name} has no evaluation yet.",
            f"Run it: hexstudio run --resume {d.name} --until evaluate",
        )
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise ValueError(f"it holds a JSON {type(doc).__name__}, not an object")
        lines = [] if args.json else table_lines(doc)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CliError(
            f"{p} is damaged ({type(exc).__name__}: {exc}).",
            f"Run the Evaluate stage again: hexstudio run --resume {d.name} --only evaluate --force",
        ) from None
    # an attempt after these scores failed (artifacts/evaluate/ keeps the earlier one), or the run changed since
    try:
        why = scores_not_current(RunManifest.load(d))
    except ManifestError as exc:
        why = f"run.json cannot be read ({exc.message}): whether these scores are current is not known."
    if args.json:
        print_json({"ok": True, **doc, "current": why is None, "not_current": why})
    else:
        print("\n".join(([f"NOT CURRENT: {why}", ""] if why else []) + lines))
    return 0
