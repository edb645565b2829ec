"""`hexstudio install-desktop`: the WSLg Start-menu entry (and, on WSL, the Windows shortcut)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from hexstudio.cli.common import CliError, print_json, set_action
from hexstudio.core import desktop
from hexstudio.shared import wslconfig

WINDOWS_CMD = desktop.WINDOWS_CMD


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "install-desktop",
        help="add HexStudio to the applications menu (WSLg lists it in the Windows Start menu)",
    )
    p.add_argument(
        "--launcher",
        type=Path,
        default=None,
        help="program the entry starts (default: bin/hexstudio-launch beside this Python)",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="default: $XDG_DATA_HOME or ~/.local/share")
    p.add_argument(
        "--bin-dir", type=Path, default=None, help="where the hexstudio-launch link goes (~/.local/bin)"
    )
    p.add_argument(
        "--windows-shortcut",
        action="store_true",
        help="also copy HexStudio.cmd to the Windows desktop (WSL only)",
    )
    set_action(p, cmd_install_desktop)


def windows_desktop() -> Path | None:
    cfg = wslconfig.locate()
    return cfg.parent / "Desktop" if cfg else None


# what HexStudio.cmd starts inside WSL (install() makes it, as a link to a hexstudio-launch launcher)
WINDOWS_LAUNCHER = Path("~/.local/bin/hexstudio-launch")


def cmd_install_desktop(args: argparse.Namespace) -> int:
    launcher = args.launcher or desktop.default_launcher()
    started = WINDOWS_LAUNCHER.expanduser()
    if args.windows_shortcut and Path(launcher).name != "hexstudio-launch" and not started.exists():
        # a pip install has no hexstudio-launch: the shortcut would fail at every click
        raise CliError(
            f"The Windows shortcut starts {WINDOWS_LAUNCHER} inside WSL, and this install has no hexstudio-launch "
            f"(the launcher is {launcher}).",
            "Run packaging/install-workstation.sh (it makes hexstudio-launch), or give --launcher "
            "PATH/TO/hexstudio-launch; the menu entry alone needs neither (leave out --windows-shortcut).",
        )
    dest = windows_desktop() if args.windows_shortcut else None
    if args.windows_shortcut and (dest is None or not dest.is_dir()):  # before anything is written
        raise CliError(
            "Cannot find the Windows desktop folder (this does not look like WSL).",
            f"Copy {WINDOWS_CMD} to your Windows desktop yourself, or leave out --windows-shortcut for the menu "
            "entry alone.",
        )
    try:
        res = desktop.install(launcher, args.data_dir, args.bin_dir)
    except FileNotFoundError as exc:
        raise CliError(
            f"Cannot install the menu entry: the launcher {exc}.",
            "Run packaging/install-workstation.sh first, or give --launcher PATH.",
        ) from None
    except OSError as exc:
        raise CliError(f"Cannot install the menu entry: {exc}.") from None
    shortcut = None
    if dest is not None:
        shortcut = dest / WINDOWS_CMD.name
        if not shortcut.is_file() or shortcut.read_bytes() != WINDOWS_CMD.read_bytes():
            try:
                shutil.copyfile(WINDOWS_CMD, shortcut)
            except OSError as exc:
                raise CliError(
                    f"The menu entry is installed, but the Windows shortcut could not be written: "
                    f"{exc.strerror or exc} ({shortcut}).",
                    f"Copy {WINDOWS_CMD} to your Windows desktop yourself.",
                ) from None
            res.changed.append(str(shortcut))
        else:
            res.unchanged.append(str(shortcut))
    if args.json:
        print_json(
            {
                "entry": str(res.entry),
                "icons": [str(i) for i in res.icons],
                "link": str(res.link) if res.link else None,
                "windows_shortcut": str(shortcut) if shortcut else None,
                "changed": res.changed,
                "unchanged": res.unchanged,
            }
        )
        return 0
    for c in res.changed:
        print(f"wrote {c}")
    if not res.changed:
        print(f"{res.entry} and its icon are up to date")
    print(
        "WSLg lists 'HexStudio' in the Windows Start menu (it can take a minute to appear). "
        f"Windows shortcut: {shortcut or WINDOWS_CMD} (double-click; it starts HexStudio through wsl.exe)."
    )
    return 0
