"""`hexstudio board add|list|password|probe|fix|push`: boards over SSH, the doctor and its fixes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from hexstudio.cli.common import EXIT_FAILED, EXIT_USAGE, CliError, add_actions, print_json, set_action
from hexstudio.cli.ssh import (
    add_ssh_flags,
    add_trust_flag,
    check_ssh_flags,
    kept_but_unreachable,
    open_named_board,
    read_password,
    ssh_config_from,
)
from hexstudio.core.device.board import Board
from hexstudio.core.device.errors import BoardError, SudoRefused
from hexstudio.core.device.verify import default_remote_name
from hexstudio.core.runs import RunBusy, RunLock
from hexstudio.core.secrets import (
    board_password_key,
    board_secret_names,
    delete_secret,
    get_secret,
    set_secret,
    sudo_password_key,
)
from hexstudio.core.settings import Settings

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bs = add_actions(
        sub, "board", help="boards: add one, check it (doctor), fix it, install QAIRT, push a bundle"
    )

    pa = bs.add_parser("add", help="add or change a board (host, port, user, auth)")
    pa.add_argument("name")
    add_ssh_flags(pa)
    pa.add_argument(
        "--qairt-zip",
        default=None,
        help="QAIRT SDK zip on this machine: the Board stage installs it when the board lacks QAIRT",
    )
    pa.add_argument("--no-connect", action="store_true", help="save only; do not try to connect")
    add_trust_flag(pa)
    set_action(pa, cmd_add)

    pl = bs.add_parser("list", help="list the boards")
    set_action(pl, cmd_list)

    pr = bs.add_parser(
        "remove",
        help="remove a board, and its SSH and sudo passwords from the keyring (runs keep their records)",
    )
    pr.add_argument("name")
    set_action(pr, cmd_remove)

    pw = bs.add_parser(
        "password",
        help="store the board's SSH password (or with --sudo its sudo password) in the system keyring",
    )
    pw.add_argument("name")
    pw.add_argument("--sudo", action="store_true", help="the sudo password instead of the SSH password")
    pw.add_argument("--stdin", action="store_true", help="read it from stdin instead of a prompt")
    pw.set_defaults(func=cmd_password)

    pp = bs.add_parser("probe", help="check the board (the doctor): SoC, QAIRT, FastRPC, daemons, HTP")
    pp.add_argument("name")
    pp.add_argument("--only", default=None, help="comma-separated check ids")
    pp.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="also compare this local bundle folder with its copy on the board (sha256 on the board)",
    )
    pp.add_argument(
        "--as",
        dest="remote_name",
        default=None,
        help="the bundle's name on the board (default: a run's bundle by its run id, as the Board stage "
        "pushes it; another folder by its name)",
    )
    add_trust_flag(pp)
    set_action(pp, cmd_probe)

    pf = bs.add_parser("fix", help="apply a doctor fix (shows its commands first)")
    pf.add_argument("name")
    pf.add_argument(
        "fix_id",
        help="group_add, relogin, udev_rule, fastrpc_packages, qairt_env, daemon_restart, dsp_start, "
        "reboot, qairt_install, geniex_install",  # hexstudio.core.device.fixes.FIX_IDS (not imported: start-up)
    )
    pf.add_argument(
        "--zip", type=Path, default=None, help="qairt_install: the QAIRT SDK zip (v<version>.zip)"
    )
    pf.add_argument(
        "--file",
        type=Path,
        default=None,
        help="geniex_install: GenieX's release tarball (geniex-cli-linux-arm64-vX.Y.Z.tar.gz) or wheel",
    )
    pf.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="qairt_install: refuse a QAIRT older than the one that compiled this bundle",
    )
    pf.add_argument("--dry-run", action="store_true", help="show the commands only")
    pf.add_argument("--sudo-password-stdin", action="store_true", help="read the sudo password from stdin")
    pf.add_argument("--remember", action="store_true", help="store the sudo password in the keyring")
    add_trust_flag(pf)
    set_action(pf, cmd_fix)

    pu = bs.add_parser("push", help="push a bundle folder to the board (resumable; unchanged files skipped)")
    pu.add_argument("name")
    pu.add_argument("bundle_dir", type=Path)
    pu.add_argument(
        "--as",
        dest="remote_name",
        default=None,
        help="bundle name on the board (default: a run's bundle by its run id; else the folder's name)",
    )
    pu.add_argument(
        "--verify",
        action="store_true",
        help="compare the sha256 of every file, computed on the board, even when nothing changed "
        "(files found wrong are sent again)",
    )
    add_trust_flag(pu)
    set_action(pu, cmd_push)


async def _open(args: argparse.Namespace) -> Board:
    board: Board = await open_named_board(args.name, args)
    return board


def _on_board(args: argparse.Namespace, work: Callable[[Board], Awaitable[T]]) -> T:
    """Connect to the board named in args, do `work` there, and close the connection however it ends."""

    async def go() -> T:
        b = await _open(args)
        try:
            return await work(b)
        finally:
            await b.transport.close()

    return asyncio.run(go())


def cmd_add(args: argparse.Namespace) -> int:
    from hexstudio.core.settings import SettingsError, check_board_name

    try:
        check_board_name(args.name)  # before anything is saved (issue 27: '../../etc', '$(id)', '' were kept)
    except SettingsError as exc:
        raise CliError(exc.message, exc.hint, exit_code=EXIT_USAGE) from None
    check_ssh_flags(args, "board")
    cfg = ssh_config_from(args)
    if args.qairt_zip:
        zip_path = Path(args.qairt_zip).expanduser().resolve()
        if not zip_path.is_file():
            # kept, it would be found missing at the Board stage's QAIRT install, after the hours of Quantize
            raise CliError(
                f"--qairt-zip {zip_path} is not a file; the board was not saved.",
                "Give the QAIRT SDK zip you downloaded (v<version>.zip), or leave --qairt-zip out.",
                exit_code=EXIT_USAGE,
            )
        cfg["qairt_zip"] = str(zip_path)
    # a name in use: its whole entry is replaced (settings the flags do not give, such as qairt_zip, go with it)
    replaced: dict[str, Any] = {}

    def put(s: Settings) -> None:
        replaced["entry"] = s.boards.get(args.name)
        s.boards[args.name] = cfg

    s = Settings.edit(put)  # as settings.json is now, one edit at a time with the studio's
    before = replaced["entry"]
    out: dict[str, Any] = {"ok": True, "board": args.name, "config": s.boards[args.name], "replaced": before}
    what = "saved"
    if before is not None:
        was = f"{before.get('user') or ''}@{before.get('host') or before.get('ssh_alias') or '?'}:{before.get('port', 22)} ({before.get('auth')})"
        dropped = sorted(set(before) - set(cfg))
        what = f"replaced (it was {was}" + (f"; no longer set: {', '.join(dropped)}" if dropped else "") + ")"
    if not args.no_connect:

        async def label(b: Board) -> str:
            return b.label

        try:
            out["label"] = _on_board(args, label)
        except CliError as exc:
            raise kept_but_unreachable(
                exc, f"Board {args.name} is {what}", "board", "probe", args.name
            ) from None
        out["state"] = "ready"
    if args.json:
        print_json(out)
    else:
        print(f"board {args.name} {what}" + (f"; connected: {out['label']}" if "label" in out else ""))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    s = Settings.load()
    rows = [{"name": "sim", "simulated": True, "label": "local simulator"}]
    rows += [{"name": n, "simulated": False, **cfg} for n, cfg in sorted(s.boards.items())]
    if args.json:
        print_json({"boards": rows})
    else:
        for r in rows:
            where = (
                r.get("label")
                or f"{r.get('user') or ''}@{r.get('host')}:{r.get('port', 22)} ({r.get('auth')})"
            )
            print(f"{r['name']:16s} {where}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    if args.name not in Settings.load().boards:
        raise CliError(f"No board named '{args.name}'.", "`hexstudio board list` shows them.")
    Settings.edit(lambda s: s.boards.pop(args.name, None))
    for name in board_secret_names(args.name):
        delete_secret(name)
    if args.json:
        print_json({"ok": True, "removed": args.name})
    else:
        print(f"board {args.name} removed (its passwords, if any, are deleted from the keyring)")
    return 0


def cmd_password(args: argparse.Namespace) -> int:
    if args.name not in Settings.load().boards:
        raise CliError(f"No board named '{args.name}'.", "Add it first: hexstudio board add NAME --host ...")
    what = "sudo" if args.sudo else "SSH"
    pw = read_password(
        f"{what} password for {args.name}: ",
        args.stdin,
        f"hexstudio board password {args.name}" + (" --sudo" if args.sudo else ""),
    )
    set_secret(sudo_password_key(args.name) if args.sudo else board_password_key(args.name), pw)
    from hexstudio.core.secrets import stored_where

    print(f"{what} password for {args.name} stored {stored_where()}")
    return 0


def _print_report(doc: dict[str, Any]) -> None:
    marks = {"ok": "  ok ", "warn": " WARN", "fail": " FAIL", "skip": " skip"}
    print(f"{doc['board']} ({doc['label']}){'  [simulated]' if doc['simulated'] else ''}")
    for c in doc["checks"]:
        fix = f"   -> fix: {c['fix']}" if c.get("fix") and c["status"] in ("fail", "warn") else ""
        print(f"{marks.get(c['status'], c['status'])}  {c['title']}: {c['message']}{fix}")


def _known_or_usage(given: list[str], known: tuple[str, ...], what: str, hint: str) -> None:
    """Refuse an id nothing has before connecting to the board (a connection, maybe a password, for a typo)."""
    unknown = [g for g in given if g not in known]
    if unknown:
        raise CliError(
            f"Unknown {what} {', '.join(map(repr, unknown))}; known: {', '.join(known)}.",
            hint,
            exit_code=EXIT_USAGE,
        )


def cmd_probe(args: argparse.Namespace) -> int:
    from hexstudio.core.device.doctor import CHECK_IDS, probe

    only = [x.strip() for x in args.only.split(",")] if args.only else None
    _known_or_usage(only or [], CHECK_IDS, "check id", "Give --only the ids above, comma-separated.")

    async def go(b: Board) -> dict[str, Any]:
        try:
            bundle = (
                (args.bundle, args.remote_name or default_remote_name(args.bundle)) if args.bundle else None
            )
            return (await probe(b, only=only, bundle=bundle)).to_dict()
        except ValueError as exc:
            raise CliError(
                str(exc),
                "See `hexstudio board probe NAME --json` for the check ids.",
                exit_code=EXIT_USAGE,
            ) from None

    doc = _on_board(args, go)
    if args.json:
        print_json(doc)
    else:
        _print_report(doc)
    return 0 if doc["clean"] else EXIT_FAILED


def _sudo_password(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(the sudo password, whether it came from the keyring). Kept with --remember only once sudo took it."""
    stored = False
    if args.sudo_password_stdin:
        pw = sys.stdin.readline().rstrip("\n")
    else:
        pw = get_secret(sudo_password_key(args.name)) or ""
        stored = bool(pw)
        if not pw and sys.stdin.isatty():
            pw = getpass.getpass(f"sudo password on {args.name} (Enter to get the commands instead): ")
    return pw or None, stored


