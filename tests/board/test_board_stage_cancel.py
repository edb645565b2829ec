"""The Board stage stops when it is cancelled: a push of gigabytes (and the sha256 check after it) must not run
on to the end and record the stage as done after the person pressed Cancel or Ctrl-C, and the board's
connection is closed however the stage ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.transport import LocalTransport
from hexstudio.core.pipeline import Pipeline
from hexstudio.core.runs import Workspace
from tests.support.sim_runs import copy_run


def test_a_cancel_stops_the_push_and_closes_the_connection(
    compiled_sim_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_put = LocalTransport.put_file
    closed: list[float] = []
    real_close = LocalTransport.close

    async def slow_put(self: LocalTransport, *a: Any, **kw: Any) -> Any:
        # a slow link: each file takes a while, so the cancel comes while the push runs
        await asyncio.sleep(0.5)
        return await real_put(self, *a, **kw)

    async def close(self: LocalTransport) -> None:
        closed.append(time.monotonic())
        await real_close(self)

    monkeypatch.setattr(LocalTransport, "put_file", slow_put)
    monkeypatch.setattr(LocalTransport, "close", close)
    run_dir = copy_run(compiled_sim_run, tmp_path)
    m = Workspace(tmp_path).open_run(run_dir.name)
    pipe: Pipeline
    asked: list[float] = []
    pending: list[Any] = []

    def on_event(stage: str, ev: dict[str, Any]) -> None:
        if not asked and ev.get("type") == "progress" and "pushing" in str(ev.get("message")):
            asked.append(time.monotonic())
            pending.append(asyncio.ensure_future(pipe.cancel()))

    pipe = Pipeline(m, on_event=on_event)
    res = asyncio.run(pipe.run(only="board"))
    assert asked, "the push never started"
    assert not res.ok and Workspace(tmp_path).open_run(run_dir.name).stage("board").state == "cancelled", res
    assert closed and closed[-1] - asked[0] < 2.0, (asked, closed)
    assert not (run_dir / "artifacts" / "board" / "board.json").exists()
