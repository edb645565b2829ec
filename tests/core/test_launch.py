"""The one way the studio starts a child process (hexstudio.core.jobs): the commands it builds, run_child's
output, timeout and cancel, and the cancel ladder every job climbs."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from hexstudio.core.jobs import (
    cancel_ladder,
    cli_command,
    code_command,
    python_command,
    run_child,
    worker_command,
)
from hexstudio.shared.python_command import RUN_MODULE_CODE


def test_commands_as_python_runs_them() -> None:
    py = sys.executable
    assert python_command("hexstudio.workers.genie_sim.t2t", "--help") == [
        py,
        "-m",
        "hexstudio.workers.genie_sim.t2t",
        "--help",
    ]
    assert cli_command("report", "R") == [py, "-m", "hexstudio", "report", "R"]
    assert worker_command("hexstudio.workers.quantize", Path("/s.json")) == [
        py,
        "-m",
        "hexstudio.workers.quantize",
        "--spec",
        "/s.json",
    ]
    assert code_command("print(1)", "a") == [py, "-c", "print(1)", "a"]


def test_commands_as_a_frozen_build_runs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PyInstaller build has no separate Python: hexstudio itself, dispatched by hexstudio/__main__.py."""
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/hexstudio/hexstudio")
    exe = "/opt/hexstudio/hexstudio"
    assert cli_command("report", "R", "--format", "pdf") == [exe, "report", "R", "--format", "pdf"]
    assert worker_command("hexstudio.workers.quantize", Path("/s.json")) == [
        exe,
        "--worker",
        "quantize",
        "--spec",
        "/s.json",
    ]
    assert python_command("hexstudio.workers.genie_sim.t2t", "-c", "g.json") == [
        exe,
        "-c",
        RUN_MODULE_CODE,
        "hexstudio.workers.genie_sim.t2t",
        "-c",
        "g.json",
    ]
    assert python_command("tests.core.fake_worker") == [exe, "-c", RUN_MODULE_CODE, "tests.core.fake_worker"]
    assert code_command("print(1)") == [exe, "-c", "print(1)"]


def test_cancel_ladder_climbs_until_the_process_ends() -> None:
    sent: list[tuple[str, bool]] = []

    async def go(ends_on: str | None) -> tuple[bool, float]:
        ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def send(sig: signal.Signals, group: bool) -> None:
            sent.append((sig.name, group))
            if sig.name == ends_on:
                asyncio.get_running_loop().call_later(0.05, ended.set_result, None)

        t0 = time.monotonic()
        ok = await cancel_ladder(send, ended, grace_s=0.3, term_s=0.3, kill_s=0.3)
        return ok, time.monotonic() - t0

    ok, took = asyncio.run(go("SIGINT"))
    assert ok and sent == [("SIGINT", False)] and took < 0.3
    sent.clear()
    ok, took = asyncio.run(go("SIGTERM"))
    assert ok and sent == [("SIGINT", False), ("SIGTERM", True)] and 0.3 <= took < 0.6
    sent.clear()
    ok, _ = asyncio.run(go(None))
    assert not ok and sent == [("SIGINT", False), ("SIGTERM", True), ("SIGKILL", True)]


def test_run_child_returns_output_and_exit_status() -> None:
    res = asyncio.run(
        run_child(
            code_command(
                "import sys; print('out'); print('err', file=sys.stderr); "
                "raise SystemExit(sys.stdin.read() == 'in' and 3)"
            ),
            what="a test child",
            input=b"in",
        )
    )
    assert (res.returncode, res.stdout, res.stderr, res.timed_out, res.ok) == (
        3,
        "out\n",
        "err\n",
        False,
        False,
    )
    assert asyncio.run(run_child(code_command("pass"), what="a test child")).ok


# Ignores SIGINT once (says so), starts a grandchild in its group, then waits.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, lambda *_: print("got SIGINT", flush=True))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_run_child_past_its_timeout_climbs_the_ladder_and_leaves_nothing() -> None:
    t0 = time.monotonic()
    res = asyncio.run(
        run_child(code_command(STUBBORN), what="a stubborn child", timeout=1.0, grace_s=0.5, term_s=2.0)
    )
    assert res.timed_out and not res.ok
    assert res.returncode == -signal.SIGTERM  # SIGINT was ignored, SIGTERM to the group ended it
    grandchild, said = res.stdout.split("\n")[:2]
    assert said == "got SIGINT"
    assert 1.4 < time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while not _gone(int(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(int(grandchild))


def test_run_child_of_a_cancelled_caller_ends_the_child_and_cancels() -> None:
    pids: list[int] = []

    async def go() -> None:
        task = asyncio.ensure_future(
            run_child(code_command(STUBBORN), what="a child of a closing window", grace_s=0.3, term_s=2.0)
        )
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def watch() -> None:
        # the stubborn child among this process's children, and its own child
        for _ in range(100):
            kids = [p for p in psutil.Process().children() if "got SIGINT" in " ".join(p.cmdline())]
            grandkids = kids[0].children() if kids else []
            if grandkids:
                pids.extend([kids[0].pid, *(c.pid for c in grandkids)])
                return
            await asyncio.sleep(0.05)

    async def both() -> None:
        await asyncio.gather(go(), watch())

    asyncio.run(both())
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)


def test_a_worker_starts_its_own_children_as_a_frozen_build_runs_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The compile worker's Qualcomm checks ran `sys.executable -m MODULE`: in a frozen build that is the
    hexstudio binary, whose CLI refuses `-m` (exit 2), so every real compile failed at its last step."""
    import io

    from hexstudio.shared.bundle import qualcomm_run
    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers.compile import qualcomm_check
    from hexstudio.workers.runtime import WorkerError

    seen: list[list[str]] = []

    def run(bundle_dir: Path, argv: list[str], **_kw: Any) -> Any:
        seen.append(list(argv))
        return qualcomm_run.QualcommRun({"available": False, "hint": "none here"}, 0, "", 1.0)

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(qualcomm_run, "run_qualcomm_checks", run)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "genie_config.json").write_text('{"dialog": {"version": 1}}')
    # without Qualcomm's checks HexStudio's still run (they passed a bundle whose config names nothing), and the
    # findings stay readable beside the bundle (a failed attempt's logs are kept)
    with pytest.raises(WorkerError) as err:
        qualcomm_check(bundle, Emitter(io.StringIO()))
    assert seen == [[sys.executable, "-c", RUN_MODULE_CODE, qualcomm_run.MODULE]]
    assert err.value.code == "bundle_check" and "fails HexStudio's checks" in err.value.message, err.value
    assert str(tmp_path / "bundle-check.log") in (err.value.hint or "")
    assert "Missing dialog field" in (tmp_path / "bundle-check.log").read_text()
