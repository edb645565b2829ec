"""Machines the CLI reaches over SSH, boards (`hexstudio board`) and worker hosts (`hexstudio worker`): the flags
that say how to reach one, its settings entry, its password, and what a first connection does with a host key
it does not know yet."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.cli.common import EXIT_USAGE, CliError, number_in


def add_ssh_flags(p: argparse.ArgumentParser) -> None:
    """How to reach a machine over SSH (a board or a worker host): --host, --port, --user, --auth, --key."""
    p.add_argument(
        "--host", required=True, help="host name, IP, or the ~/.ssh/config alias (auth ssh_config)"
    )
    p.add_argument("--port", type=number_in(int, 1, 65535), default=22)
    p.add_argument("--user", default=None)
    p.add_argument("--auth", choices=("key", "agent", "ssh_config", "password"), default="key")
    p.add_argument("--key", dest="key_path", default=None, help="private key file (auth key)")


def ssh_config_from(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The settings entry of a machine reached over SSH, from add_ssh_flags' flags (and `extra`): the key file
    made absolute, the alias kept for auth ssh_config, the values not given left out."""
    cfg: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "user": args.user,
        "auth": args.auth,
        **extra,
    }
    if args.key_path:
        cfg["key_path"] = str(Path(args.key_path).expanduser())
    if args.auth == "ssh_config":
        cfg["ssh_alias"] = args.host
    return {k: v for k, v in cfg.items() if v is not None}


def kept_but_unreachable(exc: CliError, entry: str, command: str, check: str, name: str) -> CliError:
    """A machine's entry saved, its first connection failed: the entry stays (one that is off now is still worth
    keeping), and the error says so and how to check it again or take it back out. `entry` is "Board evk is
    added" or the like; `command` the CLI group (board, worker); `check` its checking action (probe, check)."""
    return CliError(
        f"{entry}, but connecting to it failed: {exc.message}",
        f"{exc.hint or 'Check the machine and its network.'} Then check it with `hexstudio {command} {check} "
        f"{name}`, or take the entry back out with `hexstudio {command} remove {name}`.",
        exc.exit_code,
        code=exc.code,
    )


def check_ssh_flags(args: argparse.Namespace, what: str) -> None:
    """What add_ssh_flags' flags must say before a machine is saved (`what`: "board", "worker host"): a host
    without spaces, and for auth key a key file that is there. Nothing is saved when one is wrong."""
    host = str(args.host or "").strip()
    if not host or any(c.isspace() for c in host):
        raise CliError(
            f"--host {args.host!r} is no host name: the {what} was not saved.",
            "Give its host name, IP address or ~/.ssh/config alias (--auth ssh_config), e.g. --host 192.168.1.50.",
            exit_code=EXIT_USAGE,
        )
    if args.auth != "key":
        return
    if not args.key_path:
        if _config_identity_files(str(args.host)):
            return  # the key files ~/.ssh/config names for the host, as the connection uses them
        raise CliError(
            f"--auth key needs --key (the private key file), and ~/.ssh/config names no IdentityFile for "
            f"{args.host}: the {what} was not saved.",
            "Give --key ~/.ssh/id_ed25519, or use --auth agent (ssh-agent) or --auth ssh_config.",
            exit_code=EXIT_USAGE,
        )
    if not Path(args.key_path).expanduser().is_file():
        raise CliError(
            f"The key file {args.key_path} does not exist: the {what} was not saved.",
            "Check the path (`ls ~/.ssh`), or make a key with `ssh-keygen -t ed25519` and copy it to the "
            f"{what} with `ssh-copy-id`.",
            exit_code=EXIT_USAGE,
        )


def _config_identity_files(host: str) -> list[str]:
    """The IdentityFile entries ~/.ssh/config gives `host` (what key auth without a key_path connects with)."""
    from hexstudio.core.device.connect import resolve
    from hexstudio.shared.errors import ActionableError

    try:
        return list(resolve({"host": host, "auth": "key"})["identity_files"])
    except ActionableError:  # ~/.ssh/config cannot be read: the connection would say so too
        return []


def read_password(prompt: str, from_stdin: bool, command: str) -> str:
    """A password from the first line of standard input or a hidden prompt (only on a terminal: elsewhere getpass
    reads a pipe with the password echoed, or fails); an empty one is refused."""
    if not from_stdin and not sys.stdin.isatty():
        raise CliError(
            "No terminal to ask the password on.",
            f"Pipe it in instead: `{command} --stdin < password.txt` (the first line is the password).",
            exit_code=EXIT_USAGE,
        )
    # a password file saved on Windows ends its line with CRLF: the \r is not part of the password
    pw = sys.stdin.readline().rstrip("\r\n") if from_stdin else getpass.getpass(prompt)
    if not pw:
        raise CliError("Empty password: nothing stored.", None, exit_code=EXIT_USAGE)
    return pw


def add_trust_flag(p: argparse.ArgumentParser, what: str = "board") -> None:
    """--trust SHA256:...: the host key a first connection accepts without asking (what: board | host)."""
    whose = "board's host" if what == "board" else f"{what}'s"
    p.add_argument(
        "--trust",
        metavar="SHA256:...",
        default=None,
        help=f"trust the {whose} key on first contact if its fingerprint is exactly this",
    )


async def open_named_board(name: str, args: argparse.Namespace) -> Any:
    """The saved board `name`, connected as the CLI connects (an unknown host key: --trust, else asked on a
    terminal); a failure is a CliError, an unknown key's hint naming the --trust to pass."""
    from hexstudio.core.device.board import open_board
    from hexstudio.core.device.connect import HostKeyUnknown
    from hexstudio.core.device.errors import BoardError
    from hexstudio.core.settings import Settings

    try:
        return await open_board(name, Settings.load(), trust=host_key_prompt(args))
    except BoardError as exc:
        hint = (
            f"{exc.hint} Then pass --trust {exc.fingerprint}."
            if isinstance(exc, HostKeyUnknown)
            else exc.hint
        )
        raise CliError(exc.message, hint) from None


def host_key_prompt(args: argparse.Namespace, what: str = "board") -> Callable[[str, int, str, str], bool]:
    """How a first SSH connection decides on an unknown host key: the fingerprint given with --trust, else a
    question on a terminal (never with --json), else no."""
    want = getattr(args, "trust", None)

    def ask(host: str, port: int, key_type: str, fp: str) -> bool:
        if want:
            return bool(fp == want)
        if sys.stdin.isatty() and not getattr(args, "json", False):
            ans = input(
                f"First connection to {host}:{port}. Host key {key_type} {fp}.\n"
                f"Compare with the {what}'s `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`. "
                "Trust it? [y/N] "
            )
            return ans.strip().lower() in ("y", "yes")
        return False

    return ask
