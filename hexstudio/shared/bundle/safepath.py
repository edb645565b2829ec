"""The one check for a path that comes from outside: a bundle (bundle.json `files`, graphs.json,
genie_config.json's ctx-bins and tokenizer path), a run manifest, a config or the board.

Such a path names a file INSIDE a folder (the bundle folder, a run folder). It must be relative, use
`/` only, have no `..`, `.` or empty parts, no drive letter or backslash, and every part from a safe
set of characters (letters, digits, `.`, `_`, `-`, `+`), never starting with `-`. Resolved under its
folder it must stay inside it, symlinks included.

Pure Python (standard library only): hexstudio.core imports it and the simulator board's runner uses it. The
rules the board checks too (genie_config.json's path keys, the safe characters, the kinds of file refused) live in
hexstudio.shared.genie_paths, which is copied to the board beside the chat helper genie_session.py.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from hexstudio.shared.errors import ActionableError
from hexstudio.shared.genie_paths import (
    SAFE_PART,
    genie_config_paths,
    not_regular_kind,
)

MAX_PART = 255
MAX_PATH = 1024
MAX_DEPTH = 16


class UnsafePath(ActionableError, ValueError):
    """A path from a bundle, manifest, config or board that HexStudio will not use. `entry` names
    where it came from (e.g. "bundle.json files[3]"), `path` is the offending value, `why` the rule."""

    def __init__(self, entry: str, path: object, why: str, what_to_do: str | None = None) -> None:
        self.entry = entry
        self.path = path
        self.why = why
        super().__init__(
            f"{entry}: refused path {path!r}: {why}. Nothing was read or written for it.",
            what_to_do
            or (
                "This file was not made by HexStudio's compile stage or was changed "
                "since: compile the bundle again (or ask whoever sent it for a bundle "
                "from HexStudio) and do not use this one."
            ),
        )


def check_relative(path: object, entry: str = "path") -> str:
    """Return `path` (a str) when it is a safe relative POSIX path; raise UnsafePath saying why not."""
    if not isinstance(path, str):
        raise UnsafePath(entry, path, f"it is a {type(path).__name__}, not a text path")
    if not path:
        raise UnsafePath(entry, path, "it is empty")
    if len(path) > MAX_PATH:
        raise UnsafePath(entry, path[:80] + "...", f"it is longer than {MAX_PATH} characters")
    if "\x00" in path:
        raise UnsafePath(entry, path, "it holds a NUL character")
    if "\\" in path:
        raise UnsafePath(entry, path, "it holds a backslash (a Windows path); bundle paths use '/' only")
    if re.match(r"^[A-Za-z]:", path):
        raise UnsafePath(entry, path, "it starts with a drive letter (an absolute Windows path)")
    if path.startswith("/") or path.startswith("~"):
        raise UnsafePath(entry, path, "it is absolute; it must be relative to the bundle folder")
    parts = path.split("/")
    if len(parts) > MAX_DEPTH:
        raise UnsafePath(entry, path, f"it is nested deeper than {MAX_DEPTH} folders")
    for part in parts:
        if part == "..":
            raise UnsafePath(entry, path, "it climbs out of its folder with '..'")
        if part in ("", "."):
            raise UnsafePath(entry, path, "it has an empty or '.' part ('//' or '/./')")
        if len(part) > MAX_PART:
            raise UnsafePath(entry, path, f"a part is longer than {MAX_PART} characters")
        if part.startswith("-"):
            raise UnsafePath(entry, path, f"the part {part!r} starts with '-' (it would read as an option)")
        if not SAFE_PART.match(part):
            bad = "".join(sorted({c for c in part if not SAFE_PART.match(c)}))
            raise UnsafePath(
                entry,
                path,
                f"the part {part!r} holds characters outside the safe set "
                f"(letters, digits, '.', '_', '-', '+'): {bad!r}",
            )
    return path


def check_name(name: object, entry: str = "name") -> str:
    """A single safe file or folder name (no '/')."""
    s = check_relative(name, entry)
    if "/" in s:
        raise UnsafePath(entry, name, "it must be a single name, not a path")
    return s


def resolve_under(root: Path | str, path: object, entry: str = "path", *, must_exist: bool = False) -> Path:
    """`root / path`, after check_relative, and only if it resolves (symlinks followed) inside `root`."""
    rel = check_relative(path, entry)
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(os.path.join(base, rel)))
    if target != base and base not in target.parents:
        raise UnsafePath(entry, path, f"it leads outside its folder through a symbolic link (to {target})")
    if must_exist and not target.exists():
        raise UnsafePath(
            entry,
            path,
            "it does not exist in the folder",
            "The folder is incomplete: compile the bundle again.",
        )
    return target


def check_bundle_files(files: object, entry: str = "bundle.json files") -> list[dict[str, Any]]:
    """bundle.json's `files` list: each entry a {path, sha256, size} with a safe path, no duplicates and
    none of the names HexStudio keeps for itself. Returns the list."""
    if not isinstance(files, list):
        raise UnsafePath(entry, type(files).__name__, "it must be a list of {path, sha256, size}")
    seen: set[str] = set()
    for i, f in enumerate(files):
        where = f"{entry}[{i}]"
        if not isinstance(f, dict):
            raise UnsafePath(where, f, "it is not an object {path, sha256, size}")
        p = check_relative(f.get("path"), where)
        if p in RESERVED or p.endswith(".part"):
            raise UnsafePath(where, p, "it is a name HexStudio reserves for its own bookkeeping on the board")
        if p in seen:
            raise UnsafePath(where, p, "it is listed twice")
        seen.add(p)
        sha = f.get("sha256")
        if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise UnsafePath(where, p, f"its sha256 {sha!r} is not 64 hex digits")
        size = f.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UnsafePath(where, p, f"its size {size!r} is not a byte count")
    return files


RESERVED = frozenset({"bundle.json", ".hexstudio-pushed.json"})


def check_genie_config(
    cfg: object,
    root: Path | str,
    entry: str = "genie_config.json",
    *,
    regular: bool = True,
    require_dialog: bool = True,
) -> None:
    """Every file a genie_config.json names (ctx-bins, tokenizer path, backend extensions, LoRA bin-sections, a
    draft model's files, ...), checked and resolved under the bundle folder `root`; with `regular`, each that
    exists must be a regular file (a FIFO would hang whoever opens it, a device would read forever). Without
    `require_dialog` (the push: Genie's schema is `bundle check`'s business) only the paths are checked."""
    d: Any = cfg.get("dialog") if isinstance(cfg, dict) else None
    if require_dialog and not isinstance(d, dict):
        raise UnsafePath(entry, "dialog", "it has no 'dialog' object")
    for where, path in genie_config_paths(cfg):
        target = resolve_under(root, path, f"{entry} {where}")
        if regular:
            check_regular(target, f"{entry} {where}", path)


def check_regular(target: Path | str, entry: str, shown: object = None, *, must_exist: bool = False) -> None:
    """`target` (already resolved) is a regular file, or absent (unless must_exist). Never opens it."""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        if must_exist:
            raise UnsafePath(
                entry,
                shown if shown is not None else str(target),
                "it does not exist in the folder",
                "The folder is incomplete: compile the bundle again.",
            ) from None
        return
    except OSError as exc:
        raise UnsafePath(
            entry, shown if shown is not None else str(target), f"it cannot be examined ({exc})"
        ) from None
    kind = not_regular_kind(st.st_mode)
    if kind is not None:
        raise UnsafePath(
            entry,
            shown if shown is not None else str(target),
            f"it is {kind}, not a regular file (reading it could hang or never end)",
        )


def open_regular(root: Path | str, path: object, entry: str = "path") -> BinaryIO:
    """Open `root / path` for reading, after resolve_under, only if it is a regular file: opened with
    O_NOFOLLOW (the resolved name cannot have been swapped for a symlink since the check) and O_NONBLOCK (a FIFO
    cannot hang the open), then checked with fstat on the descriptor itself."""
    target = resolve_under(root, path, entry)
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(entry, path, "it became a symbolic link while it was being opened") from None
        raise
    try:
        kind = not_regular_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise UnsafePath(
                entry, path, f"it is {kind}, not a regular file (reading it could hang or never end)"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _obj(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}
