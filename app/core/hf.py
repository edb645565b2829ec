"""Hugging Face conventions, in one place: which token, which cache, which revision.

The token: the one stored with `hexstudio hf login` (the keyring) wins; else Hugging Face's own login, found
by huggingface_hub's own helper (`get_token()`: $HF_TOKEN, then the token file `hf auth login` writes under
HF_HOME). `hexstudio model inspect`, preflight and the Model stage's download all take it from here (the
stage's worker gets it by environment, app.core.pipeline.worker_env). The token itself is never printed.

The cache: huggingface_hub's constants (HF_HOME, HF_HUB_CACHE, HF_TOKEN_PATH), never a path built by hand,
so HexStudio looks where `hf download` and transformers look.

huggingface_hub is imported inside functions: it is not needed to start the studio.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import secrets
from workers.shared.errors import ActionableError
from workers.shared.hub import hub_error

TOKEN_PAGE = "https://huggingface.co/settings/tokens"
SOURCES = ("keyring", "environment", "hf login")
SOURCE_WORDS = {"keyring": "HexStudio's keyring entry (`hexstudio hf login`)",
                "environment": "$HF_TOKEN",
                "hf login": "huggingface_hub's own login (`hf auth login`)"}


@dataclass(frozen=True)
class HfToken:
    value: str | None
    source: str | None          # one of SOURCES, or None when there is no token
    keyring_error: str | None = None

    @property
    def found(self) -> bool:
        return bool(self.value)


def _hf_own_token() -> tuple[str | None, str | None]:
    """huggingface_hub's own token ($HF_TOKEN, then its token file), through its own helper."""
    try:
        from huggingface_hub import get_token

        tok = get_token()
    except Exception:  # an OIDC exchange that failed, a token file that cannot be read: no token
        tok = None
    if not tok:
        return None, None
    env = (os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or "").strip()
    return tok, "environment" if env and env == tok.strip() else "hf login"


def resolve_token() -> HfToken:
    """The token every Hugging Face request of HexStudio uses: keyring first, else huggingface_hub's own."""
    err = None
    try:
        stored = secrets.get_secret(secrets.HF_TOKEN)
    except secrets.SecretStoreError as exc:
        stored, err = None, str(exc)
    if stored:
        return HfToken(stored, "keyring", err)
    tok, source = _hf_own_token()
    return HfToken(tok, source, err)


def token_status() -> dict[str, Any]:
    """Where tokens are found (never the token): for `hexstudio hf status` and the GUI."""
    t = resolve_token()
    try:
        in_keyring = bool(secrets.get_secret(secrets.HF_TOKEN))
    except secrets.SecretStoreError:
        in_keyring = False
    in_env = bool((os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or "").strip())
    try:
        in_file = bool(token_file().read_text(encoding="utf-8").strip())
    except OSError:
        in_file = False
    return {"found": t.found, "source": t.source, "keyring": in_keyring, "environment": in_env,
            "hf_login": in_file, "token_file": str(token_file()), "keyring_error": t.keyring_error}


def worker_env_token() -> dict[str, str]:
    """What a worker's environment needs so that huggingface_hub there uses this same token."""
    t = resolve_token()
    return {"HF_TOKEN": t.value} if t.value else {}


# -- the cache -----------------------------------------------------------------------------------

def hf_home() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HOME)


def hub_cache() -> Path:
    """Where downloads land (HF_HUB_CACHE, by default $HF_HOME/hub): the folder whose disk must hold them."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def token_file() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_TOKEN_PATH)


# -- config.json before the download -----------------------------------------------------------

class HubConfigError(ActionableError):
    """A model's config.json cannot be fetched from Hugging Face: message and hint."""


def fetch_config(model: str, revision: str | None = None) -> dict[str, Any]:
    """config.json of a Hugging Face model at `revision` (a branch, tag or commit; None: main), with the
    token above, into huggingface_hub's cache. Raises HubConfigError saying what to do."""
    token = resolve_token()
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model, "config.json", revision=revision or None, token=token.value or None)
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return data
    except Exception as exc:
        mapped = hub_error(exc, model, revision, hub_cache(), has_token=token.found)
        at = f" at revision '{revision}'" if revision else ""
        if mapped is not None:
            raise HubConfigError(f"Cannot read config.json of '{model}'{at}: {mapped.message}", mapped.hint) \
                from None
        raise HubConfigError(f"Cannot read config.json of '{model}'{at}: {type(exc).__name__}: {exc}",
                             "Check the model id and your network, or give a local folder.") from None
