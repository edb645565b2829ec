"""Where a chat turn, a benchmark, an evaluation or `hexstudio serve` runs: a board and the bundle on it.

One answer for the Chat page, the Chat and Evaluate stages and `hexstudio chat | bench | serve`: the run's
board stage says which board holds which pushed bundle (artifacts/board/board.json); the CLI may also name
another board or a bundle folder, which is pushed first (unchanged files are skipped).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import Board, open_board
from hexstudio.core.device.push import push_bundle, recheck_pushed
from hexstudio.core.device.verify import default_remote_name
from hexstudio.core.runs import Workspace
from hexstudio.core.services import ServiceError
from hexstudio.core.settings import Settings


@dataclass
class ChatTarget:
    board: Board
    remote_bundle: str  # the bundle folder on the board
    bundle_doc: dict[str, Any] = field(default_factory=dict)  # its bundle.json ({} when unreadable)
    run_dir: Path | None = None  # the run it belongs to, when known


def board_doc(board_stage_dir: Path | None) -> dict[str, Any] | None:
    """The board stage's result (board, remote_bundle, simulated, ...), or None when the stage has not run."""
    if board_stage_dir is None or not (board_stage_dir / "board.json").is_file():
        return None
    try:
        doc = json.loads((board_stage_dir / "board.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


async def open_run_board(doc: dict[str, Any], settings: Settings, workspace_root: Path) -> ChatTarget:
    """The board the run's bundle was pushed to, connected (BoardError when it cannot be reached)."""
    board = await open_board(str(doc["board"]), settings, workspace_root)
    return ChatTarget(board, str(doc["remote_bundle"]))


def latest_run_with_bundle(ws: Workspace) -> Path | None:
    """The newest run that has pushed or compiled a bundle."""
    for r in ws.list_runs():
        if (r.path / "artifacts" / "board" / "board.json").is_file() or (
            r.path / "artifacts" / "compile" / "bundle" / "bundle.json"
        ).is_file():
            return r.path
    return None


async def chat_target(
    ws: Workspace,
    settings: Settings,
    *,
    run_dir: Path | None,
    board: str | None,
    bundle: str | None,
    say: Callable[[str], None] = lambda _m: None,
) -> ChatTarget:
    """The board (named, else the run's, else the simulator) and the bundle on it: a bundle folder given here
    or the run's compiled bundle is pushed first when the run's board stage did not put it on this board; a
    path that is no local folder is taken as a bundle folder already on the board."""
    doc = board_doc(run_dir / "artifacts" / "board") if run_dir is not None and not bundle else None
    doc = doc or {}
    name = board or doc.get("board") or "sim"
    target_board = await open_board(name, settings, ws.root)
    local: Path | None = None
    remote: str | None = None
    if bundle:
        if (Path(bundle) / "bundle.json").is_file():
            local = Path(bundle).resolve()
        elif Path(bundle).is_dir() and not (Path(bundle) / "genie_config.json").is_file():
            # a folder here that holds no bundle (a run folder, the bundle's parent): not a path on the board
            raise ServiceError(
                f"{bundle} has no bundle.json and no genie_config.json: it is not a Genie bundle folder.",
                "A run's bundle is runs/<RUN>/artifacts/compile/bundle: pass that folder, or --run RUN_ID.",
            )
        else:
            remote = bundle
    elif run_dir is None:
        raise ServiceError(
            "No run with a bundle in this workspace.",
            "Run the flow first (`hexstudio run`), or pass --bundle DIR.",
        )
    elif doc.get("board") == name and doc.get("remote_bundle"):
        remote = str(doc["remote_bundle"])
        pushed_from = run_dir / "artifacts" / "compile" / "bundle"
        if (pushed_from / "bundle.json").is_file():
            # the Board stage may have been skipped as current (a resume): is the bundle on the board still the
            # one it pushed? (sizes and ctimes against this studio's record; sha256 on the board where they moved)
            bad = await recheck_pushed(target_board, pushed_from, posixpath.basename(remote.rstrip("/")))
            if bad:
                say(
                    f"{len(bad)} file(s) of the bundle changed on {target_board.label} since the push (first: "
                    f"{bad[0]['path']}: {bad[0]['why']}); sending them again"
                )
                local = pushed_from
    else:
        local = run_dir / "artifacts" / "compile" / "bundle"
        if not (local / "bundle.json").is_file():
            raise ServiceError(
                f"Run {run_dir.name} has no compiled bundle.",
                f"Compile it: `hexstudio run --resume {run_dir.name} --until compile`.",
            )
    bundle_doc: dict[str, Any] = {}
    if local is not None:
        bundle_doc = json.loads((local / "bundle.json").read_text(encoding="utf-8"))
        say(f"pushing {local} to {target_board.label} (unchanged files are skipped)")
        # a run's bundle goes under its run id, as the Board stage and `board push` put it (a folder given with
        # --bundle by its own name, a run's compiled bundle by its run's): never all into one folder "bundle"
        as_name = run_dir.name if not bundle and run_dir is not None else default_remote_name(local)
        pr = await push_bundle(target_board, local, as_name)
        remote = pr.remote_dir
    assert remote is not None
    if not bundle_doc:
        try:
            raw = await target_board.transport.read_bytes(posixpath.join(remote, "bundle.json"))
            bundle_doc = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError):
            bundle_doc = {}
    return ChatTarget(target_board, remote, bundle_doc, run_dir)
