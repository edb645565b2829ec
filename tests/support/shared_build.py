"""One build of an expensive session fixture for the whole test run, when pytest-xdist runs it in several worker
processes (`./dev test` does: `-n 2`): the first worker to need it builds it under a file lock in the folder the
workers share, the others wait and use the same folder. Without xdist it is built in this process's temp folder, as
before. What such a fixture returns is shared by every worker: copy it before changing it (docs/CONTRACTS.md §6)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """`build(folder)` once per test run; returns what it returned. A failed build is not recorded: the next
    worker that needs it tries again (and fails the same way, with its own message)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(tmp_path_factory.mktemp(name))
    shared = (
        tmp_path_factory.getbasetemp().parent
    )  # pytest-of-<user>/pytest-<n>/, above each worker's popen-gwN
    record = shared / f"{name}.built.json"
    with FileLock(str(shared / f"{name}.lock")):
        if record.is_file():
            return Path(json.loads(record.read_text())["path"])
        result = build(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))
        record.write_text(json.dumps({"path": str(result), "by": os.environ["PYTEST_XDIST_WORKER"]}))
        return result
