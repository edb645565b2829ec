""".wslconfig writer on a temporary Windows home: backup, idempotent, keeps unrelated keys and comments."""

from __future__ import annotations

import codecs
import io
import json
from pathlib import Path

import pytest

from hexstudio.cli.main import main as cli_main
from hexstudio.shared import wslconfig

GiB = 1024**3

USER_FILE = (
    "# my WSL settings\r\n"
    "[wsl2]\r\n"
    "memory=64GB   # half my RAM\r\n"
    "processors=16\r\n"
    "; kernelCommandLine = vsyscall=emulate\r\n"
    "guiApplications=true\r\n"
    "\r\n"
    "[experimental]\r\n"
    "autoMemoryReclaim=gradual\r\n"
    "sparseVhd=true\r\n"
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "mnt" / "c" / "Users" / "dev"
    h.mkdir(parents=True)
    return h


def backups(home: Path) -> list[Path]:
    return sorted(home.glob(".wslconfig.hexstudio-backup-*"))


def test_write_keeps_everything_else_backs_up_and_is_idempotent(home: Path) -> None:
    cfg = home / ".wslconfig"
    cfg.write_bytes(USER_FILE.encode())
    pl = wslconfig.plan(cfg, 176, 96)
    assert pl.current == {"memory": "64GB", "swap": None}
    assert pl.target == {"memory": "176GB", "swap": "96GB"}
    assert "-memory=64GB   # half my RAM" in pl.diff() and "+memory=176GB   # half my RAM" in pl.diff()
    backup = wslconfig.write(pl, now=0)
    assert backup is not None and backup.read_bytes() == USER_FILE.encode()
    new = cfg.read_bytes().decode()
    assert new == USER_FILE.replace("memory=64GB", "memory=176GB").replace(
        "guiApplications=true\r\n", "guiApplications=true\r\nswap=96GB\r\n"
    )
    # every line ends with CRLF, as Windows wrote it
    assert new.count("\r\n") == new.count("\n")
    # second run: nothing to change, no second backup
    again = wslconfig.plan(cfg, 176, 96)
    assert not again.changed and again.diff() == ""
    assert wslconfig.write(again) is None
    assert backups(home) == [backup]
    assert cfg.read_bytes().decode() == new


def test_never_lowers_a_larger_limit(home: Path) -> None:
    cfg = home / ".wslconfig"
    cfg.write_text("[wsl2]\nmemory=256GB\nswap=128GB\n")
    pl = wslconfig.plan(cfg, 176, 96)
    assert not pl.changed and pl.target == {}
    assert any("already covers" in n for n in pl.notes)


def test_missing_file_is_created_without_backup(home: Path) -> None:
    cfg = home / ".wslconfig"
    pl = wslconfig.plan(cfg, 40, 20)
    assert "does not exist yet" in pl.diff()
    assert wslconfig.write(pl) is None
    assert cfg.read_text() == "[wsl2]\nmemory=40GB\nswap=20GB\n"
    assert not wslconfig.plan(cfg, 40, 20).changed


def test_file_without_wsl2_section_gets_one_appended(home: Path) -> None:
    cfg = home / ".wslconfig"
    cfg.write_text("[experimental]\nsparseVhd=true")  # no final newline
    wslconfig.write(wslconfig.plan(cfg, 40, 20))
    assert cfg.read_text() == "[experimental]\nsparseVhd=true\n\n[wsl2]\nmemory=40GB\nswap=20GB\n"
    assert wslconfig.read_limits(cfg.read_text()) == {"memory": "40GB", "swap": "20GB"}


def test_keys_in_other_sections_and_comments_are_not_touched() -> None:
    text = "[other]\nmemory=1GB\n[WSL2]\n# memory=8GB\nswap = 4GB\n"
    assert wslconfig.read_limits(text) == {"memory": None, "swap": "4GB"}
    out = wslconfig.apply_limits(text, {"memory": "50GB", "swap": "25GB"})
    assert out == "[other]\nmemory=1GB\n[WSL2]\n# memory=8GB\nswap = 25GB\nmemory=50GB\n"


def test_utf16_file_from_notepad_round_trips(home: Path) -> None:
    cfg = home / ".wslconfig"
    cfg.write_bytes(codecs.BOM_UTF16_LE + "[wsl2]\r\nmemory=32GB\r\n".encode("utf-16-le"))
    wslconfig.write(wslconfig.plan(cfg, 48, None))
    data = cfg.read_bytes()
    assert data.startswith(codecs.BOM_UTF16_LE)
    assert data[2:].decode("utf-16-le") == "[wsl2]\r\nmemory=48GB\r\n"


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("176GB", 176 * GiB),
        ("8192MB", 8 * GiB),
        ("1TB", 1024 * GiB),
        ("2g", 2 * GiB),
        ("lots", None),
        (None, None),
    ],
)
def test_parse_size(text: str | None, n: int | None) -> None:
    assert wslconfig.parse_size(text) == n


