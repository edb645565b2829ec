"""`hexstudio aihub login|logout|status`: the Qualcomm AI Hub API token, kept only in the keyring.

The Compile stage takes the token from the keyring (passed to the worker by environment, never written
to a file), else from an existing qai_hub `client.ini` ($QAIHUB_CLIENT_INI or ~/.qai_hub/client.ini).
The token itself is never printed.
"""

from __future__ import annotations

import argparse
import configparser
import os
from pathlib import Path
from typing import Any

from app.core import secrets
from app.core.cli.common import CliError, add_json_flag, print_json, read_token

TOKEN_PAGE = "https://app.aihub.qualcomm.com/account/"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("aihub", help="Qualcomm AI Hub API token: store it in the keyring, check, remove")
    s = p.add_subparsers(dest="aihub_command", metavar="ACTION", required=True)
    li = s.add_parser("login", help="store the AI Hub API token in the keyring (asked without echo)")
    li.add_argument("--stdin", action="store_true", help="read the token from standard input (first line)")
    li.add_argument("--status", action="store_true", help="only tell whether a token is found, and where")
    add_json_flag(li)
    li.set_defaults(func=cmd_login)
    lo = s.add_parser("logout", help="remove the AI Hub API token from the keyring")
    add_json_flag(lo)
    lo.set_defaults(func=cmd_logout)
    st = s.add_parser("status", help="whether a token is found, and where (keyring or client.ini)")
    add_json_flag(st)
    st.set_defaults(func=cmd_status)


def client_ini_path() -> Path:
    """Where the qai_hub client reads its INI (the same rule as qai_hub.api_utils.get_config_path)."""
    env = os.environ.get("QAIHUB_CLIENT_INI")
    return Path(env).expanduser() if env else Path.home() / ".qai_hub" / "client.ini"


def _ini_has_token(path: Path) -> bool:
    cp = configparser.ConfigParser()
    try:
        cp.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return False
    return bool(cp.has_section("api") and cp.get("api", "api_token", fallback="").strip())


def token_status() -> dict[str, Any]:
    """Where the Compile stage would find a token, in its order: keyring, $HEXSTUDIO_AIHUB_TOKEN,
    client.ini. Never the token itself."""
    keyring_error = None
    try:
        in_keyring = bool(secrets.get_secret(secrets.AIHUB_TOKEN))
    except secrets.SecretStoreError as exc:
        in_keyring, keyring_error = False, str(exc)
    in_env = bool(os.environ.get("HEXSTUDIO_AIHUB_TOKEN"))
    ini = client_ini_path()
    in_ini = ini.is_file() and _ini_has_token(ini)
    source = "keyring" if in_keyring else "environment" if in_env else "client.ini" if in_ini else None
    return {"found": source is not None, "source": source, "keyring": in_keyring, "environment": in_env,
            "client_ini": str(ini), "client_ini_has_token": in_ini, "keyring_error": keyring_error}


def _describe(st: dict[str, Any]) -> str:
    if st["source"] == "keyring":
        where = "in HexStudio's keyring entry"
    elif st["source"] == "environment":
        where = "in $HEXSTUDIO_AIHUB_TOKEN"
    elif st["source"] == "client.ini":
        where = f"in {st['client_ini']} (the qai_hub client's own file)"
    else:
        return ("No AI Hub token found: not in the keyring, not in $HEXSTUDIO_AIHUB_TOKEN, and "
                f"{st['client_ini']} has none. Store one with `hexstudio aihub login`.")
    extra = " (client.ini also has one; the keyring's is used)" if st["keyring"] and st["client_ini_has_token"] \
        else ""
    return f"An AI Hub token is stored {where}{extra}."


def cmd_status(args: argparse.Namespace) -> int:
    st = token_status()
    if args.json:
        print_json({"ok": True, **st})
    else:
        print(_describe(st))
        if st["keyring_error"]:
            print(f"(keyring: {st['keyring_error']})")
    return 0 if st["found"] else 1


def _read_token(from_stdin: bool) -> str:
    return read_token("AI Hub API token", TOKEN_PAGE, "hexstudio aihub login", from_stdin)


def cmd_login(args: argparse.Namespace) -> int:
    if args.status:
        return cmd_status(args)
    token = _read_token(args.stdin)
    try:
        secrets.set_secret(secrets.AIHUB_TOKEN, token)
    except secrets.SecretStoreError as exc:
        raise CliError(str(exc), "Or run `qai-hub configure --api_token TOKEN`, which writes "
                       f"{client_ini_path()} (HexStudio reads it too).") from None
    st = token_status()
    if args.json:
        print_json({"ok": True, "stored": "keyring", **st})
    else:
        print("AI Hub token stored in the keyring. The Compile stage uses it from now on "
              "(`hexstudio aihub logout` removes it).")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    try:
        had = bool(secrets.get_secret(secrets.AIHUB_TOKEN))
        secrets.delete_secret(secrets.AIHUB_TOKEN)
    except secrets.SecretStoreError as exc:
        raise CliError(str(exc)) from None
    st = token_status()
    if args.json:
        print_json({"ok": True, "removed": had, **st})
        return 0
    print("AI Hub token removed from the keyring." if had else "There was no AI Hub token in the keyring.")
    if st["client_ini_has_token"]:
        print(f"Note: {st['client_ini']} still holds a token, which the Compile stage would use; "
              "delete that file to stop it.")
    return 0
