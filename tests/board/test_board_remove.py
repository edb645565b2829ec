"""`hexstudio board remove`: the CLI could add a board but not remove one, and the studio's Remove left the
board's sudo password in the keyring. Both now delete every secret kept for the board."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexstudio.core import secrets
from hexstudio.core.settings import Settings
from tests.support.cli import python_m_hexstudio


def test_board_remove_deletes_the_board_and_its_passwords() -> None:
    r = python_m_hexstudio("board", "add", "evk", "--host", "10.0.0.5", "--auth", "password", "--no-connect")
    assert r.returncode == 0, r.stderr
    for name in secrets.board_secret_names("evk"):
        secrets.set_secret(name, f"canary-{name}")
    r = python_m_hexstudio("board", "remove", "evk")
    assert r.returncode == 0 and "board evk removed" in r.stdout, r.stderr
    assert "evk" not in Settings.load().boards
    assert [secrets.get_secret(n) for n in secrets.board_secret_names("evk")] == [None, None]
    r = python_m_hexstudio("board", "remove", "evk")
    assert r.returncode == 1 and "No board named 'evk'" in r.stderr


def test_the_studio_removes_the_sudo_password_too(qtbot: Any, tmp_path: Path) -> None:
    from tests.gui.conftest import studio_window

    s = Settings.load()
    s.boards["evk"] = {"host": "10.0.0.5", "port": 22, "auth": "password"}
    s.save()
    secrets.set_secret(secrets.sudo_password_key("evk"), "canary-sudo")
    _c, w = studio_window(qtbot, tmp_path / "ws")
    page = w.pages["board"]
    page.boards.setCurrentRow(
        next(i for i in range(page.boards.count()) if page.boards.item(i).data(256) == "evk")
    )
    page.remove_selected(confirm=False)
    assert "evk" not in Settings.load().boards
    assert secrets.get_secret(secrets.sudo_password_key("evk")) is None
