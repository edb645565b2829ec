"""Processes as the tests watch them end (through psutil, which the studio itself uses)."""

from __future__ import annotations

import psutil


def alive(pid: int) -> bool:
    """Whether `pid` is a running process: a zombie (ended, not yet reaped by its parent) is not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
