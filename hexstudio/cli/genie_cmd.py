"""`hexstudio genie profile FILE` and `hexstudio genie transcript FILE`: the two Genie parsers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hexstudio.cli.common import CliError, add_actions, print_json, set_action
from hexstudio.core.genie.profile import ProfileError, parse_profile
from hexstudio.core.genie.run import explain_failure
from hexstudio.core.genie.transcript import parse_transcript
from hexstudio.core.units import fmt_quantity


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gs = add_actions(sub, "genie", help="parse genie-t2t-run output: --profile JSON and stdout transcripts")
    pp = gs.add_parser("profile", help="normalise a --profile JSON into KPIs (init, TTFT, rates...)")
    pp.add_argument("file", help="the profile JSON file (- for stdin)")
    set_action(pp, cmd_profile)
    pt = gs.add_parser(
        "transcript", help="parse a genie-t2t-run stdout transcript (reply, state, logs, [KPIS])"
    )
    pt.add_argument("file", help="the captured stdout (- for stdin)")
    pt.add_argument(
        "--exit-status",
        type=int,
        default=None,
        help="the run's exit status when known (non-zero marks an unfinished reply as crashed)",
    )
    pt.add_argument(
        "--prompt-file",
        default=None,
        help="the prompt file the run was given: its echo is skipped exactly (without it, the echo "
        "is taken to end at the first blank line)",
    )
    set_action(pt, cmd_transcript)


def _read(file: str) -> str:
    if file == "-":
        return sys.stdin.read()
    try:
        return Path(file).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CliError(
            f"Cannot read {file}: {exc.strerror}.", "Give the path of the file genie-t2t-run wrote."
        ) from None


def cmd_profile(args: argparse.Namespace) -> int:
    text = _read(args.file)
    try:
        k = parse_profile(text if text.lstrip().startswith("{") else "{}")
    except ProfileError as exc:
        raise CliError(
            f"{args.file}: {exc}", "Pass the file named by genie-t2t-run's --profile flag."
        ) from None
    doc = k.as_json()
    if args.json:
        print_json({"ok": True, "file": args.file, "kpis": doc})
        return 0
    label = "SIMULATED (the simulator board, not a device result)" if k.source == "simulated" else "device"
    print(
        f"Genie profile {args.file} ({label}; {k.queries} quer{'y' if k.queries == 1 else 'ies'}, "
        "the last one shown)"
    )
    rows = [
        ("init", k.init_ms, "ms"),
        ("prompt tokens", k.prompt_tokens, ""),
        ("prompt rate", k.prompt_tok_s, "tok/s"),
        ("time to first token", k.ttft_ms, "ms"),
        ("generated tokens", k.generated_tokens, ""),
        ("generation rate", k.gen_tok_s, "tok/s"),
        ("generation time", k.gen_time_ms, "ms"),
    ]
    for name, value, unit in rows:
        shown = fmt_quantity(value, unit) or f"{'-' if value is None else value} {unit}"
        print(f"  {name:<20} {shown}".rstrip())
    return 0


def cmd_transcript(args: argparse.Namespace) -> int:
    text = _read(args.file)
    prompt = None
    if args.prompt_file is not None:
        try:  # exactly as genie-t2t-run read it: bytes as they are, no newline translation
            prompt = Path(args.prompt_file).read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise CliError(
                f"Cannot read {args.prompt_file}: {exc.strerror}.",
                "Give the prompt file the run was given (--prompt_file), or leave --prompt-file out.",
            ) from None
    t = parse_transcript(text, args.exit_status, prompt)
    doc = t.as_json()
    failed = t.state in ("crashed", "not_started") or bool(t.errors)
    doc["explanation"] = explain_failure(t, "", args.exit_status) if failed else None
    if args.json:
        print_json({"ok": t.state == "complete", "file": args.file, "transcript": doc})
    else:
        print(f"state: {t.state}   genie: {t.genie_version or '?'}{'  (SIMULATED)' if t.simulated else ''}")
        if t.prompt is not None:
            print(f"prompt: {t.prompt}")
        print(f"reply: {t.text}")
        for lg in t.logs:
            print(f"  [{lg['level']}] {lg['message']}")
        if t.kpis_block:
            print("  [KPIS] " + ", ".join(f"{k}={v:g}" for k, v in t.kpis_block.items()))
        if doc["explanation"]:
            print(f"what went wrong: {doc['explanation']}")
    return 0 if t.state in ("complete", "aborted") else 1
