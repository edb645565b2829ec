"""Board stage: connect, check the board, push the bundle. Writes board.json."""

from __future__ import annotations

import contextlib
import json
import platform
from pathlib import Path
from typing import Any

from hexstudio.core.device.board import BoardError, open_board
from hexstudio.core.device.doctor import probe
from hexstudio.core.device.errors import (
    BoardWriteFailed,
    ConnectionDropped,
    EmulatedBundle,
    LocalBundleError,
    UnsafeBundle,
)
from hexstudio.core.device.fixes import apply_fix, plan_qairt_install
from hexstudio.core.device.push import PushProgress, push_bundle
from hexstudio.core.manifest import RunManifest
from hexstudio.core.secrets import get_secret, sudo_password_key
from hexstudio.core.settings import Settings
from hexstudio.core.stage_api import StageContext, StageError

QAIRT_CHECKS = {"qairt", "qairt_env", "genie", "htp_validator"}


async def _install_qairt(
    ctx: StageContext, board: Any, name: str, zip_path: Path, report: Any, bundle_dir: Path
) -> Any:
    """The board lacks only QAIRT and its settings name the SDK zip: install it (sudo password from the
    keyring, or none for NOPASSWD sudo), logging the exact commands; then check again."""
    em = ctx.emitter
    em.progress(0.15, f"installing QAIRT on {name} from {zip_path.name}")
    if not zip_path.is_file():
        raise StageError(
            "qairt_zip_missing",
            f"The QAIRT SDK zip {zip_path} of board '{name}' does not exist.",
            "Fix the board's qairt_zip setting, or install QAIRT from the Board page.",
        )
    try:
        # the run's own workspace (--workspace, or the one it was made in), not the studio's choice
        cache = ctx.manifest.run_dir.parent.parent / "cache" / "qairt"
        plan = await plan_qairt_install(board, zip_path, report, bundle_dir=bundle_dir, cache_dir=cache)

        def upload(done: int, total: int, what: str) -> None:
            em.progress(
                0.15 + 0.1 * done / max(total, 1),
                f"installing QAIRT: {what} ({done / 1e6:.1f} of {total / 1e6:.1f} MB)",
                bytes_done=done,
                bytes_total=total,
            )

        res = await apply_fix(
            board,
            plan,
            sudo_password=get_secret(sudo_password_key(name)),
            on_log=lambda line: em.log(f"qairt_install: {line}"),
            rerun=False,
            on_progress=upload,
        )
    except BoardError as exc:
        raise StageError("qairt_install_failed", exc.message, exc.hint) from None
    if res.status == "manual":
        raise StageError(
            "qairt_install_needs_root",
            res.message,
            f"Store the board's sudo password (`hexstudio board password {name} --sudo`), then run the Board "
            "stage again. Or run these by hand as root on the board (the copy from this workstation):\n"
            + "\n".join(res.manual_commands),
        )
    if res.status == "failed":
        raise StageError(
            "qairt_install_failed", res.message, "See the Board page's log; fix, then run again."
        )
    return await probe(board)


# how a failed push ends the stage: the first kind that matches names the error code
PUSH_ERRORS: tuple[tuple[type[BoardError], str], ...] = (
    (LocalBundleError, "local_bundle_file"),
    (UnsafeBundle, "unsafe_bundle_path"),
    (BoardWriteFailed, "board_write_failed"),
    (ConnectionDropped, "push_interrupted"),
    (EmulatedBundle, "emulated_bundle"),
    (BoardError, "incompatible_bundle"),
)


async def _close_quietly(board: Any) -> None:
    with contextlib.suppress(Exception):
        await board.transport.close()


