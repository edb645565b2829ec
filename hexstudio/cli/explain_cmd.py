"""`hexstudio explain [TEXT | --file LOG]`: decode Genie/QNN/FastRPC error messages into cause and fix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hexstudio.cli.common import EXIT_USAGE, CliError, print_json, set_action
from hexstudio.core.device.explain import explain_dict


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="explain a Genie / QNN / FastRPC error message (cause and fix)")
    p.add_argument("text", nargs="*", help="the message (or use --file, or pipe it on stdin with -)")
    p.add_argument("--file", type=Path, default=None, help="a log file to scan")
    set_action(p, cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    if args.file is not None:
        try:
            text = args.file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise CliError(
                f"Cannot read {args.file}: {exc.strerror}.", "Give the path of a log file."
            ) from None
    elif args.text == ["-"]:
        text = sys.stdin.read()
    elif args.text:
        text = " ".join(args.text)
    else:
        raise CliError(
            "Nothing to explain.",
            "Pass the message text, --file LOG, or - to read stdin.",
            exit_code=EXIT_USAGE,
        )
    doc = explain_dict(text)
    if args.json:
        print_json(doc)
    elif not doc["matches"]:
        print("Not recognised. Run `hexstudio board probe BOARD` to check the board's setup.")
    else:
        for m in doc["matches"]:
            print(f"[{m['severity']}] line {m['line_no']}: {m['line']}")
            print(f"  cause: {m['cause']}")
            print(f"  fix:   {m['fix']}")
    return 0 if doc["recognised"] else 1
