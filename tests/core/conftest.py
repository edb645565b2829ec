from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hexstudio.core.runs import Workspace
from hexstudio.core.stages import STAGES, Stage

FAKE = "tests.core.fake_worker"


def fake_stages(names: tuple[str, ...] = ("model", "preflight")) -> tuple[Stage, ...]:
    """The real stage declarations with their workers swapped for the test worker."""
    out = []
    for s in STAGES:
        if s.name in names:
            out.append(
                dataclasses.replace(
                    s,
                    worker=FAKE,
                    action=None,
                    outputs=("result.txt",),
                    inputs=(*s.inputs, "mode", f"mode_{s.name}", "seconds"),
                )
            )
    return tuple(out)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")
