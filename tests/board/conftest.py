from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.evk_board import EvkBoard
from tests.support.sshd import ssh_server  # noqa: F401  (session fixture: a real sshd on 127.0.0.1)

CANARY = "canary-Pw-7f3e9b1d;'\"$(x)"  # the evk user's password (SSH and sudo): must never leak


@pytest.fixture(scope="module")
def evk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvkBoard]:
    """A fresh EVK test board per test module (faults as shipped: see tests/support/evk_board.py)."""
    with EvkBoard(tmp_path_factory.mktemp("evk"), sudo_password=CANARY, ssh_password_auth=True) as b:
        yield b


def settings_with(name: str, cfg: dict[str, Any]) -> Any:
    from hexstudio.core.settings import Settings

    s = Settings.load()
    s.boards[name] = cfg
    s.save()
    return s


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def board_root(evk: EvkBoard) -> Path:
    return evk.root
