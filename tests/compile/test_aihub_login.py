"""`hexstudio aihub login|logout|status`: the token goes to the keyring (the test backend), status says where
a token is found and never prints it, and the worker's missing-token hint names the real commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.core import secrets
from hexstudio.shared.run_settings import RunSettings
from tests.support.cli import python_m_hexstudio
from tests.support.terminal import converse

TOKEN = "tok-canary-5b1f0c9e2d"


def _cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return python_m_hexstudio(*args, stdin=stdin, env=env, main=True)


@pytest.fixture
def no_token_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HEXSTUDIO_AIHUB_TOKEN", raising=False)
    ini = tmp_path / "qai_hub" / "client.ini"
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(ini))
    return ini


def test_login_status_logout_with_the_keyring(no_token_env: Path) -> None:
    ini = no_token_env
    r = _cli("aihub", "status", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["found"] is False and doc["source"] is None
    r = _cli("aihub", "login", "--status")
    assert r.returncode == 1 and "hexstudio aihub login" in r.stdout

    r = _cli("aihub", "login", "--stdin", "--json", stdin=TOKEN + "\n")
    assert r.returncode == 0, r.stderr
    assert secrets.get_secret(secrets.AIHUB_TOKEN) == TOKEN  # really in the keyring
    assert TOKEN not in r.stdout + r.stderr
    r = _cli("aihub", "login", "--status", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and (doc["found"], doc["source"], doc["keyring"]) == (True, "keyring", True)
    assert TOKEN not in r.stdout

    # a client.ini beside it: status names both, the keyring's is the one used
    ini.parent.mkdir(parents=True)
    ini.write_text(f"[api]\napi_token = {TOKEN}-ini\napi_url = http://x\nweb_url = http://x\n")
    r = _cli("aihub", "status")
    assert r.returncode == 0 and "keyring" in r.stdout and "client.ini also has one" in r.stdout
    assert TOKEN not in r.stdout

    r = _cli("aihub", "logout")
    assert r.returncode == 0 and "removed from the keyring" in r.stdout and str(ini) in r.stdout
    assert secrets.get_secret(secrets.AIHUB_TOKEN) is None
    r = _cli("aihub", "status", "--json")
    doc = json.loads(r.stdout)
    assert (doc["found"], doc["source"], doc["client_ini"]) == (True, "client.ini", str(ini))
    assert TOKEN not in r.stdout
    r = _cli("aihub", "logout", "--json")
    assert json.loads(r.stdout)["removed"] is False


def test_login_refuses_empty_or_garbled_tokens_and_no_terminal(no_token_env: Path) -> None:
    r = _cli("aihub", "login", "--stdin", stdin="\n")
    assert r.returncode == 1 and "No token was given" in r.stderr
    r = _cli("aihub", "login", "--stdin", stdin="two words\n")
    assert r.returncode == 1 and "does not look like an AI Hub API token" in r.stderr
    r = _cli("aihub", "login")  # stdin is not a terminal: no hidden prompt possible
    assert r.returncode == 1 and "--stdin" in r.stderr
    assert secrets.get_secret(secrets.AIHUB_TOKEN) is None


def test_missing_token_hint_names_the_real_commands(no_token_env: Path) -> None:
    from hexstudio.workers import aihub
    from hexstudio.workers.runtime import WorkerError

    with pytest.raises(WorkerError) as ei:
        aihub.client_config(RunSettings())
    hint = ei.value.hint or ""
    assert ei.value.code == "aihub_token_missing"
    assert "the Compile page's AI Hub token field, or `hexstudio aihub login`" in hint
    assert "Settings" not in hint
    # and once stored with the CLI, the studio passes it to the worker (by environment, from the keyring)
    assert _cli("aihub", "login", "--stdin", stdin=TOKEN).returncode == 0
    from hexstudio.core.stage_api import worker_env

    assert worker_env()["HEXSTUDIO_AIHUB_TOKEN"] == TOKEN
    assert aihub.client_config(RunSettings(), worker_env()["HEXSTUDIO_AIHUB_TOKEN"]).api_token == TOKEN


def test_login_asks_on_a_terminal_without_echo(no_token_env: Path) -> None:
    """On a terminal the token is asked with echo off (getpass): it is stored, and never shown."""
    argv = [
        sys.executable,
        "-c",
        "import sys; from hexstudio.cli.main import main; sys.exit(main(['aihub', 'login']))",
    ]
    seen, code, left = converse(argv, [("not shown", TOKEN)])
    assert not left, seen
    assert code == 0, seen
    assert TOKEN.encode() not in seen  # echo was off
    # the tests' keyring is keyrings.alt's plain-text file: said as such, never "stored in the keyring" (issue 27)
    assert b"stored in a PLAIN-TEXT file at " in seen and b"keyrings.alt.file.PlaintextKeyring" in seen
    assert secrets.get_secret(secrets.AIHUB_TOKEN) == TOKEN


def test_one_token_order_a_stale_variable_never_hides_the_stored_token(
    no_token_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27 #6: the environment variable won over the keyring in the worker while status said the keyring's
    was used. One rule now: the keyring, then $HEXSTUDIO_AIHUB_TOKEN, then client.ini, for both."""
    from hexstudio.core.stage_api import worker_env

    assert _cli("aihub", "login", "--stdin", stdin=TOKEN).returncode == 0
    stale = {"HEXSTUDIO_AIHUB_TOKEN": "stale-token-from-an-old-shell"}
    r = _cli("aihub", "login", "--status", "--json", env=stale)
    doc = json.loads(r.stdout)
    assert (doc["source"], doc["unused"], doc["order"]) == (
        "keyring",
        ["environment"],
        ["keyring", "environment", "client.ini"],
    )
    r = _cli("aihub", "login", "--status", env=stale)
    assert "Order: the keyring, then $HEXSTUDIO_AIHUB_TOKEN" in r.stdout and "not used" in r.stdout
    assert TOKEN not in r.stdout and stale["HEXSTUDIO_AIHUB_TOKEN"] not in r.stdout
    monkeypatch.setenv("HEXSTUDIO_AIHUB_TOKEN", stale["HEXSTUDIO_AIHUB_TOKEN"])
    assert worker_env()["HEXSTUDIO_AIHUB_TOKEN"] == TOKEN  # what the Compile stage's worker gets
    secrets.delete_secret(secrets.AIHUB_TOKEN)
    assert worker_env()["HEXSTUDIO_AIHUB_TOKEN"] == stale["HEXSTUDIO_AIHUB_TOKEN"]  # then the variable


