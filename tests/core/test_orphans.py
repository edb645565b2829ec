"""Issue 18: workers die at once with the process that started them (parent-death signal + a liveness pipe
watched beside the worker), even when busy and silent inside a long calibration unit; a resume stops a
worker of the run that is somehow still alive (its pid, process group and boot id are in run.json)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hexstudio.core.manifest import boot_id
from hexstudio.core.pipeline import Pipeline, stop_stale_workers
from hexstudio.core.runs import Workspace
from hexstudio.core.stage_api import WORKER_RUN_ENV
from tests.core.conftest import fake_stages
from tests.support.processes import alive

REPO = Path(__file__).resolve().parents[2]
STAGES3 = ("model", "preflight", "quantize")


def _wait(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def _driver(tmp_path: Path, ws: Workspace, run_id: str) -> Path:
    """`hexstudio run --resume RUN_ID --until quantize` (the real CLI) with the stages' workers swapped for
    the fake worker."""
    script = tmp_path / "drive.py"
    script.write_text(
        "import sys\n"
        "from hexstudio.core.pipeline import Pipeline\n"
        "from tests.core.conftest import fake_stages\n"
        f"Pipeline.__init__.__defaults__ = (None, None, None, None, fake_stages({STAGES3!r}))\n"
        "from hexstudio.cli.main import main\n"
        f"sys.exit(main(['run', '--workspace', {str(ws.root)!r}, '--resume', {run_id!r}, '--until', 'quantize']))\n"
    )
    return script


def test_kill9_of_hexstudio_run_during_quantize_leaves_no_worker_alive(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    pidfile, childfile = tmp_path / "worker.pid", tmp_path / "child.pid"
    m = ws.create_run(
        "builtin:tiny-llama",
        "sim",
        {
            "mode": "ok",
            "mode_quantize": "busy",
            "seconds": 300,
            "pidfile": str(pidfile),
            "child_pidfile": str(childfile),
        },
    )
    proc = subprocess.Popen(
        [sys.executable, str(_driver(tmp_path, ws, m.run_id))],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(
            lambda: (
                proc.poll() is not None
                or (pidfile.exists() and childfile.exists() and pidfile.read_text() and childfile.read_text())
            )
        )
        assert proc.poll() is None, "the run ended early"
        worker, child = int(pidfile.read_text()), int(childfile.read_text())
        rec = json.loads((m.run_dir / "run.json").read_text())["stages"]["quantize"]["worker"]
        assert rec["pid"] == worker and rec["boot_id"] == boot_id()
        time.sleep(0.3)  # the worker is deep in its silent computation
        assert alive(worker) and alive(child)
        t0 = time.monotonic()
        proc.kill()  # kill -9 of `hexstudio run`
        proc.wait()
        _wait(lambda: not alive(worker) and not alive(child), timeout=2.0)
        gone_after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"worker and child gone {gone_after:.3f} s after kill -9 of hexstudio run")
    assert gone_after < 2.0
    # the run resumes cleanly
    m2 = ws.open_run(m.run_id)
    assert m2.stage("quantize").state == "interrupted"
    m2.settings["mode_quantize"] = "ok"
    m2.save()
    res = asyncio.run(Pipeline(m2, stages=fake_stages(STAGES3)).run(until="quantize"))
    assert res.ok, res
    assert m2.stage("quantize").data["worker"] is None


def test_a_resume_stops_a_still_running_worker_of_the_run(tmp_path: Path) -> None:
    """A worker that survived its studio (started here without the parent-death arming) is found by its
    record in run.json and stopped before the stage starts again; a process of another run is left alone."""
    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)\n"
    ours = subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=True,
        env={**os.environ, WORKER_RUN_ENV: f"{m.run_id}/quantize"},
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        start_new_session=True,
        env={**os.environ, WORKER_RUN_ENV: "another-run/quantize"},
    )
    try:
        st = m.stage("quantize").data
        st.update(
            {
                "state": "running",
                "worker": {
                    "pid": ours.pid,
                    "pgid": ours.pid,
                    "host": os.uname().nodename,
                    "boot_id": boot_id(),
                },
            }
        )
        m.stage("validate").data["worker"] = {
            "pid": other.pid,
            "pgid": other.pid,
            "host": os.uname().nodename,
            "boot_id": boot_id(),
        }
        m.save()
        t0 = time.monotonic()
        stopped = stop_stale_workers(m, term_s=0.5)
        assert stopped == ["quantize"] and time.monotonic() - t0 < 5
        assert not alive(ours.pid)  # it ignored SIGTERM: SIGKILL ended it
        assert other.poll() is None  # not this run's: untouched
        assert any(e["kind"] == "stale_worker_stopped" for e in m.data["events"])
        assert m.stage("quantize").data["worker"] is None
    finally:
        for p in (ours, other):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("how", ["stdin_closed"])
def test_the_liveness_pipe_alone_kills_the_whole_group(tmp_path: Path, how: str) -> None:
    """What a remote worker relies on (no parent-death signal there): the end of its stdin (the SSH channel)
    kills the worker and its children, busy or not."""
    spec = tmp_path / "spec.json"
    pidfile, childfile = tmp_path / "w.pid", tmp_path / "c.pid"
    spec.write_text(
        json.dumps(
            {
                "schema": 1,
                "stage": "quantize",
                "run_dir": str(tmp_path),
                "out_dir": str(tmp_path / "out"),
                "settings": {"mode": "busy", "pidfile": str(pidfile), "child_pidfile": str(childfile)},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "HEXSTUDIO_PARENT_PID"}
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.core.fake_worker", "--spec", str(spec)],
        cwd=REPO,
        env={**env, "HEXSTUDIO_LIVENESS": "stdin", "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait(
            lambda: pidfile.exists() and childfile.exists() and pidfile.read_text() and childfile.read_text()
        )
        worker, child = int(pidfile.read_text()), int(childfile.read_text())
        assert p.stdin is not None
        p.stdin.close()
        _wait(lambda: not alive(worker) and not alive(child), timeout=2.0)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_worker_that_cannot_start_leaves_no_log_open(tmp_path: Path) -> None:
    """The stage log was opened before the spawn and kept open when the spawn failed (a side interpreter missing,
    no file descriptors left): one open file per attempt, for the life of the studio."""
    from hexstudio.core.jobs import LocalJob

    job = LocalJob([str(tmp_path / "no-such-python"), "-c", "pass"], log_path=tmp_path / "logs" / "x.jsonl")
    with pytest.raises(FileNotFoundError):
        asyncio.run(job.start())
    assert job._log is None and job.stream.log is None
    fds = os.listdir("/proc/self/fd")
    assert not any(
        os.path.realpath(f"/proc/self/fd/{fd}") == str(tmp_path / "logs" / "x.jsonl") for fd in fds
    )
