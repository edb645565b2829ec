"""Worker hosts: Linux machines over SSH, named in the studio settings, that run a run's heavy stages.

A host is a record under the settings key `worker_hosts` (the same fields as a board: host, port, user,
auth, key_path, plus python and root). Here: finding it, connecting with the board connection's host-key
rules, and checking that its Python can run a stage (hexstudio.workers.remote.probe, run there).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hexstudio.core.device.connect import (
    HostKeyChanged,
    HostKeyUnknown,
    KeyPassphraseNeeded,
    KeyPassphraseWrong,
    connect_ssh,
)
from hexstudio.core.device.errors import BoardError
from hexstudio.core.device.transport import SshTransport, Transport
from hexstudio.core.secrets import SecretStoreError, get_secret, worker_password_key
from hexstudio.core.settings import Settings
from hexstudio.shared.errors import ActionableError
from hexstudio.workers.remote import host_command

WORKER_HOSTS = "worker_hosts"  # settings key: name -> {host, port, user, auth, key_path, python, root}
# What each stage's worker imports on the host (module names as `importlib.util.find_spec` sees them).
STAGE_PACKAGES: dict[str, tuple[str, ...]] = {
    "quantize": (
        "numpy",
        "onnx",
        "onnxruntime",
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "aimet_onnx",
    ),
    "validate": ("numpy", "onnx", "onnxruntime", "tokenizers"),
}
MIN_PYTHON = (3, 10)
INSTALL_HINT = (
    "The worker host needs the same CPU/GPU stack as a workstation. On the host: `git clone` HexStudio, then "
    "`bash packaging/install-workstation.sh` (it picks the torch/CUDA build for the host's GPU, installs "
    "aimet-onnx and onnxruntime-gpu, or the CPU stack with --cpu, and runs the AIMET smoke test); then point "
    "the worker host at that environment's Python: `hexstudio worker add {name} --host ... --python "
    "<clone>/.venv/bin/python`."
)


class WorkerHostError(ActionableError):
    """A worker host problem a person can act on: its code (worker_host_unreachable, ...), message, hint."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, code=code)


def worker_hosts(settings: Settings | None = None) -> dict[str, dict[str, Any]]:
    """The configured hosts by name (a live part of `settings`: changes are saved with it)."""
    if settings is None:
        settings = Settings.load()
    hosts: dict[str, dict[str, Any]] = settings.data.setdefault(WORKER_HOSTS, {})
    return hosts


def host_config(name: str, settings: Settings | None = None) -> dict[str, Any]:
    hosts = worker_hosts(settings)
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none yet"
        raise WorkerHostError(
            "worker_host_unknown",
            f"No worker host named '{name}' (configured: {known}).",
            f"Add it: `hexstudio worker add {name} --host HOST --user USER --key ~/.ssh/id_ed25519`,"
            " or run without --worker-host to run every stage on this machine.",
        )
    return dict(hosts[name])


async def connect_worker_host(
    name: str, cfg: dict[str, Any], *, trust: Callable[[str, int, str, str], bool] | None = None
) -> SshTransport:
    """An SSH transport to the worker host, with the board connection's host-key rules (an unknown key is
    never trusted silently, a changed one is refused). Raises WorkerHostError with what to do."""
    password = None
    if cfg.get("auth") == "password":
        try:
            password = get_secret(worker_password_key(name))
        except SecretStoreError as exc:
            raise WorkerHostError("worker_host_login_failed", str(exc)) from None
        if not password:
            raise WorkerHostError(
                "worker_host_login_failed",
                f"Worker host '{name}' uses password auth but no password is stored.",
                f"Run `hexstudio worker password {name}` (kept in the system keyring).",
            )
    where = f"{cfg.get('user') or ''}@{cfg.get('host')}:{cfg.get('port') or 22}".lstrip("@")
    try:
        return await connect_ssh(name, cfg, trust=trust, password=password)
    except HostKeyUnknown as exc:
        raise WorkerHostError(
            "worker_host_key_unknown",
            f"Worker host '{name}' ({where}) has not been trusted yet: its host key is {exc.key_type} "
            f"{exc.fingerprint}.",
            f"Compare it with the host's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on it), then "
            f"run `hexstudio worker check {name} --trust {exc.fingerprint}`.",
        ) from None
    except HostKeyChanged as exc:
        raise WorkerHostError(
            "worker_host_key_changed",
            f"Worker host '{name}': {exc.message}",
            exc.hint.replace("board", "host") if exc.hint else None,
        ) from None
    except BoardError as exc:
        # a key that needs its passphrase, or a refused login, is the login's; only a failed connection is the
        # host's (a known_hosts file that cannot be written and the like keep their own words and hint)
        login = (
            isinstance(exc, (KeyPassphraseNeeded, KeyPassphraseWrong)) or "refused the login" in exc.message
        )
        unreachable = not login and exc.message.startswith("Cannot connect to")
        code = (
            "worker_host_login_failed"
            if login
            else "worker_host_unreachable"
            if unreachable
            else "worker_host_ssh_failed"
        )
        hint = exc.hint or ""
        if code == "worker_host_unreachable":
            hint = (
                f"Is {cfg.get('host')} on, reachable from here and running sshd? Try "
                f"`ssh -p {cfg.get('port') or 22} {where.split(':')[0]}` by hand. Resume the run when it "
                "answers, or run it without a worker host (`hexstudio run --resume RUN_ID --worker-host local`)."
            )
        else:
            hint = hint.replace("board", "worker host")
        raise WorkerHostError(code, f"Worker host '{name}': {exc.message}", hint) from None


async def check_host(
    transport: Transport, name: str, python: str, packages: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The host's Python, memory and CPUs (hexstudio.workers.remote.probe); raises WorkerHostError when Python or a
    package is missing."""
    res = await transport.run(host_command(python, "probe", *packages), timeout=120)
    label = transport.label
    if res.exit_status != 0:
        err = (res.stderr or "").strip()
        if res.exit_status == 127 or "not found" in err or "No such file" in err:
            raise WorkerHostError(
                "worker_host_python_missing",
                f"Worker host '{name}' ({label}) has no Python at '{python}'.",
                INSTALL_HINT.format(name=name),
            )
        raise WorkerHostError(
            "worker_host_python_broken",
            f"'{python}' on worker host '{name}' failed to start (exit {res.exit_status}): {err[-400:]}",
            INSTALL_HINT.format(name=name),
        )
    try:
        info: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise WorkerHostError(
            "worker_host_python_broken",
            f"'{python}' on worker host '{name}' printed something unexpected: {res.stdout[-300:]!r}",
            INSTALL_HINT.format(name=name),
        ) from None
    if tuple(info["python"][:2]) < MIN_PYTHON:
        have = ".".join(map(str, info["python"]))
        raise WorkerHostError(
            "worker_host_python_old",
            f"'{python}' on worker host '{name}' is Python {have}; HexStudio's workers need "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer.",
            INSTALL_HINT.format(name=name),
        )
    if info["missing"]:
        raise WorkerHostError(
            "worker_host_packages_missing",
            f"'{python}' on worker host '{name}' cannot import {', '.join(info['missing'])}, "
            "which this stage needs.",
            INSTALL_HINT.format(name=name),
        )
    return info
