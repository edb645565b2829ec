"""`hexstudio doctor`: this workstation's side of the studio, checked: where secrets are kept (the keyring
backend and whether it encrypts them; a warning for a plain-text one), which AI Hub token the Compile stage would
use (one rule: the keyring, then $HEXSTUDIO_AIHUB_TOKEN, then client.ini), and the workspace. The board's own
doctor is `hexstudio board probe NAME`; the model's needs are `hexstudio preflight`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from hexstudio.cli.common import CliError, add_json_flag, add_workspace_flag, print_json, workspace_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this workstation's side: the keyring (encrypted or plain text), the "
        "AI Hub token's source, the workspace",
    )
    add_json_flag(p)
    add_workspace_flag(p)
    p.set_defaults(func=cmd_doctor)


def checks(args: argparse.Namespace) -> list[dict[str, Any]]:
    from hexstudio.core import secrets
    from hexstudio.core.services.aihub_token import describe, token_status
    from hexstudio.core.settings import Settings, SettingsError

    out: list[dict[str, Any]] = []
    try:
        s = Settings.load()
        out.append(
            {"check": "settings", "ok": True, "level": "ok", "message": f"{s.path} reads well.", "hint": None}
        )
    except SettingsError as exc:
        out.append(
            {"check": "settings", "ok": False, "level": "error", "message": exc.message, "hint": exc.hint}
        )
    kb = secrets.backend_info()
    out.append(
        {
            "check": "keyring",
            "ok": kb["encrypted"] is True,
            "level": "ok" if kb["encrypted"] else "warning",
            "message": f"Secrets are kept {secrets.stored_where(kb)}.",
            "hint": kb["warning"],
            "backend": kb,
        }
    )
    st = token_status()
    out.append(
        {
            "check": "aihub_token",
            "ok": st["found"],
            "level": "ok" if st["found"] else "warning",
            "message": describe(st),
            "hint": None,
            "source": st["source"],
            "order": st["order"],
            "unused": st["unused"],
        }
    )
    try:
        root = workspace_from(args).root
    except CliError as exc:
        # a workspace that cannot be one (a file, a folder not writable): a row of its own, not the doctor's end
        out.append(
            {
                "check": "workspace",
                "ok": False,
                "level": "error",
                "message": exc.message,
                "hint": exc.hint,
            }
        )
        return out
    except (
        SettingsError
    ) as exc:  # the studio's choice of workspace is kept in the settings: said above already
        out.append(
            {
                "check": "workspace",
                "ok": False,
                "level": "error",
                "message": "The workspace cannot be told while the settings file cannot be read.",
                "hint": f"Fix the settings file first (above), or give --workspace. {exc.hint or ''}".strip(),
            }
        )
        return out
    writable = (root.is_dir() and os.access(root, os.W_OK)) or (
        not root.exists() and os.access(next((p for p in root.parents if p.exists()), root.anchor), os.W_OK)
    )
    out.append(
        {
            "check": "workspace",
            "ok": bool(writable),
            "level": "ok" if writable else "error",
            "message": f"workspace {root} {'is writable' if writable else 'cannot be written'}.",
            "hint": None
            if writable
            else "Give --workspace a folder you can write to (or set HEXSTUDIO_WORKSPACE).",
        }
    )
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    rows = checks(args)
    if args.json:
        print_json({"ok": all(r["level"] != "error" for r in rows), "checks": rows})
    else:
        for r in rows:
            mark = {"ok": "ok  ", "warning": "WARN", "error": "FAIL"}[r["level"]]
            print(f"{mark} {r['check']:12s} {r['message']}")
            if r.get("hint") and r["level"] != "ok":
                print(f"     {'':12s} {r['hint']}")
    return 0 if all(r["level"] != "error" for r in rows) else 1
