"""The file operations a sync with a worker host needs, run there (hexstudio.core.remote.sync):

    list ROOT RECORD          {"files": {rel: size}, "record": <ROOT/RECORD as JSON, or {}>}
    hash ROOT  < ["rel"...]   {rel: sha256}
    prune ROOT < ["rel"...]   removes those files (missing ones are fine)
    promote ROOT FINAL        FINAL replaced by ROOT (a rename)
    reset ROOT                ROOT emptied (made when missing)

One JSON document on stdout where there is an answer. Relative paths are POSIX-style; symbolic links
are not listed. Stdlib only, self-contained: sent as `python -c SOURCE ARGS` (hexstudio.workers.remote).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from typing import Any


def list_files(root: str, record: str) -> dict[str, Any]:
    files: dict[str, int] = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            p = os.path.join(folder, name)
            if not os.path.islink(p):
                files[os.path.relpath(p, root).replace(os.sep, "/")] = os.path.getsize(p)
    kept: Any = {}
    try:
        with open(os.path.join(root, record), encoding="utf-8") as fh:
            kept = json.load(fh)
    except (OSError, ValueError):
        pass
    return {"files": files, "record": kept if isinstance(kept, dict) else {}}


def hash_files(root: str, rels: list[str]) -> dict[str, str]:
    out = {}
    for rel in rels:
        h = hashlib.sha256()
        with open(os.path.join(root, rel), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        out[rel] = h.hexdigest()
    return out


def prune(root: str, rels: list[str]) -> None:
    for rel in rels:
        try:
            os.remove(os.path.join(root, rel))
        except OSError:
            pass


def promote(root: str, final: str) -> None:
    shutil.rmtree(final, ignore_errors=True)
    os.rename(root, final)


def reset(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: files list|hash|prune|promote|reset ROOT [...]", file=sys.stderr)
        return 2
    mode, root, rest = argv[0], argv[1], argv[2:]
    if mode == "list" and len(rest) == 1:
        print(json.dumps(list_files(root, rest[0])))
    elif mode == "hash":
        print(json.dumps(hash_files(root, json.load(sys.stdin))))
    elif mode == "prune":
        prune(root, json.load(sys.stdin))
    elif mode == "promote" and len(rest) == 1:
        promote(root, rest[0])
    elif mode == "reset":
        reset(root)
    else:
        print(f"files: bad arguments {argv!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
