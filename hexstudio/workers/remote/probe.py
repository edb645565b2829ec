"""What a worker host offers: its Python, CPUs, memory, and which of the named modules it cannot import.

    python -c SOURCE numpy torch ...      one JSON line: python, executable, platform, cpu_count,
                                          memory_bytes, missing

Sent by hexstudio.core.remote.hosts.check_host before anything is installed on the host (hexstudio.workers.remote).
Stdlib only, self-contained.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from typing import Any


def memory_bytes(meminfo: str = "/proc/meminfo") -> int:
    """MemTotal in bytes; 0 where the file is missing (not Linux)."""
    try:
        with open(meminfo, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def missing_modules(modules: list[str]) -> list[str]:
    """The modules this Python cannot import (found without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def probe(modules: list[str]) -> dict[str, Any]:
    return {
        "python": list(sys.version_info[:3]),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": memory_bytes(),
        "missing": missing_modules(modules),
    }


def main(argv: list[str]) -> int:
    print(json.dumps(probe(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
