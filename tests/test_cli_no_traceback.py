"""No traceback reaches a user from any CLI command (issue 27 #8): each command, as a real `hexstudio`
process with stdin closed, given malformed input (wrong numbers, paths that are files, folders or missing,
garbage JSON, hostile names, an unreadable settings file), must answer with words and an exit status, never a
Python traceback. The bad-input table (test_bad_inputs.py) checks the words; this sweeps the commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BAD = "../../etc/$(id)"

# (id, argv); "{tmp}" is a folder, "{file}" a file holding garbage, "{nojson}" a folder with a garbage bundle.json
SWEEP: list[tuple[str, list[str]]] = [
    ("run --resume ''", ["run", "--resume", ""]),
    ("run --resume bad id", ["run", "--resume", BAD]),
    ("run --set garbage", ["run", "--set", "ar_n={{{", "--until", "model"]),
    ("run --model a file", ["run", "--model", "{file}", "--until", "model"]),
    ("runs show bad id", ["runs", "show", BAD]),
    ("runs delete bad id", ["runs", "delete", BAD]),
    ("runs delete, no terminal", ["runs", "delete", "20260101-000000-x-0000"]),
    ("preflight --model a file", ["preflight", "--model", "{file}"]),
    ("preflight --context-length -1", ["preflight", "--context-length", "-1"]),
    ("model inspect a file", ["model", "inspect", "{file}"]),
    ("model inspect --parts 0", ["model", "inspect", "builtin:tiny-llama", "--parts", "0"]),
    ("model inspect --ar-n abc", ["model", "inspect", "builtin:tiny-llama", "--ar-n", "abc"]),
    ("bundle verify garbage", ["bundle", "verify", "{nojson}"]),
    ("bundle verify a file", ["bundle", "verify", "{file}"]),
    ("bundle check garbage", ["bundle", "check", "{nojson}"]),
    ("bundle check missing", ["bundle", "check", "{tmp}/missing"]),
    ("bundle config a file", ["bundle", "config", "--model", "{file}"]),
    ("aihub login, no terminal", ["aihub", "login"]),
    ("hf login, no terminal", ["hf", "login"]),
    ("board add bad name", ["board", "add", BAD, "--host", "127.0.0.1", "--no-connect"]),
    ("board add bad port", ["board", "add", "b1", "--host", "127.0.0.1", "--port", "x", "--no-connect"]),
    ("board probe unknown", ["board", "probe", BAD]),
    ("board push unknown board", ["board", "push", BAD, "{tmp}"]),
    ("chat --max-tokens -1", ["chat", "--max-tokens", "-1"]),
    ("chat unknown board", ["chat", "--board", BAD, "--prompt", "hi"]),
    ("bench unknown board", ["bench", "--board", BAD]),
    ("report bad id", ["report", BAD]),
    ("report --out a folder", ["report", "20260101-000000-x-0000", "--out", "{tmp}"]),
    ("serve --port 70000", ["serve", "--port", "70000"]),
    ("serve --max-tokens -5", ["serve", "--max-tokens", "-5"]),
    ("serve unknown board", ["serve", "--board", BAD, "--port", "0"]),
    ("explain empty", ["explain", ""]),
    ("genie transcript a folder", ["genie", "transcript", "{tmp}"]),
    ("genie profile a folder", ["genie", "profile", "{tmp}"]),
    ("eval add a file", ["eval", "add", "{file}"]),
    ("worker add bad name", ["worker", "add", BAD, "--host", "127.0.0.1"]),
    ("predict a file", ["predict", "--model", "{file}"]),
    ("doctor", ["doctor"]),
]

SETTINGS = [
    ("[]", b"[]"),
    ("boards x", b'{"boards": "x"}'),
    ("board 5", b'{"boards": {"b": 5}}'),
    ("not UTF-8", b'{"boards": "\xff"}'),
    ("truncated", b'{"boards": {'),
]


def _hexstudio(tmp: Path, argv: list[str], config: Path) -> subprocess.CompletedProcess[str]:
    garbage = tmp / "garbage.txt"
    garbage.write_bytes(b"\x00\xff not a model \xfe")
    nojson = tmp / "nojson"
    nojson.mkdir(exist_ok=True)
    (nojson / "bundle.json").write_text('{"files": [')
    (nojson / "genie_config.json").write_text("{{")
    args = [
        a.replace("{tmp}", str(tmp)).replace("{file}", str(garbage)).replace("{nojson}", str(nojson))
        for a in argv
    ]
    env = {
        **os.environ,
        "HEXSTUDIO_WORKSPACE": str(tmp / "ws"),
        "HEXSTUDIO_CONFIG_DIR": str(config),
        "HF_HUB_OFFLINE": "1",
        "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("HEXSTUDIO_TRACEBACK", None)
    with open(os.devnull, "rb") as devnull:
        return subprocess.run(
            [sys.executable, "-m", "hexstudio", *args],
            cwd=REPO,
            env=env,
            stdin=devnull,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.mark.parametrize(("what", "argv"), SWEEP, ids=[s[0] for s in SWEEP])
def test_no_traceback(tmp_path: Path, what: str, argv: list[str]) -> None:
    r = _hexstudio(tmp_path, argv, tmp_path / "config")
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert "failed unexpectedly" not in out, out  # the CLI's last net: a bug, not a message
    if what != "doctor":
        assert r.returncode != 0, out
        assert out.strip(), "no words at all"


@pytest.mark.parametrize(("what", "content"), SETTINGS, ids=[s[0] for s in SETTINGS])
@pytest.mark.parametrize(
    "argv",
    [["board", "list"], ["run", "--until", "model"], ["doctor"], ["chat", "--prompt", "hi"]],
    ids=lambda a: " ".join(a[:2]),
)
def test_no_traceback_with_a_broken_settings_file(
    tmp_path: Path, what: str, content: bytes, argv: list[str]
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_bytes(content)
    r = _hexstudio(tmp_path, argv, config)
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "failed unexpectedly" not in out, out
    assert r.returncode != 0 and "settings.json" in out, out
    assert not (tmp_path / "ws" / "runs").exists() or not any((tmp_path / "ws" / "runs").iterdir())
