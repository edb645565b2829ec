"""`hexstudio hf login|logout|status`: the Hugging Face token for gated and private models, kept in the keyring.

One token source for everything (hexstudio.core.hf.resolve_token): this keyring entry, else huggingface_hub's own
login ($HF_TOKEN, `hf auth login`'s token file). `model inspect`, preflight and the Model stage's download use it;
the stage passes it to its worker by environment (never through a file). The token itself is never printed.
"""

from __future__ import annotations

import argparse
from typing import Any

from hexstudio.cli.common import CliError, add_actions, print_json, print_token_status, read_token, set_action
from hexstudio.core import hf, secrets
from hexstudio.core.hf import TOKEN_PAGE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = add_actions(
        sub, "hf", help="Hugging Face token (gated/private models): store it in the keyring, check, remove"
    )
    li = s.add_parser("login", help="store a Hugging Face read token in the keyring (asked without echo)")
    li.add_argument("--stdin", action="store_true", help="read the token from standard input (first line)")
    set_action(li, cmd_login)
    lo = s.add_parser("logout", help="remove the Hugging Face token from the keyring")
    set_action(lo, cmd_logout)
    st = s.add_parser(
        "status", help="whether a token is found, and where (keyring, $HF_TOKEN or hf's own login)"
    )
    set_action(st, cmd_status)


def token_status() -> dict[str, Any]:
    return hf.token_status()


def _describe(st: dict[str, Any]) -> str:
    where = hf.SOURCE_WORDS.get(str(st["source"]))
    if where is None:
        return (
            "No Hugging Face token found. Public models download without one; for a gated or private model "
            f"create a read token at {TOKEN_PAGE} and run `hexstudio hf login`."
        )
    also = [
        hf.SOURCE_WORDS[k]
        for k, flag in (("environment", st["environment"]), ("hf login", st["hf_login"]))
        if flag and k != st["source"]
    ]
    return (
        f"HexStudio uses the Hugging Face token in {where}"
        + (f" (also found, not used: {', '.join(also)})" if also else "")
        + "."
    )


def cmd_status(args: argparse.Namespace) -> int:
    st = token_status()
    return print_token_status(args, st, _describe(st))


def cmd_login(args: argparse.Namespace) -> int:
    token = read_token("Hugging Face token", TOKEN_PAGE, "hexstudio hf login", args.stdin)
    if not token.startswith("hf_"):
        raise CliError(
            "That does not look like a Hugging Face token (they start with 'hf_').",
            f"Copy a read token from {TOKEN_PAGE}, then run `hexstudio hf login` again.",
        )
    try:
        secrets.set_secret(secrets.HF_TOKEN, token)
    except secrets.SecretStoreError as exc:
        raise CliError(
            exc.message,
            f"{exc.hint} Or run `hf auth login`, whose stored token HexStudio's downloads also use.",
        ) from None
    if args.json:
        print_json({"ok": True, "stored": "keyring", **token_status()})
    else:
        from hexstudio.core.secrets import stored_where

        print(
            f"Hugging Face token stored {stored_where()}. The Model stage uses it for downloads from now on "
            "(`hexstudio hf logout` removes it)."
        )
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    try:
        had = bool(secrets.get_secret(secrets.HF_TOKEN))
        secrets.delete_secret(secrets.HF_TOKEN)
    except secrets.SecretStoreError as exc:
        raise CliError.of(exc) from None
    if args.json:
        print_json({"ok": True, "removed": had, **token_status()})
    else:
        print(
            "Hugging Face token removed from the keyring."
            if had
            else "There was no Hugging Face token in the keyring."
        )
    return 0
