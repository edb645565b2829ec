"""The programs the studio runs on a worker host (hexstudio.workers.remote), run as it runs them: `python -c SOURCE`,
here, and a remote job over the local transport (the same RemoteJob code as over SSH, without sshd)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.transport import LocalTransport
from hexstudio.core.remote.job import RemoteJob, read_lines
from hexstudio.core.remote.sync import SYNC_MANIFEST
from hexstudio.workers.remote import PROGRAMS, groupmem, host_command, probe, program_source
from hexstudio.workers.remote import files as host_files


def run(
    name: str,
    *args: str,
    stdin: Any = None,
    isolated: bool = False,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    argv = host_command(sys.executable, name, *args)
    if isolated:  # -I -S: no site-packages, no PYTHONPATH, not the current folder: stdlib alone
        argv = [argv[0], "-I", "-S", *argv[1:]]
    return subprocess.run(
        argv,
        input=None if stdin is None else json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_is_self_contained(name: str, tmp_path: Path) -> None:
    """Sent before anything of HexStudio is on the host: stdlib only, a usage error without arguments."""
    src = program_source(name)
    assert "import hexstudio" not in src and "from hexstudio" not in src
    r = run(name, isolated=True, cwd=tmp_path)
    assert r.returncode in (0, 2), r.stderr
    assert "Traceback" not in r.stderr
    with pytest.raises(ValueError):
        program_source("../runtime")


def test_probe_reports_python_memory_and_missing_modules(tmp_path: Path) -> None:
    r = run("probe", "json", "no_such_module_hexstudio", "no_such.sub", isolated=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["python"] == list(sys.version_info[:3])
    assert info["missing"] == ["no_such_module_hexstudio", "no_such.sub"]
    assert info["cpu_count"] >= 1 and info["memory_bytes"] > 0 and info["executable"]
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:  10 kB\nMemTotal:  2048 kB\n")
    assert probe.memory_bytes(str(meminfo)) == 2048 * 1024
    assert probe.memory_bytes(str(tmp_path / "none")) == 0


def test_files_list_hash_prune_promote_reset(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"x" * 1000)
    (root / "sub" / "b.txt").write_text("hello")
    (root / "link").symlink_to(root / "a.bin")
    (root / SYNC_MANIFEST).write_text(json.dumps({"a.bin": [1000, "abc"]}))
    r = run("files", "list", str(root), SYNC_MANIFEST, isolated=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["files"] == {
        "a.bin": 1000,
        "sub/b.txt": 5,
        SYNC_MANIFEST: len((root / SYNC_MANIFEST).read_text()),
    }
    assert doc["record"] == {"a.bin": [1000, "abc"]}
    (root / SYNC_MANIFEST).write_text("[not a record")
    assert host_files.list_files(str(root), SYNC_MANIFEST)["record"] == {}

    r = run("files", "hash", str(root), stdin=["a.bin", "sub/b.txt"])
    assert json.loads(r.stdout) == {
        "a.bin": hashlib.sha256(b"x" * 1000).hexdigest(),
        "sub/b.txt": hashlib.sha256(b"hello").hexdigest(),
    }
    r = run("files", "prune", str(root), stdin=["a.bin", "gone.txt"])
    assert r.returncode == 0 and r.stdout == "" and not (root / "a.bin").exists()

    final = tmp_path / "final"
    final.mkdir()
    (final / "old").write_text("old")
    assert run("files", "promote", str(root), str(final)).returncode == 0
    assert (
        not root.exists()
        and (final / "sub" / "b.txt").read_text() == "hello"
        and not (final / "old").exists()
    )
    assert run("files", "reset", str(final)).returncode == 0
    assert final.is_dir() and not any(final.iterdir())
    assert run("files", "reset", str(tmp_path / "new" / "dir")).returncode == 0
    assert (tmp_path / "new" / "dir").is_dir()

    bad = run("files", "promote", str(final))
    assert bad.returncode == 2 and "bad arguments" in bad.stderr
    failed = run("files", "hash", str(final), stdin=["missing"])
    assert failed.returncode != 0 and "missing" in failed.stderr


def _group_with_memory(mb: int) -> subprocess.Popen[bytes]:
    """A process group: a shell and a Python child holding `mb` MiB."""
    code = (
        f"b = bytearray({mb} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(60)"
    )
    return subprocess.Popen(
        ["sh", "-c", f'{sys.executable} -c "$1"; sleep 60', "sh", code], start_new_session=True
    )


def test_groupmem_samples_the_whole_group_until_it_is_gone() -> None:
    group = _group_with_memory(64)
    try:
        deadline = time.monotonic() + 20
        while groupmem.group_rss_proc(group.pid) < 64 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        rss = groupmem.group_rss_proc(group.pid)
        assert rss >= 64 << 20
        assert abs(groupmem.group_rss_ps(group.pid) - rss) < 16 << 20  # ps and /proc agree
        sampler = subprocess.Popen(
            host_command(sys.executable, "groupmem", str(group.pid), "0.05"),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sampler.stdout is not None
        lines = [sampler.stdout.readline() for _ in range(3)]
        assert all(int(x) >= 64 << 20 for x in lines)
        os.killpg(group.pid, signal.SIGKILL)
        group.wait()
        assert sampler.wait(timeout=10) == 0  # ends by itself once the group is gone
    finally:
        if group.poll() is None:
            os.killpg(group.pid, signal.SIGKILL)
            group.wait()
    assert groupmem.main(["x"]) == 2
    assert groupmem.group_rss_proc(group.pid) == 0


def test_read_lines_joins_chunks_and_keeps_a_last_line_without_newline() -> None:
    chunks = [b"a", b"b\nc", b"\n\nd", b""]

    async def read() -> bytes:
        return chunks.pop(0)

    async def go() -> list[bytes]:
        return [line async for line in read_lines(read)]

    assert asyncio.run(go()) == [b"ab", b"c", b"", b"d"]


def _spec(tmp_path: Path, seconds: float) -> dict[str, Any]:
    return {
        "schema": 1,
        "stage": "selftest",
        "run_dir": str(tmp_path),
        "out_dir": str(tmp_path / "out"),
        "settings": {"seconds": seconds},
        "upstream": {},
        "inputs": {},
    }


def test_remote_job_over_the_local_transport(tmp_path: Path) -> None:
    """RemoteJob's own code (install, setsid, pid mark, events, group sampler) without sshd."""
    events: list[dict[str, Any]] = []

    async def go() -> tuple[Any, RemoteJob]:
        t = LocalTransport(tmp_path / "host")
        job = RemoteJob(
            t,
            "hexstudio.workers.selftest",
            _spec(tmp_path, 1.0),
            python=sys.executable,
            on_event=events.append,
        )
        await job.start()
        return await job.wait(), job

    res, job = asyncio.run(go())
    assert res.ok, (res.message, res.stderr_tail)
    assert [e["type"] for e in events][-1] == "done" and res.events == len(events)
    assert job.remote_root is not None and job.remote_root.startswith(str(tmp_path / "host"))
    assert job.remote_pid is not None and job.samples and res.peak_rss_bytes == job.peak_rss > 0


def test_remote_job_cancel_climbs_the_ladder_over_the_local_transport(tmp_path: Path) -> None:
    async def go() -> tuple[Any, bool]:
        t = LocalTransport(tmp_path / "host")
        job = RemoteJob(
            t, "hexstudio.workers.selftest", _spec(tmp_path, 60), python=sys.executable, grace_s=5
        )
        await job.start()
        for _ in range(200):
            if job.remote_pid and job.stream.events >= 2:
                break
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await job.cancel()
        res = await job.wait()
        assert time.monotonic() - t0 < 5  # SIGINT was enough: the worker said `cancelled`
        return res, await job.group_alive()

    res, alive = asyncio.run(go())
    assert res.kind == "cancelled" and res.code == "cancelled"
    assert alive is False