def test_locate_uses_override_then_wslvar_then_cmd_exe() -> None:
    assert wslconfig.locate({"HEXSTUDIO_WSLCONFIG": "/tmp/x/.wslconfig"}) == Path("/tmp/x/.wslconfig")
    calls: list[list[str]] = []

    def fake(answers: dict[str, str]) -> wslconfig.Runner:
        def run(cmd: list[str]) -> str:
            calls.append(cmd)
            return answers.get(cmd[0], "")

        return run

    got = wslconfig.locate({}, fake({"wslvar": "C:\\Users\\dev", "wslpath": "/mnt/c/Users/dev"}))
    assert got == Path("/mnt/c/Users/dev/.wslconfig")
    assert calls[-1] == ["wslpath", "-u", "C:\\Users\\dev"]
    # no wslvar (wslu not installed): cmd.exe answers
    got = wslconfig.locate({}, fake({"cmd.exe": "C:\\Users\\ann\r\n", "wslpath": "/mnt/c/Users/ann"}))
    assert got == Path("/mnt/c/Users/ann/.wslconfig")
    # Windows' folders not on PATH (/etc/wsl.conf appendWindowsPath=false) and no wslvar: cmd.exe by its place
    on_c = {wslconfig.WINDOWS_CMD: "C:\\Users\\bo\r\n", "wslpath": "/mnt/c/Users/bo"}
    assert wslconfig.locate({}, fake(on_c)) == Path("/mnt/c/Users/bo/.wslconfig")
    # cmd.exe echoing the variable unexpanded, or not WSL at all
    assert wslconfig.locate({}, fake({"cmd.exe": "%USERPROFILE%"})) is None
    assert wslconfig.locate({}, fake({})) is None


def test_target_limits_cover_the_need_with_headroom() -> None:
    mem, swap = wslconfig.target_limits(int(173.6 * GiB))
    assert mem * GiB >= 173.6 * GiB * 1.25 and swap >= 16


# --- the CLI: hexstudio preflight --write-wslconfig ------------------------------------------------


