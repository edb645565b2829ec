"""Hugging Face conventions, in one place: which token, which cache, which revision.

The token: the one stored with `hexstudio hf login` (the keyring) wins; else Hugging Face's own login, found
by huggingface_hub's own helper (`get_token()`: $HF_TOKEN, then the token file `hf auth login` writes under
HF_HOME). `hexstudio model inspect`, preflight and the Model stage's download all take it from here (the
stage's worker gets it by environment, hexstudio.core.stage_api.worker_env). The token itself is never printed.

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

from hexstudio.core import secrets
from hexstudio.shared.errors import ActionableError
from hexstudio.shared.hub import hub_error

TOKEN_PAGE = "https://huggingface.co/settings/tokens"
SOURCE_WORDS = {
    "keyring": "HexStudio's keyring entry (`hexstudio hf login`)",
    "environment": "$HF_TOKEN",
    "hf login": "huggingface_hub's own login (`hf auth login`)",
}


@dataclass(frozen=True)
class HfToken:
    value: str | None
    source: str | None  # "keyring", "environment" or "hf login", or None when there is no token
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
    secrets.remember_secret(tok)  # not from the keyring, but the studio log scrubs it all the same
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
    return {
        "found": t.found,
        "source": t.source,
        "keyring": in_keyring,
        "environment": in_env,
        "hf_login": in_file,
        "token_file": str(token_file()),
        "keyring_error": t.keyring_error,
    }


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


def weights_cached(model: str, revision: str | None = None) -> bool:
    """Whether the model's safetensors are all in the Hugging Face cache already (its index and every shard
    it names, or the one model.safetensors): then a run downloads nothing of size."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> str | None:
        try:
            got = try_to_load_from_cache(model, name, cache_dir=hub_cache(), revision=revision)
        except (ValueError, OSError):  # not a repository id
            return None
        return got if isinstance(got, str) else None

    index = cached("model.safetensors.index.json")
    if index is None:
        return cached("model.safetensors") is not None
    try:
        shards = set(json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return bool(shards) and all(cached(str(f)) is not None for f in shards)


def cached_blob_bytes(model: str) -> int:
    """The bytes of the model's files in the Hugging Face cache, finished or not (`.incomplete`): what a download
    that stopped part-way has already, and resumes from (any revision's: a lower bound of nothing)."""
    from huggingface_hub.file_download import repo_folder_name

    try:
        blobs = hub_cache() / repo_folder_name(repo_id=model, repo_type="model") / "blobs"
        return sum(f.stat().st_size for f in blobs.iterdir() if f.is_file())
    except (OSError, ValueError):  # not there yet, or not a repository id
        return 0


def token_file() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_TOKEN_PATH)


# -- config.json before the download -----------------------------------------------------------


class HubConfigError(ActionableError):
    """A model's config.json cannot be fetched from Hugging Face: message and hint."""


REACH_TIMEOUT_S = 2.5  # one connect to the Hub (or the proxy) before a download is tried


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as it is now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE")
    return _truthy(env) if env is not None else bool(constants.HF_HUB_OFFLINE)


def hub_unreachable(timeout: float = REACH_TIMEOUT_S) -> str | None:
    """None when the Hub (HF_ENDPOINT, or the HTTPS proxy when one is set) takes a TCP connection within
    `timeout` seconds; else why not, in words. huggingface_hub retries an unreachable host with back-off
    for ~20 s before it gives up; one connect tells the same in a moment (issue 32)."""
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    proxy = next(
        (
            os.environ[k]
            for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
            if os.environ.get(k)
        ),
        None,
    )
    no_proxy = (os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or "").replace(" ", "").split(",")
    u = urlparse(endpoint)
    host = u.hostname or "huggingface.co"
    if (
        proxy
        and "*" not in no_proxy
        and not any(  # NO_PROXY=*: no host goes through the proxy
            n and (host == n.lstrip(".") or host.endswith("." + n.lstrip("."))) for n in no_proxy
        )
    ):
        u = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    target = (u.hostname or host, u.port or (443 if u.scheme == "https" else 80))
    result: list[str | None] = []

    def attempt() -> None:  # in a thread: a name look-up does not heed socket time-outs
        try:
            socket.create_connection(target, timeout=timeout).close()
            result.append(None)
        except OSError as exc:
            result.append(exc.strerror or str(exc) or type(exc).__name__)

    t = threading.Thread(target=attempt, daemon=True, name="hub-reach")
    t.start()
    t.join(timeout + 0.5)
    where = f"{target[0]}:{target[1]}" + (" (the proxy)" if target[0] != host else "")
    if not result:
        return f"no answer from {where} within {timeout:.1f} s"
    return None if result[0] is None else f"{where}: {result[0]}"


def fetch_config(model: str, revision: str | None = None) -> dict[str, Any]:
    """config.json of a Hugging Face model at `revision` (a branch, tag or commit; None: main), with the
    token above, into huggingface_hub's cache. Raises HubConfigError saying what to do.

    Offline (HF_HUB_OFFLINE, or the Hub not reachable within a few seconds) only the local cache is read,
    so the clear error comes at once instead of after huggingface_hub's ~20 s of retries."""
    token = resolve_token()
    at = f" at revision '{revision}'" if revision else ""
    offline = hub_offline()
    why = None if offline else hub_unreachable()
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(
            model,
            "config.json",
            revision=revision or None,
            token=token.value or None,
            local_files_only=offline or why is not None,
        )
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return data
    except Exception as exc:
        if why is not None:
            raise HubConfigError(
                f"Cannot read config.json of '{model}'{at}: the Hugging Face Hub cannot be reached ({why}), and "
                f"the model is not in the local Hugging Face cache ({hub_cache()}).",
                "Check the internet connection, proxy (HTTPS_PROXY) and firewall; or give a local folder with the "
                "model. To work from the cache only, set HF_HUB_OFFLINE=1.",
            ) from None
        mapped = hub_error(
            exc, model, revision, hub_cache(), has_token=token.found, keyring_error=token.keyring_error
        )
        if mapped is not None:
            raise HubConfigError(
                f"Cannot read config.json of '{model}'{at}: {mapped.message}", mapped.hint
            ) from None
        raise HubConfigError(
            f"Cannot read config.json of '{model}'{at}: {type(exc).__name__}: {exc}",
            "Check the model id and your network, or give a local folder.",
        ) from None
