"""Worker-host faults a review found: a `--python` of `~/...` (the docs' own example) was quoted past the host
shell's `~`, the QuantSim configurations were not sent to the host, and a key that needs its passphrase was said
as "the host is unreachable"."""

from __future__ import annotations

import asyncio
import io
import tarfile
from typing import Any

import pytest

from hexstudio.core.remote import hosts
from hexstudio.core.remote.sync import host_python, workers_bundle


@pytest.mark.parametrize(
    ("python", "want"),
    [
        (None, "python3"),
        ("python3.11", "python3.11"),  # a command on the host's PATH
        ("/opt/venv/bin/python", "/opt/venv/bin/python"),
        ("~/hexstudio/.venv/bin/python", "/home/me/hexstudio/.venv/bin/python"),
        (".venv/bin/python", "/home/me/.venv/bin/python"),  # the worker runs in another folder
    ],
)
def test_a_hosts_python_is_a_command_or_a_path_under_its_home(python: str | None, want: str) -> None:
    assert host_python(python, "/home/me") == want


def test_the_workers_bundle_carries_the_quantsim_configurations() -> None:
    """quantsim_config=llm on a worker host listed a folder that was never sent: FileNotFoundError in quantize."""
    _digest, blob = workers_bundle()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = tar.getnames()
    assert any("/shared/data/quantsim/" in n and n.endswith(".json") for n in names), names[:20]


def test_a_key_that_needs_its_passphrase_is_a_login_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    from hexstudio.core.device.connect import KeyPassphraseNeeded

    async def needs_passphrase(*_a: Any, **_k: Any) -> Any:
        raise KeyPassphraseNeeded("/home/me/.ssh/id_ed25519")

    monkeypatch.setattr(hosts, "connect_ssh", needs_passphrase)
    cfg = {"host": "gpu-box", "user": "me", "auth": "key", "key_path": "/home/me/.ssh/id_ed25519"}
    with pytest.raises(hosts.WorkerHostError) as err:
        asyncio.run(hosts.connect_worker_host("box", cfg))
    assert err.value.code == "worker_host_login_failed", (err.value.code, err.value.message)
    assert "running sshd" not in (err.value.hint or "")
