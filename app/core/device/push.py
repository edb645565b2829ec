"""Bundle push: resumable (sha256 per file; unchanged files skipped; written as .part then renamed),
with a compatibility check of bundle against board before anything is sent."""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
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

    @property
    def mb_per_s(self) -> float:
        return self.sent_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def check_compatibility(bundle: dict[str, Any], board: Board) -> None:
    if bundle.get("simulated") and not board.simulated:
        raise BoardError("This is a simulation bundle (ONNX parts for the simulator); a real board needs "
                         "context binaries compiled by AI Hub.", "Compile for the board's device, then push.")
    if not bundle.get("simulated") and board.simulated:
        raise BoardError("The simulator board runs simulation bundles only.",
                         "Compile with compile_target=sim for the simulator board.")


async def push_bundle(board: Board, bundle_dir: Path, name: str,
                      progress: Callable[[int, int, str], None] | None = None) -> PushResult:
    doc = json.loads((bundle_dir / "bundle.json").read_text())
    check_compatibility(doc, board)
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
            await t.put_file(bundle_dir / rel, dst)
            sent += int(f["size"])
            sent_files += 1
            pushed[rel] = f["sha256"]
            await t.write_bytes(man, json.dumps(pushed).encode())  # resumable: record as we go
        done += int(f["size"])
        if progress is not None:
            progress(done, total, rel)
    return PushResult(remote, sent_files, skipped, sent, time.monotonic() - t0)
