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

from hexstudio.cli.common import EXIT_USAGE, CliError


def add_ssh_flags(p: argparse.ArgumentParser) -> None:
    """How to reach a machine over SSH (a board or a worker host): --host, --port, --user, --auth, --key."""
    p.add_argument(
        "--host", required=True, help="host name, IP, or the ~/.ssh/config alias (auth ssh_config)"
    )
    p.add_argument("--port", type=int, default=22)
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


def read_password(prompt: str, from_stdin: bool) -> str:
    """A password from the first line of standard input or a hidden prompt; an empty one is refused."""
    pw = sys.stdin.readline().rstrip("\n") if from_stdin else getpass.getpass(prompt)
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
