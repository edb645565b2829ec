"""Where the Compile stage finds the Qualcomm AI Hub API token, and storing or removing HexStudio's own copy:
one answer for `hexstudio aihub ...` and the Compile page. The token itself is never returned or printed.

The one rule (TOKEN_ORDER), the same for the Compile stage (hexstudio.core.stage_api.worker_env passes the keyring's
token to the worker as $HEXSTUDIO_AIHUB_TOKEN, replacing one set in the environment), `hexstudio bundle
devices`, `aihub login --status` and the Compile page: HexStudio's keyring entry, else $HEXSTUDIO_AIHUB_TOKEN,
else the qai_hub client's own INI ($QAIHUB_CLIENT_INI or ~/.qai_hub/client.ini, the rule of
qai_hub.api_utils.get_config_path). A stale variable never hides a good stored token (issue 27).
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any

from hexstudio.core import secrets

TOKEN_PAGE = "https://app.aihub.qualcomm.com/account/"
TOKEN_ORDER = ("keyring", "environment", "client.ini")
ORDER_TEXT = "the keyring, then $HEXSTUDIO_AIHUB_TOKEN, then the qai_hub client's client.ini"


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
    has = {"keyring": in_keyring, "environment": in_env, "client.ini": in_ini}
    source = next((s for s in TOKEN_ORDER if has[s]), None)
    return {
        "found": source is not None,
        "source": source,
        "order": list(TOKEN_ORDER),
        "unused": [s for s in TOKEN_ORDER if has[s] and s != source],
        "keyring": in_keyring,
        "environment": in_env,
        "client_ini": str(ini),
        "client_ini_has_token": in_ini,
        "keyring_error": keyring_error,
        "keyring_backend": secrets.backend_info(),
    }


def describe(st: dict[str, Any]) -> str:
    """One sentence: where the token the Compile stage would use is, or what to do when there is none."""
    if st["source"] == "keyring":
        where = "in HexStudio's keyring entry"
    elif st["source"] == "environment":
        where = "in $HEXSTUDIO_AIHUB_TOKEN"
    elif st["source"] == "client.ini":
        where = f"in {st['client_ini']} (the qai_hub client's own file)"
    else:
        return (
            "No AI Hub token found: not in the keyring, not in $HEXSTUDIO_AIHUB_TOKEN, and "
            f"{st['client_ini']} has none. Paste yours on the Compile page or run `hexstudio aihub login` "
            f"(it is on {TOKEN_PAGE})."
        )
    names = {
        "keyring": "the keyring",
        "environment": "$HEXSTUDIO_AIHUB_TOKEN",
        "client.ini": st["client_ini"],
    }
    unused = st.get("unused") or []
    extra = (
        f" ({' and '.join(names[u] for u in unused)} also {'has' if len(unused) == 1 else 'have'} one, not "
        "used)"
        if unused
        else ""
    )
    return f"The AI Hub token used is the one {where}{extra}. Order: {ORDER_TEXT}."


def store_token(token: str) -> dict[str, Any]:
    """Keep the token in the keyring (raises SecretStoreError when there is no usable keyring)."""
    secrets.set_secret(secrets.AIHUB_TOKEN, token)
    return token_status()


def remove_token() -> tuple[bool, dict[str, Any]]:
    """Remove HexStudio's keyring copy: (whether there was one, the status after)."""
    had = bool(secrets.get_secret(secrets.AIHUB_TOKEN))
    secrets.delete_secret(secrets.AIHUB_TOKEN)
    return had, token_status()
