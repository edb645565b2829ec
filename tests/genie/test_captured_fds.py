"""The board helper captures what a C library prints on fds 1 and 2 around Genie's config parser (fd 1 is its
JSON-lines channel): the text comes back to the helper, and with `forward` it also reaches stderr as it is written
(the helper's stderr is what the studio shows when a helper ends without a word)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, sys
from hexstudio.workers.board.genie_session import captured_fds
with captured_fds(forward=FORWARD) as said:
    os.write(1, b"on fd 1\n")
    os.write(2, b"on fd 2\n")
sys.stdout.write("channel: " + repr(said) + "\n")
"""


def _run(forward: bool) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.replace("FORWARD", str(forward))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_text_is_captured_and_kept_off_the_channel() -> None:
    r = _run(forward=False)
    assert r.stdout == "channel: ['on fd 1\\non fd 2\\n']\n" and r.stderr == ""
    r = _run(forward=True)
    assert r.stdout == "channel: ['on fd 1\\non fd 2\\n']\n" and r.stderr == "on fd 1\non fd 2\n"