def test_cli_refuses_without_confirmation_then_writes_with_yes(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = home / ".wslconfig"
    cfg.write_bytes(USER_FILE.encode())
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: never write without --yes
    args = [
        "preflight",
        "--write-wslconfig",
        "--wslconfig",
        str(cfg),
        "--memory-gb",
        "176",
        "--swap-gb",
        "96",
    ]
    assert cli_main(args) != 0
    out, err = capsys.readouterr()
    assert "+memory=176GB" in out and "+swap=96GB" in out and "now: memory=64GB" in out
    assert "Did not write" in err and "--yes" in err
    assert cfg.read_bytes() == USER_FILE.encode() and backups(home) == []

    assert cli_main([*args, "--yes"]) == 0
    out, _ = capsys.readouterr()
    assert "wsl --shutdown" in out and "backup:" in out
    assert wslconfig.read_limits(cfg.read_text()) == {"memory": "176GB", "swap": "96GB"}
    assert len(backups(home)) == 1 and backups(home)[0].read_bytes() == USER_FILE.encode()

    assert cli_main([*args, "--yes"]) == 0  # idempotent
    out, _ = capsys.readouterr()
    assert "Nothing to change" in out and len(backups(home)) == 1


def test_cli_json_for_the_builtin_model_has_nothing_to_raise(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = home / ".wslconfig"
    cfg.write_text("[wsl2]\nmemory=8GB\n")
    monkeypatch.setenv("HEXSTUDIO_WSLCONFIG", str(cfg))
    assert cli_main(["preflight", "--write-wslconfig", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["changed"] is False and doc["written"] is False and doc["current"]["memory"] == "8GB"
    assert doc["basis"]["quantize_peak_rss_bytes"] < 2 * GiB
    assert cfg.read_text() == "[wsl2]\nmemory=8GB\n"


def test_cli_without_wsl_explains_how_to_give_the_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HEXSTUDIO_WSLCONFIG", raising=False)
    monkeypatch.setattr(wslconfig, "locate", lambda *a, **k: None)
    assert cli_main(["preflight", "--write-wslconfig", "--memory-gb", "64"]) != 0
    assert "--wslconfig /mnt/c/Users/" in capsys.readouterr().err


def test_cli_json_refusal_is_one_json_document(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = home / ".wslconfig"
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert (
        cli_main(["preflight", "--write-wslconfig", "--wslconfig", str(cfg), "--memory-gb", "100", "--json"])
        == 1
    )
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["ok"] is False and doc["written"] is False and "+memory=100GB" in doc["diff"]
    assert "--yes" in err and not cfg.exists()


def test_wsl_check_shows_the_current_wslconfig_and_the_lines_to_write() -> None:
    from hexstudio.shared.preflight_checks import run_checks
    from tests.preflight.test_checks import by_id, needs_8b, probe

    # a VM smaller than the 8B's part-wise quantization estimate (~6.5 GiB)
    cfg = {
        "path": "/mnt/c/Users/dev/.wslconfig",
        "exists": True,
        "text": "[wsl2]\nmemory=4GB\n",
        "limits": {"memory": "4GB", "swap": None},
    }
    c = by_id(
        run_checks(probe(wsl=True, mem_total_bytes=4 * GiB, swap_total_bytes=0, wslconfig=cfg), needs_8b())
    )["wsl"]
    assert c["status"] == "fail" and "memory=4GB" in c["message"] and c["fix"].startswith("wslconfig:memory=")
    mem, swap = (int(x.split("=")[1].rstrip("GB")) for x in c["fix"].split(":", 1)[1].split(","))
    assert (mem, swap) == wslconfig.target_limits(needs_8b()["peak_rss_bytes"])
    big = by_id(
        run_checks(
            probe(
                wsl=True,
                mem_total_bytes=250 * GiB,
                wslconfig={**cfg, "limits": {"memory": "256GB", "swap": "64GB"}},
            ),
            needs_8b(),
        )
    )["wsl"]
    assert big["status"] == "ok" and "memory=256GB, swap=64GB" in big["message"]


def test_the_question_on_a_terminal_stays_out_of_the_json(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked on a terminal under --json, the question went to stdout ahead of the document, which was then no JSON
    for the script reading it."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    cfg = home / ".wslconfig"
    cfg.write_bytes(USER_FILE.encode())
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    args = ["preflight", "--write-wslconfig", "--wslconfig", str(cfg), "--memory-gb", "176", "--json"]
    assert cli_main(args) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["written"] is True and "[y/N]" in err
    # the command's terminal prompts were its own: they did not stay for what runs next in this process (an
    # encrypted SSH key then met getpass's prompt instead of "no one to ask", tests/board/test_ssh_config.py)
    from hexstudio.core.device.connect import DEFAULT_PROMPTS

    assert DEFAULT_PROMPTS.passphrase is None and DEFAULT_PROMPTS.offer_known_hosts is None


def test_an_edit_made_while_the_change_was_shown_is_not_undone(home: Path) -> None:
    """The plan was made when the Fix… dialog opened and written when the user agreed, without reading the file
    again: an edit made in Notepad meanwhile (the dialog points there) was replaced, kept only in the backup."""
    cfg = home / ".wslconfig"
    cfg.write_bytes(USER_FILE.encode())
    pl = wslconfig.plan(cfg, 176, 96)
    edited = USER_FILE.replace("guiApplications=true", "guiApplications=false")
    cfg.write_bytes(edited.encode())  # the user's own edit, meanwhile
    with pytest.raises(wslconfig.ChangedMeanwhile, match="changed since this change was planned"):
        wslconfig.write(pl, now=0)
    assert cfg.read_bytes().decode() == edited and backups(home) == []
    cfg.unlink()  # removed meanwhile: the plan said it was there
    with pytest.raises(wslconfig.ChangedMeanwhile):
        wslconfig.write(pl, now=0)
    again = wslconfig.plan(cfg, 176, 96)  # planned again from the file as it is: written
    assert wslconfig.write(again, now=0) is None and "memory=176GB" in cfg.read_text()
