"""WSLg launch: the .desktop entry (desktop-file-validate), its installation, the Windows .cmd, and the
default workspace inside the Linux filesystem."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hexstudio.cli.main import main as cli_main
from hexstudio.core import desktop
from hexstudio.core.paths import default_workspace
from tests.packaging.conftest import ROOT

VALIDATE = shutil.which("desktop-file-validate")
needs_validator = pytest.mark.skipif(
    VALIDATE is None,
    reason="desktop-file-validate missing: apt-get install desktop-file-utils (./dev test installs it)",
)


def validate(path: Path) -> None:
    assert VALIDATE
    r = subprocess.run([VALIDATE, str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    p = tmp_path / "My Tools" / "venv" / "bin" / "hexstudio-launch"  # a space: Exec= must quote it
    p.parent.mkdir(parents=True)
    p.write_text("#!/bin/sh\nexit 0\n")
    p.chmod(0o755)
    return p


@needs_validator
def test_shipped_desktop_entry_is_valid() -> None:
    validate(ROOT / "hexstudio" / "core" / "desktop_files" / "hexstudio.desktop")


@needs_validator
def test_install_writes_a_valid_entry_icons_and_link_and_is_idempotent(
    tmp_path: Path, launcher: Path
) -> None:
    data, bindir = tmp_path / "share", tmp_path / "bin"
    res = desktop.install(launcher, data, bindir)
    entry = data / "applications" / "hexstudio.desktop"
    assert res.entry == entry
    validate(entry)
    text = entry.read_text()
    assert f'Exec="{launcher}"' in text and f"TryExec={launcher}\n" in text
    png = data / "icons" / "hicolor" / "256x256" / "apps" / "hexstudio.png"
    assert f"Icon={png}\n" in text and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        (data / "icons" / "hicolor" / "scalable" / "apps" / "hexstudio.svg").read_text().startswith("<?xml")
    )
    assert "Name=HexStudio\n" in text and "Terminal=false" in text
    link = bindir / "hexstudio-launch"
    assert link.is_symlink() and link.resolve() == launcher.resolve()
    mtime = entry.stat().st_mtime_ns
    again = desktop.install(launcher, data, bindir)
    assert again.changed == [] and entry.stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("/home/dev/.venv/bin/hexstudio-launch", "/home/dev/.venv/bin/hexstudio-launch"),
        ("/home/dev/my venv/bin/x", '"/home/dev/my venv/bin/x"'),
        ('/a"b/$x', '"/a\\\\"b/\\\\$x"'),
        ("/100%/x", '"/100%%/x"'),
    ],
)
def test_exec_quoting_follows_the_desktop_entry_spec(arg: str, quoted: str) -> None:
    assert desktop.exec_quote(arg) == quoted


def test_cli_install_desktop_json(tmp_path: Path, launcher: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "install-desktop",
        "--launcher",
        str(launcher),
        "--data-dir",
        str(tmp_path / "share"),
        "--bin-dir",
        str(tmp_path / "bin"),
        "--json",
    ]
    assert cli_main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["entry"].endswith("applications/hexstudio.desktop") and len(doc["changed"]) == 4
    assert cli_main(args) == 0
    assert json.loads(capsys.readouterr().out)["changed"] == []


def test_cli_install_desktop_without_launcher_explains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli_main(["install-desktop", "--launcher", str(tmp_path / "nope"), "--data-dir", str(tmp_path)])
    assert rc != 0 and "install-workstation.sh" in capsys.readouterr().err


def test_a_windows_shortcut_without_hexstudio_launch_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pip install's launcher is `hexstudio`: no hexstudio-launch link is made, yet HexStudio.cmd, which starts
    ~/.local/bin/hexstudio-launch, went to the Windows desktop and failed at every click."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    plain = tmp_path / "venv" / "bin" / "hexstudio"
    plain.parent.mkdir(parents=True)
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o755)
    share = tmp_path / "share"
    rc = cli_main(
        ["install-desktop", "--launcher", str(plain), "--data-dir", str(share), "--windows-shortcut"]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "~/.local/bin/hexstudio-launch" in err and "install-workstation.sh" in err, err
    assert not share.exists()  # nothing written


def test_windows_shortcut_starts_the_installed_launcher_through_wsl() -> None:
    data = (ROOT / "hexstudio" / "core" / "desktop_files" / "HexStudio.cmd").read_bytes()
    assert data.count(b"\r\n") == data.count(b"\n"), "a .cmd needs CRLF line endings"
    text = data.decode("ascii")
    assert "wsl.exe" in text and "~/.local/bin/hexstudio-launch" in text and "--cd ~" in text
    # the link that install-desktop creates (test above) and install-workstation.sh writes
    assert "hexstudio-launch" in (ROOT / "packaging" / "install-workstation.sh").read_text()


def test_default_workspace_is_inside_the_linux_filesystem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HEXSTUDIO_WORKSPACE", raising=False)
    monkeypatch.setenv("HOME", "/home/dev")
    ws = default_workspace()
    assert ws == Path("/home/dev/hexstudio-workspace")
    assert not str(ws).startswith("/mnt/")


def test_a_windows_shortcut_with_no_windows_desktop_writes_nothing(
    tmp_path: Path, launcher: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside WSL the menu entry, icons and link were written, then the command failed on the shortcut, without
    saying the entry was installed."""
    from hexstudio.cli import desktop_cmd

    monkeypatch.setattr(desktop_cmd, "windows_desktop", lambda: None)
    share = tmp_path / "share"
    args = [
        "install-desktop",
        "--launcher",
        str(launcher),
        "--data-dir",
        str(share),
        "--bin-dir",
        str(tmp_path / "b"),
    ]
    assert cli_main([*args, "--windows-shortcut"]) != 0
    assert "Windows desktop folder" in capsys.readouterr().err
    assert not share.exists() and not (tmp_path / "b").exists()
