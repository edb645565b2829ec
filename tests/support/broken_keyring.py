"""A keyring backend that fails as keyrings.alt's EncryptedKeyring does without pycryptodome (a RuntimeError, not a
KeyringError): set PYTHON_KEYRING_BACKEND=tests.support.broken_keyring.BrokenKeyring."""

from __future__ import annotations

from keyring.backend import KeyringBackend


class BrokenKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        raise RuntimeError("pycryptodome/x required")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise RuntimeError("pycryptodome/x required")

    def delete_password(self, service: str, username: str) -> None:
        raise RuntimeError("pycryptodome/x required")
