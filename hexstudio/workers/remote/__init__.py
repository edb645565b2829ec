"""Programs the studio runs on a worker host (hexstudio.core.remote), each a module of its own here.

    probe      the host's Python, CPUs, memory, and the modules a stage needs that it cannot import
    files      the file operations a sync needs there: list, hash, prune, promote, reset
    groupmem   the RSS of a process group, 4 times a second while the group lives

They run before the workers are installed on the host (probe) or on folders outside the installed copy,
so each is sent as `python -c SOURCE ARGS` (host_command): stdlib only, self-contained, importing nothing
of HexStudio's, each with a `main(argv)`. This package is light: hexstudio.core imports it for host_command, never
the programs themselves.
"""

from __future__ import annotations

from importlib import resources

PROGRAMS = ("probe", "files", "groupmem")


def program_source(name: str) -> str:
    """The text of one program (a module of this package)."""
    if name not in PROGRAMS:
        raise ValueError(f"no worker-host program named {name!r} (known: {', '.join(PROGRAMS)})")
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")


def host_command(python: str, name: str, *args: str) -> list[str]:
    """argv that runs program `name` with the host's `python`: `python -c SOURCE ARGS`."""
    return [python, "-c", program_source(name), *args]
