"""Bundle push: resumable (sha256 per file; unchanged files skipped; written as .part then renamed),
with a compatibility check of bundle against board before anything is sent."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.atomic import sha256_file
from app.core.device.board import Board, BoardError
from app.core.device.errors import (
    BoardWriteFailed,
    ConnectionDropped,
    EmulatedBundle,
    LocalBundleError,
    UnsafeBundle,
)
from workers.shared.bundle.safepath import UnsafePath, check_bundle_files, check_name, resolve_under

log = logging.getLogger("hexstudio.board")

REMOTE_MANIFEST = ".hexstudio-pushed.json"


@dataclass
class PushResult:
    remote_dir: str
    sent_files: int
    skipped_files: int
    sent_bytes: int
    seconds: float
    warnings: list[str] = field(default_factory=list)
    emulated: bool = False                   # an AI Hub EMULATOR bundle (test boards only), labeled so
    verified: str = "size"                   # what was compared on the board: "size" or "sha256"
    resent: list[dict[str, str]] = field(default_factory=list)   # files found wrong on the board and sent again
    verify_seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.sent_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PushProgress:
    """Where a push stands. `done` counts every byte of the bundle accounted for (sent or skipped as
    unchanged); `sent` only the bytes really sent by this push, which the rate is computed from."""
    done: int
    total: int
    sent: int
    file: str
    seconds: float
    file_done: int = 0
    file_size: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.sent / 1e6 / self.seconds if self.seconds > 0 else 0.0


PROGRESS_INTERVAL_S = 0.1                    # at most 10 progress events a second (plus one per file end)


def _allow_emulated(board: Board, allow_emulated: bool) -> bool:
    return bool(allow_emulated or board.config.get("allow_emulated_bundles"))


def check_compatibility(bundle: dict[str, Any], board: Board, facts: dict[str, Any] | None = None,
                        bundle_dir: Path | None = None, allow_emulated: bool = False) -> list[str]:
    """Raise BoardError when the bundle cannot run on the board; return warnings otherwise.
    `facts`: the doctor's facts of a real board (dsp_arch, qairt_version, mem_*). An EMULATED bundle
    (compiled by HexStudio's AI Hub emulator) is refused on a real board unless `allow_emulated` or the
    board's settings entry has `allow_emulated_bundles: true` (test boards)."""
    if bundle.get("simulated") and not board.simulated:
        raise BoardError("This is a simulation bundle (ONNX parts for the simulator); a real board needs "
                         "context binaries compiled by AI Hub.", "Compile for the board's device, then push.")
    if not bundle.get("simulated") and board.simulated:
        raise BoardError("The simulator board runs simulation bundles only.",
                         "Compile with compile_target=sim for the simulator board.")
    warnings: list[str] = []
    if bundle.get("emulated") and not board.simulated:
        if not _allow_emulated(board, allow_emulated):
            raise EmulatedBundle(
                f"This bundle was compiled by HexStudio's AI Hub EMULATOR, not by Qualcomm AI Hub: its .bin files "
                f"are zip packages of the inputs, not QNN context binaries, so Genie on {board.name} cannot load "
                "them. Nothing was sent.",
                "Compile against the real Qualcomm AI Hub (store the token with `hexstudio aihub login`, and "
                "remove any aihub_api_url setting that points at the emulator), then push that bundle.")
        warnings.append("EMULATED bundle pushed to a test board (allow_emulated_bundles): its context binaries "
                        "are emulator packages, not device results.")
    if board.simulated or facts is None:
        return warnings
    from app.core.device.qairt import bundle_qairt_version, compare_qairt

    want = (bundle.get("device") or {}).get("dsp_arch")
    have = facts.get("dsp_arch")
    if want and have and want != have:
        raise BoardError(f"The bundle was compiled for Hexagon {want}; this board ({facts.get('chip')}) is {have}. "
                         "A context binary is pinned to its dsp_arch and will not load.",
                         f"Compile again for a {have} device (the IQ-9075 EVK is v73).")
    if not have:
        warnings.append("The board's Hexagon arch is unknown: the bundle's dsp_arch could not be checked.")
    compiled = bundle_qairt_version(bundle_dir) if bundle_dir is not None else None
    status, msg = compare_qairt(facts.get("qairt_version"), compiled)
    if status == "refuse":
        raise BoardError(msg, "Install a newer QAIRT on the board (Board page: Install QAIRT), then push again.")
    if status == "warn":
        warnings.append(msg)
    bins = sum(int(f.get("size", 0)) for f in bundle.get("files", []) if str(f.get("path", "")).endswith(".bin"))
    total, avail = int(facts.get("mem_total_bytes") or 0), int(facts.get("mem_available_bytes") or 0)
    if bins and total and bins > total:
        raise BoardError(f"The context binaries ({bins / 2**30:.1f} GiB) are larger than the board's RAM "
                         f"({total / 2**30:.1f} GiB).", "Use a smaller model or a shorter context_length.")
    if bins and avail and bins > avail:
        warnings.append(f"The context binaries ({bins / 2**30:.1f} GiB) exceed the RAM available now "
                        f"({avail / 2**30:.1f} GiB): stop other programs on the board.")
    return warnings


def _dropped(exc: BaseException) -> bool:
    return isinstance(exc, (OSError, EOFError)) or exc.__class__.__module__.startswith("paramiko") \
        or exc.__class__.__name__ == "ConnectionLost"


async def _free_space(board: Board, remote: str) -> str | None:
    """"N MB free on the board's bundle disk" when the board still answers, None when it does not."""
    try:
        where = remote.rsplit("/", 1)[0] if remote else await board.transport.home()
        res = await board.transport.run(["sh", "-c", 'd="$1"; while [ ! -d "$d" ]; do d="$(dirname "$d")"; done; '
                                         'df -Pk "$d"', "df", where], timeout=15)
    except Exception:
        return None
    try:
        avail_kb = int(res.stdout.strip().splitlines()[-1].split()[3])
    except (IndexError, ValueError):
        return "free space unknown"
    return f"{avail_kb / 1024:.1f} MB free on the board's disk there"


VERIFY_JOBS = 4          # files hashed at once on the board (sha256sum processes)
STAT_LINE = re.compile(r"^(\d+) (\d+(?:\.\d+)?) (.+)$")
CTIMES = "//ctime"          # key of the board manifest holding each file's ctime after the push (never a path)
HASH_LINE = re.compile(r"^\\?([0-9a-f]{64}) [ *](.+)$")


def load_bundle(bundle_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """bundle.json and its files, every path checked (safepath) and every local file present with the size
    bundle.json gives, before anything is sent. Raises UnsafeBundle or LocalBundleError."""
    manifest = bundle_dir / "bundle.json"
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LocalBundleError(f"{manifest} does not exist: {bundle_dir} is not a complete bundle folder.",
                               "Give the compile stage's bundle folder (artifacts/compile/bundle), or compile "
                               "again.") from None
    except (OSError, ValueError) as exc:
        raise LocalBundleError(f"{manifest} cannot be read ({exc}).",
                               "Compile again: bundle.json is written last by the compile stage.") from None
    if not isinstance(doc, dict):
        raise LocalBundleError(f"{manifest} is not a JSON object.", "Compile again.")
    try:
        files = check_bundle_files(doc.get("files"))
        for i, f in enumerate(files):
            resolve_under(bundle_dir, f["path"], f"bundle.json files[{i}]")
    except UnsafePath as exc:
        raise UnsafeBundle(f"Refused to push {bundle_dir}: {exc}", exc.hint) from None
    for i, f in enumerate(files):
        local = bundle_dir / str(f["path"])
        try:
            size = local.stat().st_size
        except FileNotFoundError:
            raise LocalBundleError(
                f"The local bundle file {local} (bundle.json files[{i}], '{f['path']}') is missing. Nothing was "
                "sent for it; the board and its connection are fine.",
                "The bundle folder is incomplete (deleted or moved files): run the Compile stage again, or "
                f"`hexstudio bundle verify {bundle_dir}` to see every difference.") from None
        except OSError as exc:
            raise LocalBundleError(f"The local bundle file {local} cannot be read ({exc}).",
                                   "Check its permissions and the disk, then push again.") from None
        if not local.is_file():
            raise LocalBundleError(f"The local bundle entry {local} (bundle.json files[{i}]) is not a file.",
                                   "Compile the bundle again.")
        if size != int(f["size"]):
            raise LocalBundleError(
                f"The local bundle file {local} has {size} bytes but bundle.json says {f['size']}: it changed "
                "after the bundle was compiled. Nothing was sent.",
                f"Run the Compile stage again (or `hexstudio bundle verify {bundle_dir}` to see what changed).")
    return doc, files


async def _board_lines(t: Any, argv: list[str], cwd: str, rels: list[str], timeout: float) -> list[str]:
    res = await t.run(argv, cwd=cwd, stdin=b"\0".join(r.encode() for r in rels), timeout=timeout)
    if res.exit_status == 124:
        raise BoardError(f"Checking the bundle on the board timed out ({' '.join(argv[:3])}...).",
                         "The board may be overloaded or its storage slow; push again.")
    return list(res.stdout.splitlines())


async def remote_stat(t: Any, remote: str, rels: list[str]) -> dict[str, tuple[int, str]]:
    """{path: (size, ctime)} of the files that exist on the board (one `stat` for all of them). The ctime
    changes with any write to a file and cannot be set back by its owner: a file changed on the board
    after a push shows a new one."""
    if not rels:
        return {}
    out: dict[str, tuple[int, str]] = {}
    for fmt in ("%s %.9Z %n", "%s %Z %n"):   # an old coreutils stat lacks the fraction
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


async def compare_on_board(board: Board, remote: str, files: list[dict[str, Any]], *, hashes: bool,
                           ctimes: dict[str, str] | None = None) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The bundle files whose copy on the board is missing, of another size or of another sha256 than
    bundle.json says: ([{"path", "why"}], {path: ctime} of the files found right). The sha256 is computed
    on the board for every file when `hashes`, else only for files whose ctime differs from `ctimes` (what
    the last push recorded) or that have none recorded."""
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
            bad.append({"path": rel, "why": f"{got[0]} bytes on the board, {size} expected (truncated or changed)"})
        elif hashes or (ctimes or {}).get(rel) != got[1]:
            todo.append(f)
    sums = await remote_sha256(t, remote, [str(f["path"]) for f in todo])
    for f in todo:
        got_sha = sums.get(str(f["path"]))
        if got_sha is None:
            bad.append({"path": str(f["path"]), "why": "could not be read on the board"})
        elif got_sha != f["sha256"]:
            bad.append({"path": str(f["path"]), "why": f"sha256 on the board {got_sha[:12]}..., "
                                                    f"{str(f['sha256'])[:12]}... expected (content changed)"})
    wrong = {b["path"] for b in bad}
    return bad, {rel: st[1] for rel, st in stats.items() if rel not in wrong}


async def remote_bundle_dir(board: Board, name: str) -> str:
    try:
        check_name(name, "bundle name")
    except UnsafePath as exc:
        raise UnsafeBundle(str(exc), "Name the bundle with letters, digits, '.', '_', '-' or '+' only "
                                     "(a run id always is).") from None
    home = await board.transport.home()
    if not isinstance(home, str) or not home.startswith("/") or "\n" in home or "\x00" in home:
        raise BoardError(f"The board answered {home!r} for the home folder, which is not an absolute path.",
                         "Check the board user's home folder (echo $HOME on the board).")
    return posixpath.join(home, "hexstudio", "bundles", name)


async def verify_pushed(board: Board, bundle_dir: Path, name: str, *, hashes: bool = True) -> list[dict[str, str]]:
    """Compare the bundle on the board with the local one (sizes; sha256 computed on the board when
    `hashes`): the files that differ, [] when it matches. For the doctor and the Board stage's gate."""
    _doc, files = load_bundle(bundle_dir)
    entries = [*files, {"path": "bundle.json", "sha256": sha256_file(bundle_dir / "bundle.json"),
                        "size": (bundle_dir / "bundle.json").stat().st_size}]
    bad, _ = await compare_on_board(board, await remote_bundle_dir(board, name), entries, hashes=hashes)
    return bad


async def push_bundle(board: Board, bundle_dir: Path, name: str,
                      progress: Callable[[PushProgress], None] | None = None,
                      facts: dict[str, Any] | None = None, *, allow_emulated: bool = False,
                      verify: bool | None = None) -> PushResult:
    """Check, then send what the board lacks, then check what is on the board: sizes always, sha256 of
    every file computed on the board when the bundle changed since the last push (files were sent) or
    `verify` is True; a file found wrong is sent again and reported in PushResult.resent.

    Every path of bundle.json is checked first (workers.shared.bundle.safepath): one that is absolute, climbs with
    '..', leaves the safe character set or leads outside the folder by a symlink raises UnsafeBundle and
    nothing is sent. A local file missing or changed raises LocalBundleError. `facts`: the doctor's facts (a
    real board is probed for soc/qairt/memory when not given). `progress` gets a PushProgress on the event
    loop's thread as bytes go out. A connection lost on the way raises ConnectionDropped (pushing again
    resumes); a write the board refuses while connected raises BoardWriteFailed."""
    log.info("board %s: push of %s (%s) started", board.name, bundle_dir, name)
    doc, files_in = load_bundle(bundle_dir)
    remote_checked_name = name
    if facts is None and not board.simulated:
        from app.core.device.doctor import probe

        facts = (await probe(board, only=("soc", "qairt", "memory"))).facts
    warnings = check_compatibility(doc, board, facts, bundle_dir, allow_emulated=allow_emulated)
    if not board.simulated:    # Genie's contract (`hexstudio bundle check`); the simulator board checks it at load
        from workers.shared.bundle.check import check_bundle, errors, report_text

        if refused := errors(check_bundle(bundle_dir, facts)):
            raise BoardError(f"Genie would refuse this bundle or run it wrong; nothing was sent.\n{report_text(refused)}",
                             f"Fix what each finding says (`hexstudio bundle check {bundle_dir}`), then push again.")
    t = board.transport
    loop = asyncio.get_running_loop()
    files = [*files_in, {"path": "bundle.json", "sha256": sha256_file(bundle_dir / "bundle.json"),
                         "size": (bundle_dir / "bundle.json").stat().st_size}]
    total = sum(int(f["size"]) for f in files)
    st = {"done": 0, "sent": 0}
    t0 = time.monotonic()
    last = [0.0]

    def report(rel: str, file_done: int = 0, file_size: int = 0) -> None:
        if progress is not None:
            progress(PushProgress(st["done"] + file_done, total, st["sent"], rel, time.monotonic() - t0,
                                  file_done, file_size))

    def byte_progress(rel: str, size: int) -> Callable[[int], None]:
        """put_file's callback (called in the transport's thread): the first call is the starting offset
        (a continued .part), then the bytes written so far."""
        base: list[int] = []

        def cb(n: int) -> None:
            if not base:
                base.append(n)
            now = time.monotonic()
            if now - last[0] < PROGRESS_INTERVAL_S or n >= size:
                return   # the end of the file is reported once put_file returns
            last[0] = now
            if progress is not None:
                ev = PushProgress(st["done"] + n, total, st["sent"] + n - base[0], rel, now - t0, n, size)
                loop.call_soon_threadsafe(progress, ev)
        return cb

    rel = ""
    remote = ""
    man = ""
    sent_files = skipped = 0
    pushed: dict[str, Any] = {}

    async def send(f: dict[str, Any], with_progress: bool) -> None:
        nonlocal sent_files
        size = int(f["size"])
        local = bundle_dir / str(f["path"])
        try:
            n = await t.put_file(local, posixpath.join(remote, str(f["path"])),
                                 byte_progress(str(f["path"]), size) if with_progress and progress else None)
        except Exception as exc:
            if not local.is_file() or not os.access(local, os.R_OK):
                raise LocalBundleError(
                    f"The local bundle file {local} disappeared or became unreadable while it was being pushed "
                    f"({exc}). The board and its connection are fine.",
                    "Restore the file (run the Compile stage again), then push again.") from exc
            raise
        st["sent"] += size if n is None else int(n)   # n: bytes really sent (a continued .part: the rest)
        sent_files += 1
        pushed[str(f["path"])] = f["sha256"]
        await t.write_bytes(man, json.dumps(pushed).encode())  # resumable: record as we go

    resent: list[dict[str, str]] = []
    verified = "size"
    t_verify = 0.0
    try:
        remote = await remote_bundle_dir(board, remote_checked_name)
        man = posixpath.join(remote, REMOTE_MANIFEST)
        if await t.exists(man):
            try:
                got = json.loads((await t.read_bytes(man)).decode())
                pushed = got if isinstance(got, dict) else {}   # the board's note, only ever compared with
            except (ValueError, OSError):                         # bundle.json's sha256s, never used as a path
                pushed = {}
        for f in files:
            rel = str(f["path"])
            size = int(f["size"])
            if pushed.get(rel) == f["sha256"] and await t.exists(posixpath.join(remote, rel)):
                skipped += 1
            else:
                await send(f, True)
            st["done"] += size
            last[0] = time.monotonic()
            report(rel)
        # what is on the board now: sizes always; sha256 computed there when anything changed or asked
        rel = ""
        tv = time.monotonic()
        hashes = bool(verify) or sent_files > 0
        verified = "sha256" if hashes else "size"
        seen = pushed.get(CTIMES)
        bad, ctimes = await compare_on_board(board, remote, files, hashes=hashes,
                                             ctimes=seen if isinstance(seen, dict) else {})
        by_path = {str(f["path"]): f for f in files}
        for b in bad:
            rel = b["path"]
            pushed.pop(rel, None)
            await send(by_path[rel], False)
            resent.append(b)
        if bad:
            again, fixed = await compare_on_board(board, remote, [by_path[b["path"]] for b in bad], hashes=True)
            if again:
                raise BoardError(
                    f"{len(again)} file(s) of the bundle are still wrong on the board after sending them again "
                    f"(first: {again[0]['path']}: {again[0]['why']}).",
                    "The board's storage may be failing or full: check `df -h` and `dmesg` on the board.")
            ctimes.update(fixed)
        rel = ""
        if ctimes != seen:   # what the files look like now, so the next push sees any later change
            pushed[CTIMES] = ctimes
            await t.write_bytes(man, json.dumps(pushed).encode())
        t_verify = time.monotonic() - tv
    except BoardError:
        raise
    except Exception as exc:
        if not _dropped(exc):
            raise
        if isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError)):
            free = await _free_space(board, remote)
            if free is not None:   # the board still answers: it refused the write, the link is fine
                raise BoardWriteFailed(
                    f"The board refused to write {rel or 'the bundle'} into {remote or 'its bundle folder'} ({exc}); "
                    f"the connection is fine. {free}. {sent_files} file(s) were complete before it.",
                    "Free space on the board (old bundles are in ~/hexstudio/bundles; `df -h` shows the disks) "
                    "or make the folder writable, then push again: files already sent are skipped.") from exc
        what = f"while pushing {rel}" if rel else "before the push started"
        raise ConnectionDropped(
            f"The connection to {board.label} dropped {what} ({exc or type(exc).__name__}); "
            f"{sent_files} file(s) were complete before it.",
            "Check the board's power and network, then push again (run the Board stage again): files already "
            "sent are skipped and the interrupted one continues where it stopped.") from exc
    if resent:
        warnings.append(f"{len(resent)} file(s) on the board differed from the local bundle and were sent again: "
                        + "; ".join(f"{b['path']} ({b['why']})" for b in resent))
    pr = PushResult(remote, sent_files, skipped, st["sent"], time.monotonic() - t0, warnings,
                    emulated=bool(doc.get("emulated")), verified=verified, resent=resent,
                    verify_seconds=t_verify)
    log.info("board %s: push to %s done: %d file(s) sent (%d bytes), %d skipped, %d resent, %s checked, %.1f s",
             board.name, remote, sent_files, st["sent"], skipped, len(resent), verified, pr.seconds)
    return pr
