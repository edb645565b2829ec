"""Helpers shared by CLI commands: JSON output, errors a person can act on, exit codes."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hexstudio.core.runs import Workspace
from hexstudio.shared.errors import ActionableError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(ActionableError):
    """A command's failure: `message`, `hint` and, as every error in HexStudio, a string `code` ("usage" for
    a wrong command line, else "cli_error" unless given); `exit_code` is the process's exit status.
    (An int as `code` is taken as the exit status, as callers wrote it before.)"""

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        exit_code: int = EXIT_FAILED,
        *,
        code: str | int | None = None,
    ) -> None:
        if isinstance(code, int):
            exit_code, code = code, None
        super().__init__(message, hint, code=code or ("usage" if exit_code == EXIT_USAGE else None))
        self.exit_code = exit_code

    @classmethod
    def of(cls, exc: ActionableError) -> CliError:
        """The command's failure for an error of the layers below: its message, hint and code kept (str(exc)
        alone dropped the hint, what to do)."""
        return cls(exc.message, exc.hint, code=exc.code)


def error_document(exc: ActionableError) -> dict[str, Any]:
    """What `--json` prints when a command fails: {"ok": false, "error": {code, message, hint}}, the error in
    the worker protocol's shape (hexstudio/shared/errors.py: error_fields)."""
    return {"ok": False, "error": exc.fields()}


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_workspace_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help='workspace folder (default: $HEXSTUDIO_WORKSPACE, else settings.json\'s "workspace", else '
        "~/hexstudio-workspace: the studio's)",
    )


def set_action(
    p: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int], *, workspace: bool = False
) -> None:
    """A command's last lines: the --workspace flag (when it takes one), --json, and the function it runs."""
    if workspace:
        add_workspace_flag(p)
    add_json_flag(p)
    p.set_defaults(func=func)


def workspace_from(args: argparse.Namespace) -> Workspace:
    """--workspace, else the studio's own choice (hexstudio.core.paths.default_workspace): the runs the window
    shows."""
    given = getattr(args, "workspace", None)
    ws = Workspace(given) if given is not None else Workspace.chosen()
    if ws.root.exists() and not ws.root.is_dir():
        where = "--workspace" if given is not None else '$HEXSTUDIO_WORKSPACE or settings.json\'s "workspace"'
        raise CliError(
            f"The workspace {ws.root} is a file, not a folder.",
            f"Check {where}: it names the folder that holds runs/ and suites/.",
            exit_code=EXIT_USAGE,
        )
    return ws


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def eprint(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def read_token(what: str, page: str, command: str, from_stdin: bool) -> str:
    """An API token from a hidden prompt, or the first line of standard input; checked for the obvious slips."""
    if from_stdin:
        token = sys.stdin.readline()
    else:
        if not sys.stdin.isatty():
            raise CliError(
                "No terminal to ask the token on.", f"Pipe it in instead: `{command} --stdin < token.txt`."
            )
        token = getpass.getpass(f"{what} (from {page}; not shown): ")
    token = token.strip()
    if not token:
        raise CliError("No token was given.", f"Copy your token from {page} and run `{command}` again.")
    if any(c.isspace() for c in token):
        article = "an" if what[:1] in "AEIOU" else "a"
        raise CliError(
            f"That does not look like {article} {what} (it contains spaces or line breaks).",
            f"Copy just the token from {page} (one line), then run `{command}` again.",
        )
    return token


def print_token_status(
    args: argparse.Namespace, st: dict[str, Any], sentence: str, notes: Sequence[str] = ()
) -> int:
    """`hexstudio aihub|hf status`: where a token is found (never the token itself): the status as JSON, else the
    sentence, the keyring's error if there was one, and the notes. Exit status 1 when no token is found."""
    if args.json:
        print_json({"ok": True, **st})
    else:
        print(sentence)
        if st["keyring_error"]:
            print(f"(keyring: {st['keyring_error']})")
        for line in notes:
            print(line)
    return EXIT_OK if st["found"] else EXIT_FAILED


def number_in(kind: type, lo: float, hi: float) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` (int or float) from lo to hi, else a usage error naming the range
    (argparse prints it and exits 2: no traceback)."""

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {'whole ' if kind is int else ''}number"
            ) from None
        if v != v or not lo <= v <= hi:
            span = f"{int(lo)} to {int(hi)}" if kind is int else f"{lo:g} to {hi:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {span}")
        return v

    parse.__name__ = kind.__name__
    return parse


def int_in(lo: int, hi: int) -> Callable[[str], Any]:
    """A whole number from lo to hi (number_in)."""
    return number_in(int, lo, hi)


def setting_range(name: str) -> Callable[[str], Any]:
    """An argparse type for the run setting `name`: a whole number in the registry's range (docs/settings.md)."""
    from hexstudio.shared.run_settings import SETTINGS

    lo, hi = SETTINGS[name].range or (-(1 << 62), 1 << 62)
    return int_in(int(lo), int(hi))


def add_shape_flags(
    p: argparse.ArgumentParser, context_help: str, context_flags: Sequence[str] = ("--context-length",)
) -> None:
    """--context-length, --ar-n and --parts: the graph shapes of a run, each None (the run default) unless given."""
    p.add_argument(
        *context_flags,
        dest="context_length",
        type=setting_range("context_length"),
        default=None,
        help=context_help,
    )
    p.add_argument(
        "--ar-n",
        type=setting_range("ar_n"),
        default=None,
        help="prompt processor length (default: the run default)",
    )
    p.add_argument(
        "--parts",
        type=setting_range("parts"),
        default=None,
        help="parts (default: the run default; auto by model size)",
    )


def add_actions(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str, help: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """A command that takes an ACTION (`hexstudio board add ...`): the parsers of its actions go on what this
    returns. The action lands in args.<command>_command, where main's log line looks for it."""
    p = sub.add_parser(command, help=help)
    return p.add_subparsers(dest=f"{command.replace('-', '_')}_command", metavar="ACTION", required=True)
