"""Files between the studio and a worker host: the workers themselves (installed once per version), the
folders a stage reads (uploaded: what is already there with the same size and sha256 is skipped, an
interrupted file continues) and the folder it wrote (downloaded), with the paths inside its JSON files
mapped back to this machine's.

The host side of every operation is hexstudio.workers.remote.files, run there with the host's Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import posixpath
import secrets
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import sha256_file, write_json_atomic
from hexstudio.core.device.transport import Transport
from hexstudio.core.paths import WORKERS_ROOT, config_dir
from hexstudio.core.remote.hosts import WorkerHostError
from hexstudio.shared import data
from hexstudio.workers.remote import host_command

WORKERS_DIR = WORKERS_ROOT / "hexstudio" / "workers"  # the installed (or checked-out) workers package
SHARED_DIR = WORKERS_ROOT / "hexstudio" / "shared"  # what the workers share with the studio: goes with them
# hexstudio/__init__.py goes with it: `python -m hexstudio.workers.X` imports the parent package first
PARENT_INIT = WORKERS_ROOT / "hexstudio" / "__init__.py"
# Package data the workers read on the host (the built-in calibration/validation text, the recipes, the QuantSim
# configurations of quantsim_config): copied with the modules, at the same place inside the package. Not the
# built-in model: the model stage's output (hf/) is uploaded with the run.
WORKER_DATA = (data.data_path(*data.BUILTIN_TEXT), data.recipes_dir(), data.data_path(*data.QUANTSIM))
# A synced folder's record on the host: rel -> [size, sha256] of the files known complete there.
SYNC_MANIFEST = ".hexstudio-synced.json"


def workers_bundle() -> tuple[str, bytes]:
    """The workers package as a tar.gz and its content hash (the remote folder's name)."""
    files = [
        PARENT_INIT,
        *sorted(
            p for d in (WORKERS_DIR, SHARED_DIR) for p in d.rglob("*.py") if "__pycache__" not in p.parts
        ),
    ]
    for folder in WORKER_DATA:
        files += sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "train.txt")
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(WORKERS_ROOT).as_posix().encode() + b"\0" + p.read_bytes())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in files:
            tar.add(p, arcname=p.relative_to(WORKERS_ROOT).as_posix())
    return h.hexdigest()[:16], buf.getvalue()


def host_folder(root: str | None, home: str) -> str:
    """A worker host's `root` setting as an absolute path there: unset is ~/.cache/hexstudio; `~`, `~/x` and a
    relative `x` are under the host's home (neither SFTP nor a quoted shell argument expands `~`, and the worker
    runs in another folder than a relative path would be read from)."""
    if not root:
        return posixpath.join(home, ".cache", "hexstudio")
    if root == "~" or root.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, root[2:]))
    return posixpath.normpath(posixpath.join(home, root))


def host_python(python: object, home: str) -> str:
    """A worker host's `python` setting as the command to run there: unset is python3; a bare name (python3.11)
    is looked up on the host's PATH; `~/x` or a relative `x/y` is under the host's home (a quoted shell argument
    expands no `~`, and the worker runs in another folder than a relative path would be read from)."""
    text = str(python or "").strip() or "python3"
    if text.startswith("/") or ("/" not in text and not text.startswith("~")):
        return text
    return host_folder(text, home)


async def install_workers(transport: Transport, base: str | None = None) -> str:
    """Copy the workers package to the host once per version; return the folder holding it."""
    digest, blob = workers_bundle()
    home = await transport.home()
    root = posixpath.join(host_folder(base, home), f"workers-{digest}")
    if await transport.exists(posixpath.join(root, "hexstudio", "shared", "protocol.py")):
        return root
    # the staging names are this install's own: two studios installing at once do not remove each other's
    mine = secrets.token_hex(4)
    tmp_tar = posixpath.join(posixpath.dirname(root), f".workers-{digest}-{mine}.tar.gz")
    staging = f"{root}.partial-{mine}"
    made = await transport.run(["mkdir", "-p", posixpath.dirname(root)], timeout=30)
    if made.exit_status != 0:
        raise _install_failed(transport, posixpath.dirname(root), made.stderr)
    try:
        await transport.write_bytes(tmp_tar, blob)
    except OSError as exc:  # the host's disk full (its SFTP server says a bare "Failure"), or not this user's
        with contextlib.suppress(Exception):
            await transport.run(["rm", "-f", tmp_tar], timeout=30)
        raise _install_failed(transport, posixpath.dirname(root), str(exc)) from None
    res = await transport.run(
        [
            "sh",
            "-c",
            # an install of the same version that finished meanwhile is kept (not removed, not moved into)
            'rm -rf "$1" && mkdir -p "$1" && tar -xzf "$2" -C "$1" && rm -f "$2" && '
            'if [ -e "$3/hexstudio/shared/protocol.py" ]; then rm -rf "$1"; '
            'else rm -rf "$3" && mv -T "$1" "$3"; fi',
            "sh",
            staging,
            tmp_tar,
            root,
        ],
        timeout=120,
    )
    if res.exit_status != 0:
        await transport.run(["rm", "-rf", staging, tmp_tar], timeout=60)
        if await transport.exists(posixpath.join(root, "hexstudio", "shared", "protocol.py")):
            return root  # another install of the same version finished first
        raise _install_failed(transport, posixpath.dirname(root), res.stderr)
    return root


