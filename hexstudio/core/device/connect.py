"""Connecting to a board over SSH: ~/.ssh/config, host-key trust, authentication, connection states.

~/.ssh/config is honoured as OpenSSH does, through paramiko's SSHConfig: HostName, Port, User, IdentityFile
(several), IdentitiesOnly, ProxyJump (a chain of jump hosts: each next hop is a direct-tcpip channel through
the previous connection), ProxyCommand (paramiko.ProxyCommand), HostKeyAlias, UserKnownHostsFile and
HashKnownHosts. The board's own settings (host, port, user, key_path) win over the file where they are given.

Authentication, by the board's `auth`: "key" (its key_path, else the config's IdentityFiles), "agent" (the
SSH agent's keys), "ssh_config" (what `ssh` would try: agent keys and IdentityFiles, IdentitiesOnly limiting
the agent to those), "password" (from the keyring). An encrypted key asks for its passphrase through the
`passphrase` callback (the CLI asks with getpass, the studio with a dialog); without one it raises
KeyPassphraseNeeded, which the caller answers by asking and connecting again. A passphrase is kept only in
memory (the opened key, for reconnects in this process) unless the person chooses the keyring.

Host keys: HexStudio's own known_hosts file (<config dir>/known_hosts) plus the user's (~/.ssh/known_hosts or
UserKnownHostsFile). An unknown key is never added silently: `connect_ssh` raises HostKeyUnknown (with the
SHA256 fingerprint) unless a `trust` callback says yes; the CLI/GUI shows the fingerprint, and on "trust"
calls `trust_host_key` (or passes trust=...) and connects again. Once trusted, the key can also be written to
the user's known_hosts (as ssh-keyscan writes it, hashed when that file or HashKnownHosts says so), only when
`save_known_hosts` says yes: offered, never done silently. A key that differs from the stored one raises
HostKeyChanged: refused, loudly, never overridden here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import getpass
import hashlib
import os
import re
import shlex
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from hexstudio.core.device.errors import BoardError
from hexstudio.core.device.transport import SshSession, SshTransport
from hexstudio.core.paths import config_dir
from hexstudio.core.secrets import (
    SecretStoreError,
    board_password_key,
    delete_secret,
    get_secret,
    key_passphrase_key,
    remember_secret,
    set_secret,
)

if TYPE_CHECKING:
    from typing import Unpack  # 3.11; annotations only (the studio runs on 3.10 too)

AUTH_KINDS = ("key", "agent", "ssh_config", "password")
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")  # as OpenSSH tries them
PASSPHRASE_TRIES = 3
# connection states reported through on_state(state, detail)
CONNECTING, READY, FAILED = "connecting", "ready", "failed"


class HostKeyUnknown(BoardError):
    def __init__(self, host: str, port: int, key_type: str, fingerprint: str, key: Any) -> None:
        super().__init__(
            f"First connection to {host}:{port}: its host key is {key_type} {fingerprint}.",
            "Compare this fingerprint with the board's own (on the board: "
            "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) and trust it only if they match.",
        )
        self.host, self.port, self.key_type, self.fingerprint, self.key = (
            host,
            port,
            key_type,
            fingerprint,
            key,
        )


class HostKeyChanged(BoardError):
    def __init__(
        self,
        host: str,
        port: int,
        fingerprint: str,
        expected: str,
        files: list[str] | None = None,
        entry: str | None = None,
    ) -> None:
        """`files`: the user's known_hosts files read (None: ~/.ssh/known_hosts); `entry`: the board's name in them
        ([host]:port, or its HostKeyAlias)."""
        entry = entry or host_entry(host, port)
        where = [*(files or [os.path.expanduser("~/.ssh/known_hosts")]), str(known_hosts_path())]
        super().__init__(
            f"REFUSED: the host key of {host}:{port} has CHANGED (now {fingerprint}, trusted {expected}). "
            "Someone may be intercepting the connection, or the board was reinstalled.",
            f"If the board was reflashed, remove its {entry} lines ("
            + "; ".join(f"ssh-keygen -R {shlex.quote(entry)} -f {shlex.quote(f)}" for f in where)
            + ") and connect again to review the new fingerprint. Otherwise do not connect.",
        )
        self.host, self.port, self.fingerprint, self.expected = host, port, fingerprint, expected


class HostKeyOtherType(BoardError):
    def __init__(self, host: str, port: int, key_type: str, fingerprint: str, known: list[str]) -> None:
        super().__init__(
            f"REFUSED: {host}:{port} answered with a {key_type} host key ({fingerprint}), but a key of another type "
            f"({', '.join(known)}) is what is trusted for it. Someone may be intercepting the connection, or the "
            "board was reinstalled without its old key.",
            "Check on the board (`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub`): if the board was reflashed, remove "
            f"its lines from {known_hosts_path()} (and ~/.ssh/known_hosts) and connect again to review the new "
            "fingerprint. Otherwise do not connect.",
        )
        self.host, self.port, self.fingerprint = host, port, fingerprint


class HostKeyRevoked(BoardError):
    def __init__(self, host: str, port: int, fingerprint: str) -> None:
        super().__init__(
            f"REFUSED: the host key of {host}:{port} ({fingerprint}) is marked @revoked in a known_hosts file.",
            "Do not connect. If the board has a new key, give it one that is not revoked and remove the board's "
            "old lines.",
        )


def known_hosts_path() -> Path:
    return config_dir() / "known_hosts"


def fingerprint(key: Any) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _append_line(path: Path, line: str) -> None:
    """Append one line to a known_hosts file in place (O_APPEND, as ssh adds keys; mode 0600 and the folder 0700
    if new): a symlinked file (a dotfiles manager's) stays a link to its target, and a line ssh appends at the same
    time is kept, where a rewrite and rename replaced the link and could drop it."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        sep = b""
        if os.fstat(fd).st_size:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                sep = b"" if f.read(1) == b"\n" else b"\n"
        os.write(fd, sep + line.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def known_hosts_line(host: str, port: int, key: Any, hashed: bool = False) -> str:
    """One known_hosts line as `ssh-keyscan` writes it ([host]:port for a port other than 22); `hashed` as
    `ssh-keyscan -H` (|1|salt|HMAC-SHA1), which hides the host name from whoever reads the file."""
    import paramiko

    entry = host_entry(host, port)
    if hashed:
        entry = paramiko.HostKeys.hash_host(entry)
    return f"{entry} {key.get_name()} {key.get_base64()}"


def file_is_hashed(path: Path) -> bool:
    """Whether a known_hosts file already keeps its host names hashed (then new lines are hashed too)."""
    try:
        lines = [
            ln
            for ln in path.read_text(errors="replace").splitlines()
            if ln.strip() and not ln.startswith("#")
        ]
    except OSError:
        return False
    return bool(lines) and all(ln.startswith("|1|") for ln in lines)


def user_known_hosts_path(cfg: dict[str, Any] | None = None) -> Path:
    """The user's own known_hosts for this board: UserKnownHostsFile from ~/.ssh/config, else ~/.ssh/known_hosts."""
    if cfg is not None:
        with contextlib.suppress(BoardError):
            files = resolve(cfg)["known_hosts_files"]
            if files:
                return Path(files[0])
    return Path(os.path.expanduser("~/.ssh/known_hosts"))


def trust_host_key(
    host: str, port: int, key: Any, *, user_known_hosts: Path | None = None, hashed: bool | None = None
) -> None:
    """Append the key to HexStudio's known_hosts; with `user_known_hosts` (the person said yes to the offer)
    also to that file (~/.ssh/known_hosts), hashed when `hashed` or, if None, when that file is already hashed."""
    _append_line(known_hosts_path(), known_hosts_line(host, port, key))
    if user_known_hosts is not None:
        save_to_user_known_hosts(user_known_hosts, host, port, key, hashed)


def save_to_user_known_hosts(path: Path, host: str, port: int, key: Any, hashed: bool | None = None) -> bool:
    """Add the key to the user's known_hosts unless it is already there; True when a line was written."""
    import paramiko

    path = Path(path).expanduser()
    if path.exists():
        with contextlib.suppress(OSError, paramiko.SSHException):
            hk = paramiko.HostKeys(str(path))
            known = hk.lookup(host_entry(host, port))
            if known is not None and key.get_name() in known and known[key.get_name()] == key:
                return False
    try:
        _append_line(
            path, known_hosts_line(host, port, key, file_is_hashed(path) if hashed is None else hashed)
        )
    except OSError as exc:
        raise BoardError(
            f"Cannot add the host key to {path}: {exc.strerror or exc}.",
            f"Check the permissions of {path} and its folder (ssh wants ~/.ssh 0700 and its files "
            "0600); HexStudio's own trust of the key is kept.",
        ) from None
    return True


# -- passphrases and offers: callbacks the CLI and the studio supply --------------------------------


@dataclass(frozen=True)
class KeyPassphrase:
    value: str
    remember: bool = False  # the person chose to keep it in the keyring (stored once it opens the key)


# ask(key_path, attempt) -> the passphrase, or None to skip this key (attempt counts from 0)
AskPassphrase = Callable[[str, int], "KeyPassphrase | None"]
# offer(host, port, key_type, fingerprint, path) -> also write the trusted key to the user's known_hosts `path`?
OfferKnownHosts = Callable[[str, int, str, str, Path], bool]
# trust(host, port, key_type, fingerprint) -> trust this first-contact host key?
TrustHostKey = Callable[[str, int, str, str], bool]


class SshAsks(TypedDict, total=False):
    """What connecting may need from the person, declared once: every layer from open_board down to
    connect_ssh_sync takes these as keywords (`**asks`) and hands them on unchanged. Without `trust` an unknown
    host key raises HostKeyUnknown; without `passphrase` or `offer_known_hosts` the face's DEFAULT_PROMPTS
    answer; `password` is the board's SSH password when its auth is "password" and the keyring has none."""

    trust: TrustHostKey | None
    password: str | None
    passphrase: AskPassphrase | None
    offer_known_hosts: OfferKnownHosts | None


class KeyPassphraseNeeded(BoardError):
    def __init__(self, key_path: str) -> None:
        super().__init__(
            f"The SSH key {key_path} is encrypted and no passphrase was given for it.",
            f"Type its passphrase when HexStudio asks (the terminal or the Board page), or load it "
            f"into your SSH agent once (`ssh-add {key_path}`) and use agent or ssh_config auth.",
        )
        self.key_path = key_path


class KeyPassphraseWrong(BoardError):
    def __init__(self, key_path: str, tries: int) -> None:
        super().__init__(
            f"The passphrase for the SSH key {key_path} is wrong ({tries} tries).",
            f"Type it again (check Caps Lock and the keyboard layout); `ssh-keygen -y -f {key_path}` "
            "tells you whether a passphrase opens it. If it was stored in the keyring, the stored one "
            "is no longer asked for.",
        )
        self.key_path = key_path


@dataclass
class Prompts:
    """What a face (CLI, studio) registers once, used when a call passes no callback of its own."""

    passphrase: AskPassphrase | None = None
    offer_known_hosts: OfferKnownHosts | None = None


DEFAULT_PROMPTS = Prompts()


def set_default_prompts(
    passphrase: AskPassphrase | None = None, offer_known_hosts: OfferKnownHosts | None = None
) -> None:
    DEFAULT_PROMPTS.passphrase = passphrase
    DEFAULT_PROMPTS.offer_known_hosts = offer_known_hosts


def tty_passphrase(key_path: str, attempt: int) -> KeyPassphrase | None:
    """The CLI's passphrase prompt (getpass, no echo); an empty answer skips the key."""
    if not sys.stdin.isatty():
        return None
    again = " (wrong, try again)" if attempt else ""
    pw = getpass.getpass(f"Passphrase for SSH key {key_path}{again}: ")
    if not pw:
        return None
    ans = _ask_line("Keep it in the system keyring so HexStudio does not ask again? [y/N] ")
    return KeyPassphrase(pw, remember=ans in ("y", "yes"))


def _ask_line(prompt: str) -> str:
    """A question on the terminal, the prompt on stderr (stdout may carry --json output)."""
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower()


def tty_offer_known_hosts(host: str, port: int, key_type: str, fp: str, path: Path) -> bool:
    """The CLI's offer, after the person trusted a host key: also add it to ~/.ssh/known_hosts?"""
    if not sys.stdin.isatty():
        return False
    ans = _ask_line(
        f"Also add {host_entry(host, port)} {key_type} {fp} to {path}, so that ssh, scp and your "
        "editor trust it too? [y/N] "
    )
    return ans in ("y", "yes")


# -- ~/.ssh/config ---------------------------------------------------------------------------------


def ssh_config_path() -> Path:
    return Path(os.path.expanduser("~/.ssh/config"))


def _ssh_config_lookup(alias: str, required: bool = False) -> dict[str, Any]:
    import paramiko

    p = ssh_config_path()
    if not p.exists():
        if required:
            raise BoardError(
                f"Board auth is ssh_config but {p} does not exist.",
                "Add a Host entry for the board there, or choose key/agent/password auth.",
            )
        return {}
    try:
        return dict(paramiko.SSHConfig.from_path(str(p)).lookup(alias))
    except (OSError, paramiko.SSHException, ValueError, KeyError) as exc:
        raise BoardError(
            f"{p} cannot be read ({type(exc).__name__}: {exc}).",
            f"Fix the line it names (`ssh -G {alias}` shows how OpenSSH reads it).",
        ) from None


def _none(v: Any) -> str | None:
    return None if v is None or str(v).strip().lower() == "none" else str(v)


def resolve(cfg: dict[str, Any]) -> dict[str, Any]:
    """Where and how to connect: the board's settings over ~/.ssh/config (looked up by ssh_alias or host)."""
    auth = cfg.get("auth", "key")
    if auth not in AUTH_KINDS:
        raise BoardError(f"Unknown board auth '{auth}'.", f"Use one of: {', '.join(AUTH_KINDS)}.")
    alias = str(cfg.get("ssh_alias") or cfg.get("host") or "")
    if not alias:
        raise BoardError("The board has no host.", "Set its host name or IP address.")
    c = _ssh_config_lookup(alias, required=auth == "ssh_config")
    if c.get("port") and (auth == "ssh_config" or not cfg.get("port")):
        port = _port(c["port"], f"~/.ssh/config's Port for {alias}")
    else:
        port = _port(cfg.get("port") or 22, f"The port of board host {alias}")
    user = cfg.get("user") or c.get("user") or getpass.getuser()
    ids = [os.path.expanduser(str(f)) for f in c.get("identityfile") or []]
    known = [os.path.expanduser(f) for f in str(c.get("userknownhostsfile") or "").split() if f != "none"]
    return {
        "alias": alias,
        "host": str(c.get("hostname") or cfg.get("host") or alias),
        "port": port,
        "user": user,
        "auth": auth,
        "key_path": cfg.get("key_path") or (ids[0] if auth == "ssh_config" and ids else None),
        "identity_files": ids,
        "identities_only": str(c.get("identitiesonly", "no")).lower() == "yes",
        "proxy_jump": _none(c.get("proxyjump")),
        "proxy_command": _none(c.get("proxycommand")),
        "host_key_alias": _none(c.get("hostkeyalias")),
        "known_hosts_files": known,
        "hash_known_hosts": str(c.get("hashknownhosts", "no")).lower() == "yes",
        "from_ssh_config": bool(c),
    }


def _port(value: Any, what: str) -> int:
    """A TCP port from settings or ~/.ssh/config, or a BoardError naming where the bad one was written."""
    try:
        port = int(str(value).strip())
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise BoardError(
            f"{what} is {str(value)!r:.40}, not a port number (1 to 65535).",
            "Correct it (`ssh -G HOST | grep port` shows what OpenSSH reads), or leave it out for port 22.",
        )
    return port


def _jump_spec(spec: str) -> dict[str, Any]:
    """One ProxyJump element ([user@]host[:port], or ssh://[user@]host[:port]) as board settings."""
    s = spec.strip().removeprefix("ssh://")
    user, _, hostport = s.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):  # [v6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest.lstrip(":") or None
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    return {
        "host": host,
        "port": _port(port, f"The ProxyJump {spec!r}'s port") if port else None,
        "user": user or None,
    }


# -- keys ------------------------------------------------------------------------------------------

# keys opened in this process, by (path, mtime): a reconnect does not ask again (memory only, never a file)
_OPENED: dict[tuple[str, int], Any] = {}
_OPENED_LOCK = threading.Lock()


def _key_classes() -> list[Any]:
    import paramiko

    return [paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey]


def _try_open(path: str, passphrase: str | None) -> tuple[Any, bool]:
    """(key or None, encrypted?)"""
    import paramiko

    encrypted = False
    for cls in _key_classes():
        try:
            return cls.from_private_key_file(path, passphrase), encrypted
        except paramiko.PasswordRequiredException:
            encrypted = True
        except (paramiko.SSHException, ValueError, TypeError, IndexError, UnicodeDecodeError):
            continue
    return None, encrypted


class _NeedPassphrase(Exception):
    pass


def open_key(path: str, ask: AskPassphrase | None) -> Any:
    """The private key at `path`: unencrypted; opened before in this process; with the passphrase kept in the
    keyring (if the person chose that); else asking `ask` (up to 3 tries). Raises BoardError (missing,
    unreadable), KeyPassphraseWrong, _NeedPassphrase (encrypted, nobody to ask), or returns None (skipped)."""
    p = Path(path).expanduser()
    try:
        stamp = (str(p.resolve()), p.stat().st_mtime_ns)
    except OSError as exc:
        raise BoardError(
            f"The SSH key file {p} cannot be read ({exc.strerror}).",
            "Check the path (the board's key_path, or IdentityFile in ~/.ssh/config).",
        ) from None
    with _OPENED_LOCK:
        if stamp in _OPENED:
            return _OPENED[stamp]
    key, encrypted = _try_open(str(p), None)
    if key is None and not encrypted:
        raise BoardError(
            f"{p} is not a private key HexStudio can read (ed25519, ECDSA or RSA).",
            f"Check that it is the private key, not the .pub (`ssh-keygen -l -f {p}`).",
        )
    if key is None:
        stored = None
        with contextlib.suppress(SecretStoreError):
            stored = get_secret(key_passphrase_key(stamp[0]))
        if stored:
            key, _ = _try_open(str(p), stored)
        if key is None:
            if ask is None:
                raise _NeedPassphrase(str(p))
            for attempt in range(PASSPHRASE_TRIES):
                answer = ask(str(p), attempt)
                if answer is None:
                    return None
                key, _ = _try_open(str(p), answer.value)
                if key is not None:
                    remember_secret(answer.value)  # the studio log scrubs it, kept or not
                    if answer.remember:
                        try:
                            set_secret(key_passphrase_key(stamp[0]), answer.value)
                        except SecretStoreError as exc:
                            raise BoardError(
                                f"The key opened, but the keyring refused its passphrase ({exc}).",
                                "Connect without remembering it, or fix the keyring.",
                            ) from None
                    elif stored:
                        with contextlib.suppress(SecretStoreError):
                            delete_secret(key_passphrase_key(stamp[0]))  # the stored one is stale
                    break
            else:
                raise KeyPassphraseWrong(str(p), PASSPHRASE_TRIES)
    with _OPENED_LOCK:
        _OPENED[stamp] = key
    return key


def _pub_blob(path: str) -> bytes | None:
    """The public key blob of an identity file (its .pub, else the unencrypted private key)."""
    pub = Path(path + ".pub")
    with contextlib.suppress(OSError, ValueError, IndexError):
        return base64.b64decode(pub.read_text().split()[1])
    key, _ = _try_open(path, None) if Path(path).exists() else (None, False)
    return key.asbytes() if key is not None else None


def _agent_keys() -> tuple[Any, list[Any]]:
    """(the agent's connection, its keys): the keys sign through that connection, so it stays open until the
    authentication is over (_Plan.close)."""
    import paramiko

    if not os.environ.get("SSH_AUTH_SOCK"):
        return None, []
    agent = None
    try:
        agent = paramiko.Agent()
        return agent, list(agent.get_keys())
    except (paramiko.SSHException, OSError):
        if agent is not None:
            agent.close()
        return None, []


@dataclass
class _Candidate:
    label: str
    key: Any = None
    path: str | None = None  # an identity file opened only when its turn comes


@dataclass
class _Plan:
    candidates: list[_Candidate] = field(default_factory=list)
    password: str | None = None
    notes: list[str] = field(default_factory=list)
    agent: Any = None  # the SSH agent's connection its keys sign through, closed once authentication is over

    def close(self) -> None:
        if self.agent is not None:
            with contextlib.suppress(Exception):
                self.agent.close()
            self.agent = None


def _auth_plan(name: str, r: dict[str, Any], password: str | None) -> _Plan:
    plan = _Plan()
    auth = r["auth"]
    if auth == "password":
        pw = password if password is not None else get_secret(board_password_key(name))
        if not pw:
            raise BoardError(
                f"Board '{name}' uses password auth but no password is stored.",
                f"Run `hexstudio board password {name}` (kept in the system keyring).",
            )
        plan.password = pw
        return plan
    if auth == "key":
        files = [r["key_path"]] if r["key_path"] else list(r["identity_files"])
        if not files:
            raise BoardError(
                f"Board '{name}' uses key auth but has no key_path.", "Set the private key file."
            )
        for f in files:
            p = os.path.expanduser(str(f))
            if not Path(p).exists():
                raise BoardError(
                    f"The SSH key file {p} does not exist.",
                    "Check the board's key_path (or IdentityFile in ~/.ssh/config).",
                )
            plan.candidates.append(_Candidate(f"key {p}", path=p))
        return plan
    # agent, ssh_config and jump hosts: what `ssh` would try
    files = ([os.path.expanduser(str(r["key_path"]))] if r.get("key_path") else []) + [
        f for f in r["identity_files"] if f != r.get("key_path")
    ]
    explicit = bool(files)
    if not files and auth != "agent":
        files = [os.path.expanduser(f) for f in DEFAULT_IDENTITIES]
    files = [f for f in files if Path(f).exists() or explicit]
    plan.agent, agent = _agent_keys()
    wanted = {b for b in (_pub_blob(f) for f in files) if b}
    in_agent = set()
    for k in agent:
        blob = k.asbytes()
        if r["identities_only"] and blob not in wanted:
            plan.notes.append(f"agent key {k.get_name()} {fingerprint(k)} not offered (IdentitiesOnly yes)")
            continue
        in_agent.add(blob)
        plan.candidates.append(_Candidate(f"agent key {k.get_name()} {fingerprint(k)}", key=k))
    if auth == "agent" and not agent:
        raise BoardError(
            "This connection uses agent auth but no SSH agent is reachable (SSH_AUTH_SOCK is "
            + ("not set" if not os.environ.get("SSH_AUTH_SOCK") else "set, but the agent did not answer")
            + ").",
            "Start one and add your key: `eval $(ssh-agent) && ssh-add ~/.ssh/id_ed25519` "
            "(then start HexStudio from that shell), or use key auth with the key file.",
        )
    if auth != "agent":
        for f in files:
            if _pub_blob(f) in in_agent:
                continue  # the agent already holds it: no passphrase needed
            if not Path(f).exists():
                plan.notes.append(f"IdentityFile {f} does not exist")
                continue
            plan.candidates.append(_Candidate(f"key {f}", path=f))
    return plan


# -- one SSH hop -----------------------------------------------------------------------------------


def _load_host_keys(r: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The trusted host keys of the user's known_hosts files and HexStudio's, and the @revoked ones. Read line by
    line, as OpenSSH reads them: a line paramiko cannot parse (@cert-authority, bad base64) is passed over; its
    HostKeys.load raised on one and every connection failed with a raw error."""
    import paramiko
    from paramiko.hostkeys import HostKeyEntry

    hk, revoked = paramiko.HostKeys(), []
    files = [Path(f) for f in r["known_hosts_files"]] or [Path(os.path.expanduser("~/.ssh/known_hosts"))]
    for f in (*files, known_hosts_path()):
        try:
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            marker, rest = "", line.strip()
            if rest.startswith("@"):
                marker, _, rest = rest.partition(" ")
            if marker not in ("", "@revoked"):  # @cert-authority: certificates, which HexStudio does not use
                continue
            try:
                e = HostKeyEntry.from_line(rest)
            except Exception:  # paramiko's InvalidHostKey is a bare Exception
                continue
            if e is None or e.key is None:
                continue
            if marker:
                revoked.append(e.key)
                continue
            for name in e.hostnames:
                hk.add(name, e.key.get_name(), e.key)
    return hk, revoked


def _key_name(r: dict[str, Any]) -> tuple[str, int]:
    """(host, port) of the board's known_hosts entry: HostKeyAlias alone where ssh_config sets one (ssh looks the
    alias up without the port: evk, not [evk]:2222), else the host and port."""
    return (r["host_key_alias"], 22) if r["host_key_alias"] else (r["host"], r["port"])


def _lookup(hk: Any, r: dict[str, Any]) -> Any:
    """The board's trusted keys in `hk` (paramiko HostKeys): under its known_hosts name, else, for a HostKeyAlias
    on another port than 22, under the [alias]:port HexStudio wrote before it named such boards as ssh does."""
    known = hk.lookup(host_entry(*_key_name(r)))
    if known is None and r["host_key_alias"] and r["port"] != 22:
        known = hk.lookup(host_entry(r["host_key_alias"], r["port"]))
    return known


def known_key_types(r: dict[str, Any]) -> list[str]:
    """The host key types trusted for this board, first found first."""
    known = _lookup(_load_host_keys(r)[0], r)
    return list(known.keys()) if known is not None else []


def _check_host_key(
    t: Any,
    r: dict[str, Any],
    trust: TrustHostKey | None,
    offer: OfferKnownHosts | None,
) -> None:
    host, port = r["host_key_alias"] or r["host"], r["port"]
    entry = _key_name(r)  # where the key is looked up and written; (host, port) is what the messages show
    key = t.get_remote_server_key()
    hk, revoked = _load_host_keys(r)
    known = _lookup(hk, r)
    fp = fingerprint(key)
    if any(key == k for k in revoked):
        raise HostKeyRevoked(host, port, fp)
    if known is not None and key.get_name() in known:
        if known[key.get_name()] != key:
            raise HostKeyChanged(
                host, port, fp, fingerprint(known[key.get_name()]), r["known_hosts_files"], host_entry(*entry)
            )
        return
    if known is not None and len(known):
        # a key of another type than the trusted one is no first connection (the transport asked for the trusted
        # type first): offering it to be trusted is how an interceptor gets a "yes"
        raise HostKeyOtherType(host, port, key.get_name(), fp, list(known.keys()))
    if trust is None or not trust(host, port, key.get_name(), fp):
        raise HostKeyUnknown(host, port, key.get_name(), fp, key)
    trust_host_key(*entry, key)
    path = (
        Path(r["known_hosts_files"][0])
        if r["known_hosts_files"]
        else Path(os.path.expanduser("~/.ssh/known_hosts"))
    )
    if offer is not None and offer(host, port, key.get_name(), fp, path):
        save_to_user_known_hosts(path, *entry, key, True if r["hash_known_hosts"] else None)


GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _first(wanted: tuple[str, ...], have: tuple[str, ...]) -> tuple[str, ...]:
    """`have` with those of `wanted` it holds moved to the front, in `wanted`'s order."""
    return tuple(w for w in wanted if w in have) + tuple(h for h in have if h not in wanted)


def _fast_transport(sock: Any, known_types: Sequence[str] = (), **kw: Any) -> Any:
    """A paramiko Transport preferring AES-GCM (no separate HMAC per packet: faster bundle pushes; the other
    ciphers stay allowed for boards without it) and the host key types already trusted for the board (as
    OpenSSH does: a board pinned by its ECDSA key is asked for that one, not offered ed25519 as a "first
    connection")."""
    import paramiko

    t = paramiko.Transport(sock, **kw)
    opts = t.get_security_options()
    opts.ciphers = _first(GCM_FIRST, tuple(opts.ciphers))
    # an RSA key is known as ssh-rsa and negotiated as its SHA-2 signature algorithms
    wanted = [
        a for k in known_types for a in (("rsa-sha2-512", "rsa-sha2-256", k) if k == "ssh-rsa" else (k,))
    ]
    opts.key_types = _first(tuple(wanted), tuple(opts.key_types))
    return t


# a keyboard-interactive prompt that is not the password, though it may say "pass" (a one-time passcode)
_NOT_THE_PASSWORD = re.compile(r"(?i)\b(code|passcode|token|otp|one.time|verif\w*|pin)\b")
_LOGIN = re.compile(
    r"\S+@\S+"
)  # the user@host a prompt names ("dev@vscode-box's password:"): not its meaning


def password_answers(
    password: str, other: list[str]
) -> Callable[[str, str, list[tuple[str, bool]]], list[str]]:
    """keyboard-interactive answers: the password to a hidden prompt that asks for it ("Password:", "user@host's
    password:"; a lone hidden prompt in another language too), nothing to any other (a verification code),
    whose text is added to `other`. The password once sent to an OTP prompt is in the board's auth log."""

    def answer(_title: str, _instructions: str, prompts: list[tuple[str, bool]]) -> list[str]:
        out = []
        for text, echo in prompts:
            asks = not echo and not _NOT_THE_PASSWORD.search(_LOGIN.sub(" ", text))
            if asks and ("pass" in text.lower() or len(prompts) == 1):
                out.append(password)
            else:
                other.append(text.strip() or "(a prompt without text)")
                out.append("")
        return out

    return answer


def _authenticate(t: Any, name: str, r: dict[str, Any], plan: _Plan, ask: AskPassphrase | None) -> None:
    import paramiko

    user, where = r["user"], f"{r['user']}@{r['host']}:{r['port']}"
    tried: list[str] = []
    need: list[str] = []
    for c in plan.candidates:
        key = c.key
        if key is None and c.path is not None:
            try:
                key = open_key(c.path, ask)
            except _NeedPassphrase:
                need.append(c.path)
                continue
            if key is None:
                tried.append(f"{c.label} (skipped: no passphrase given)")
                continue
        try:
            t.auth_publickey(user, key)
        except paramiko.BadAuthenticationType as exc:
            raise BoardError(
                f"{where} does not accept SSH keys (it allows: {', '.join(exc.allowed_types)}).",
                "Use password auth for this board (`hexstudio board password NAME`), or enable "
                "PubkeyAuthentication in its sshd_config.",
            ) from None
        except paramiko.AuthenticationException:
            tried.append(c.label)
            continue
        except paramiko.SSHException as exc:  # an agent that would not sign, say
            tried.append(f"{c.label} ({exc})")
            continue
        if t.is_authenticated():
            return
    if plan.password is not None:
        try:
            t.auth_password(user, plan.password)
        except paramiko.BadAuthenticationType as exc:
            if "keyboard-interactive" not in exc.allowed_types:
                raise BoardError(
                    f"{where} does not accept passwords (it allows: {', '.join(exc.allowed_types)}).",
                    "Use key auth: install your public key on the board (`ssh-copy-id`).",
                ) from None
            other: list[str] = []
            with contextlib.suppress(paramiko.AuthenticationException):
                t.auth_interactive(user, password_answers(plan.password, other))
            if other and not t.is_authenticated():
                raise BoardError(
                    f"{where} asks for more than the password at login ({'; '.join(other)}): HexStudio answers "
                    "only a password prompt, and did not send the password to the others.",
                    "Use key auth for this board: `ssh-copy-id USER@HOST` from this machine, then connect again.",
                ) from None
        except paramiko.AuthenticationException:
            pass
        if t.is_authenticated():
            return
        raise BoardError(
            f"{where} refused the login with the stored password (board '{name}').",
            f"Store the right password: `hexstudio board password {name}` (kept in the keyring).",
        )
    if need and not t.is_authenticated():
        raise KeyPassphraseNeeded(need[0])
    notes = "; ".join(plan.notes)
    if not tried:
        raise BoardError(
            f"No SSH key to offer {where}" + (f" ({notes})" if notes else "") + ".",
            "Set the board's key_path, add an IdentityFile for it in ~/.ssh/config, or load your key "
            "into the agent (`ssh-add`)."
            + (" IdentitiesOnly yes keeps the agent's other keys back." if r["identities_only"] else ""),
        )
    raise BoardError(
        f"{where} refused the login (tried: {', '.join(tried)}" + (f"; {notes}" if notes else "") + ").",
        "Check the user name and the key: its public key must be in the board's ~/.ssh/authorized_keys "
        f"(`ssh-copy-id -i KEY.pub -p {r['port']} {where.rsplit(':', 1)[0]}`)."
        + (" IdentitiesOnly yes offers only the IdentityFile keys." if r["identities_only"] else ""),
    )


def _open_hop(
    name: str,
    r: dict[str, Any],
    sock: Any,
    *,
    trust: TrustHostKey | None,
    offer: OfferKnownHosts | None,
    ask: AskPassphrase | None,
    password: str | None,
    timeout: float,
    plan: _Plan | None = None,
) -> Any:
    plan = plan or _auth_plan(name, r, password)
    t = _fast_transport(sock, known_key_types(r))
    t.banner_timeout = timeout
    t.auth_timeout = timeout
    try:
        t.start_client(timeout=timeout)
        _check_host_key(t, r, trust, offer)
        _authenticate(t, name, r, plan, ask)
    except BaseException:
        t.close()
        raise
    finally:
        plan.close()
    t.set_keepalive(15)
    return t


def _direct_socket(r: dict[str, Any], timeout: float) -> Any:
    try:
        return socket.create_connection((r["host"], r["port"]), timeout=timeout)
    except socket.gaierror as exc:  # a name no one answers for: a typo or DNS, not a board that is off
        if exc.errno == socket.EAI_AGAIN:
            raise BoardError(
                f"The name server did not answer for '{r['host']}' (a temporary failure in name resolution).",
                "Check this machine's network and DNS (on WSL: /etc/resolv.conf), or use the board's IP address.",
            ) from None
        raise BoardError(
            f"The host name '{r['host']}' does not resolve (no such name on this network).",
            "Check the spelling, or use the board's IP address (`hexstudio board add NAME --host 192.168.x.y ...` "
            "replaces the entry). On WSL a .local name needs mDNS: use the IP.",
        ) from None
    except OSError as exc:
        raise BoardError(
            f"Cannot connect to {r['host']}:{r['port']}: {exc.strerror or exc}.",
            "Is the board on, on the network, and running sshd? Try `ping` and "
            f"`ssh -p {r['port']} {r['user']}@{r['host']}` by hand.",
        ) from None


def _proxy_socket(r: dict[str, Any]) -> Any:
    import paramiko

    class ProxyCommand(paramiko.ProxyCommand):
        """paramiko's, closed twice safely (by the transport's thread and on a failed connect), reaped, and its
        three pipes closed (paramiko's close only signals the command: each connection left three open files to
        the garbage collector)."""

        def close(self) -> None:
            with contextlib.suppress(ProcessLookupError, OSError):
                super().close()
            with contextlib.suppress(Exception):
                self.process.wait(2)
            for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()

    cmd = str(r["proxy_command"])
    try:
        return ProxyCommand(cmd)
    except (OSError, paramiko.SSHException) as exc:
        raise BoardError(
            f"The ProxyCommand for {r['alias']} in ~/.ssh/config could not start ({exc}): {cmd}",
            "Run that command by hand to see why; fix or remove the ProxyCommand line.",
        ) from None


def _connect_chain(
    name: str,
    r: dict[str, Any],
    *,
    trust: TrustHostKey | None,
    offer: OfferKnownHosts | None,
    ask: AskPassphrase | None,
    password: str | None,
    timeout: float,
) -> SshSession:
    import paramiko

    plan = _auth_plan(name, r, password)  # a missing key or password is said before any connection
    hops: list[Any] = []
    sock: Any = None
    hop_label = ""
    try:
        if r["proxy_command"]:
            sock = _proxy_socket(r)
            hop_label = f"ProxyCommand {r['proxy_command']}"
        elif r["proxy_jump"]:
            specs = [s for s in str(r["proxy_jump"]).split(",") if s.strip()]
            for i, spec in enumerate(specs):
                j = _jump_spec(spec)
                jc = _ssh_config_lookup(j["host"])
                jr = {
                    "alias": j["host"],
                    "host": str(jc.get("hostname") or j["host"]),
                    "port": _port(j["port"] or jc.get("port") or 22, f"The port of jump host {j['host']}"),
                    "user": j["user"] or jc.get("user") or getpass.getuser(),
                    "auth": "ssh_config",
                    "key_path": None,
                    "identity_files": [os.path.expanduser(str(f)) for f in jc.get("identityfile") or []],
                    "identities_only": str(jc.get("identitiesonly", "no")).lower() == "yes",
                    "proxy_jump": None,
                    "proxy_command": None,
                    "host_key_alias": _none(jc.get("hostkeyalias")),
                    "known_hosts_files": r["known_hosts_files"],
                    "hash_known_hosts": r["hash_known_hosts"],
                }
                jwhere = f"{jr['user']}@{jr['host']}:{jr['port']}"
                try:
                    if sock is None:
                        sock = _direct_socket(jr, timeout)
                    jt = _open_hop(
                        f"{name} (jump host {j['host']})",
                        jr,
                        sock,
                        trust=trust,
                        offer=offer,
                        ask=ask,
                        password=None,
                        timeout=timeout,
                    )
                except (HostKeyUnknown, HostKeyChanged, KeyPassphraseNeeded, KeyPassphraseWrong):
                    raise
                except BoardError as exc:
                    raise BoardError(
                        f"Jump host {spec.strip()} (ProxyJump for {r['alias']} in ~/.ssh/config): "
                        f"{exc.message}",
                        (exc.hint or "").replace("Is the board on", "Is the jump host on"),
                    ) from None
                hops.append(jt)
                nxt = specs[i + 1] if i + 1 < len(specs) else None
                if nxt is not None:
                    nj = _jump_spec(nxt)
                    njc = _ssh_config_lookup(nj["host"])
                    dest = (
                        str(njc.get("hostname") or nj["host"]),
                        _port(nj["port"] or njc.get("port") or 22, f"The port of jump host {nj['host']}"),
                    )
                else:
                    dest = (r["host"], r["port"])
                try:
                    sock = jt.open_channel("direct-tcpip", dest, ("127.0.0.1", 0), timeout=timeout)
                except (paramiko.ChannelException, paramiko.SSHException, EOFError, OSError) as exc:
                    why = getattr(exc, "text", None) or str(exc) or type(exc).__name__
                    raise BoardError(
                        f"The jump host {jwhere} could not open a connection to {dest[0]}:{dest[1]} ({why}).",
                        f"Check that {jr['host']} can reach {dest[0]}:{dest[1]} (on it: `nc -z "
                        f"{dest[0]} {dest[1]}`) and that its sshd allows forwarding "
                        "(AllowTcpForwarding yes).",
                    ) from None
                hop_label = f"via {', '.join(s.strip() for s in specs)}"
        else:
            sock = _direct_socket(r, timeout)
        t = _open_hop(
            name, r, sock, trust=trust, offer=offer, ask=ask, password=password, timeout=timeout, plan=plan
        )
    except BaseException:
        for h in reversed(hops):
            with contextlib.suppress(Exception):
                h.close()
        if isinstance(sock, paramiko.ProxyCommand):
            with contextlib.suppress(Exception):
                sock.close()
        raise
    finally:
        plan.close()  # a jump host that failed never reached the board's own authentication
    return SshSession(t, hops, via=hop_label)


def connect_ssh_sync(
    name: str, cfg: dict[str, Any], *, timeout: float = 15.0, **asks: Unpack[SshAsks]
) -> SshTransport:
    import paramiko

    r = resolve(cfg)
    host, port, user = r["host"], r["port"], r["user"]
    ask = asks.get("passphrase") or DEFAULT_PROMPTS.passphrase
    offer = asks.get("offer_known_hosts") or DEFAULT_PROMPTS.offer_known_hosts
    try:
        session = _connect_chain(
            name,
            r,
            trust=asks.get("trust"),
            offer=offer,
            ask=ask,
            password=asks.get("password"),
            timeout=timeout,
        )
    except BoardError:
        raise
    except paramiko.ProxyCommandFailure as exc:
        raise BoardError(
            f"The ProxyCommand for {r['alias']} failed: {exc}.",
            f"Run it by hand ({r['proxy_command']}) to see why; fix the ProxyCommand line in ~/.ssh/config.",
        ) from None
    except (OSError, paramiko.SSHException, EOFError) as exc:
        via = (
            f" (through {r['proxy_command'] or r['proxy_jump']})"
            if r["proxy_command"] or r["proxy_jump"]
            else ""
        )
        raise BoardError(
            f"Cannot connect to {host}:{port}{via}: {exc or type(exc).__name__}.",
            "Is the board on, on the network, and running sshd? Try `ping` and "
            f"`ssh -p {port} {user}@{r['alias']}` by hand.",
        ) from None
    return SshTransport(session, host, port, user)


def _close_when_made(opening: asyncio.Future[SshTransport]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().client.close()  # paramiko's close: the session, its jump hosts, a ProxyCommand


async def connect_ssh(
    name: str,
    cfg: dict[str, Any],
    *,
    timeout: float = 15.0,
    on_state: Callable[[str, str], None] | None = None,
    **asks: Unpack[SshAsks],
) -> SshTransport:
    if on_state:
        on_state(CONNECTING, f"{cfg.get('user') or ''}@{cfg.get('host')}:{cfg.get('port') or 22}")
    opening = asyncio.ensure_future(
        asyncio.to_thread(functools.partial(connect_ssh_sync, name, cfg, timeout=timeout, **asks))
    )
    try:
        t = await asyncio.shield(opening)
    except asyncio.CancelledError:
        # the thread cannot be stopped: the connection it makes is closed once it is made, not left open
        opening.add_done_callback(_close_when_made)
        raise
    except BoardError as exc:
        if on_state:
            on_state(FAILED, exc.message)
        raise
    if on_state:
        on_state(READY, t.label)
    return t
