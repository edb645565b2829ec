"""Hugging Face conventions, end to end through huggingface_hub against a fake hub on 127.0.0.1
(tests/support/fake_hub.py): one token source for `model inspect`, preflight and the Model stage's download
(keyring first, else huggingface_hub's own login), the cache where huggingface_hub's constants put it, and
`--revision` from the command line to model.json. Never the network."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexstudio.core import secrets
from hexstudio.shared.data import builtin_model_dir
from tests.support.cli import python_m_hexstudio
from tests.support.fake_hub import FakeHub, folder_files, hub_env

REPO = Path(__file__).resolve().parents[2]
MODEL = "test-org/tiny-llama"
PREFLIGHT = ("preflight", "--model", MODEL, "--context-length", "512", "--no-smoke-test", "--json")
INSPECT = ("model", "inspect", MODEL, "--context-length", "512", "--json")
KEYRING_TOKEN = "hf_keyringT0ken1111"
ENV_TOKEN = "hf_envT0ken2222"
FILE_TOKEN = "hf_fileT0ken3333"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    secrets.delete_secret(secrets.HF_TOKEN)
    files = folder_files(builtin_model_dir())
    cfg = json.loads(files["config.json"])
    older = dict(files, **{"config.json": json.dumps({**cfg, "num_hidden_layers": 1}).encode()})
    with FakeHub() as h:
        h.add_repo(MODEL, {"main": files, "v1": older})
        yield h


def cli(
    hub: FakeHub, hf_home: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    extra = {**hub_env(hub, hf_home), **(env or {})}
    return python_m_hexstudio(*args, stdin=stdin, env=extra, timeout=240, cwd=REPO)


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_inspect_preflight_and_download_use_the_one_token(hub: FakeHub, tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    (hf_home / "token").write_text(FILE_TOKEN)  # huggingface_hub's own login...
    env = {"HF_TOKEN": ENV_TOKEN}  # ...and $HF_TOKEN: the keyring wins over both
    hub.repos[MODEL].gated_token = KEYRING_TOKEN
    r = cli(hub, hf_home, "hf", "login", "--stdin", stdin=KEYRING_TOKEN + "\n", env=env)
    assert r.returncode == 0, r.stderr
    st = json.loads(cli(hub, hf_home, "hf", "status", "--json", env=env).stdout)
    assert st["source"] == "keyring" and st["environment"] and st["hf_login"]
    assert st["token_file"] == str(hf_home / "token") and KEYRING_TOKEN not in json.dumps(st)

    r = cli(hub, hf_home, *INSPECT, "--revision", "v1", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["revision"] == "v1" and doc["num_layers"] == 1  # v1's config.json, not main's
    assert hub.tokens_seen() == {bearer(KEYRING_TOKEN)}
    assert any(s.path == f"/{MODEL}/resolve/v1/config.json" for s in hub.seen)

    hub.seen.clear()
    r = cli(
        hub,
        hf_home,
        *PREFLIGHT,
        env=env,
    )
    assert r.returncode in (0, 1), r.stderr  # 1: a check failed on this machine
    pf = json.loads(r.stdout)
    assert hub.tokens_seen() == {bearer(KEYRING_TOKEN)}
    assert pf["probe"]["hf_cache"]["path"] == str(hf_home / "hub")  # huggingface_hub's HF_HUB_CACHE

    hub.seen.clear()
    r = cli(
        hub,
        hf_home,
        "run",
        "--model",
        MODEL,
        "--revision",
        "v1",
        "--board",
        "sim",
        "--until",
        "model",
        "--set",
        "context_length=512",
        "--json",
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert hub.seen and hub.tokens_seen() == {bearer(KEYRING_TOKEN)}
    run_dir = Path(out["run_dir"])
    model_json = json.loads(next(run_dir.glob("artifacts/model/model.json")).read_text())
    commit = hub.repos[MODEL].refs["v1"]
    assert model_json["requested_revision"] == "v1" and model_json["revision"] == commit
    assert model_json["info"]["num_layers"] == 1
    assert Path(model_json["hf_dir"]).is_relative_to(hf_home / "hub")  # the download stays in HF's cache
    assert json.loads((run_dir / "run.json").read_text())["inputs"]["settings"]["revision"] == "v1"
    # a resumed run keeps its revision: --revision cannot change it
    r = cli(hub, hf_home, "run", "--resume", out["run_id"], "--revision", "main", env=env)
    assert r.returncode != 0 and "--revision" in r.stderr


def test_without_the_keyring_huggingface_hubs_own_login_is_used(hub: FakeHub, tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    (hf_home / "token").write_text(FILE_TOKEN + "\n")
    hub.repos[MODEL].gated_token = FILE_TOKEN
    r = cli(hub, hf_home, *INSPECT)
    assert r.returncode == 0, r.stderr
    assert hub.tokens_seen() == {bearer(FILE_TOKEN)}
    assert json.loads(cli(hub, hf_home, "hf", "status", "--json").stdout)["source"] == "hf login"
    hub.seen.clear()
    hub.repos[MODEL].gated_token = ENV_TOKEN  # $HF_TOKEN before the token file, as HF does
    r = cli(hub, hf_home, *INSPECT, env={"HF_TOKEN": ENV_TOKEN})
    assert r.returncode == 0, r.stderr
    assert hub.tokens_seen() == {bearer(ENV_TOKEN)}


def test_no_token_and_a_wrong_revision_say_what_to_do(hub: FakeHub, tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    hub.repos[MODEL].gated_token = KEYRING_TOKEN
    r = cli(hub, hf_home, "model", "inspect", MODEL)
    assert r.returncode != 0 and hub.tokens_seen() == {None}
    assert "gated" in r.stderr and "hexstudio hf login" in r.stderr, r.stderr
    hub.repos[MODEL].gated_token = None
    r = cli(hub, hf_home, "model", "inspect", MODEL, "--revision", "no-such-tag")
    assert r.returncode != 0 and "no revision 'no-such-tag'" in r.stderr, r.stderr
    assert "Files and versions" in r.stderr


def test_the_cache_is_where_huggingface_hub_puts_it(hub: FakeHub, tmp_path: Path) -> None:
    """HF_HUB_CACHE moves the downloads without moving HF_HOME: the preflight disk check follows it."""
    hf_home, cache = tmp_path / "hf", tmp_path / "elsewhere" / "hub-cache"
    cache.mkdir(parents=True)
    r = cli(
        hub,
        hf_home,
        *PREFLIGHT,
        env={"HF_HUB_CACHE": str(cache)},
    )
    assert r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout)["probe"]["hf_cache"]["path"] == str(cache)
    assert (cache / "models--test-org--tiny-llama").is_dir()  # config.json went to that cache too
