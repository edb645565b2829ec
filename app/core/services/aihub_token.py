"""Where the Compile stage finds the Qualcomm AI Hub API token, and storing or removing HexStudio's own copy:
one answer for `hexstudio aihub ...` and the Compile page. The token itself is never returned or printed.

Order (the compile worker's, workers/aihub.py): HexStudio's keyring entry (passed to the worker by
environment), else $HEXSTUDIO_AIHUB_TOKEN, else the qai_hub client's own INI ($QAIHUB_CLIENT_INI or
~/.qai_hub/client.ini, the rule of qai_hub.api_utils.get_config_path).
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any

from app.core import secrets

TOKEN_PAGE = "https://app.aihub.qualcomm.com/account/"


def client_ini_path() -> Path:
    """Where the qai_hub client reads its INI."""
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
    """Where a token is found, in the Compile stage's order; never the token itself."""
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


def describe(st: dict[str, Any]) -> str:
    """One sentence: where the token the Compile stage would use is, or what to do when there is none."""
    if st["source"] == "keyring":
        where = "in HexStudio's keyring entry"
    elif st["source"] == "environment":
        where = "in $HEXSTUDIO_AIHUB_TOKEN"
    elif st["source"] == "client.ini":
        where = f"in {st['client_ini']} (the qai_hub client's own file)"
    else:
        return ("No AI Hub token found: not in the keyring, not in $HEXSTUDIO_AIHUB_TOKEN, and "
                f"{st['client_ini']} has none. Paste yours on the Compile page or run `hexstudio aihub login` "
                f"(it is on {TOKEN_PAGE}).")
    extra = " (client.ini also has one; the keyring's is used)" if st["keyring"] and st["client_ini_has_token"] \
        else ""
    return f"An AI Hub token is stored {where}{extra}."


def store_token(token: str) -> dict[str, Any]:
    """Keep the token in the keyring (raises SecretStoreError when there is no usable keyring)."""
    secrets.set_secret(secrets.AIHUB_TOKEN, token)
    return token_status()


def remove_token() -> tuple[bool, dict[str, Any]]:
    """Remove HexStudio's keyring copy: (whether there was one, the status after)."""
    had = bool(secrets.get_secret(secrets.AIHUB_TOKEN))
    secrets.delete_secret(secrets.AIHUB_TOKEN)
    return had, token_status()
