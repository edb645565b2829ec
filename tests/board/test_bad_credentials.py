"""Wrong credentials against the real sshd EVK test board, table-driven like tests/test_bad_inputs.py: what is
given, the words a person must see, and that nothing was trusted or stored that should not be."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.board import BoardError
from hexstudio.core.device.connect import HostKeyUnknown, connect_ssh
from hexstudio.core.secrets import board_password_key, get_secret, set_secret
from tests.support.evk_board import EvkBoard
from tests.support.sshd import _keygen

pytestmark = pytest.mark.sshd


def _trusted(evk: EvkBoard, cfg: dict[str, Any]) -> None:
    """The person has accepted the board's fingerprint once (as the Board page asks)."""
    t = asyncio.run(connect_ssh("b", cfg, trust=lambda *a: True))
    asyncio.run(t.close())


def wrong_password(evk: EvkBoard, tmp: Path) -> dict[str, Any]:
    cfg = evk.board_config("password")
    _trusted(evk, evk.board_config())
    set_secret(board_password_key("b"), "not-the-password")
    return cfg


def wrong_key(evk: EvkBoard, tmp: Path) -> dict[str, Any]:
    other = tmp / "other_key"
    _keygen(other, "ed25519")
    _trusted(evk, evk.board_config())
    return {**evk.board_config(), "key_path": str(other)}


def missing_key_file(evk: EvkBoard, tmp: Path) -> dict[str, Any]:
    _trusted(evk, evk.board_config())
    return {**evk.board_config(), "key_path": str(tmp / "no_such_key")}


def unknown_host_key(evk: EvkBoard, tmp: Path) -> dict[str, Any]:
    return evk.board_config()  # never trusted: the fingerprint must be shown, nothing added silently


ROWS: dict[str, tuple[Callable[[EvkBoard, Path], dict[str, Any]], type[Exception], list[str]]] = {
    "wrong password": (wrong_password, BoardError, ["password", "b"]),
    "wrong key": (wrong_key, BoardError, ["key"]),
    "key file missing": (missing_key_file, BoardError, ["no_such_key"]),
    "unknown host key": (unknown_host_key, HostKeyUnknown, ["SHA256:"]),
}


@pytest.fixture()
def evk(tmp_path: Path) -> Any:
    with EvkBoard(tmp_path / "evk", ssh_password_auth=True) as b:
        yield b


@pytest.mark.parametrize("given", list(ROWS))
def test_wrong_credentials_are_refused_clearly(evk: EvkBoard, tmp_path: Path, given: str) -> None:
    make, exc_type, words = ROWS[given]
    cfg = make(evk, tmp_path)
    with pytest.raises(exc_type) as err:
        asyncio.run(connect_ssh("b", cfg))
    text = f"{getattr(err.value, 'message', err.value)} {getattr(err.value, 'hint', '')}"
    for w in words:
        assert w in text, (w, text)
    assert "Traceback" not in text
    if given == "unknown host key":  # nothing was trusted behind the person's back
        with pytest.raises(HostKeyUnknown):
            asyncio.run(connect_ssh("b", cfg))
    if given == "wrong password":  # the stored secret is left as the person typed it, never echoed
        assert "not-the-password" not in text and get_secret(board_password_key("b")) == "not-the-password"