def sim_runtime_check(bundle_dir: Path) -> dict[str, Any]:
    """What runs the bundle on the simulator board: Qualcomm's libGenie on the HTP simulator for real context
    binaries, the onnxruntime twin for stand-ins. Both simulated (no Hexagon NPU in this machine)."""
    from hexstudio.workers.qnn.libs import INSTALL_HINT, find_qnn_libs

    try:
        doc = json.loads((bundle_dir / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    libs = find_qnn_libs()
    ev: dict[str, Any] = {"machine": platform.machine(), "bundle_binaries": doc.get("binaries") or "stand-in"}
    if doc.get("binaries") == "qnn":
        if libs is None:
            return {
                "id": "soc",
                "status": "fail",
                "evidence": ev,
                "fix": INSTALL_HINT,
                "message": "The bundle holds real QNN context binaries and Qualcomm's libGenie is not installed "
                "here to run them.",
            }
        ev.update(
            {
                "genie": "libGenie.so (onnxruntime-qnn " + libs.wheel_version + ")",
                "qnn": libs.qnn_version,
                "lib_dir": str(libs.folder),
            }
        )
        return {
            "id": "soc",
            "status": "ok",
            "evidence": ev,
            "message": f"Simulator board: Qualcomm's libGenie and QNN {libs.qnn_version} run the bundle's context "
            "binaries on the HTP simulator on this CPU (simulated; no Hexagon NPU).",
        }
    return {
        "id": "soc",
        "status": "ok" if libs is None else "warn",
        "evidence": ev,
        "message": "Simulator board: HexStudio's onnxruntime twin runs the QDQ ONNX parts on this CPU (a labeled "
        "fallback; simulated; no Hexagon NPU)."
        + (
            ""
            if libs is None
            else " Qualcomm's runtime is installed: compile with compile_target "
            "local to run the bundle on it."
        ),
    }


async def board_still_in_place(m: RunManifest) -> str | None:
    """The Board stage's recheck (stages.py), before a resumed run skips it as current: the bundle it pushed is
    compared with the local one by content, every file's sha256 computed on the board (verify_pushed), and
    symlinks there refused. None when it is as pushed; else why not, and the Board stage runs again (the push
    sends what differs, or says why it cannot)."""
    from hexstudio.core.device.verify import remote_bundle_dir, symlinks_on_board, verify_pushed

    name = str(m.inputs.get("board", "sim"))
    bundle_dir = m.run_dir / "artifacts" / "compile" / "bundle"
    if not (bundle_dir / "bundle.json").is_file():
        return "the Compile stage's bundle is no longer on this machine"
    try:
        board = await open_board(name, Settings.load(), m.run_dir.parent.parent)
    except BoardError as exc:
        return f"board {name} cannot be reached to check the bundle on it ({exc.message})"
    try:
        links = await symlinks_on_board(board, await remote_bundle_dir(board, m.run_id))
        if links:
            return f"a symbolic link is in the way on the board ({links[0]})"
        bad = await verify_pushed(board, bundle_dir, m.run_id, hashes=True)
    except (BoardError, OSError) as exc:
        return f"the bundle on board {name} could not be checked ({getattr(exc, 'message', None) or exc})"
    finally:
        await _close_quietly(board)
    if bad:
        return (
            f"{len(bad)} bundle file(s) on board {name} differ from the local bundle, first "
            f"{bad[0]['path']}: {bad[0]['why']}"
        )
    return None


async def run_board_stage(ctx: StageContext) -> dict[str, Any]:
    em = ctx.emitter
    name = str(ctx.manifest.inputs.get("board", "sim"))
    if not (ctx.upstream["compile"] / "bundle" / "bundle.json").is_file():
        raise StageError(
            "bundle_missing",
            f"The Compile stage's bundle is not on this machine "
            f"({ctx.upstream['compile'] / 'bundle'} has no bundle.json): there is nothing to push.",
            "Run the Compile stage again (`hexstudio run --resume RUN --only compile --force`, or Run "
            "on the Compile page).",
        )
    em.progress(0.05, f"connecting to board {name}")
    try:
        board = await open_board(name, Settings.load(), ctx.manifest.run_dir.parent.parent)
    except BoardError as exc:
        raise StageError("board_unavailable", exc.message, exc.hint) from None
    # closed however the stage ends: a failed install, a cancel, a local file that became unreadable
    try:
        return await _check_and_push(ctx, board, name)
    finally:
        await _close_quietly(board)


async def _check_and_push(ctx: StageContext, board: Any, name: str) -> dict[str, Any]:
    """The doctor (a QAIRT install where the board lacks it and a zip is set), then the push and its check."""
    em = ctx.emitter
    bundle_dir = ctx.upstream["compile"] / "bundle"
    doctor: list[dict[str, Any]] = []
    if board.simulated:
        res = await board.transport.run([*board.genie_command, "--help"], timeout=60)
        doctor.append(
            {
                "id": "genie_runner",
                "status": "ok" if res.exit_status == 0 else "fail",
                "evidence": {"command": "genie-t2t-run --help (simulator)", "exit_status": res.exit_status},
                "message": "The simulator's genie-t2t-run starts."
                if res.exit_status == 0
                else f"The simulator cannot start: {res.stderr.strip()[-300:]}",
            }
        )
        doctor.append(sim_runtime_check(bundle_dir))
    facts: dict[str, Any] = {}
    if not board.simulated:
        em.progress(0.1, f"checking board {name} (doctor)")
        report = await probe(board)
        doctor = [c.to_dict() for c in report.checks]
        facts = report.facts
        for c in report.checks:
            if c.status in ("fail", "warn"):
                em.log(f"doctor: {c.status} {c.id}: {c.message}" + (f" (fix: {c.fix})" if c.fix else ""))
        failing = {c.id for c in report.checks if c.status == "fail"}
        qzip = board.config.get("qairt_zip")
        if "qairt" in failing and failing <= QAIRT_CHECKS and qzip:
            report = await _install_qairt(ctx, board, name, Path(str(qzip)).expanduser(), report, bundle_dir)
            doctor = [c.to_dict() for c in report.checks]
            facts = report.facts
    failed = [d for d in doctor if d["status"] == "fail"]
    if failed:
        (ctx.out_dir / "board.json").write_text(
            json.dumps(
                {
                    "board": name,
                    "label": board.label,
                    "simulated": board.simulated,
                    "doctor": doctor,
                    "facts": facts,
                },
                indent=2,
            )
        )
        fixes = sorted({str(d["fix"]) for d in failed if d.get("fix")})
        raise StageError(
            "doctor_failed",
            f"{len(failed)} board check(s) failed; first: {failed[0]['message']}",
            f"Apply the fixes on the Board page or `hexstudio board fix {name} FIX` "
            f"({', '.join(fixes) or 'see the doctor'}), then run the Board stage again.",
        )
    em.progress(0.3, "pushing the bundle")

    def progress(p: PushProgress) -> None:
        rate = f", {p.mb_per_s:.1f} MB/s" if p.sent and p.seconds > 0.5 else ""
        em.progress(
            0.3 + 0.65 * p.done / max(p.total, 1),
            f"pushing {p.file} ({p.done / 1e6:.1f} of {p.total / 1e6:.1f} MB{rate})",
            bytes_done=p.done,
            bytes_total=p.total,
            bytes_sent=p.sent,
            mb_per_s=round(p.mb_per_s, 2),
        )

    try:
        # verify=True: the gate "the bundle on the board matches the local one" is checked by sha256 of
        # every file, computed on the board; a file found wrong is sent again (pr.resent)
        pr = await push_bundle(
            board, bundle_dir, ctx.manifest.run_id, progress, facts=facts or None, verify=True
        )
    except BoardError as exc:
        code = next(c for kind, c in PUSH_ERRORS if isinstance(exc, kind))
        raise StageError(code, exc.message, exc.hint) from None
    for w in pr.warnings:
        em.warning(w)
    doc = {
        "board": name,
        "label": board.label,
        "simulated": board.simulated,
        "emulated_bundle": pr.emulated,
        "doctor": doctor,
        "facts": facts,
        "push_warnings": pr.warnings,
        "remote_bundle": pr.remote_dir,
        "push": {
            "sent_files": pr.sent_files,
            "skipped_files": pr.skipped_files,
            "sent_bytes": pr.sent_bytes,
            "mb_per_s": round(pr.mb_per_s, 2),
            "verified": pr.verified,
            "resent": pr.resent,
            "verify_s": round(pr.verify_seconds, 3),
        },
    }
    (ctx.out_dir / "board.json").write_text(json.dumps(doc, indent=2))
    em.artifact("board.json", kind="json", role="board")
    em.metric("push_sent_files", pr.sent_files)
    em.metric("push_skipped_files", pr.skipped_files)
    em.metric("simulated", board.simulated)
    em.metric("emulated", pr.emulated)
    em.metric("push_mb_per_s", round(pr.mb_per_s, 2), unit="MB/s")
    em.metric("bundle_verified", pr.verified == "sha256")
    em.metric("push_resent_files", len(pr.resent))
    return {"board": name, "simulated": board.simulated, "remote_bundle": pr.remote_dir}
