"""pytest fixture for the AI Hub emulator. Import it into a conftest:

from tests.aihub_emulator.fixtures import aihub_emulator  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.aihub_emulator.server import AIHubEmulator, fast_client_knobs


@pytest.fixture
def aihub_emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[AIHubEmulator]:
    """A started emulator; the worker environment (token, api url, NO_PROXY) is set for this test."""
    with AIHubEmulator() as emu, fast_client_knobs():
        for k, v in emu.worker_env().items():
            monkeypatch.setenv(k, v)
        yield emu
