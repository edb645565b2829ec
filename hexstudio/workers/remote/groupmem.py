"""The resident memory of a process group, sampled on a worker host while a remote job runs
(hexstudio.core.remote.job): one line per sample, the group's RSS in bytes, every INTERVAL seconds while the
group has a process; it ends when the group is gone.

    python -c SOURCE PGID [INTERVAL]

Reads /proc (Linux); elsewhere `ps -eo pgid=,rss=`. Stdlib only, self-contained (hexstudio.workers.remote).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def group_rss_proc(pgid: int, proc: str = "/proc") -> int:
    """Sum of the RSS of every process whose group is pgid, from /proc/<pid>/stat (field 24, pages)."""
    total = 0
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat"), encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue  # the process ended meanwhile
        # "pid (comm) state ppid pgrp ... rss": comm may hold spaces and ')', so split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        try:
            if int(fields[2]) == pgid:
                total += int(fields[21]) * PAGE
        except (IndexError, ValueError):
            continue
    return total


def group_rss_ps(pgid: int) -> int:
    out = subprocess.run(["ps", "-eo", "pgid=,rss="], capture_output=True, text=True, check=False).stdout
    total = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == str(pgid) and parts[1].isdigit():
            total += int(parts[1]) * 1024
    return total


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: groupmem PGID [INTERVAL]", file=sys.stderr)
        return 2
    pgid = int(argv[0])
    interval = float(argv[1]) if len(argv) > 1 else 0.25
    sample = group_rss_proc if os.path.isdir("/proc/self") else group_rss_ps
    try:
        while group_alive(pgid):
            print(sample(pgid), flush=True)
            time.sleep(interval)
    except (BrokenPipeError, KeyboardInterrupt):  # the studio stopped reading
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
