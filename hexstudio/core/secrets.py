"""Secrets (AI Hub token, SSH and sudo passwords, HF token) live only in keyring.

One small interface. Tests set PYTHON_KEYRING_BACKEND to a file or null backend
(see tests/conftest.py); the studio uses the system keyring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keyring
import keyring.errors

from hexstudio.shared.errors import ActionableError

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


def board_secret_names(board: str) -> list[str]:
    """Every secret kept for a board: what removing it deletes."""
    return [board_password_key(board), sudo_password_key(board)]


def worker_password_key(name: str) -> str:
    """A worker host's SSH password (hexstudio.core.remote.hosts)."""
    return f"worker-host:{name}:ssh_password"


def secret_names(settings: dict[str, Any]) -> list[str]:
    """The name of every secret HexStudio may keep for these settings (settings.json's data): the tokens, each
    board's SSH and sudo password, each worker host's password, each key file's passphrase. What a report
    scrubs: a name missing here let its value through."""
    boards = settings.get("boards") or {}
    hosts = settings.get("worker_hosts") or {}
    keys = {
        str(entry.get("key_path"))
        for entry in (*boards.values(), *hosts.values())
        if isinstance(entry, dict) and entry.get("key_path")
    }
    return [
        AIHUB_TOKEN,
        HF_TOKEN,
        *(n for b in boards for n in board_secret_names(b)),
        *(worker_password_key(h) for h in hosts),
        *(key_passphrase_key(str(Path(k).expanduser().resolve())) for k in sorted(keys)),
    ]


class SecretStoreError(ActionableError):
    pass


_SEEN: set[str] = set()  # every secret value this process read or stored: the studio log never shows them


def remember_secret(value: str | None) -> None:
    """Note a secret this process holds without the keyring (a sudo password typed once) so that the studio
    log (hexstudio.core.logs) scrubs it too."""
    if value:
        _SEEN.add(value)


def seen_secret_values() -> list[str]:
    return list(_SEEN)


# what to do when the keyring fails: the backends HexStudio names (backend_info, stored_where)
KEYRING_HINT = (
    "On WSL or a server without a desktop keyring: pip install keyrings.alt, then set "
    "PYTHON_KEYRING_BACKEND=keyrings.alt.file.PlaintextKeyring (or EncryptedKeyring, which also needs "
    "pycryptodome and asks for its password on a terminal). `keyring diagnose` shows which backend is in use."
)


def _failed(exc: Exception) -> str:
    """A keyring backend's failure in words, with the backend named. Backends raise more than KeyringError:
    keyrings.alt's EncryptedKeyring a RuntimeError without pycryptodome and an EOFError without a terminal for
    its password, a damaged file a configparser error, Secret Service a DBus error."""
    try:
        backend = type(keyring.get_keyring()).__qualname__
    except Exception:
        backend = "unknown"
    return f"{type(exc).__name__}: {exc}; keyring backend {backend}"


def get_secret(name: str) -> str | None:
    try:
        value = keyring.get_password(SERVICE, name)
    except Exception as exc:
        raise SecretStoreError(f"The keyring could not be read ({_failed(exc)}).", KEYRING_HINT) from None
    remember_secret(value)
    return value


def set_secret(name: str, value: str) -> None:
    remember_secret(value)
    try:
        keyring.set_password(SERVICE, name, value)
        # the null keyring (and a backend that drops what it is given) raises nothing: read it back, or a
        # login said "stored" and the next command found no token
        back = keyring.get_password(SERVICE, name)
    except Exception as exc:
        raise SecretStoreError(
            f"The keyring refused to store '{name}' ({_failed(exc)}); it was not saved.", KEYRING_HINT
        ) from None
    if back != value:
        kb = backend_info()
        raise SecretStoreError(
            f"The keyring did not keep '{name}': reading it back gave "
            f"{'nothing' if back is None else 'another value'} ({kb['name']}: {kb['what']}); it was not saved.",
            KEYRING_HINT,
        )


def delete_secret(name: str) -> None:
    try:
        keyring.delete_password(SERVICE, name)
    except keyring.errors.PasswordDeleteError:
        pass
    except Exception as exc:
        raise SecretStoreError(
            f"The keyring refused to delete '{name}' ({_failed(exc)}).", KEYRING_HINT
        ) from None


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


