"""The live AI Hub device list as the Compile page and `hexstudio bundle devices --aihub` get it
(hexstudio/core/services/aihub_devices.py): a worker process of its own, stopped when AI Hub does not answer in
time, its failures said as the AI Hub stage says them. The listing itself, against the AI Hub emulator, is in
tests/gui/test_compile_page.py and tests/compile/test_aihub.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers (AI Hub behind a dead proxy)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def _listing_workers() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "hexstudio.workers.aihub_devices" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_ai_hub_that_never_answers_is_given_up_on_and_its_worker_stopped(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.core.services import ServiceError
    from hexstudio.core.services.aihub_devices import list_aihub_devices, log_path

    monkeypatch.setenv("HEXSTUDIO_AIHUB_API_URL", silent_server)
    monkeypatch.setenv("HEXSTUDIO_AIHUB_WEB_URL", silent_server)
    monkeypatch.setenv("HEXSTUDIO_AIHUB_TOKEN", "test-token-0123456789")
    t0 = time.monotonic()
    with pytest.raises(ServiceError) as e:
        asyncio.run(list_aihub_devices(timeout_s=3))
    took = time.monotonic() - t0
    assert e.value.message == "AI Hub did not answer within 3 s.", e.value.message
    assert e.value.hint and "network" in e.value.hint
    assert took < 3 + 5 + 3 + 5, took  # the timeout, then SIGINT's grace and SIGTERM's, at the most
    assert _listing_workers() == []
    assert "asking AI Hub" in log_path().read_text()  # the worker's own log, in the studio's log folder


def test_no_token_anywhere_says_where_to_put_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hexstudio.core.services import ServiceError
    from hexstudio.core.services.aihub_devices import list_aihub_devices

    monkeypatch.delenv("HEXSTUDIO_AIHUB_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(tmp_path / "none" / "client.ini"))
    with pytest.raises(ServiceError) as e:
        asyncio.run(list_aihub_devices(timeout_s=60))
    assert "No Qualcomm AI Hub API token" in e.value.message, e.value.message
    assert e.value.hint and "qai-hub configure" in e.value.hint
    assert _listing_workers() == []
