"""The bundle on the board checked against the local one, without copying anything back: bundle.json's
files (every path checked: hexstudio.shared.bundle.safepath), their sizes and ctimes from one `stat` and their
sha256 computed on the board. The push (hexstudio.core.device.push) resumes with it; the doctor's "bundle" check
and the Board stage's gate call verify_pushed."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import sha256_file
from hexstudio.core.device.board import Board, BoardError
from hexstudio.core.device.errors import (
    LocalBundleError,
    UnsafeBundle,
)
from hexstudio.shared.bundle.safepath import (
    UnsafePath,
    check_bundle_files,
    check_genie_config,
    check_name,
    open_regular,
    resolve_under,
)

MAX_MANIFEST_BYTES = 64 << 20  # bundle.json / genie_config.json: far beyond any real one
VERIFY_JOBS = 4  # files hashed at once on the board (sha256sum processes)
STAT_LINE = re.compile(r"^(\d+) (\d+(?:\.\d+)?) (.+)$")
CTIMES = "//ctime"  # key of the board manifest holding each file's ctime after the push (never a path)
HASH_LINE = re.compile(r"^\\?([0-9a-f]{64}) [ *](.+)$")


def load_bundle(bundle_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """bundle.json and its files, every path checked (safepath) and every local file present with the size
    bundle.json gives, before anything is sent. Raises UnsafeBundle or LocalBundleError."""
    manifest = bundle_dir / "bundle.json"
    try:
        with open_regular(
            bundle_dir, "bundle.json", "bundle.json"
        ) as fh:  # a FIFO here must not hang the push
            doc = json.loads(fh.read(MAX_MANIFEST_BYTES).decode("utf-8"))
    except UnsafePath as exc:
        raise UnsafeBundle(f"Refused to push {bundle_dir}: {exc}", exc.hint) from None
    except FileNotFoundError:
        raise LocalBundleError(
            f"{manifest} does not exist: {bundle_dir} is not a complete bundle folder.",
            "Give the compile stage's bundle folder (artifacts/compile/bundle), or compile again.",
        ) from None
    except (OSError, ValueError) as exc:
        raise LocalBundleError(
            f"{manifest} cannot be read ({exc}).",
            "Compile again: bundle.json is written last by the compile stage.",
        ) from None
    if not isinstance(doc, dict):
        raise LocalBundleError(f"{manifest} is not a JSON object.", "Compile again.")
    try:
        files = check_bundle_files(doc.get("files"))
        for i, f in enumerate(files):
            resolve_under(bundle_dir, f["path"], f"bundle.json files[{i}]")
        if any(f["path"] == "genie_config.json" for f in files):
            # every file genie_config.json names (ctx-bins, tokenizer, extensions, LoRA, draft model): inside the
            # bundle, no symlink out, a regular file, so nothing outside it is sent, read or loaded on the board
            with open_regular(bundle_dir, "genie_config.json", "genie_config.json") as fh:
                cfg = json.loads(fh.read(MAX_MANIFEST_BYTES).decode("utf-8"))
            check_genie_config(cfg, bundle_dir, require_dialog=False)
    except UnsafePath as exc:
        raise UnsafeBundle(f"Refused to push {bundle_dir}: {exc}", exc.hint) from None
    except (OSError, ValueError) as exc:  # genie_config.json unreadable or not JSON
        raise LocalBundleError(
            f"{bundle_dir / 'genie_config.json'} cannot be read ({exc}).",
            "Compile the bundle again (`hexstudio bundle check` says what is wrong).",
        ) from None
    for i, f in enumerate(files):
        local = bundle_dir / str(f["path"])
        try:
            size = local.stat().st_size
        except FileNotFoundError:
            raise LocalBundleError(
                f"The local bundle file {local} (bundle.json files[{i}], '{f['path']}') is missing. Nothing was "
                "sent for it; the board and its connection are fine.",
                "The bundle folder is incomplete (deleted or moved files): run the Compile stage again, or "
                f"`hexstudio bundle verify {bundle_dir}` to see every difference.",
            ) from None
        except OSError as exc:
            raise LocalBundleError(
                f"The local bundle file {local} cannot be read ({exc}).",
                "Check its permissions and the disk, then push again.",
            ) from None
        if not local.is_file():
            raise LocalBundleError(
                f"The local bundle entry {local} (bundle.json files[{i}]) is not a file.",
                "Compile the bundle again.",
            )
        if size != int(f["size"]):
            raise LocalBundleError(
                f"The local bundle file {local} has {size} bytes but bundle.json says {f['size']}: it changed "
                "after the bundle was compiled. Nothing was sent.",
                f"Run the Compile stage again (or `hexstudio bundle verify {bundle_dir}` to see what changed).",
            )
    return doc, files


async def _board_lines(t: Any, argv: list[str], cwd: str, rels: list[str], timeout: float) -> list[str]:
    res = await t.run(argv, cwd=cwd, stdin=b"\0".join(r.encode() for r in rels), timeout=timeout)
    if res.exit_status == 124:
        raise BoardError(
            f"Checking the bundle on the board timed out ({' '.join(argv[:3])}...).",
            "The board may be overloaded or its storage slow; push again.",
        )
    return list(res.stdout.splitlines())


async def remote_stat(t: Any, remote: str, rels: list[str]) -> dict[str, tuple[int, str]]:
    """{path: (size, ctime)} of the files that exist on the board (one `stat` for all of them). The ctime
    changes with any write to a file and cannot be set back by its owner: a file changed on the board
    after a push shows a new one."""
    if not rels:
        return {}
    out: dict[str, tuple[int, str]] = {}
    for fmt in ("%s %.9Z %n", "%s %Z %n"):  # an old coreutils stat lacks the fraction
        for line in await _board_lines(t, ["xargs", "-0", "-r", "stat", "-c", fmt, "--"], remote, rels, 300):
            m = STAT_LINE.match(line)
            if m:
                out[m.group(3)] = (int(m.group(1)), m.group(2))
        if out:
            break
    return out


async def remote_sha256(t: Any, remote: str, rels: list[str], jobs: int = VERIFY_JOBS) -> dict[str, str]:
    """{path: sha256} computed ON the board, `jobs` files at a time (sha256sum, one process a file so each
    answer is one atomic line); nothing is copied back. Files missing there are absent from the answer."""
    if not rels:
        return {}
    out: dict[str, str] = {}
    argv = ["xargs", "-0", "-r", "-n", "1", "-P", str(max(1, jobs)), "sha256sum", "--"]
    for line in await _board_lines(t, argv, remote, rels, 3600):
        m = HASH_LINE.match(line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


async def compare_on_board(
    board: Board,
    remote: str,
    files: list[dict[str, Any]],
    *,
    hashes: bool,
    ctimes: dict[str, str] | None = None,
) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The bundle files whose copy on the board is missing, of another size or of another sha256 than
    bundle.json says: ([{"path", "why"}], {path: seen} of the files found right, where `seen` is the file's
    ctime on the board and the sha256 it was found to have). The sha256 is computed on the board for every
    file when `hashes`, else for each file whose record in `ctimes` (what the last push saw) is missing or
    differs: its ctime moved on the board, or bundle.json now wants another sha256 (a recompiled bundle whose
    files kept their sizes)."""
    t = board.transport
    rels = [str(f["path"]) for f in files]
    if not await t.exists(remote):
        return [{"path": r, "why": "missing on the board"} for r in rels], {}
    stats = await remote_stat(t, remote, rels)
    bad: list[dict[str, str]] = []
    todo: list[dict[str, Any]] = []
    for f in files:
        rel, size = str(f["path"]), int(f["size"])
        got = stats.get(rel)
        if got is None:
            bad.append({"path": rel, "why": "missing on the board"})
        elif got[0] != size:
            bad.append(
                {"path": rel, "why": f"{got[0]} bytes on the board, {size} expected (truncated or changed)"}
            )
        elif hashes or (ctimes or {}).get(rel) != seen_as(got[1], str(f["sha256"])):
            todo.append(f)
    sums = await remote_sha256(t, remote, [str(f["path"]) for f in todo])
    for f in todo:
        got_sha = sums.get(str(f["path"]))
        if got_sha is None:
            bad.append({"path": str(f["path"]), "why": "could not be read on the board"})
        elif got_sha != f["sha256"]:
            bad.append(
                {
                    "path": str(f["path"]),
                    "why": f"sha256 on the board {got_sha[:12]}..., "
                    f"{str(f['sha256'])[:12]}... expected (content changed)",
                }
            )
    wrong = {b["path"] for b in bad}
    return bad, {
        str(f["path"]): seen_as(stats[str(f["path"])][1], str(f["sha256"]))
        for f in files
        if str(f["path"]) in stats and str(f["path"]) not in wrong
    }


