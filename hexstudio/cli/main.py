"""Entry point of the `hexstudio` command line (without a subcommand: the GUI)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from hexstudio import __version__
from hexstudio.cli.common import EXIT_FAILED, EXIT_USAGE, CliError, eprint, error_document, print_json
from hexstudio.core import logs
from hexstudio.shared.errors import ActionableError

log = logging.getLogger("hexstudio.cli")

# Each module defines register(subparsers). Keep one command group per module.
COMMAND_MODULES = (
    "hexstudio.cli.run_cmd",
    "hexstudio.cli.runs_cmd",
    "hexstudio.cli.preflight_cmd",
    "hexstudio.cli.predict_cmd",
    "hexstudio.cli.bundle_cmd",
    "hexstudio.cli.aihub_cmd",
    "hexstudio.cli.doctor_cmd",
    "hexstudio.cli.hf_cmd",
    "hexstudio.cli.model_cmd",
    "hexstudio.cli.explain_cmd",
    "hexstudio.cli.board_cmd",
    "hexstudio.cli.desktop_cmd",
    "hexstudio.cli.genie_cmd",
    "hexstudio.cli.chat_cmd",
    "hexstudio.cli.bench_cmd",
    "hexstudio.cli.report_cmd",
    "hexstudio.cli.worker_cmd",
    "hexstudio.cli.eval_cmd",
    "hexstudio.cli.serve_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hexstudio",
        description="HexStudio: Hugging Face LLM -> W4A16 -> AI Hub -> Genie on a Qualcomm Hexagon NPU board. "
        "Without a command, starts the studio window.",
    )
    parser.add_argument("--version", action="version", version=f"hexstudio {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=f"log debug detail, on stderr too (the log: {logs.log_path()})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # the window: started by hexstudio/__main__.py before this parser (the CLI never imports the GUI); listed here so
    # `hexstudio --help` names it
    gui = sub.add_parser(
        "gui",
        help="open the studio window (also the default without a command; "
        "`hexstudio gui --help` needs no display)",
    )
    gui.set_defaults(func=_gui_elsewhere)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _add_verbose(sub)
    return parser


def _gui_elsewhere(_args: argparse.Namespace) -> int:
    print(
        "error: the window starts from the `hexstudio` command itself: run `hexstudio gui`.", file=sys.stderr
    )
    return 2


def _add_verbose(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """-v / --verbose after the command too (`hexstudio run ... -v`, as the crash message suggests), on every
    subcommand."""
    for p in set(sub.choices.values()):
        taken = {o for a in p._actions for o in a.option_strings}
        if "--verbose" not in taken:
            p.add_argument(
                *(["-v"] if "-v" not in taken else []),
                "--verbose",
                action="store_true",
                default=argparse.SUPPRESS,
                help="log debug detail, on stderr too",
            )
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                _add_verbose(a)


def _command_words(args: argparse.Namespace) -> str:
    """The command and its action (`runs show`), never an argument's value (a path, a host, a prompt)."""
    command = str(getattr(args, "command", None) or "")
    action = getattr(args, f"{command.replace('-', '_')}_command", None)
    return f"{command} {action}" if isinstance(action, str) else command


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    if sys.stdin is not None and not sys.stdin.closed and sys.stdin.isatty():
        # an encrypted SSH key asks for its passphrase here (getpass); a newly trusted host key may also go to
        # ~/.ssh/known_hosts if the person says yes (hexstudio.core.device.connect)
        from hexstudio.core.device.connect import (
            DEFAULT_PROMPTS,
            set_default_prompts,
            tty_offer_known_hosts,
            tty_passphrase,
        )

        before = (DEFAULT_PROMPTS.passphrase, DEFAULT_PROMPTS.offer_known_hosts)
        set_default_prompts(passphrase=tty_passphrase, offer_known_hosts=tty_offer_known_hosts)
        try:
            return _run(args, func)
        finally:  # this command's prompts: a caller in the same process (the tests) keeps its own
            set_default_prompts(*before)
    return _run(args, func)


def _run(args: argparse.Namespace, func: Callable[[argparse.Namespace], int | None]) -> int:
    """The command, its errors said as a person can act on them, and its exit status."""
    what = _command_words(args)
    logs.setup_logging("cli", verbose=bool(getattr(args, "verbose", False)))
    log.info("hexstudio %s: started (version %s)", what, __version__)
    try:
        rc = int(func(args) or 0)
    except ActionableError as exc:  # CliError, or a core error nobody turned into one: say it the same way
        log.warning(
            "hexstudio %s: failed: %s: %s",
            what,
            exc.code,
            exc.message,
            exc_info=not isinstance(exc, CliError),
        )
        if getattr(args, "json", False):
            print_json(error_document(exc))
        eprint(f"error: {exc.message}")
        if exc.hint:
            eprint(f"  what to do: {exc.hint}")
        return exc.exit_code if isinstance(exc, CliError) else EXIT_FAILED
    except KeyboardInterrupt:
        log.info("hexstudio %s: interrupted", what)
        eprint("interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except (
        Exception
    ) as exc:  # a bug: the traceback goes to the log (and to stderr with -v), a sentence to the person
        logs.log_exception(log, f"hexstudio {what}: crashed", exc)
        if getattr(args, "verbose", False) or os.environ.get("HEXSTUDIO_TRACEBACK"):
            import traceback

            sys.stderr.write(
                logs.scrub_text(traceback.format_exc())
            )  # scrubbed: it is pasted into bug reports
        detail = logs.scrub_text(f"{type(exc).__name__}: {exc}")
        if getattr(args, "json", False):
            print_json(
                {
                    "ok": False,
                    "error": {
                        "code": "internal",
                        "message": f"hexstudio {what} failed: {detail}",
                        "hint": f"The traceback is in {logs.log_path()}.",
                    },
                }
            )
        eprint(f"error: hexstudio {what} failed unexpectedly ({detail[:300]}).")
        eprint(
            f"  what to do: this is a HexStudio bug, not something you did; the traceback is in "
            f"{logs.log_path()} (run again with -v to see it here). Please report it with that file."
        )
        return EXIT_FAILED
    log.info("hexstudio %s: exit %d", what, rc)
    return rc
