"""Which thread a function ran on: for the checks that keep slow work (the keyring, files, reports) off the window's
thread, which is the event loop's."""

from __future__ import annotations

import threading
from typing import Any

import pytest


def record_threads(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[str]:
    """`owner.name` wrapped to note the name of the thread each call runs on (the list returned), then to do what
    it did."""
    real = getattr(owner, name)
    seen: list[str] = []

    def noted(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, noted)
    return seen
