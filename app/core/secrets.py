"""Secrets (AI Hub token, SSH and sudo passwords, HF token) live only in keyring.

One small interface. Tests set PYTHON_KEYRING_BACKEND to a file or null backend
(see tests/conftest.py); the studio uses the system keyring.
"""

from __future__ import annotations

import keyring
import keyring.errors

from workers.shared.errors import ActionableError

SERVICE = "hexstudio"

# Well-known secret names
AIHUB_TOKEN = "aihub:api_token"
HF_TOKEN = "huggingface:token"


def board_password_key(board: str) -> str:
    return f"board:{board}:ssh_password"


def key_passphrase_key(key_path: str) -> str:
    """An SSH key's passphrase, by the key file's absolute path: stored only when the person chooses to."""
    return f"ssh_key:{key_path}:passphrase"


def sudo_password_key(board: str) -> str:
    return f"board:{board}:sudo_password"


class SecretStoreError(ActionableError):
    pass


_SEEN: set[str] = set()   # every secret value this process read or stored: the studio log never shows them


def remember_secret(value: str | None) -> None:
    """Note a secret this process holds without the keyring (a sudo password typed once) so that the studio
    log (app.core.logs) scrubs it too."""
    if value:
        _SEEN.add(value)


def seen_secret_values() -> list[str]:
    return list(_SEEN)


def get_secret(name: str) -> str | None:
    try:
        value = keyring.get_password(SERVICE, name)
    except keyring.errors.KeyringError as exc:
        raise SecretStoreError(f"The keyring could not be read ({exc}). On WSL without a desktop keyring, "
                               "install `keyrings.alt` or set PYTHON_KEYRING_BACKEND.") from None
    remember_secret(value)
    return value


def set_secret(name: str, value: str) -> None:
    remember_secret(value)
    try:
        keyring.set_password(SERVICE, name, value)
    except keyring.errors.KeyringError as exc:
        raise SecretStoreError(f"The keyring refused to store '{name}' ({exc}).") from None


def delete_secret(name: str) -> None:
    try:
        keyring.delete_password(SERVICE, name)
    except keyring.errors.PasswordDeleteError:
        pass
    except keyring.errors.KeyringError as exc:
        raise SecretStoreError(f"The keyring refused to delete '{name}' ({exc}).") from None


def known_secret_values(names: list[str] | None = None) -> list[str]:
    """Current values of well-known secrets (for redaction); missing ones are skipped."""
    out = []
    for n in names or [AIHUB_TOKEN, HF_TOKEN]:
        try:
            v = get_secret(n)
        except SecretStoreError:
            v = None
        if v:
            out.append(v)
    return out
