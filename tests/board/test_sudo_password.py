"""`board fix --remember` keeps a sudo password only once sudo took it: a mistyped one was stored for good, and
every later fix (and the Board stage) was refused with it, with a hint to type it again that `board fix`
never asked for."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from hexstudio.cli.main import main
from hexstudio.core.device.board import open_board
from hexstudio.core.secrets import get_secret, set_secret, sudo_password_key
from tests.board.conftest import CANARY, settings_with
from tests.support.evk_board import EvkBoard


def _fix(monkeypatch: pytest.MonkeyPatch, capsys: Any, *extra: str, stdin: str = "") -> tuple[int, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(["board", "fix", "evk", "daemon_restart", *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_a_sudo_password_is_kept_only_once_sudo_took_it(
    evk: EvkBoard, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    settings = settings_with("evk", evk.board_config())

    async def pin_host_key() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        await board.transport.close()

    asyncio.run(pin_host_key())
    key = sudo_password_key("evk")
    rc, text = _fix(monkeypatch, capsys, "--remember", "--sudo-password-stdin", stdin="mistyped\n")
    assert rc != 0 and "refused the password" in text and "type the board user's password" in text, text
    assert get_secret(key) is None
    # one stored earlier and wrong: said so, with the command that changes it
    set_secret(key, "stale")
    rc, text = _fix(monkeypatch, capsys)
    assert rc != 0 and "the one stored for evk" in text and "hexstudio board password evk --sudo" in text, (
        text
    )
    set_secret(key, "")
    rc, text = _fix(monkeypatch, capsys, "--remember", "--sudo-password-stdin", stdin=CANARY + "\n")
    assert rc == 0, text
    assert get_secret(key) == CANARY