def _print_upload(done: int, total: int, what: str) -> None:
    print(
        f"\r  | {what}: {done / 1e6:.1f} / {total / 1e6:.1f} MB",
        end="\n" if done >= total else "",
        flush=True,
    )


def cmd_fix(args: argparse.Namespace) -> int:
    from hexstudio.core.device.fixes import FIX_IDS, apply_fix, plan_fix, plan_qairt_install

    _known_or_usage(
        [args.fix_id], FIX_IDS, "fix", "`hexstudio board probe NAME` names the fix each failed check needs."
    )

    async def go(b: Board) -> dict[str, Any]:
        try:
            if args.fix_id == "qairt_install" and args.zip is not None:
                plan = await plan_qairt_install(b, args.zip, bundle_dir=args.bundle)
            else:
                plan = await plan_fix(b, args.fix_id, qairt_zip=args.zip, geniex_file=args.file)
        except BoardError as exc:
            raise CliError(exc.message, exc.hint) from None
        if not args.json:
            print(f"{plan.title}. Commands:")
            for line in plan.commands:
                print("  " + line.replace("\n", "\n  "))
            for n in plan.notes:
                print(f"  note: {n}")
        if args.dry_run:
            return {"ok": True, "plan": plan.to_dict(), "applied": False}
        pw, stored = _sudo_password(args) if plan.needs_sudo else (None, False)
        try:
            res = await apply_fix(
                b,
                plan,
                sudo_password=pw,
                on_log=None if args.json else (lambda line: print("  | " + line)),
                on_progress=None if args.json else _print_upload,
            )
        except SudoRefused as exc:
            if stored:
                raise CliError(
                    f"{exc.message} It is the one stored for {args.name}.",
                    f"Store the right one: `hexstudio board password {args.name} --sudo` (or give it once with "
                    "--sudo-password-stdin).",
                ) from None
            raise CliError(exc.message, "Run the fix again and type the board user's password.") from None
        except BoardError as exc:
            raise CliError(exc.message, exc.hint) from None
        if pw and args.remember and not stored and res.password_taken:
            set_secret(sudo_password_key(args.name), pw)
        return {"ok": res.status in ("applied", "already"), "plan": plan.to_dict(), **res.to_dict()}

    doc = _on_board(args, go)
    if args.json:
        print_json(doc)
    elif doc.get("status") == "manual":
        print(doc["message"])
        for line in doc["manual_commands"]:
            print("  " + line.replace("\n", "\n  "))
    elif "status" in doc:
        print(doc["message"])
    return 0 if doc["ok"] else EXIT_FAILED


