"""Issue 32: `model inspect` of a Hugging Face id with no network retried for 23 s before its clear error.
One connect to the Hub (or the proxy) tells in a moment: unreachable, only the local cache is read and the
clear error comes within ~3 s; a config already in the cache is still read. Never the network."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hexstudio.core.hf import HubConfigError, fetch_config, hub_unreachable
from hexstudio.shared.data import builtin_model_dir
from tests.support.fake_hub import FakeHub, folder_files, hub_env

REPO = Path(__file__).resolve().parents[2]
MODEL = "test-org/tiny-llama"


def _inspect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`hexstudio model inspect ARGS` in a child with exactly `env`."""
    return subprocess.run(
        [sys.executable, "-m", "hexstudio", "model", "inspect", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:{port}", "https://no-such-hub.invalid"])
def test_an_unreachable_hub_gives_the_clear_error_at_once(
    endpoint: str, no_proxy_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint.format(port=closed_port()))
    t0 = time.monotonic()
    with pytest.raises(HubConfigError) as ei:
        fetch_config("nobody/no-such-model-xyz")
    took = time.monotonic() - t0
    assert took < 3.0, took
    err = ei.value
    assert "cannot be reached" in err.message and "not in the local Hugging Face cache" in err.message
    assert "HTTPS_PROXY" in (err.hint or "") and "HF_HUB_OFFLINE=1" in (err.hint or "")
    assert "local folder" in (err.hint or "")


def test_a_proxy_is_what_is_tried(no_proxy_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.co")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    why = hub_unreachable()
    assert why is not None and f"127.0.0.1:{port} (the proxy)" in why
    # NO_PROXY=* sends every host around the proxy (httpx's reading): the proxy's state says nothing of the Hub
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("NO_PROXY", "*")
    why = hub_unreachable()
    assert why is not None and "(the proxy)" not in why and f"127.0.0.1:{port}" in why, why


def test_cli_inspect_offline_is_quick_and_a_cached_config_still_reads(tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with FakeHub() as hub:
        hub.add_repo(MODEL, {"main": folder_files(builtin_model_dir())})
        env = {**base, **hub_env(hub, hf_home)}
        r = _inspect(env, MODEL, "--json")
        assert r.returncode == 0, r.stderr
        endpoint = hub.endpoint
    # the hub is gone (its port closed): the cached config.json is read, an unknown id fails fast and clearly
    env = {**base, **hub_env(hub, hf_home), "HF_ENDPOINT": endpoint}
    r = _inspect(env, MODEL, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_layers"] >= 1
    t0 = time.monotonic()
    r = _inspect(env, "nobody/no-such-model-xyz")
    took = time.monotonic() - t0
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "cannot be reached" in r.stderr and "not in the local Hugging Face cache" in r.stderr, r.stderr
    assert took < 8.0, took  # interpreter start-up on a loaded 2-core box included; the error itself < 3 s