def seen_as(ctime: str, sha256: str) -> str:
    """A verified file as the push records it: its ctime on the board and the sha256 it was found to have. Both
    must match for the next comparison to skip hashing it: a later write on the board moves the ctime, a
    recompiled bundle changes the sha256 bundle.json asks for (records of older HexStudios hold the ctime alone,
    so they never match and each file is hashed once more)."""
    return f"{ctime} {sha256}"


async def remote_bundle_dir(board: Board, name: str) -> str:
    try:
        check_name(name, "bundle name")
    except UnsafePath as exc:
        raise UnsafeBundle(
            str(exc), "Name the bundle with letters, digits, '.', '_', '-' or '+' only (a run id always is)."
        ) from None
    home = await board.transport.home()
    if not isinstance(home, str) or not home.startswith("/") or "\n" in home or "\x00" in home:
        raise BoardError(
            f"The board answered {home!r} for the home folder, which is not an absolute path.",
            "Check the board user's home folder (echo $HOME on the board).",
        )
    return posixpath.join(home, "hexstudio", "bundles", name)


def default_remote_name(bundle_dir: Path) -> str:
    """The name a bundle folder has on the board when none is given: a run's compiled bundle
    (<runs>/<run-id>/artifacts/compile/bundle) is pushed as its run id, as the Board stage pushes it; any other
    folder by its own name (issue 27: `board probe --bundle RUN/artifacts/compile/bundle` compared "bundle")."""
    p = Path(os.path.abspath(bundle_dir))
    if p.name == "bundle" and p.parent.name == "compile" and p.parent.parent.name == "artifacts":
        return p.parent.parent.parent.name
    return p.name


