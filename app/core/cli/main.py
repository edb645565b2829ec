"""Entry point of the `hexstudio` command line (without a subcommand: the GUI)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from app import __version__
from app.core.cli.common import EXIT_FAILED, EXIT_USAGE, CliError, eprint, print_json

# Each module defines register(subparsers). Keep one command group per module.
COMMAND_MODULES = (
    "app.core.cli.run_cmd",
    "app.core.cli.runs_cmd",
    "app.core.cli.preflight_cmd",
    "app.core.cli.bundle_cmd",
    "app.core.cli.aihub_cmd",
    "app.core.cli.hf_cmd",
    "app.core.cli.model_cmd",
    "app.core.cli.explain_cmd",
    "app.core.cli.board_cmd",
    "app.core.cli.desktop_cmd",
    "app.core.cli.genie_cmd",
    "app.core.cli.chat_cmd",
    "app.core.cli.bench_cmd",
    "app.core.cli.report_cmd",
    "app.core.cli.worker_cmd",
    "app.core.cli.eval_cmd",
    "app.core.cli.serve_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hexstudio",
        description="HexStudio: Hugging Face LLM -> W4A16 -> AI Hub -> Genie on a Qualcomm Hexagon NPU board. "
                    "Without a command, starts the studio window.")
    parser.add_argument("--version", action="version", version=f"hexstudio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    if sys.stdin.isatty():
        # an encrypted SSH key asks for its passphrase here (getpass); a newly trusted host key may also go to
        # ~/.ssh/known_hosts if the person says yes (app.core.device.connect)
        from app.core.device.connect import set_default_prompts, tty_offer_known_hosts, tty_passphrase

        set_default_prompts(passphrase=tty_passphrase, offer_known_hosts=tty_offer_known_hosts)
    try:
        rc = func(args)
        return int(rc or 0)
    except CliError as exc:
        if getattr(args, "json", False):
            print_json({"ok": False, "error": exc.message, "hint": exc.hint})
        eprint(f"error: {exc.message}")
        if exc.hint:
            eprint(f"  what to do: {exc.hint}")
        return exc.code
    except KeyboardInterrupt:
        eprint("interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
