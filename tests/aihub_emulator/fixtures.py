"""pytest fixture for the AI Hub emulator. Import it into a conftest:

from tests.aihub_emulator.fixtures import aihub_emulator  # noqa: F401
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aihub_emulator.server import AIHubEmulator, fast_client_knobs


@pytest.fixture
def aihub_emulator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[AIHubEmulator]:
    """A started emulator; the worker environment (token, api url, NO_PROXY) is set for this test. The qai_hub
    client's upload leaves a `tmpXXXX.aimet.zip` file and a `tmpXXXX.aimet/` folder in the temporary folder
    (its NamedTemporaryFile(delete=False) and zip_model): a worker's temporary folder is its own
    (hexstudio/workers/runtime.py private_tmp), and so is this test's, instead of the system's /tmp."""
    tmp = tmp_path / "client-tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    with AIHubEmulator() as emu, fast_client_knobs():
        for k, v in emu.worker_env().items():
            monkeypatch.setenv(k, v)
        yield emu
