"""Bundle push: resumable (sha256 per file; unchanged files skipped; written as .part then renamed),
with a compatibility check of bundle against board before anything is sent."""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.atomic import sha256_file
from app.core.device.board import Board, BoardError

REMOTE_MANIFEST = ".hexstudio-pushed.json"


@dataclass
class PushResult:
    remote_dir: str
    sent_files: int
    skipped_files: int
    sent_bytes: int
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.sent_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def check_compatibility(bundle: dict[str, Any], board: Board, facts: dict[str, Any] | None = None,
                        bundle_dir: Path | None = None) -> list[str]:
    """Raise BoardError when the bundle cannot run on the board; return warnings otherwise.
    `facts`: the doctor's facts of a real board (dsp_arch, qairt_version, mem_*)."""
    if bundle.get("simulated") and not board.simulated:
        raise BoardError("This is a simulation bundle (ONNX parts for the simulator); a real board needs "
                         "context binaries compiled by AI Hub.", "Compile for the board's device, then push.")
    if not bundle.get("simulated") and board.simulated:
        raise BoardError("The simulator board runs simulation bundles only.",
                         "Compile with compile_target=sim for the simulator board.")
    warnings: list[str] = []
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


async def push_bundle(board: Board, bundle_dir: Path, name: str,
                      progress: Callable[[int, int, str], None] | None = None,
                      facts: dict[str, Any] | None = None) -> PushResult:
    """Check, then send what the board lacks. `facts`: the doctor's facts (a real board is probed for
    soc/qairt/memory when not given)."""
    doc = json.loads((bundle_dir / "bundle.json").read_text())
    if facts is None and not board.simulated:
        from app.core.device.doctor import probe

        facts = (await probe(board, only=("soc", "qairt", "memory"))).facts
    warnings = check_compatibility(doc, board, facts, bundle_dir)
    t = board.transport
    remote = posixpath.join(await t.home(), "hexstudio", "bundles", name)
    pushed: dict[str, str] = {}
    man = posixpath.join(remote, REMOTE_MANIFEST)
    if await t.exists(man):
        try:
            pushed = json.loads((await t.read_bytes(man)).decode())
        except (ValueError, OSError):
            pushed = {}
    files = [*doc["files"], {"path": "bundle.json", "sha256": sha256_file(bundle_dir / "bundle.json"),
                             "size": (bundle_dir / "bundle.json").stat().st_size}]
    total = sum(int(f["size"]) for f in files)
    done = sent = sent_files = skipped = 0
    t0 = time.monotonic()
    for f in files:
        rel = f["path"]
        dst = posixpath.join(remote, rel)
        if pushed.get(rel) == f["sha256"] and await t.exists(dst):
            skipped += 1
        else:
            try:
                n = await t.put_file(bundle_dir / rel, dst)
            except (OSError, EOFError) as exc:
                raise BoardError(f"The connection to {board.label} dropped while pushing {rel} ({exc or 'EOF'}).",
                                 "Reconnect and push again: files already sent are skipped and the interrupted "
                                 "one continues where it stopped.") from exc
            except Exception as exc:
                if exc.__class__.__module__.startswith("paramiko") or exc.__class__.__name__ == "ConnectionLost":
                    raise BoardError(f"The connection to {board.label} dropped while pushing {rel} ({exc}).",
                                     "Reconnect and push again: it resumes where it stopped.") from exc
                raise
            sent += int(f["size"]) if n is None else int(n)   # n: bytes really sent (a resumed .part: the rest)
            sent_files += 1
            pushed[rel] = f["sha256"]
            await t.write_bytes(man, json.dumps(pushed).encode())  # resumable: record as we go
        done += int(f["size"])
        if progress is not None:
            progress(done, total, rel)
    return PushResult(remote, sent_files, skipped, sent, time.monotonic() - t0, warnings)
