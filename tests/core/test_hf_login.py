"""`hexstudio hf login|logout|status`: the Hugging Face token goes to the keyring (the tests' file backend), the
Model stage hands it to its worker by environment, and it is never printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexstudio.core import secrets
from tests.support.cli import python_m_hexstudio as _cli

TOKEN = "hf_canaryT0ken5b1f0c9e2d"


@pytest.fixture
def no_hf_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secrets.delete_secret(secrets.HF_TOKEN)
    return {"HF_HOME": str(tmp_path / "hf-home")}


def test_login_status_logout(no_hf_token: dict[str, str]) -> None:
    env = no_hf_token
    r = _cli("hf", "status", "--json", env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["found"] is False
    assert "hexstudio hf login" in _cli("hf", "status", env=env).stdout
    r = _cli("hf", "login", "--stdin", stdin=TOKEN + "\n", env=env)
    assert r.returncode == 0, r.stderr
    assert (
        TOKEN not in r.stdout + r.stderr and "stored in a PLAIN-TEXT file at" in r.stdout
    )  # the tests' keyrings.alt file
    assert secrets.get_secret(secrets.HF_TOKEN) == TOKEN
    doc = json.loads(_cli("hf", "status", "--json", env=env).stdout)
    assert doc["source"] == "keyring" and TOKEN not in json.dumps(doc)
    # the pipeline hands it to the Model worker by environment
    from hexstudio.core.stage_api import worker_env

    assert worker_env()["HF_TOKEN"] == TOKEN
    r = _cli("hf", "logout", env=env)
    assert r.returncode == 0 and "removed" in r.stdout and secrets.get_secret(secrets.HF_TOKEN) is None
    # huggingface_hub's own login is found too
    Path(env["HF_HOME"]).mkdir(parents=True)
    (Path(env["HF_HOME"]) / "token").write_text("hf_other\n")
    assert json.loads(_cli("hf", "status", "--json", env=env).stdout)["source"] == "hf login"


def test_bad_tokens_are_refused_with_what_to_do(no_hf_token: dict[str, str]) -> None:
    for given, says in (
        ("", "No token was given"),
        ("hf_ab cd", "contains spaces"),
        ("sk-notahftoken", "start with 'hf_'"),
    ):
        r = _cli("hf", "login", "--stdin", stdin=given + "\n", env=no_hf_token)
        assert r.returncode != 0 and says in r.stderr and "huggingface.co/settings/tokens" in r.stderr, (
            r.stderr
        )
    r = _cli("hf", "login", env=no_hf_token)  # no terminal, no --stdin
    assert r.returncode != 0 and "--stdin" in r.stderr
    assert secrets.get_secret(secrets.HF_TOKEN) is None


def test_a_keyring_backend_failing_outside_keyring_errors_is_said_not_a_bug(
    no_hf_token: dict[str, str],
) -> None:
    """keyrings.alt's EncryptedKeyring (which HexStudio names as an option) raises RuntimeError without
    pycryptodome, EOFError without a terminal for its password: `aihub status` and `hf login` said "failed
    unexpectedly ... a HexStudio bug"."""
    import keyring

    from tests.support.broken_keyring import BrokenKeyring

    before = keyring.get_keyring()
    keyring.set_keyring(BrokenKeyring())
    try:
        with pytest.raises(secrets.SecretStoreError) as ei:
            secrets.set_secret(secrets.HF_TOKEN, "hf_x")
        assert "RuntimeError: pycryptodome/x required" in ei.value.message and "not saved" in ei.value.message
        assert ei.value.hint and "PYTHON_KEYRING_BACKEND" in ei.value.hint
        with pytest.raises(secrets.SecretStoreError):
            secrets.get_secret(secrets.AIHUB_TOKEN)
    finally:
        keyring.set_keyring(before)
    env = {**no_hf_token, "PYTHON_KEYRING_BACKEND": "tests.support.broken_keyring.BrokenKeyring"}
    for args, stdin in ((("aihub", "status"), None), (("hf", "login", "--stdin"), "hf_" + "a" * 34 + "\n")):
        r = _cli(*args, stdin=stdin, env=env)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "HexStudio bug" not in out and "unexpectedly" not in out, out
        assert "pycryptodome/x required" in out, out
    # the logouts kept the message and dropped what to do
    for args in (("hf", "logout"), ("aihub", "logout")):
        r = _cli(*args, env=env)
        assert r.returncode != 0 and "PYTHON_KEYRING_BACKEND" in r.stderr, r.stderr


def test_a_keyring_that_keeps_nothing_is_not_called_stored(no_hf_token: dict[str, str]) -> None:
    """The null keyring takes every secret and keeps none: `hf login` said "stored", and the Model stage then
    found no token. Each secret is read back now, and the login fails with what to do."""
    env = {**no_hf_token, "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    r = _cli("hf", "login", "--stdin", stdin=TOKEN + "\n", env=env)
    assert r.returncode == 1, r.stdout
    assert (
        "stored" not in r.stdout
        and "did not keep 'huggingface:token': reading it back gave nothing" in r.stderr
    )
    assert "PYTHON_KEYRING_BACKEND" in r.stderr and "hf auth login" in r.stderr
    r = _cli("board", "add", "evk", "--host", "10.0.0.5", "--auth", "password", "--no-connect", env=env)
    assert r.returncode == 0, r.stderr
    r = _cli("board", "password", "evk", "--stdin", stdin="pw\n", env=env)
    assert r.returncode == 1 and "stored" not in r.stdout and "did not keep" in r.stderr, r.stdout + r.stderr


def test_a_token_from_the_environment_is_scrubbed_from_the_log(
    no_hf_token: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only keyring values were scrubbed from the studio log: a token from $HF_TOKEN (or `hf auth login`), which
    every Hugging Face request of the studio sends, would have been written as it is."""
    from hexstudio.core import hf, logs

    monkeypatch.setenv("HF_TOKEN", TOKEN + "env")
    monkeypatch.setenv("HF_HOME", no_hf_token["HF_HOME"])
    assert hf.resolve_token().value == TOKEN + "env"
    assert logs.scrub_text(f"GET failed with {TOKEN}env") == "GET failed with [redacted]"
