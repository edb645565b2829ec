"""`hexstudio aihub login|logout|status`: the Qualcomm AI Hub API token, kept only in the keyring.

The Compile stage takes the token from the keyring (passed to the worker by environment, never written
to a file), else from an existing qai_hub `client.ini` ($QAIHUB_CLIENT_INI or ~/.qai_hub/client.ini).
The token itself is never printed.
"""

from __future__ import annotations

import argparse

from hexstudio.cli.common import CliError, add_actions, print_json, print_token_status, read_token, set_action
from hexstudio.core import secrets
from hexstudio.core.services import aihub_token


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_actions(sub, "aihub", help="Qualcomm AI Hub API token: store it in the keyring, check, remove")
    li = s.add_parser("login", help="store the AI Hub API token in the keyring (asked without echo)")
    li.add_argument("--stdin", action="store_true", help="read the token from standard input (first line)")
    li.add_argument(
        "--status",
        action="store_true",
        help="only tell whether a token is found, where, the order the sources are read in, and the "
        "keyring backend",
    )
    set_action(li, cmd_login)
    lo = s.add_parser("logout", help="remove the AI Hub API token from the keyring")
    set_action(lo, cmd_logout)
    st = s.add_parser(
        "status",
        help="whether a token is found and where (the keyring, then "
        "$HEXSTUDIO_AIHUB_TOKEN, then client.ini), and the keyring backend",
    )
    set_action(st, cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    st = aihub_token.token_status()
    kb = st["keyring_backend"]
    notes = [f"Keyring: {kb['name']} ({kb['what']})."]
    if kb["warning"]:
        notes.append(f"warning: {kb['warning']}")
    return print_token_status(args, st, aihub_token.describe(st), notes)


def _read_token(from_stdin: bool) -> str:
    return read_token("AI Hub API token", aihub_token.TOKEN_PAGE, "hexstudio aihub login", from_stdin)


def cmd_login(args: argparse.Namespace) -> int:
    if args.status:
        return cmd_status(args)
    token = _read_token(args.stdin)
    try:
        st = aihub_token.store_token(token)
    except secrets.SecretStoreError as exc:
        raise CliError(
            exc.message,
            (f"{exc.hint} " if exc.hint else "")
            + "Or run `qai-hub configure --api_token TOKEN`, which writes "
            f"{aihub_token.client_ini_path()} (HexStudio reads it too).",
        ) from None
    if args.json:
        print_json({"ok": True, "stored": "keyring", **st})
    else:
        from hexstudio.core.secrets import stored_where

        print(
            f"AI Hub token stored {stored_where(st['keyring_backend'])}. The Compile stage uses it from now on "
            "(`hexstudio aihub logout` removes it)."
        )
        if st["keyring_backend"]["warning"]:
            print(f"warning: {st['keyring_backend']['warning']}")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    try:
        had, st = aihub_token.remove_token()
    except secrets.SecretStoreError as exc:
        raise CliError.of(exc) from None
    if args.json:
        print_json({"ok": True, "removed": had, **st})
        return 0
    print("AI Hub token removed from the keyring." if had else "There was no AI Hub token in the keyring.")
    if st["client_ini_has_token"]:
        print(
            f"Note: {st['client_ini']} still holds a token, which the Compile stage would use; "
            "delete that file to stop it."
        )
    return 0
