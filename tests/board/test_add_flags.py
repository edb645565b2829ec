"""`hexstudio board add` / `worker add`: what the flags must say before a machine is saved. Key auth without
--key was refused, though the connection uses the IdentityFile ~/.ssh/config names for the host; and a worker
host could not be named "sim", with a board's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from hexstudio.core.settings import Settings
from tests.support.cli import python_m_hexstudio


def test_key_auth_takes_the_identity_file_from_ssh_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "lab_key").write_text("not a real key: never read here (--no-connect)\n")
    (ssh / "config").write_text("Host evk9\n  HostName 10.0.0.9\n  IdentityFile ~/.ssh/lab_key\n")
    r = python_m_hexstudio("board", "add", "evk9", "--host", "evk9", "--no-connect")
    assert r.returncode == 0, r.stderr
    assert Settings.load().boards["evk9"]["auth"] == "key"
    # a host ~/.ssh/config names no key for is still refused, saying where a key could come from
    r = python_m_hexstudio("board", "add", "evk10", "--host", "10.0.0.10", "--no-connect")
    assert r.returncode == 2 and "names no IdentityFile for 10.0.0.10" in r.stderr, r.stderr
    assert "evk10" not in Settings.load().boards


def test_a_worker_host_may_be_named_sim() -> None:
    r = python_m_hexstudio("worker", "add", "sim", "--host", "gpu-box", "--auth", "agent", "--no-connect")
    assert r.returncode == 0 and "worker host sim saved" in r.stdout, r.stderr
    r = python_m_hexstudio("worker", "add", "a b", "--host", "gpu-box", "--auth", "agent", "--no-connect")
    assert r.returncode == 2 and "The worker host name 'a b' is not allowed" in r.stderr, r.stderr
    assert "Pick another name for the worker host" in r.stderr


ADD_EVK = ("board", "add", "evk", "--host", "10.0.0.5", "--auth", "agent")


def test_adding_a_board_under_a_name_in_use_says_it_replaced_it(tmp_path: Path) -> None:
    """`board add` for a name in use said "saved", as for a new board, and dropped the settings its flags do not
    give (the QAIRT zip) without a word."""
    zip_path = tmp_path / "qairt.zip"
    zip_path.write_bytes(b"PK")
    r = python_m_hexstudio(*ADD_EVK, "--qairt-zip", str(zip_path), "--no-connect")
    assert r.returncode == 0 and "board evk saved" in r.stdout, r.stderr
    r = python_m_hexstudio("board", "add", "evk", "--host", "10.0.0.6", "--auth", "agent", "--no-connect")
    assert r.returncode == 0, r.stderr
    assert "board evk replaced (it was @10.0.0.5:22 (agent); no longer set: qairt_zip)" in r.stdout, r.stdout
    assert Settings.load().boards["evk"]["host"] == "10.0.0.6"


def test_a_board_added_while_it_cannot_be_reached_says_it_is_saved(tmp_path: Path) -> None:
    """The entry was saved (or replaced an older one) before connecting; a failed connection then said only why it
    failed, so the replaced entry was gone without a word."""
    r = python_m_hexstudio("board", "add", "b1", "--host", "192.0.2.1", "--auth", "password", "--no-connect")
    assert r.returncode == 0, r.stderr
    r = python_m_hexstudio(
        "board",
        "add",
        "b1",
        "--host",
        "127.0.0.1",
        "--port",
        "1",
        "--auth",
        "agent",
        "--json",
        env={"SSH_AUTH_SOCK": ""},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "Board b1 is replaced (it was @192.0.2.1:22 (password)), but connecting to it failed" in out, out
    assert "hexstudio board remove b1" in out and "hexstudio board probe b1" in out
    assert Settings.load().boards["b1"]["port"] == 1


def test_board_fix_help_names_every_fix(capsys: pytest.CaptureFixture[str]) -> None:
    """The fix ids in `hexstudio board fix --help` are written out (the CLI does not import the fixes at start-up);
    geniex_install was missing while --file spoke of it."""
    from hexstudio.cli.main import main
    from hexstudio.core.device.fixes import FIX_IDS

    with pytest.raises(SystemExit):
        main(["board", "fix", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(f in shown for f in FIX_IDS), [f for f in FIX_IDS if f not in shown]


def test_a_qairt_zip_that_is_not_there_is_not_saved(tmp_path: Path) -> None:
    """`board add --qairt-zip /nonexistent.zip --no-connect` saved the board; the missing zip was found at the
    Board stage's QAIRT install."""
    missing = tmp_path / "v2.42.zip"
    r = python_m_hexstudio(*ADD_EVK, "--qairt-zip", str(missing), "--no-connect")
    assert r.returncode == 2 and f"--qairt-zip {missing} is not a file" in r.stderr, r.stderr
    assert "evk" not in Settings.load().boards
