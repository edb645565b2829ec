"""A report scrubs every secret HexStudio keeps: the tokens, each board's SSH and sudo password, and also each
worker host's password and each key file's passphrase, which it used to leave out."""

from __future__ import annotations

from pathlib import Path

from hexstudio.core import secrets
from hexstudio.core.reports.collect import _keyring_secrets
from hexstudio.core.settings import Settings


def test_every_kept_secret_is_scrubbed(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not read here")
    s = Settings.load()
    s.boards["evk"] = {"host": "10.0.0.5", "port": 22, "user": "u", "auth": "key", "key_path": str(key)}
    s.data["worker_hosts"]["gpu1"] = {"host": "10.0.0.6", "port": 22, "user": "u", "auth": "password"}
    s.save()
    kept = {
        secrets.board_password_key("evk"): "canary-board",
        secrets.sudo_password_key("evk"): "canary-sudo",
        secrets.worker_password_key("gpu1"): "canary-worker-host",
        secrets.key_passphrase_key(str(key.resolve())): "canary-passphrase",
        secrets.AIHUB_TOKEN: "canary-aihub",
    }
    for name, value in kept.items():
        secrets.set_secret(name, value)
    assert set(secrets.secret_names(s.data)) >= set(kept)
    assert set(_keyring_secrets()) >= set(kept.values())