def local_record_path(board: Board, remote: str) -> Path:
    """Where the studio keeps what it found on the board after its last push there: each file's ctime and the
    sha256 it was verified to have (`seen_as`). The trust anchor for the next comparison: the copy on the board (REMOTE_MANIFEST) can be edited by
    anyone who can write the bundle folder, so a flipped byte plus an edited ctime there would hide (issue 27)."""
    from hexstudio.core.paths import config_dir

    key = hashlib.sha256(f"{board.name}\0{remote}".encode()).hexdigest()[:32]
    return config_dir() / "pushes" / f"{key}.json"


def load_local_record(board: Board, remote: str) -> dict[str, str]:
    try:
        doc = json.loads(local_record_path(board, remote).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    got = doc.get("ctimes") if isinstance(doc, dict) else None
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def save_local_record(board: Board, remote: str, ctimes: dict[str, str]) -> None:
    from hexstudio.core.atomic import write_json_atomic

    try:
        write_json_atomic(
            local_record_path(board, remote), {"board": board.name, "remote": remote, "ctimes": ctimes}
        )
    except OSError:  # no record: the next comparison computes every sha256 on the board (slower, as safe)
        pass


async def symlinks_on_board(board: Board, remote: str) -> list[str]:
    """The bundle folder, its parents under ~/hexstudio, or anything inside it that is a symbolic link on the
    board: a push would write through it (issue 27: a symlinked folder already on the board was followed)."""
    parent = posixpath.dirname(remote)
    script = (
        'for p in "$1" "$2" "$3"; do [ -L "$p" ] && echo "$p"; done; '
        '[ -d "$3" ] && [ ! -L "$3" ] && find "$3" -mindepth 1 -type l -print 2>/dev/null; true'
    )
    res = await board.transport.run(
        ["sh", "-c", script, "_", posixpath.dirname(parent), parent, remote], timeout=120
    )
    return [ln for ln in res.stdout.splitlines() if ln.strip()]


async def verify_pushed(
    board: Board, bundle_dir: Path, name: str, *, hashes: bool = True
) -> list[dict[str, str]]:
    """Compare the bundle on the board with the local one (sizes; sha256 computed on the board when
    `hashes`): the files that differ, [] when it matches. For the doctor and the Board stage's gate."""
    _doc, files = load_bundle(bundle_dir)
    entries = [
        *files,
        {
            "path": "bundle.json",
            "sha256": sha256_file(bundle_dir / "bundle.json"),
            "size": (bundle_dir / "bundle.json").stat().st_size,
        },
    ]
    bad, _ = await compare_on_board(board, await remote_bundle_dir(board, name), entries, hashes=hashes)
    return bad
