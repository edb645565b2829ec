"""The board-runtime seam (issue 30): a new runtime is one BoardRuntime subclass, one register_runtime call and,
to choose it, one rule; nothing else in the studio changes. Here a dummy runtime (a scripted helper that speaks
the helper protocol) serves chat through the real ChatSession on the simulator board."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTED = Path(__file__).resolve().parents[1] / "eval" / "scripted_helper.py"


def test_a_dummy_runtime_plugs_in_without_touching_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.core.device.board import Board, sim_board
    from hexstudio.core.genie import runtime as rt
    from hexstudio.core.genie.session import ChatSession
    from hexstudio.shared import bundle as gb
    from hexstudio.shared.data import builtin_model_dir

    class Dummy(rt.BoardRuntime):
        key, name, title, simulated = "dummy", "genie", "A dummy runtime (scripted, test only)", True

        def helper_argv(
            self, board: Board, sampler: dict[str, Any] | None, helper_remote: str | None, bundle_dir: str
        ) -> tuple[list[str], dict[str, str] | None]:
            return [sys.executable, str(SCRIPTED), json.dumps({"France": "Paris, from the dummy."})], None

    monkeypatch.setattr(
        rt, "RULES", [lambda name, board, binaries: "dummy" if board.name == "sim" else None, *rt.RULES]
    )
    monkeypatch.setitem(rt._REGISTRY, "dummy", rt._REGISTRY.get("dummy", Dummy()))
    rt.register_runtime(Dummy())

    board = sim_board(tmp_path / "ws")
    bundle = Path(board.transport.root) / "bundles" / "b"
    bundle.mkdir(parents=True)
    hf = json.loads((builtin_model_dir() / "config.json").read_text())
    (bundle / "genie_config.json").write_text(json.dumps(gb.genie_config(hf, 512, ["m_part_1_of_1.bin"], 32)))

    async def go() -> Any:
        async with ChatSession(board, str(bundle), mode="persistent", max_tokens=8) as s:
            r = await s.send("What is the capital of France?")
            return s, r

    s, r = asyncio.run(go())
    assert s.runtime.key == "dummy" and s.runtime.title.startswith("A dummy runtime")
    assert r.text == "Paris, from the dummy." and r.state == "complete" and s.simulated


def test_the_htp_simulator_helper_keeps_this_processs_library_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper's environment was built from PYTHONPATH alone, and the transport puts LD_LIBRARY_PATH over the
    studio's own: a Python that needs a libpython or CUDA path there could not start the helper."""
    from hexstudio.core.device.board import sim_board
    from hexstudio.core.genie import runtime as rt
    from hexstudio.workers.qnn import libs

    wheel = tmp_path / "onnxruntime_qnn" / "capi"
    monkeypatch.setattr(libs, "find_qnn_libs", lambda: libs.QnnLibs(wheel, "2.51.0", "2.7.0"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/python/lib:/usr/local/cuda/lib64")
    monkeypatch.setenv("HF_TOKEN", "not-for-the-helper")
    _argv, env = rt.GenieHtpSimulator().helper_argv(sim_board(tmp_path), None, None, str(tmp_path))
    assert env["LD_LIBRARY_PATH"] == f"{wheel}:/opt/python/lib:/usr/local/cuda/lib64"  # the wheel's first
    assert "HF_TOKEN" not in env and env["PYTHONPATH"]  # only what the helper needs, as before