def cmd_push(args: argparse.Namespace) -> int:
    from hexstudio.core.device.push import PushProgress, push_bundle

    if not (args.bundle_dir / "bundle.json").is_file():
        raise CliError(f"{args.bundle_dir} has no bundle.json.", "Give the compile stage's bundle folder.")

    async def go(b: Board) -> dict[str, Any]:

        def progress(p: PushProgress) -> None:
            if not args.json:
                rate = f"{p.mb_per_s:6.1f} MB/s" if p.sent else " " * 11
                print(
                    f"\r  {p.done / 1e6:8.1f} / {p.total / 1e6:.1f} MB  {rate}  {p.file[:50]:50s}",
                    end="",
                    flush=True,
                )

        try:
            r = await push_bundle(
                b,
                args.bundle_dir,
                args.remote_name or default_remote_name(args.bundle_dir),
                progress,
                verify=True if args.verify else None,
            )
        except BoardError as exc:
            raise CliError(exc.message, exc.hint) from None
        return {
            "ok": True,
            "remote_bundle": r.remote_dir,
            "sent_files": r.sent_files,
            "skipped_files": r.skipped_files,
            "sent_bytes": r.sent_bytes,
            "seconds": round(r.seconds, 3),
            "mb_per_s": round(r.mb_per_s, 1),
            "warnings": r.warnings,
            "simulated": b.simulated,
            "emulated": r.emulated,
            "verified": r.verified,
            "resent": r.resent,
        }

    # a run's bundle: pushed under the run's lock, as its Board stage pushes it (two pushes of one file write into
    # one .part; a Compile that runs again replaces the folder under the push)
    run_dir = next((p for p in args.bundle_dir.resolve().parents if (p / "run.json").is_file()), None)
    try:
        with RunLock(run_dir) if run_dir is not None else contextlib.nullcontext():
            doc = _on_board(args, go)
    except RunBusy as exc:
        raise CliError(
            f"Run {exc.run_id} is working (PID {exc.pid or '?'}): its bundle is not pushed while the run may be "
            "pushing or compiling it.",
            "Wait for the run's stage to end (or cancel it), then push again; unchanged files are skipped.",
        ) from None
    if args.json:
        print_json(doc)
    else:
        print(
            f"\npushed to {doc['remote_bundle']}: {doc['sent_files']} files sent ({doc['sent_bytes'] / 1e6:.1f} MB, "
            f"{doc['mb_per_s']} MB/s), {doc['skipped_files']} unchanged"
        )
        print(
            f"  checked on the board: {'sha256 of every file' if doc['verified'] == 'sha256' else 'sizes'}"
            + (
                f"; {len(doc['resent'])} file(s) were wrong there and were sent again"
                if doc["resent"]
                else ""
            )
        )
        for w in doc["warnings"]:
            print(f"  warning: {w}")
    return 0