# How each keyring backend keeps what it stores: True encrypted at rest, False plain text on disk, None nothing
# kept (or unknown). By class name (module.Class) as keyring reports it.
_BACKENDS: dict[str, tuple[bool | None, str]] = {
    "keyring.backends.SecretService.Keyring": (
        True,
        "the desktop's Secret Service (GNOME Keyring, KWallet ...), encrypted with your login",
    ),
    "keyring.backends.libsecret.Keyring": (
        True,
        "libsecret (the desktop's Secret Service), encrypted with your login",
    ),
    "keyring.backends.kwallet.DBusKeyring": (True, "KWallet, encrypted"),
    "keyring.backends.macOS.Keyring": (True, "the macOS Keychain, encrypted"),
    "keyring.backends.Windows.WinVaultKeyring": (
        True,
        "the Windows Credential Manager, encrypted for your user",
    ),
    "keyrings.alt.file.EncryptedKeyring": (True, "keyrings.alt's file, encrypted with a password you chose"),
    "keyrings.alt.file.PlaintextKeyring": (
        False,
        "keyrings.alt's PLAIN-TEXT file: anyone who can read your home folder can read the secrets",
    ),
    "keyrings.alt.Windows.RegistryKeyring": (True, "the Windows registry, encrypted for your user (DPAPI)"),
    "keyring.backends.null.Keyring": (None, "the null keyring: nothing is stored"),
    "keyring.backends.fail.Keyring": (None, "no keyring is available: nothing can be stored"),
}


def backend_info() -> dict[str, object]:
    """Which keyring backend holds HexStudio's secrets and whether it encrypts them (for `hexstudio doctor`,
    `aihub login --status` and About): {"name", "encrypted": True|False|None, "what", "warning"}. A chainer
    backend is reported by the backend that writes (the first, by priority)."""
    try:
        kr = keyring.get_keyring()
    except Exception as exc:  # a broken keyring configuration
        return {
            "name": None,
            "encrypted": None,
            "what": f"the keyring cannot be loaded ({exc})",
            "warning": "No keyring: secrets cannot be stored. Install a desktop keyring or keyrings.alt.",
        }
    inner = list(getattr(kr, "backends", None) or [kr])
    b = inner[0] if inner else kr
    name = f"{type(b).__module__}.{type(b).__qualname__}"
    encrypted, what = _BACKENDS.get(
        name, (None, "a keyring backend HexStudio does not know (whether it encrypts is not known)")
    )
    warning = None
    if encrypted is False:
        path = getattr(b, "file_path", None)
        warning = (
            f"Secrets are stored in PLAIN TEXT{f' in {path}' if path else ''} ({name}). Use an encrypting "
            "keyring: a desktop Secret Service, or `keyrings.alt.file.EncryptedKeyring` "
            "(PYTHON_KEYRING_BACKEND=keyrings.alt.file.EncryptedKeyring)."
        )
    elif encrypted is None and name.endswith((".null.Keyring", ".fail.Keyring")):
        warning = f"No secret can be kept ({what}): logins must be given again each time."
    return {
        "name": name,
        "encrypted": encrypted,
        "what": what,
        "warning": warning,
        "path": str(getattr(b, "file_path", "") or "") or None,
    }


def stored_where(info: dict[str, object] | None = None) -> str:
    """Where a secret just stored went, in words true of the backend in use (issue 27): "in the keyring
    (libsecret …, encrypted …)", or "in a PLAIN-TEXT file at PATH (keyrings.alt), not encrypted"."""
    kb = info or backend_info()
    name = str(kb.get("name") or "no keyring")
    if kb.get("encrypted") is False:
        at = f" at {kb['path']}" if kb.get("path") else ""
        return (
            f"in a PLAIN-TEXT file{at} ({name}), not encrypted — for an encrypted "
            "one use a desktop Secret Service or PYTHON_KEYRING_BACKEND=keyrings.alt.file.EncryptedKeyring"
        )
    if kb.get("encrypted") is True:
        return f"in the keyring: {kb.get('what')} ({name})"
    return f"in the keyring backend {name} ({kb.get('what')})"
