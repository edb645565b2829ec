"""Bundle push: resumable (sha256 per file; unchanged files skipped; written as .part then renamed),
with a compatibility check of bundle against board before anything is sent."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import sha256_file
from hexstudio.core.device.board import Board, BoardError
from hexstudio.core.device.doctor import probe
from hexstudio.core.device.errors import (
    BoardWriteFailed,
    ConnectionDropped,
    EmulatedBundle,
    LocalBundleError,
    UnsafeBundle,
    link_failure,
)
from hexstudio.core.device.qairt import compare_qairt
from hexstudio.core.device.verify import (
    CTIMES,
    compare_on_board,
    load_bundle,
    load_local_record,
    remote_bundle_dir,
    save_local_record,
    symlinks_on_board,
)
from hexstudio.shared.bundle import bundle_qairt_version
from hexstudio.shared.bundle.check import check_bundle, errors, report_text

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
    emulated: bool = False  # an AI Hub EMULATOR bundle (test boards only), labeled so
    verified: str = "size"  # what was compared on the board: "size" or "sha256"
    resent: list[dict[str, str]] = field(
        default_factory=list
    )  # files found wrong on the board and sent again
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


PROGRESS_INTERVAL_S = 0.1  # at most 10 progress events a second (plus one per file end)


def _allow_emulated(board: Board, allow_emulated: bool) -> bool:
    return bool(allow_emulated or board.config.get("allow_emulated_bundles"))


def check_compatibility(
    bundle: dict[str, Any],
    board: Board,
    facts: dict[str, Any] | None = None,
    bundle_dir: Path | None = None,
    allow_emulated: bool = False,
) -> list[str]:
    """Raise BoardError when the bundle cannot run on the board; return warnings otherwise.
    `facts`: the doctor's facts of a real board (dsp_arch, qairt_version, mem_*). An EMULATED bundle
    (compiled by HexStudio's AI Hub emulator) is refused on a real board unless `allow_emulated` or the
    board's settings entry has `allow_emulated_bundles: true` (test boards)."""
    if bundle.get("simulated") and not board.simulated:
        raise BoardError(
            "This is a simulation bundle (ONNX parts for the simulator); a real board needs "
            "context binaries compiled by AI Hub.",
            "Compile for the board's device, then push.",
        )
    if not bundle.get("simulated") and board.simulated:
        if bundle.get("emulated") or (
            bundle.get("binaries") != "qnn" and bundle.get("compile_target") != "local"
        ):
            raise BoardError(
                "The simulator board runs bundles compiled on this machine (compile_target local: real "
                "QNN context binaries on Qualcomm's HTP simulator) or the onnxruntime twin's bundles; "
                "this one came from elsewhere.",
                "Compile with compile_target=local (or auto) for the simulator board.",
            )
        if bundle.get("weight_sharing"):
            raise BoardError(
                "This bundle's context binaries share weights between the prompt processor and the token "
                "generator, and Qualcomm's x86 HTP simulator cannot load shared weights (QNN says "
                '"Shared weights buffer isn\'t supported on this platform").',
                "Compile for the simulator board (compile_target local with --board sim: one context "
                "binary per graph); push this bundle to a real board.",
            )
    warnings: list[str] = []
    if not board.simulated and bundle.get("context_binary_form") == "single":
        warnings.append(
            "This bundle's context binaries share no weights (one binary per graph, the form Qualcomm's x86 "
            "simulator needs): on the board the prompt processor and the token generator each load every weight, "
            "about twice the memory. Compile for this board (--board NAME) to have them share."
        )
    if bundle.get("emulated") and not board.simulated:
        if not _allow_emulated(board, allow_emulated):
            raise EmulatedBundle(
                f"This bundle was compiled by HexStudio's AI Hub EMULATOR, not by Qualcomm AI Hub: its .bin files "
                f"are zip packages of the inputs, not QNN context binaries, so Genie on {board.name} cannot load "
                "them. Nothing was sent.",
                "Compile against the real Qualcomm AI Hub (store the token with `hexstudio aihub login`, and "
                "remove any aihub_api_url setting that points at the emulator), then push that bundle.",
            )
        warnings.append(
            "EMULATED bundle pushed to a test board (allow_emulated_bundles): its context binaries "
            "are emulator packages, not device results."
        )
    if board.simulated or facts is None:
        return warnings
    want = (bundle.get("device") or {}).get("dsp_arch")
    have = facts.get("dsp_arch")
    if want and have and want != have:
        raise BoardError(
            f"The bundle was compiled for Hexagon {want}; this board ({facts.get('chip')}) is {have}. "
            "A context binary is pinned to its dsp_arch and will not load.",
            f"Compile again for a {have} device (the IQ-9075 EVK is v73).",
        )
    if not have:
        warnings.append("The board's Hexagon arch is unknown: the bundle's dsp_arch could not be checked.")
    compiled = bundle_qairt_version(bundle_dir) if bundle_dir is not None else None
    status, msg = compare_qairt(facts.get("qairt_version"), compiled)
    if status == "refuse":
        raise BoardError(
            msg, "Install a newer QAIRT on the board (Board page: Install QAIRT), then push again."
        )
    if status == "warn":
        warnings.append(msg)
    bins = sum(
        int(f.get("size", 0)) for f in bundle.get("files", []) if str(f.get("path", "")).endswith(".bin")
    )
    total, avail = int(facts.get("mem_total_bytes") or 0), int(facts.get("mem_available_bytes") or 0)
    if bins and total and bins > total:
        raise BoardError(
            f"The context binaries ({bins / 2**30:.1f} GiB) are larger than the board's RAM "
            f"({total / 2**30:.1f} GiB).",
            "Use a smaller model or a shorter context_length.",
        )
    if bins and avail and bins > avail:
        warnings.append(
            f"The context binaries ({bins / 2**30:.1f} GiB) exceed the RAM available now "
            f"({avail / 2**30:.1f} GiB): stop other programs on the board."
        )
    return warnings


async def _free_space(board: Board, remote: str) -> str | None:
    """ "N MB free on the board's bundle disk" when the board still answers, None when it does not."""
    try:
        where = remote.rsplit("/", 1)[0] if remote else await board.transport.home()
        res = await board.transport.run(
            [
                "sh",
                "-c",
                'd="$1"; while [ ! -d "$d" ]; do d="$(dirname "$d")"; done; df -Pk "$d"',
                "df",
                where,
            ],
            timeout=15,
        )
    except Exception:
        return None
    try:
        avail_kb = int(res.stdout.strip().splitlines()[-1].split()[3])
    except (IndexError, ValueError):
        return "free space unknown"
    return f"{avail_kb / 1024:.1f} MB free on the board's disk there"


async def push_bundle(
    board: Board,
    bundle_dir: Path,
    name: str,
    progress: Callable[[PushProgress], None] | None = None,
    facts: dict[str, Any] | None = None,
    *,
    allow_emulated: bool = False,
    verify: bool | None = None,
) -> PushResult:
    """Check, then send what the board lacks, then check what is on the board: sizes always, sha256 of
    every file computed on the board when the bundle changed since the last push (files were sent) or
    `verify` is True; a file found wrong is sent again and reported in PushResult.resent.

    Every path of bundle.json is checked first (hexstudio.shared.bundle.safepath): one that is absolute, climbs with
    '..', leaves the safe character set or leads outside the folder by a symlink raises UnsafeBundle and
    nothing is sent. A local file missing or changed raises LocalBundleError. `facts`: the doctor's facts (a
    real board is probed for soc/qairt/memory when not given). `progress` gets a PushProgress on the event
    loop's thread as bytes go out. A connection lost on the way raises ConnectionDropped (pushing again
    resumes); a write the board refuses while connected raises BoardWriteFailed."""
    log.info("board %s: push of %s (%s) started", board.name, bundle_dir, name)
    doc, files_in = load_bundle(bundle_dir)
    remote_checked_name = name
    if facts is None and not board.simulated:
        facts = (await probe(board, only=("soc", "qairt", "memory"))).facts
    warnings = check_compatibility(doc, board, facts, bundle_dir, allow_emulated=allow_emulated)
    # Genie's contract (`hexstudio bundle check`); the simulator board checks it at load
    if not board.simulated and (refused := errors(check_bundle(bundle_dir, facts))):
        raise BoardError(
            f"Genie would refuse this bundle or run it wrong; nothing was sent.\n{report_text(refused)}",
            f"Fix what each finding says (`hexstudio bundle check {bundle_dir}`), then push again.",
        )
    t = board.transport
    loop = asyncio.get_running_loop()
    files = [
        *files_in,
        {
            "path": "bundle.json",
            "sha256": sha256_file(bundle_dir / "bundle.json"),
            "size": (bundle_dir / "bundle.json").stat().st_size,
        },
    ]
    total = sum(int(f["size"]) for f in files)
    st = {"done": 0, "sent": 0}
    t0 = time.monotonic()
    last = [0.0]

    def report(rel: str, file_done: int = 0, file_size: int = 0) -> None:
        if progress is not None:
            progress(
                PushProgress(
                    st["done"] + file_done,
                    total,
                    st["sent"],
                    rel,
                    time.monotonic() - t0,
                    file_done,
                    file_size,
                )
            )

    def byte_progress(rel: str, size: int) -> Callable[[int], None]:
        """put_file's callback (called in the transport's thread): the first call is the starting offset
        (a continued .part), then the bytes written so far."""
        base: list[int] = []

        def cb(n: int) -> None:
            if not base:
                base.append(n)
            now = time.monotonic()
            if now - last[0] < PROGRESS_INTERVAL_S or n >= size:
                return  # the end of the file is reported once put_file returns
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
            n = await t.put_file(
                local,
                posixpath.join(remote, str(f["path"])),
                byte_progress(str(f["path"]), size) if with_progress and progress else None,
            )
        except Exception as exc:
            if not local.is_file() or not os.access(local, os.R_OK):
                raise LocalBundleError(
                    f"The local bundle file {local} disappeared or became unreadable while it was being pushed "
                    f"({exc}). The board and its connection are fine.",
                    "Restore the file (run the Compile stage again), then push again.",
                ) from exc
            raise
        st["sent"] += size if n is None else int(n)  # n: bytes really sent (a continued .part: the rest)
        sent_files += 1
        pushed[str(f["path"])] = f["sha256"]
        await t.write_bytes(man, json.dumps(pushed).encode())  # resumable: record as we go

    resent: list[dict[str, str]] = []
    verified = "size"
    t_verify = 0.0
    try:
        remote = await remote_bundle_dir(board, remote_checked_name)
        await _refuse_symlinks(board, remote)
        man = posixpath.join(remote, REMOTE_MANIFEST)
        if await t.exists(man):
            try:
                got = json.loads((await t.read_bytes(man)).decode())
                pushed = got if isinstance(got, dict) else {}  # the board's note, only ever compared with
            except (ValueError, OSError):  # bundle.json's sha256s, never used as a path
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
        # the ctimes this studio recorded after its last push here: the board's copy is only a note (anyone who
        # can write the folder can edit it); no local record: every sha256 is computed on the board
        seen = load_local_record(board, remote)
        bad, ctimes = await compare_on_board(board, remote, files, hashes=hashes, ctimes=seen)
        by_path = {str(f["path"]): f for f in files}
        for b in bad:
            rel = b["path"]
            pushed.pop(rel, None)
            await send(by_path[rel], False)
            resent.append(b)
        if bad:
            again, fixed = await compare_on_board(
                board, remote, [by_path[b["path"]] for b in bad], hashes=True
            )
            if again:
                raise BoardError(
                    f"{len(again)} file(s) of the bundle are still wrong on the board after sending them again "
                    f"(first: {again[0]['path']}: {again[0]['why']}).",
                    "The board's storage may be failing or full: check `df -h` and `dmesg` on the board.",
                )
            ctimes.update(fixed)
        rel = ""
        if ctimes != seen:  # what the files look like now, so the next push sees any later change
            save_local_record(board, remote, ctimes)
        if ctimes != pushed.get(CTIMES):
            pushed[CTIMES] = ctimes
            await t.write_bytes(man, json.dumps(pushed).encode())
        t_verify = time.monotonic() - tv
    except BoardError:
        raise
    except Exception as exc:
        if not link_failure(exc):
            raise
        if isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError)):
            free = await _free_space(board, remote)
            if free is not None:  # the board still answers: it refused the write, the link is fine
                raise BoardWriteFailed(
                    f"The board refused to write {rel or 'the bundle'} into {remote or 'its bundle folder'} ({exc}); "
                    f"the connection is fine. {free}. {sent_files} file(s) were complete before it.",
                    "Free space on the board (old bundles are in ~/hexstudio/bundles; `df -h` shows the disks) "
                    "or make the folder writable, then push again: files already sent are skipped.",
                ) from exc
        what = f"while pushing {rel}" if rel else "before the push started"
        raise ConnectionDropped(
            f"The connection to {board.label} dropped {what} ({exc or type(exc).__name__}); "
            f"{sent_files} file(s) were complete before it.",
            "Check the board's power and network, then push again (run the Board stage again): files already "
            "sent are skipped and the interrupted one continues where it stopped.",
        ) from exc
    if resent:
        warnings.append(
            f"{len(resent)} file(s) on the board differed from the local bundle and were sent again: "
            + "; ".join(f"{b['path']} ({b['why']})" for b in resent)
        )
    pr = PushResult(
        remote,
        sent_files,
        skipped,
        st["sent"],
        time.monotonic() - t0,
        warnings,
        emulated=bool(doc.get("emulated")),
        verified=verified,
        resent=resent,
        verify_seconds=t_verify,
    )
    log.info(
        "board %s: push to %s done: %d file(s) sent (%d bytes), %d skipped, %d resent, %s checked, %.1f s",
        board.name,
        remote,
        sent_files,
        st["sent"],
        skipped,
        len(resent),
        verified,
        pr.seconds,
    )
    return pr


