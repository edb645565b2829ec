"""Connecting to a board over SSH: host-key trust, authentication, connection states.

Host keys: HexStudio's own known_hosts file (<config dir>/known_hosts) plus ~/.ssh/known_hosts.
An unknown key is never added silently: `connect_ssh` raises HostKeyUnknown (with the SHA256
fingerprint) unless a `trust` callback says yes; the CLI/GUI shows the fingerprint, and on "trust"
calls `trust_host_key` (or passes trust=...) and connects again. A key that differs from the stored
one raises HostKeyChanged: refused, loudly, never overridden here.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.device.errors import BoardError
from app.core.device.transport import SshTransport
from app.core.paths import config_dir
from app.core.secrets import board_password_key, get_secret

AUTH_KINDS = ("key", "agent", "ssh_config", "password")
# connection states reported through on_state(state, detail)
CONNECTING, READY, FAILED = "connecting", "ready", "failed"


class HostKeyUnknown(BoardError):
    def __init__(self, host: str, port: int, key_type: str, fingerprint: str, key: Any) -> None:
        super().__init__(f"First connection to {host}:{port}: its host key is {key_type} {fingerprint}.",
                         "Compare this fingerprint with the board's own (on the board: "
                         "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) and trust it only if they match.")
        self.host, self.port, self.key_type, self.fingerprint, self.key = host, port, key_type, fingerprint, key


class HostKeyChanged(BoardError):
    def __init__(self, host: str, port: int, fingerprint: str, expected: str) -> None:
        super().__init__(
            f"REFUSED: the host key of {host}:{port} has CHANGED (now {fingerprint}, trusted {expected}). "
            "Someone may be intercepting the connection, or the board was reinstalled.",
            f"If the board was reflashed, remove its line from {known_hosts_path()} (and ~/.ssh/known_hosts) "
            "and connect again to review the new fingerprint. Otherwise do not connect.")
        self.host, self.port, self.fingerprint, self.expected = host, port, fingerprint, expected


def known_hosts_path() -> Path:
    return config_dir() / "known_hosts"


def fingerprint(key: Any) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def trust_host_key(host: str, port: int, key: Any) -> None:
    """Append the key to HexStudio's known_hosts (write temp + rename)."""
    path = known_hosts_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    line = f"{host_entry(host, port)} {key.get_name()} {key.get_base64()}\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(old + ("" if not old or old.endswith("\n") else "\n") + line)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _ssh_config_lookup(alias: str) -> dict[str, Any]:
    import paramiko

    p = Path(os.path.expanduser("~/.ssh/config"))
    if not p.exists():
        raise BoardError(f"Board auth is ssh_config but {p} does not exist.",
                         "Add a Host entry for the board there, or choose key/agent/password auth.")
    return dict(paramiko.SSHConfig.from_path(str(p)).lookup(alias))


def resolve(cfg: dict[str, Any]) -> dict[str, Any]:
    """host, port, user, key_path from a board's settings (following ~/.ssh/config for ssh_config)."""
    auth = cfg.get("auth", "key")
    if auth not in AUTH_KINDS:
        raise BoardError(f"Unknown board auth '{auth}'.", f"Use one of: {', '.join(AUTH_KINDS)}.")
    out = {"host": cfg.get("host"), "port": int(cfg.get("port") or 22), "user": cfg.get("user"),
           "key_path": cfg.get("key_path"), "auth": auth}
    if auth == "ssh_config":
        c = _ssh_config_lookup(str(cfg.get("ssh_alias") or cfg.get("host")))
        out["host"] = c.get("hostname", out["host"])
        out["port"] = int(c.get("port", out["port"] if cfg.get("port") else 22))
        out["user"] = cfg.get("user") or c.get("user")
        if c.get("identityfile"):
            out["key_path"] = os.path.expanduser(c["identityfile"][0])
    if not out["host"]:
        raise BoardError("The board has no host.", "Set its host name or IP address.")
    if not out["user"]:
        import getpass

        out["user"] = getpass.getuser()
    return out


GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _fast_transport(sock: Any, **kw: Any) -> Any:
    """A paramiko Transport preferring AES-GCM (no separate HMAC per packet: faster bundle pushes);
    the other ciphers stay allowed for boards without it."""
    import paramiko

    t = paramiko.Transport(sock, **kw)
    opts = t.get_security_options()
    ciphers = tuple(opts.ciphers)
    opts.ciphers = tuple(c for c in GCM_FIRST if c in ciphers) + tuple(c for c in ciphers if c not in GCM_FIRST)
    return t


def connect_ssh_sync(name: str, cfg: dict[str, Any], *, trust: Callable[[str, int, str, str], bool] | None = None,
                     password: str | None = None, timeout: float = 15.0) -> SshTransport:
    import paramiko

    r = resolve(cfg)
    host, port, user = r["host"], r["port"], r["user"]

    class AskPolicy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            fp = fingerprint(key)
            if trust is not None and trust(host, port, key.get_name(), fp):
                trust_host_key(host, port, key)
                return
            raise HostKeyUnknown(host, port, key.get_name(), fp, key)

    client = paramiko.SSHClient()
    hk = client.get_host_keys()
    system = Path(os.path.expanduser("~/.ssh/known_hosts"))
    for f in (system, known_hosts_path()):
        if f.exists():
            try:
                hk.load(str(f))
            except (OSError, paramiko.SSHException):
                pass
    client.set_missing_host_key_policy(AskPolicy())
    kw: dict[str, Any] = {"hostname": host, "port": port, "username": user, "timeout": timeout,
                          "banner_timeout": timeout, "auth_timeout": timeout, "allow_agent": False,
                          "look_for_keys": False}
    if r["auth"] == "key":
        if not r["key_path"]:
            raise BoardError(f"Board '{name}' uses key auth but has no key_path.", "Set the private key file.")
        kw["key_filename"] = os.path.expanduser(str(r["key_path"]))
    elif r["auth"] == "agent":
        kw["allow_agent"] = True
    elif r["auth"] == "ssh_config":
        kw["allow_agent"] = True
        kw["look_for_keys"] = True
        if r["key_path"]:
            kw["key_filename"] = r["key_path"]
    else:
        pw = password if password is not None else get_secret(board_password_key(name))
        if not pw:
            raise BoardError(f"Board '{name}' uses password auth but no password is stored.",
                             f"Run `hexstudio board password {name}` (kept in the system keyring).")
        kw["password"] = pw
    kw["transport_factory"] = _fast_transport
    try:
        client.connect(**kw)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyChanged(host, port, fingerprint(exc.key), fingerprint(exc.expected_key)) from None
    except HostKeyUnknown:
        client.close()
        raise
    except paramiko.AuthenticationException as exc:
        client.close()
        raise BoardError(f"{user}@{host}:{port} refused the login ({exc}).",
                         "Check the user name and the key/password; for key auth the public key must be in "
                         "the board's ~/.ssh/authorized_keys.") from None
    except (OSError, paramiko.SSHException, EOFError) as exc:
        client.close()
        raise BoardError(f"Cannot connect to {host}:{port}: {exc}.",
                         "Is the board on, on the network, and running sshd? Try `ping` and `ssh` by hand.") from None
    t = client.get_transport()
    if t is not None:
        t.set_keepalive(15)
    return SshTransport(client, host, port, user)


async def connect_ssh(name: str, cfg: dict[str, Any], *, trust: Callable[[str, int, str, str], bool] | None = None,
                      password: str | None = None, timeout: float = 15.0,
                      on_state: Callable[[str, str], None] | None = None) -> SshTransport:
    if on_state:
        on_state(CONNECTING, f"{cfg.get('user') or ''}@{cfg.get('host')}:{cfg.get('port') or 22}")
    try:
        t = await asyncio.to_thread(connect_ssh_sync, name, cfg, trust=trust, password=password, timeout=timeout)
    except BoardError as exc:
        if on_state:
            on_state(FAILED, exc.message)
        raise
    if on_state:
        on_state(READY, t.label)
    return t