def _install_failed(transport: Transport, where: str, stderr: str) -> WorkerHostError:
    """The host refused the workers' files: a full disk, a quota, a folder that is not this user's (not a bug)."""
    return WorkerHostError(
        "worker_host_install_failed",
        f"HexStudio's workers could not be installed in {where} on {transport.label}: "
        f"{stderr.strip()[-300:] or 'the command failed without a message'}.",
        "Check the free space and the owner of that folder on the host (`df -h`, `ls -ld`), or set the host's "
        "root to a folder you can write (`hexstudio worker add NAME ... --root DIR`), then run the stage again.",
    )


async def host_files(
    transport: Transport,
    python: str,
    mode: str,
    root: str,
    *extra: str,
    data: Any = None,
    timeout: float = 3600,
) -> Any:
    """One file operation on the host (hexstudio.workers.remote.files): its JSON answer, or None."""
    res = await transport.run(
        host_command(python, "files", mode, root, *extra),
        timeout=timeout,
        stdin=None if data is None else json.dumps(data).encode(),
    )
    if res.exit_status != 0:
        raise WorkerHostError(
            "worker_host_files_failed",
            f"A file operation ({mode}) on the worker host failed in {root}: "
            f"{(res.stderr or '').strip()[-400:]}",
            "Check the host's free disk space and the worker host's root folder.",
        )
    out = res.stdout.strip()
    return json.loads(out.splitlines()[-1]) if out else None


def hash_cache_path() -> Path:
    return config_dir() / "remote-hash-cache.json"