async def _refuse_symlinks(board: Board, remote: str) -> None:
    links = await symlinks_on_board(board, remote)
    if links:
        raise UnsafeBundle(
            f"{links[0]} is a symbolic link on {board.label}: a push would write through it to "
            "wherever it points. Nothing was sent.",
            f"Remove the link on the board (rm {links[0]}), then push again; HexStudio makes its "
            "folders itself under ~/hexstudio/bundles.",
        )


async def recheck_pushed(board: Board, bundle_dir: Path, name: str) -> list[dict[str, str]]:
    """Before a chat or evaluate session on a bundle pushed earlier (the Board stage may be skipped as current on
    a resume): one `stat` of the bundle on the board against what this studio recorded after its push; a file
    whose size or ctime changed since (or with no record) gets its sha256 computed on the board. The files
    found wrong ([] when the bundle is as pushed); symlinks in the way raise UnsafeBundle."""
    _doc, files = load_bundle(bundle_dir)
    entries = [
        *files,
        {
            "path": "bundle.json",
            "sha256": sha256_file(bundle_dir / "bundle.json"),
            "size": (bundle_dir / "bundle.json").stat().st_size,
        },
    ]
    remote = await remote_bundle_dir(board, name)
    await _refuse_symlinks(board, remote)
    bad, _ctimes = await compare_on_board(
        board, remote, entries, hashes=False, ctimes=load_local_record(board, remote)
    )
    if bad:
        log.warning(
            "board %s: bundle %s changed on the board since the push: %s",
            board.name,
            name,
            "; ".join(f"{b['path']} ({b['why']})" for b in bad[:5]),
        )
    return bad
