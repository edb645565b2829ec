"""A command on a pseudo-terminal, answering its prompts as a user would (getpass, yes/no questions)."""

from __future__ import annotations

import os
import pty
import select
import time
from collections.abc import Sequence


def converse(
    argv: Sequence[str], answers: Sequence[tuple[str, str]], timeout: float = 60
) -> tuple[bytes, int, list[tuple[str, str]]]:
    """Run argv (argv[0] a path) on a new terminal; each (prompt, answer) in turn is typed, with Enter, once
    `prompt` shows at the end of the output. Returns what the terminal showed, the exit code and the answers
    never asked for."""
    left = list(answers)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        os.execv(argv[0], list(argv))
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
            if left and left[0][0].encode() in seen.split(b"\n")[-1] + seen[-400:]:
                os.write(fd, left.pop(0)[1].encode() + b"\n")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return seen, os.waitstatus_to_exitcode(status), left
