"""Test-wide setup: never the system keyring, never the user's config or workspace, Qt offscreen."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# keyring: a plaintext file backend in a per-session temp folder (set before anything imports keyring)
os.environ["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HEXSTUDIO_CONFIG_DIR", str(base / "config"))
    monkeypatch.setenv("HEXSTUDIO_WORKSPACE", str(base / "workspace"))
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "xdg-data"))  # PlaintextKeyring lives here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def python_exe() -> str:
    return sys.executable


# Prepared runs shared by every area (docs/CONTRACTS.md §6). Built once per pytest process;
# copy the folder before changing it.
@pytest.fixture(scope="session")
def validated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.runs import build_validated_run

    return build_validated_run(tmp_path_factory.mktemp("validated-ws"))


@pytest.fixture(scope="session")
def compiled_sim_run(validated_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.sim_runs import build_compiled_sim_run

    return build_compiled_sim_run(validated_run, tmp_path_factory.mktemp("compiled-ws"))