@pytest.mark.parametrize(
    ("backend", "level", "words"),
    [
        ("keyrings.alt.file.PlaintextKeyring", "warning", "PLAIN TEXT"),
        ("keyring.backends.null.Keyring", "warning", "nothing is stored"),
    ],
)
def test_doctor_names_the_keyring_backend_and_warns_for_plain_text(
    no_token_env: Path, backend: str, level: str, words: str
) -> None:
    r = _cli("doctor", "--json", env={"PYTHON_KEYRING_BACKEND": backend})
    doc = json.loads(r.stdout)
    kr = next(c for c in doc["checks"] if c["check"] == "keyring")
    assert kr["backend"]["name"] == backend and kr["level"] == level and words in (kr["hint"] or ""), kr
    if backend.endswith("PlaintextKeyring"):
        assert (
            kr["message"].startswith("Secrets are kept in a PLAIN-TEXT file at ")
            and "not encrypted" in kr["message"]
        )
        assert "EncryptedKeyring" in kr["message"]  # and how to get an encrypting one
    r = _cli("doctor", env={"PYTHON_KEYRING_BACKEND": backend})
    assert backend in r.stdout and "Traceback" not in r.stderr
    r = _cli("aihub", "status", env={"PYTHON_KEYRING_BACKEND": backend})
    assert f"Keyring: {backend}" in r.stdout


def test_a_keyring_that_cannot_be_read_is_said_by_the_worker(
    no_token_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A locked or broken keyring: the studio passed no token and the AI Hub worker said "not in HexStudio's
    keyring", sending the person to log in again. The keyring's own failure now reaches the worker, and a
    Hugging Face refusal for want of a token says it too."""
    import keyring

    from hexstudio.core.stage_api import worker_env
    from hexstudio.shared.hub import hub_error
    from hexstudio.workers import aihub
    from hexstudio.workers.runtime import WorkerError
    from tests.support.broken_keyring import BrokenKeyring

    before = keyring.get_keyring()
    keyring.set_keyring(BrokenKeyring())
    try:
        env = worker_env()
    finally:
        keyring.set_keyring(before)
    assert "HEXSTUDIO_AIHUB_TOKEN" not in env
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(WorkerError) as ei:
        aihub.client_config(RunSettings())
    assert ei.value.code == "aihub_token_missing"
    assert (
        "keyring could not be read" in ei.value.message
        and "not in HexStudio's keyring" not in ei.value.message
    )
    assert "pycryptodome/x required" in ei.value.message and "PYTHON_KEYRING_BACKEND" in ei.value.message
    from huggingface_hub.errors import RepositoryNotFoundError

    # made without its HTTP response (whose class differs between huggingface_hub versions)
    not_found = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
    Exception.__init__(not_found, "404 Client Error")
    err = hub_error(not_found, "meta-llama/Llama-3.1-8B", has_token=False)
    assert err is not None and "keyring could not be read" in (err.hint or "")
    # a keyring that reads again: the next worker is not told the old failure
    assert "HEXSTUDIO_KEYRING_UNREAD" not in worker_env()


def test_qualcomms_ai_hub_is_never_polled_faster_than_every_5_s() -> None:
    """aihub_poll_interval_s took 0.01 against Qualcomm's own AI Hub: a status request every 10 ms per job, which
    the service rate-limits. Against another API (the emulator) the setting holds as given."""
    from qai_hub.public_rest_api import DEFAULT_HUB_API_URL

    from hexstudio.shared.run_settings import RunSettings
    from hexstudio.workers.aihub import DEFAULT_POLL_S, MIN_QUALCOMM_POLL_S, poll_interval

    fast, slow, unset = (RunSettings(aihub_poll_interval_s=v) for v in (0.01, 30.0, None))
    assert poll_interval(fast, DEFAULT_HUB_API_URL) == MIN_QUALCOMM_POLL_S == 5.0
    assert poll_interval(fast, DEFAULT_HUB_API_URL + "/") == 5.0
    assert poll_interval(fast, "https://app.aihub.qualcomm.com") == 5.0  # an older client.ini's address
    assert poll_interval(fast, "http://127.0.0.1:8123") == 0.01
    assert poll_interval(slow, DEFAULT_HUB_API_URL) == 30.0
    assert poll_interval(unset, DEFAULT_HUB_API_URL) == DEFAULT_POLL_S == 15.0
