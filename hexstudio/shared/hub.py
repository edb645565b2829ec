"""Hugging Face's failures as errors a person can act on, and the token a request carries: the Model stage's
download (hexstudio/workers/model.py) and the studio's config.json look-up (hexstudio.core.hf) say the same things.
huggingface_hub is imported inside the functions that need it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hexstudio.shared.errors import ActionableError, find_cause, keyring_unread


class HubError(ActionableError):
    """A Hugging Face failure: `code` (gated_model, bad_token, model_not_found, network, disk_full, ...),
    message and what to do."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, code=code)


TOKEN_HINT = (
    "Create a read token at https://huggingface.co/settings/tokens and store it with "
    "`hexstudio hf login` (kept in the keyring), or run `hf auth login`."
)


def _is_network_error(e: BaseException) -> bool:
    names = {c.__name__ for c in type(e).__mro__}
    return bool(
        names
        & {
            "ConnectError",
            "ConnectionError",
            "ConnectTimeout",
            "ReadTimeout",
            "TimeoutException",
            "NetworkError",
            "RemoteProtocolError",
            "gaierror",
            "TimeoutError",
            "ConnectionResetError",
            "ConnectionRefusedError",
        }
    )


def hub_token() -> str | None:
    """The token this worker's huggingface_hub requests carry: $HF_TOKEN (the parent puts the one from
    `hexstudio hf login` there, hexstudio.core.hf), else huggingface_hub's own login, through its own helper."""
    try:
        from huggingface_hub import get_token

        return get_token() or None
    except Exception:  # a failed OIDC exchange, an unreadable token file: no token
        return None


