"""Crash-safe file writes: write a temp file in the same folder, fsync, rename."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def sync_tree(root: Path) -> None:
    """Every file and folder under `root` (and `root`) forced to disk: a stage's output, before run.json says it is
    done with each file's size and sha256 (after a power cut, a file the kernel had not written yet comes back
    empty, and the stage, hours of work, would run again with a message blaming its inputs)."""
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            _fsync_path(p)


def fsync_dir(path: Path) -> None:
    """A folder's entries (a rename into it, a file made in it) forced to disk."""
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    _fsync_path(path)


def _fsync_path(path: Path) -> None:
    """A file's data or a folder's entries forced to disk, as far as the file system lets it (no error raised)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    try:  # Linux 4.7+: read, not set (os.umask would change it for every thread a moment)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _file_mode(target: Path, private: bool) -> int:
    """The new file's permissions: those of the file it replaces, else what open() would give (0666 less the
    umask); 0600 for a private one. mkstemp's own 0600 made a report the user exported unreadable to others."""
    if private:
        return 0o600
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_writer(
    path: str | Path, mode: str = "w", encoding: str | None = "utf-8", *, private: bool = False
) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on clean exit fsync and rename it over `path`. The file keeps the mode of
    the one it replaces (a new one: the umask's); `private`: readable by its owner only."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    ok = False
    try:
        os.fchmod(fd, _file_mode(target, private))
        with os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        ok = True
        _fsync_dir(target.parent)
    finally:
        if not ok:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def write_text_atomic(path: str | Path, text: str, *, private: bool = False) -> None:
    with atomic_writer(path, "w", private=private) as fh:
        fh.write(text)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_writer(path, "wb", encoding=None) as fh:
        fh.write(data)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def sha256_file(path: str | Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(bufsize):
            h.update(chunk)
    return h.hexdigest()