class LocalHashes:
    """sha256 of local files: from run.json's artifact records when given, else computed once per
    (path, size, mtime) and remembered in <config>/remote-hash-cache.json (a 16 GB model is not hashed
    again for every stage)."""

    def __init__(self) -> None:
        self.path = hash_cache_path()
        try:
            self.cache: dict[str, list[Any]] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.cache = {}
        self.dirty = False

    def sha(self, p: Path) -> str:
        st = p.stat()
        key = str(p.resolve())
        hit = self.cache.get(key)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return str(hit[2])
        digest = sha256_file(p)
        self.cache[key] = [st.st_size, st.st_mtime_ns, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            with contextlib.suppress(OSError):
                write_json_atomic(self.path, self.cache)
            self.dirty = False


@dataclass
class SyncStats:
    """What an upload or download moved."""

    sent_files: int = 0
    skipped_files: int = 0
    sent_bytes: int = 0
    total_bytes: int = 0


def local_files(root: Path) -> dict[str, Path]:
    """Files under root by relative POSIX path, following symlinks (a Hugging Face cache snapshot is
    links to blobs: the content is what counts)."""
    out: dict[str, Path] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != SYNC_MANIFEST:
            out[p.relative_to(root).as_posix()] = p
    return out


async def upload_tree(
    transport: Transport,
    python: str,
    local: Path,
    remote: str,
    hashes: LocalHashes,
    known: dict[str, str] | None = None,
    stats: SyncStats | None = None,
    log: Callable[[str], None] | None = None,
) -> SyncStats:
    """Make `remote` hold exactly the files of `local`. A file already there with the same size and sha256
    is skipped (checked against the folder's sync record, else hashed on the host); the rest is sent with
    the transport's resumable put_file (as <file>.part, continued after a dropped connection, then renamed),
    the same primitive as the board's bundle push. Files the local folder lacks are removed.
    `known`: rel -> sha256 already known here (run.json's artifact records)."""
    stats = stats or SyncStats()
    files = local_files(local)
    await transport.run(["mkdir", "-p", remote], timeout=60)
    listing = await host_files(transport, python, "list", remote, SYNC_MANIFEST)
    there: dict[str, int] = listing["files"]
    record: dict[str, list[Any]] = listing["record"]
    want: dict[str, tuple[int, str]] = {}
    for rel, p in files.items():
        size = p.stat().st_size
        sha: str = (known or {}).get(rel) or ""
        if not sha:
            sha = await asyncio.to_thread(hashes.sha, p)
        want[rel] = (size, sha)
        stats.total_bytes += size
    unsure = [
        rel for rel, (size, sha) in want.items() if there.get(rel) == size and record.get(rel) != [size, sha]
    ]
    remote_sha: dict[str, str] = {}
    if unsure:
        remote_sha = await host_files(transport, python, "hash", remote, data=unsure)
    new_record: dict[str, list[Any]] = {}
    for rel, (size, sha) in want.items():
        if there.get(rel) == size and (record.get(rel) == [size, sha] or remote_sha.get(rel) == sha):
            stats.skipped_files += 1
            new_record[rel] = [size, sha]
    extra = [
        rel
        for rel in there
        if rel not in want and rel != SYNC_MANIFEST and not (rel.endswith(".part") and rel[:-5] in want)
    ]
    if extra:
        await host_files(transport, python, "prune", remote, data=extra)
    man = posixpath.join(remote, SYNC_MANIFEST)
    if new_record != record:
        await transport.write_bytes(man, json.dumps(new_record).encode())
    for rel, (size, sha) in want.items():
        if rel in new_record:
            continue
        if log is not None and size >= 64 << 20:
            log(f"uploading {rel} ({size / 1e6:.0f} MB)")
        n = await transport.put_file(files[rel], posixpath.join(remote, rel))
        stats.sent_bytes += size if n is None else int(n)
        stats.sent_files += 1
        new_record[rel] = [size, sha]
        await transport.write_bytes(man, json.dumps(new_record).encode())  # resumable: record as we go
    hashes.save()
    return stats


async def download_tree(
    transport: Transport, python: str, remote: str, local: Path, stats: SyncStats | None = None
) -> SyncStats:
    """Copy every file of the remote folder into `local` (which the pipeline just made empty)."""
    stats = stats or SyncStats()
    listing = await host_files(transport, python, "list", remote, SYNC_MANIFEST)
    for rel, size in sorted(listing["files"].items()):
        if rel == SYNC_MANIFEST:
            continue
        dst = local / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        await transport.get_file(posixpath.join(remote, rel), dst)
        if dst.stat().st_size != size:
            raise WorkerHostError(
                "worker_host_download_failed",
                f"{rel} arrived with {dst.stat().st_size} bytes instead of {size}.",
                "Resume the run to run the stage again.",
            )
        stats.sent_files += 1
        stats.sent_bytes += size
        stats.total_bytes += size
    return stats


def map_prefix(path: str, pairs: list[tuple[str, str]]) -> str:
    """`path` with the longest matching prefix of pairs (from, to) replaced; unchanged when none matches.
    (The worker's side of the same map, from HEXSTUDIO_PATH_MAP: hexstudio.workers.runtime.map_path.)"""
    for src, dst in sorted(pairs, key=lambda p: -len(p[0])):
        src = src.rstrip("/") or "/"
        if path == src or path.startswith(src + "/"):
            return dst.rstrip("/") + path[len(src) :]
    return path


def map_json_paths(folder: Path, pairs: list[tuple[str, str]]) -> list[str]:
    """Rewrite host paths inside the JSON files of a downloaded folder to this machine's (quantize.json's
    calibration text, validation.json's validation text...). Returns the files changed."""
    changed = []
    # a host path as a JSON file may hold it: escaped (json.dumps' default) or as UTF-8 (ensure_ascii=False)
    needles = {json.dumps(src, ensure_ascii=a)[1:-1].encode() for src, _ in pairs for a in (True, False)}

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return map_prefix(v, pairs)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    for p in sorted(folder.rglob("*.json")):
        raw = p.read_bytes()
        if not any(n in raw for n in needles):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        new = walk(doc)
        if new != doc:
            p.write_text(json.dumps(new, indent=2, ensure_ascii=False), encoding="utf-8")
            changed.append(p.relative_to(folder).as_posix())
    return changed
