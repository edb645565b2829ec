"""A worker on a remote Linux host over a real OpenSSH server on loopback streams the same events."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.remote.job import RemoteJob
from tests.support.sshd import SshServer, sshd_available

ok, why = sshd_available()
pytestmark = [pytest.mark.sshd, pytest.mark.skipif(not ok, reason=why)]


def _selftest_spec(run_dir: Path, out_dir: Path, seconds: float) -> dict[str, Any]:
    """The selftest worker's spec: it runs `seconds`, reporting progress, into out_dir."""
    return {
        "schema": 1,
        "stage": "selftest",
        "run_dir": str(run_dir),
        "out_dir": str(out_dir),
        "settings": {"seconds": seconds},
        "upstream": {},
        "inputs": {},
    }


async def _connect(srv: SshServer) -> Any:
    from hexstudio.core.device.connect import connect_ssh

    cfg = srv.key_config()
    return await connect_ssh("remote-worker-test", cfg, trust=lambda *_a: True)


def test_remote_selftest_worker_streams_events(tmp_path: Path) -> None:
    out_dir = tmp_path / "remote-out"
    events: list[dict[str, Any]] = []

    async def go() -> Any:
        t = await _connect(srv)
        try:
            spec = _selftest_spec(tmp_path, out_dir, 1.0)
            job = RemoteJob(
                t, "hexstudio.workers.selftest", spec, python=sys.executable, on_event=events.append
            )
            await job.start()
            return await job.wait(), job
        finally:
            await t.close()

    with SshServer(tmp_path / "sshd") as srv:
        res, job = asyncio.run(go())
    assert res.ok, (res.message, res.stderr_tail)
    kinds = [e["type"] for e in events]
    assert kinds.count("progress") >= 3 and kinds[-1] == "done" and "metric" in kinds
    assert json.loads((out_dir / "selftest.json").read_text())["packages"]["onnxruntime"] is True
    assert job.remote_pid is not None and res.peak_rss_bytes > 0 and job.samples


async def _running_selftest(t: Any, tmp_path: Path) -> RemoteJob:
    """A minute-long selftest worker on the host, started and streaming (its pid known)."""
    spec = _selftest_spec(tmp_path, tmp_path / "o", 60)
    job = RemoteJob(t, "hexstudio.workers.selftest", spec, python=sys.executable, grace_s=5)
    await job.start()
    for _ in range(100):
        if job.remote_pid and job.stream.events >= 2:
            break
        await asyncio.sleep(0.1)
    return job


def test_remote_cancel_kills_the_remote_process_group(tmp_path: Path) -> None:
    async def go() -> tuple[Any, bool]:
        t = await _connect(srv)
        try:
            job = await _running_selftest(t, tmp_path)
            await job.cancel()
            res = await job.wait()
            return res, await job.group_alive()
        finally:
            await t.close()

    with SshServer(tmp_path / "sshd") as srv:
        res, alive = asyncio.run(go())
    assert res.kind == "cancelled"
    assert alive is False


def test_a_worker_killed_on_the_host_reads_as_killed_not_as_exit_9(tmp_path: Path) -> None:
    """The out-of-memory killer (here kill -9) ends the worker on the host. Under `setsid -w` the exit code is
    the raw signal number (9) with "did not exit normally" on stderr: the job must read as killed by SIGKILL
    (which the stage judges against the host's memory), not as a worker that exited 9 without reporting done."""
    import os
    import signal

    async def go() -> Any:
        t = await _connect(srv)
        try:
            job = await _running_selftest(t, tmp_path)
            assert job.remote_pid
            # the loopback sshd's host is this machine
            os.kill(job.remote_pid, signal.SIGKILL)
            return await job.wait()
        finally:
            await t.close()

    with SshServer(tmp_path / "sshd") as srv:
        res = asyncio.run(go())
    # a small worker: "killed" (the stage judges out of memory against the host's RAM, core/remote/stage.py)
    assert res.kind == "killed" and res.signal == "SIGKILL" and "SIGKILL" in res.message, (
        res.kind,
        res.message,
    )
    assert "OOM killer" in (res.hint or "")


def test_remote_returncode() -> None:
    from hexstudio.core.remote.job import remote_returncode

    assert remote_returncode(9, "setsid: child 123 did not exit normally: No such file", False) == -9
    assert remote_returncode(139, "setsid: child 9 did not exit normally", False) == -11
    assert remote_returncode(137, "", False) == -9
    assert remote_returncode(3, "Traceback ...", False) == 3
    assert remote_returncode(9, "", True) == 9


def test_a_worker_host_root_is_a_folder_under_its_home() -> None:
    """`--root ~/hx` or `--root hx` is read on the host, under its home: neither SFTP nor a quoted shell argument
    expands `~`, and the worker runs in another folder than a relative path would be read from."""
    from hexstudio.core.remote.sync import host_folder

    home = "/home/ann"
    assert host_folder(None, home) == "/home/ann/.cache/hexstudio"
    assert host_folder("~/hx", home) == "/home/ann/hx"
    assert host_folder("~", home) == "/home/ann"
    assert host_folder("hx/w", home) == "/home/ann/hx/w"
    assert host_folder("/srv/hx/", home) == "/srv/hx"
