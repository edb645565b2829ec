"""Helpers for the installer tests: run packaging/install-workstation.sh, fake environments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "packaging" / "install-workstation.sh"

# A recorded `nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader`
RTX_5090 = "NVIDIA GeForce RTX 5090, 12.0, 32607 MiB, 576.02"


def run_installer(
    *args: str, gpu: str, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "HEXSTUDIO_GPU_INFO": gpu, **(env or {})}
    e.pop("PYTHON", None)
    return subprocess.run(
        ["bash", str(INSTALLER), *args], capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT
    )


def commands(out: str) -> list[str]:
    """The command lines the installer printed (`+ ...`)."""
    return [line[2:] for line in out.splitlines() if line.startswith("+ ")]


def pip_lines(out: str) -> list[str]:
    return [c for c in commands(out) if " -m pip " in c]


@pytest.fixture
def fake_venv(tmp_path: Path):
    """A real venv (no pip) of this Python whose site-packages gets fake dist-info folders, so the
    installer's "what is installed" queries see a chosen set of versions without installing anything."""
    venv = tmp_path / "fake venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next((venv / "lib").glob("python3*/site-packages"))

    def add(dist: str, version: str) -> None:
        d = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")

    return venv, add
