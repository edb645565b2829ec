"""Start-menu integration: the freedesktop entry that WSLg turns into "HexStudio" in the Windows Start
menu, its icon, and a `~/.local/bin/hexstudio-launch` link that the Windows shortcut
(HexStudio.cmd) starts through wsl.exe. The entry, the icons and the shortcut are package data in
hexstudio/core/desktop_files/ (importlib.resources), so an installed wheel carries them.

Qt-free. Every write is idempotent: an unchanged file is not rewritten.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hexstudio.core.atomic import atomic_writer
from hexstudio.shared.data import package_path

FILES = package_path("hexstudio.core", "desktop_files")  # package data (importlib.resources)
TEMPLATE = FILES / "hexstudio.desktop"
ICONS = {"scalable": FILES / "hexstudio.svg", "256x256": FILES / "hexstudio.png"}
WINDOWS_CMD = FILES / "HexStudio.cmd"
DESKTOP_ID = "hexstudio.desktop"
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def exec_quote(arg: str) -> str:
    """Quote one Exec= argument as the Desktop Entry spec asks (reserved characters -> double quotes,
    with ", `, $ and \\ escaped inside; then the string-level escaping of backslashes)."""
    if arg and not (_RESERVED & set(arg)) and "%" not in arg:
        return arg
    inner = "".join("\\" + c if c in '"`$\\' else c for c in arg).replace("%", "%%")
    return ('"' + inner + '"').replace("\\", "\\\\")


def default_launcher() -> Path:
    """The program the entry starts: bin/hexstudio-launch beside this Python (it sets the libpython hook),
    else the `hexstudio` script, else a frozen build's own executable."""
    if getattr(sys, "frozen", False):
        return Path(sys.executable)
    bindir = Path(sys.executable).parent
    for name in ("hexstudio-launch", "hexstudio"):
        if (bindir / name).is_file():
            return bindir / name
    found = shutil.which("hexstudio")
    return Path(found) if found else bindir / "hexstudio"


def render(template: str, launcher: Path, icon: Path) -> str:
    """The template with absolute Exec=/TryExec=/Icon= values for this installation."""
    out = []
    for line in template.splitlines():
        key = line.split("=", 1)[0]
        if key == "Exec":
            line = f"Exec={exec_quote(str(launcher))}"
        elif key == "TryExec":
            line = f"TryExec={str(launcher).replace(chr(92), chr(92) * 2)}"
        elif key == "Icon":
            line = f"Icon={icon}"
        out.append(line)
    return "\n".join(out) + "\n"


@dataclass
class DesktopInstall:
    entry: Path
    icons: list[Path]
    link: Path | None
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def _write_if_changed(path: Path, data: bytes, mode: int, res: DesktopInstall) -> None:
    if path.is_file() and path.read_bytes() == data:
        res.unchanged.append(str(path))
        return
    with atomic_writer(path, "wb") as fh:
        fh.write(data)
    path.chmod(mode)
    res.changed.append(str(path))


def install(launcher: Path, data_dir: Path | None = None, bin_dir: Path | None = None) -> DesktopInstall:
    """Install the entry, its icons and the ~/.local/bin/hexstudio-launch link. Safe to run again."""
    data_dir = data_dir or data_home()
    bin_dir = bin_dir or Path.home() / ".local" / "bin"
    launcher = launcher.expanduser().absolute()
    if not launcher.is_file():
        raise FileNotFoundError(f"{launcher} does not exist")
    icons = {
        size: data_dir / "icons" / "hicolor" / size / "apps" / f"hexstudio{src.suffix}"
        for size, src in ICONS.items()
    }
    res = DesktopInstall(entry=data_dir / "applications" / DESKTOP_ID, icons=list(icons.values()), link=None)
    for size, dst in icons.items():
        _write_if_changed(dst, ICONS[size].read_bytes(), 0o644, res)
    # absolute PNG: WSLg converts it for the Windows Start menu without needing an icon theme
    text = render(TEMPLATE.read_text(encoding="utf-8"), launcher, icons["256x256"])
    _write_if_changed(res.entry, text.encode("utf-8"), 0o644, res)
    link = bin_dir / "hexstudio-launch"
    if launcher.name == "hexstudio-launch" and link != launcher:
        if link.is_symlink() and Path(os.readlink(link)) == launcher:
            res.unchanged.append(str(link))
        elif link.exists() and not link.is_symlink():
            res.unchanged.append(f"{link} (a file that is not HexStudio's link: left alone)")
        else:
            bin_dir.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{link.name}.tmp")
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(launcher)
            os.replace(tmp, link)
            res.changed.append(str(link))
        res.link = link
    if res.changed and shutil.which("update-desktop-database"):
        subprocess.run(["update-desktop-database", str(res.entry.parent)], capture_output=True, timeout=30)
    return res
