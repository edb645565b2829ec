"""`hexstudio serve` as the serve tests (tests/eval, tests/qnn) and bench/serve_load.py start it, and raw HTTP
answers read back from a socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def serve_argv(port_file: Path, run: str | None, *extra: str) -> list[str]:
    """`hexstudio serve` on the sim board, listening on a free port it writes to `port_file`, serving `run`'s
    bundle (None: the latest run with one)."""
    argv = [sys.executable, "-m", "hexstudio", "serve", "--board", "sim", "--port", "0"]
    argv += ["--port-file", str(port_file), *(["--run", run] if run else []), *extra]
    return argv


def start_serve(
    ws: Path, run: str, port_file: Path, *extra: str, timeout: float = 120, poll: float = 0.1
) -> tuple[subprocess.Popen[str], int]:
    """serve_argv over workspace `ws` (stdout and stderr together on proc.stdout); the process and its port once
    it listens. The test fails, the process killed, when it exits or does not listen within `timeout` s."""
    import pytest  # here: bench/serve_load.py uses serve_argv without pytest

    proc = subprocess.Popen(
        serve_argv(port_file, run, *extra),
        env={**os.environ, "HEXSTUDIO_WORKSPACE": str(ws)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while not port_file.is_file() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"hexstudio serve did not start: {proc.communicate()[0]}")
        time.sleep(poll)
    return proc, int(port_file.read_text())


def http_answer(buf: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, headers (lower-cased names) and body of a raw HTTP/1.1 answer; (0, {}, buf) when `buf` is
    not one (the server closed with no answer)."""
    if not buf.startswith(b"HTTP/1.1 "):
        return 0, {}, buf
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hs = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines[1:] if ": " in ln)}
    return int(lines[0].split()[1]), hs, body
