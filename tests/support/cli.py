"""The studio's command line as the tests run it, in a child process with its output captured as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# `hexstudio run` of the built-in model on the simulator board (add --until, --set, --json ...)
RUN_BUILTIN = ("run", "--model", "builtin:tiny-llama", "--board", "sim")


def hexstudio(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed `hexstudio` console script (beside this interpreter) with ARGS."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("hexstudio")), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# `python -c CLI_MAIN ARGS`: the CLI's main() itself, not through hexstudio/__main__.py
CLI_MAIN = "import sys; from hexstudio.cli.main import main; sys.exit(main(sys.argv[1:]))"


def python_m_hexstudio(
    *args: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
    main: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m hexstudio ARGS` (`main`: `python -c CLI_MAIN ARGS`) with this environment plus `env`, reading
    `stdin` (else /dev/null)."""
    return subprocess.run(
        [sys.executable, *(["-c", CLI_MAIN] if main else ["-m", "hexstudio"]), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def python_module(
    module: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in `cwd`, its output captured as text; `env` is its whole environment (else this
    one's)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sim_t2t_argv(prompt: str, max_tokens: int, *more: str) -> list[str]:
    """The simulator's genie-t2t-run (hexstudio/workers/genie_sim/t2t.py) on genie_config.json, to run in the
    bundle folder: `prompt`, at most `max_tokens` tokens, then the options `more`."""
    return [
        sys.executable,
        "-m",
        "hexstudio.workers.genie_sim.t2t",
        "-c",
        "genie_config.json",
        "-p",
        prompt,
        "--max-tokens",
        str(max_tokens),
        *more,
    ]