def hub_error(
    exc: BaseException,
    model_id: str,
    revision: str | None = None,
    cache: Path | None = None,
    need_bytes: int | None = None,
    has_token: bool | None = None,
    keyring_error: str | None = None,
) -> HubError | None:
    """huggingface_hub's failures as errors a person can act on; None for anything not recognised.
    `keyring_error`: why the keyring could not be read for the token, where the caller asked it (a worker is told
    through its environment: keyring_unread)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = bool(hub_token()) if has_token is None else has_token
    unread = None if token else keyring_error or keyring_unread()
    # no token because the keyring could not be read: that, not "log in", is what to fix
    token_hint = f"HexStudio's keyring could not be read for the token: {unread}" if unread else TOKEN_HINT
    full = find_cause(exc, lambda e: isinstance(e, OSError) and e.errno == errno.ENOSPC)
    if full is not None:
        where = cache or Path(getattr(full, "filename", None) or "the Hugging Face cache")
        need = f" The model needs about {need_bytes / 1024**3:.1f} GiB there." if need_bytes else ""
        return HubError(
            "disk_full",
            f"The disk holding {where} is full: the download of {model_id} stopped.{need}",
            "Free space on that disk and run the Model stage again (the download resumes), or "
            "point HF_HOME at a bigger disk (export HF_HOME=/path/on/big/disk) before starting "
            "HexStudio. `hexstudio preflight --model ...` shows the space needed.",
        )
    denied = find_cause(exc, lambda e: isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EROFS))
    if denied is not None and not isinstance(exc, HfHubHTTPError):
        return HubError(
            "cache_not_writable",
            f"Cannot write the Hugging Face cache ({denied}).",
            "Check the permissions of the cache folder, or point HF_HOME at a folder you can write.",
        )
    if isinstance(exc, GatedRepoError):
        return HubError(
            "gated_model",
            f"{model_id} is a gated model: its licence must be accepted first"
            + ("" if token else ", and HexStudio has no Hugging Face token")
            + ".",
            f"Open https://huggingface.co/{model_id}, accept the licence with your account "
            "(approval can take a while for some models), then make sure HexStudio uses a token "
            f"of that account. {token_hint}",
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(
            "revision_not_found",
            f"{model_id} has no revision '{revision}'.",
            "Use a branch, tag or commit that exists (see the model's 'Files and versions' page).",
        )
    status = getattr(getattr(exc, "response", None), "status_code", None)
    server = str(getattr(exc, "server_message", "") or "")
    if (
        isinstance(exc, HfHubHTTPError)
        and status == 401
        and ("Invalid credentials" in server or "Invalid credentials" in str(exc))
    ):
        return HubError(
            "bad_token",
            "Hugging Face rejected the token (401: invalid credentials): it was "
            "revoked, expired or mistyped.",
            TOKEN_HINT,
        )
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            "model_not_found",
            f"Hugging Face has no model '{model_id}' that "
            + ("this token can see" if token else "can be read without logging in")
            + ": the id is wrong, or the model is private or gated.",
            "Check the spelling (owner/name) on https://huggingface.co/models. For a private or "
            f"gated model, use a token of an account with access. {token_hint}",
        )
    if isinstance(exc, HfHubHTTPError) and status == 401:
        return HubError("bad_token", f"Hugging Face refused the request (401): {server or exc}.", TOKEN_HINT)
    if isinstance(exc, HfHubHTTPError) and status == 403:
        return HubError(
            "token_forbidden",
            f"The Hugging Face token may not read {model_id} (403 Forbidden"
            + (f": {server}" if server else "")
            + ").",
            "A fine-grained token needs 'Read access to contents of all public gated repos you can "
            "access' (or a plain read token). " + TOKEN_HINT,
        )
    if isinstance(exc, HfHubHTTPError) and status == 429:
        return HubError(
            "rate_limited",
            "Hugging Face is rate-limiting this machine (429 Too Many Requests).",
            "Wait a few minutes and run the Model stage again (the download resumes); logging in "
            "with a token raises the limit.",
        )
    if isinstance(exc, HfHubHTTPError) and status is not None and status >= 500:
        return HubError(
            "hub_unavailable",
            f"Hugging Face answered with a server error ({status}).",
            "The hub is having trouble: try again later (https://status.huggingface.co).",
        )
    proxy = find_cause(exc, lambda e: "ProxyError" in {c.__name__ for c in type(e).__mro__})
    if proxy is not None:  # httpx's ProxyError is a TransportError, not a NetworkError: a proxy said no
        return HubError(
            "proxy",
            f"The proxy refused the connection to Hugging Face for {model_id} ({proxy}).",
            "Check HTTPS_PROXY: a proxy that asks for a login needs it in the address "
            "(http://user:password@proxy:port), or set NO_PROXY=huggingface.co to go around it. Then run "
            "the Model stage again.",
        )
    if isinstance(exc, LocalEntryNotFoundError) or find_cause(exc, _is_network_error) is not None:
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            return HubError(
                "offline",
                f"{model_id} is not in the local Hugging Face cache and offline mode is on (HF_HUB_OFFLINE).",
                "Unset HF_HUB_OFFLINE to download it, or give a local folder with the model.",
            )
        return HubError(
            "network",
            f"Cannot reach huggingface.co to download {model_id} (network error), and it "
            "is not in the local cache.",
            "Check the internet connection, proxy (HTTPS_PROXY) and firewall, then run the Model stage "
            "again: the download resumes where it stopped. Or give a local folder with the model.",
        )
    return None


def model_spec_problem(model: str) -> tuple[str, str] | None:
    """Why `model` names no model a run can start from: not a built-in one, not a folder on this machine, not a
    Hugging Face id (owner/name, as the Hub spells them); (the message, what to do), None when it can. Asked when a
    run is made (its model cannot change on resume) and again by the Model stage (a folder may have gone since)."""
    from hexstudio.shared.data import BUILTIN_MODELS

    example = (
        f"Give {next(iter(BUILTIN_MODELS))}, a Hugging Face id like meta-llama/Llama-3.1-8B-Instruct, or a folder "
        "holding config.json and *.safetensors."
    )
    if model in BUILTIN_MODELS:
        return None
    if model.startswith("builtin:"):
        return (
            f"There is no built-in model '{model}'.",
            f"The built-in models are {', '.join(BUILTIN_MODELS)}.",
        )
    if Path(model).expanduser().is_dir():
        return None
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        return f"'{model}' is neither a folder nor a Hugging Face id (owner/name).", example
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError as exc:
        return f"'{model}' is no Hugging Face id: {exc}", example
    return None
