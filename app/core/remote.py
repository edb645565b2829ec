"""Run a worker on a remote Linux host over SSH, streaming the same events as a local job.

For users whose workstation is too small for the model: the heavy stage runs on a
bigger Linux box. The `workers` package is self-contained (stdlib + its ML deps), so it
is copied to the host (content-addressed, once per version) and started there as
`python3 -m workers.<stage> --spec spec.json`. Events stream back over the SSH channel;
RSS of the remote process group is sampled at 4 Hz by a small shell loop on the host;
cancel sends SIGINT, then SIGTERM and SIGKILL to the remote process group.

The transport is app.core.device's Transport (docs/CONTRACTS.md §4): host keys are
verified there, never auto-added silently.

A run with the setting `worker_host` (a name under `worker_hosts` in the studio settings, the same
record as a board: host, port, user, auth) runs its heavy stages (Stage.heavy: quantize, validate)
there through `start_worker_job`, which the pipeline calls instead of starting a local worker:
RemoteStageJob connects, checks the host's Python and packages, uploads the stage's upstream artifact
folders and the model's Hugging Face folder into <root>/runs/<run_id>/ (files already there with the
same size and sha256 are skipped; an interrupted file continues), rewrites the spec's paths, runs the
worker with RemoteJob and, on success only, downloads the remote output folder into the local
<stage>.partial folder. See docs/WORKER_PROTOCOL.md ("Remote workers").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import posixpath
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from app.core.jobs import EventHandler, EventStream, JobResult, JobRunner, LocalJob, SampleHandler, classify
from app.core.sampler import ResourceSample
from workers.runtime import LIVENESS_ENV

if TYPE_CHECKING:
    from app.core.manifest import RunManifest
    from app.core.stages import Stage

REPO_DIR = Path(__file__).resolve().parents[2]
WORKERS_DIR = REPO_DIR / "workers"
# Data files the workers read from the repository (workers/quant/calib.py BUILTIN_TEXT, workers/recipes.py
# RECIPES_DIR): copied with them,
# at the same place relative to the workers package.
WORKER_DATA = ("resources/builtin_model/text", "packaging/recipes")
PID_MARK = "HEXSTUDIO_PID:"

# Prints the RSS (KiB) of the remote process group 4 times a second while it lives.
_SAMPLER_SH = ('while kill -s 0 -- "-$1" 2>/dev/null; do '
               'ps -eo pgid=,rss= | awk -v g="$1" \'$1 == g {s += $2} END {print s + 0}\'; sleep 0.25; done')


class _CommandResult(Protocol):
    exit_status: int
    stdout: str
    stderr: str


class _RemoteProcess(Protocol):
    async def read_stdout(self, n: int = 65536) -> bytes: ...
    async def read_stderr(self, n: int = 65536) -> bytes: ...
    async def wait(self) -> int: ...
    async def terminate(self) -> None: ...


class _Transport(Protocol):
    label: str

    async def run(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                  timeout: float | None = None, stdin: bytes | None = None) -> Any: ...
    async def start(self, argv: list[str], *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> Any: ...
    async def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None: ...
    async def read_bytes(self, remote: str) -> bytes: ...
    async def exists(self, remote: str) -> bool: ...
    async def home(self) -> str: ...


def workers_bundle() -> tuple[str, bytes]:
    """The workers package as a tar.gz and its content hash (the remote folder's name)."""
    files = sorted(p for p in WORKERS_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    for rel in WORKER_DATA:
        files += sorted(p for p in (REPO_DIR / rel).rglob("*") if p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(REPO_DIR).as_posix().encode() + b"\0" + p.read_bytes())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in files:
            tar.add(p, arcname=p.relative_to(REPO_DIR).as_posix())
    return h.hexdigest()[:16], buf.getvalue()


async def install_workers(transport: _Transport, base: str | None = None) -> str:
    """Copy the workers package to the host once per version; return the folder holding it."""
    digest, blob = workers_bundle()
    home = await transport.home()
    root = posixpath.join(base or posixpath.join(home, ".cache", "hexstudio"), f"workers-{digest}")
    if await transport.exists(posixpath.join(root, "workers", "protocol.py")):
        return root
    tmp_tar = posixpath.join(posixpath.dirname(root), f".workers-{digest}.tar.gz")
    staging = f"{root}.partial"
    await transport.run(["mkdir", "-p", posixpath.dirname(root)], timeout=30)
    await transport.write_bytes(tmp_tar, blob)
    res = await transport.run(["sh", "-c", 'rm -rf "$1" && mkdir -p "$1" && tar -xzf "$2" -C "$1" && '
                               'rm -rf "$3" && mv "$1" "$3" && rm -f "$2"', "sh", staging, tmp_tar, root],
                              timeout=120)
    if res.exit_status != 0:
        raise RuntimeError(f"Could not unpack the workers on {transport.label}: {res.stderr.strip()}")
    return root


class RemoteJob:
    """A worker on a remote host. Same shape as app.core.jobs.LocalJob: start, wait, cancel."""

    def __init__(self, transport: _Transport, module: str, spec: dict[str, Any], *,
                 python: str = "python3", on_event: EventHandler | None = None,
                 on_sample: SampleHandler | None = None, what: str | None = None,
                 grace_s: float = 5.0, term_s: float = 3.0, env: dict[str, str] | None = None,
                 log: IO[str] | None = None, workers_base: str | None = None) -> None:
        self.transport = transport
        # LIVENESS_ENV: the worker watches its stdin, the SSH channel, and dies with it (workers.runtime)
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {}), LIVENESS_ENV: "stdin"}
        self.log = log
        self.workers_base = workers_base
        self.module = module
        self.spec = spec
        self.python = python
        self.on_sample = on_sample
        self.what = what or f"Worker {module} on {transport.label}"
        self.grace_s = grace_s
        self.term_s = term_s
        self.stream = EventStream(on_event, log)
        self.remote_pid: int | None = None
        self.remote_root: str | None = None
        self.peak_rss = 0
        self.samples: list[ResourceSample] = []
        self._cancelled = False
        self._stderr = ""
        self._task: asyncio.Task[JobResult] | None = None
        self._pid_seen = asyncio.Event()

    async def start(self) -> None:
        if self.remote_root is None:   # a caller that installed them already (RemoteStageJob) sets it
            self.remote_root = await install_workers(self.transport, self.workers_base)
        spec_path = posixpath.join(self.remote_root, "specs", f"{self.spec.get('stage', 'job')}-{time.time_ns()}.json")
        await self.transport.run(["mkdir", "-p", posixpath.dirname(spec_path)], timeout=30)
        await self.transport.write_bytes(spec_path, json.dumps(self.spec).encode())
        # A Python from packaging/install-workstation.sh has the libpython hook (AIMET's PtrToInt64 trap)
        # beside it: source it, as bin/activate would.
        argv = ["sh", "-c", f'h="$(dirname "$1")/hexstudio-env.sh"; [ -f "$h" ] && . "$h"; '
                            f'echo "{PID_MARK}$$"; exec "$@"', "sh",
                self.python, "-m", self.module, "--spec", spec_path]
        # setsid: the worker leads its own process group on the host, so cancel reaches its children
        proc = await self.transport.start(["setsid", "-w", *argv], cwd=self.remote_root, env=self.env)
        self._task = asyncio.ensure_future(self._run(proc))

    async def _read_events(self, proc: _RemoteProcess) -> None:
        pending = b""
        while True:
            chunk = await proc.read_stdout()
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if self.remote_pid is None and line.startswith(PID_MARK.encode()):
                    self.remote_pid = int(line[len(PID_MARK):].strip())
                    self._pid_seen.set()
                    continue
                self.stream.feed(line)
        if pending.strip():
            self.stream.feed(pending)

    async def _read_stderr(self, proc: _RemoteProcess) -> None:
        while True:
            chunk = await proc.read_stderr()
            if not chunk:
                break
            text = chunk.decode("utf-8", "replace")
            self._stderr = (self._stderr + text)[-8000:]
            if self.log is not None:
                for line in text.splitlines():
                    self.log.write(json.dumps({"v": 1, "type": "log", "level": "debug", "t": time.time(),
                                               "stream": "stderr", "message": line}, ensure_ascii=False) + "\n")

    async def _sample(self) -> None:
        await self._pid_seen.wait()
        sampler = await self.transport.start(["sh", "-c", _SAMPLER_SH, "sh", str(self.remote_pid)])
        pending = b""
        try:
            while True:
                chunk = await sampler.read_stdout()
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        rss = int(line.strip()) * 1024
                        s = ResourceSample(time.time(), rss, None, 0)
                        self.peak_rss = max(self.peak_rss, rss)
                        self.samples.append(s)
                        if self.on_sample is not None:
                            self.on_sample(s)
        finally:
            with contextlib.suppress(Exception):
                await sampler.terminate()

    async def _run(self, proc: _RemoteProcess) -> JobResult:
        t0 = time.monotonic()
        sampling = asyncio.ensure_future(self._sample())
        try:
            await asyncio.gather(self._read_events(proc), self._read_stderr(proc))
            rc = await proc.wait()
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampling
        # OpenSSH reports a signal death as exit-signal (no status): the transport gives -1 or 128+N
        returncode: int | None = rc
        if rc is not None and rc > 128 and self.stream.done is None:
            returncode = -(rc - 128)
        res = classify(returncode, self.stream, self._cancelled, self.peak_rss, self._stderr, self.what)
        res.peak_rss_bytes = self.peak_rss
        res.duration_s = time.monotonic() - t0
        res.events = self.stream.events
        res.bad_lines = self.stream.bad_lines
        res.stderr_tail = self._stderr[-2000:]
        return res

    async def wait(self) -> JobResult:
        assert self._task is not None, "start() first"
        return await asyncio.shield(self._task)

    async def _signal(self, sig: str, group: bool) -> None:
        if self.remote_pid is None:
            return
        target = f"-{self.remote_pid}" if group else str(self.remote_pid)
        with contextlib.suppress(Exception):
            await self.transport.run(["kill", f"-{sig}", "--", target], timeout=15)

    async def cancel(self) -> None:
        """SIGINT to the remote worker, then SIGTERM and SIGKILL to its process group."""
        if self._task is None or self._task.done():
            return
        self._cancelled = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._pid_seen.wait(), 10)
        for sig, group, timeout in (("INT", False, self.grace_s), ("TERM", True, self.term_s),
                                    ("KILL", True, 5.0)):
            await self._signal(sig, group)
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
                return
            except asyncio.TimeoutError:
                continue

    async def group_alive(self) -> bool:
        if self.remote_pid is None:
            return False
        res = await self.transport.run(["kill", "-0", "--", f"-{self.remote_pid}"], timeout=15)
        return bool(res.exit_status == 0)


async def run_remote_worker(transport: _Transport, module: str, spec: dict[str, Any],
                            on_event: Callable[[dict[str, Any]], None] | None = None,
                            python: str = "python3") -> JobResult:
    job = RemoteJob(transport, module, spec, python=python, on_event=on_event)
    await job.start()
    return await job.wait()


# ---------------------------------------------------------------------------------------------
# Worker hosts: a run setting `worker_host` names one; heavy stages run there.

WORKER_HOSTS = "worker_hosts"          # settings key: name -> {host, port, user, auth, key_path, python, root}
SYNC_MANIFEST = ".hexstudio-synced.json"
# What each stage's worker imports on the host (module names as `importlib.util.find_spec` sees them).
STAGE_PACKAGES: dict[str, tuple[str, ...]] = {
    "quantize": ("numpy", "onnx", "onnxruntime", "torch", "transformers", "tokenizers", "safetensors", "aimet_onnx"),
    "validate": ("numpy", "onnx", "onnxruntime", "tokenizers"),
}
# Run settings that name a file on this machine; the file is uploaded and the setting rewritten.
FILE_SETTINGS = ("calibration_text", "validation_text")
MIN_PYTHON = (3, 10)
INSTALL_HINT = (
    "The worker host needs the same CPU/GPU stack as a workstation. On the host: `git clone` HexStudio, then "
    "`bash packaging/install-workstation.sh` (it picks the torch/CUDA build for the host's GPU, installs "
    "aimet-onnx and onnxruntime-gpu, or the CPU stack with --cpu, and runs the AIMET smoke test); then point "
    "the worker host at that environment's Python: `hexstudio worker add {name} --host ... --python "
    "<clone>/.venv/bin/python`.")


def worker_password_key(name: str) -> str:
    """Keyring name of a worker host's SSH password (app.core.secrets)."""
    return f"worker-host:{name}:ssh_password"


class WorkerHostError(Exception):
    """A worker host problem a person can act on (code, message, what to do)."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.hint = code, message, hint


def worker_hosts(settings: Any = None) -> dict[str, dict[str, Any]]:
    if settings is None:
        from app.core.settings import Settings

        settings = Settings.load()
    hosts: dict[str, dict[str, Any]] = settings.data.setdefault(WORKER_HOSTS, {})
    return hosts


def host_config(name: str, settings: Any = None) -> dict[str, Any]:
    hosts = worker_hosts(settings)
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none yet"
        raise WorkerHostError("worker_host_unknown", f"No worker host named '{name}' (configured: {known}).",
                              f"Add it: `hexstudio worker add {name} --host HOST --user USER --key ~/.ssh/id_ed25519`,"
                              " or run without --worker-host to run every stage on this machine.")
    return dict(hosts[name])


async def connect_worker_host(name: str, cfg: dict[str, Any], *,
                              trust: Callable[[str, int, str, str], bool] | None = None) -> Any:
    """An SSH transport to the worker host, with the board connection's host-key rules (an unknown key is
    never trusted silently, a changed one is refused). Raises WorkerHostError with what to do."""
    from app.core.device.connect import HostKeyChanged, HostKeyUnknown, connect_ssh
    from app.core.device.errors import BoardError
    from app.core.secrets import SecretStoreError, get_secret

    password = None
    if cfg.get("auth") == "password":
        try:
            password = get_secret(worker_password_key(name))
        except SecretStoreError as exc:
            raise WorkerHostError("worker_host_login_failed", str(exc)) from None
        if not password:
            raise WorkerHostError("worker_host_login_failed",
                                  f"Worker host '{name}' uses password auth but no password is stored.",
                                  f"Run `hexstudio worker password {name}` (kept in the system keyring).")
    where = f"{cfg.get('user') or ''}@{cfg.get('host')}:{cfg.get('port') or 22}".lstrip("@")
    try:
        return await connect_ssh(name, cfg, trust=trust, password=password)
    except HostKeyUnknown as exc:
        raise WorkerHostError(
            "worker_host_key_unknown",
            f"Worker host '{name}' ({where}) has not been trusted yet: its host key is {exc.key_type} "
            f"{exc.fingerprint}.",
            f"Compare it with the host's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on it), then "
            f"run `hexstudio worker check {name} --trust {exc.fingerprint}`.") from None
    except HostKeyChanged as exc:
        raise WorkerHostError("worker_host_key_changed", f"Worker host '{name}': {exc.message}",
                              exc.hint.replace("board", "host") if exc.hint else None) from None
    except BoardError as exc:
        code = "worker_host_login_failed" if "refused the login" in exc.message else "worker_host_unreachable"
        hint = exc.hint or ""
        if code == "worker_host_unreachable":
            hint = (f"Is {cfg.get('host')} on, reachable from here and running sshd? Try "
                    f"`ssh -p {cfg.get('port') or 22} {where.split(':')[0]}` by hand. Resume the run when it "
                    "answers, or run it without a worker host (`hexstudio run --resume RUN_ID --worker-host local`).")
        elif code == "worker_host_login_failed":
            hint = hint.replace("board", "worker host")
        raise WorkerHostError(code, f"Worker host '{name}': {exc.message}", hint) from None


_PROBE_PY = r"""
import importlib.util, json, os, platform, sys
mods = sys.argv[1:]
mem = 0
try:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
except OSError:
    pass
print(json.dumps({"python": list(sys.version_info[:3]), "executable": sys.executable,
                  "platform": platform.platform(), "cpu_count": os.cpu_count() or 1, "memory_bytes": mem,
                  "missing": [m for m in mods if importlib.util.find_spec(m) is None]}))
"""


async def check_host(transport: Any, name: str, python: str, packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """The host's Python, memory and CPUs; raises WorkerHostError when Python or a package is missing."""
    res = await transport.run([python, "-c", _PROBE_PY, *packages], timeout=120)
    label = getattr(transport, "label", name)
    if res.exit_status != 0:
        err = (res.stderr or "").strip()
        if res.exit_status == 127 or "not found" in err or "No such file" in err:
            raise WorkerHostError("worker_host_python_missing",
                                  f"Worker host '{name}' ({label}) has no Python at '{python}'.",
                                  INSTALL_HINT.format(name=name))
        raise WorkerHostError("worker_host_python_broken",
                              f"'{python}' on worker host '{name}' failed to start (exit {res.exit_status}): "
                              f"{err[-400:]}", INSTALL_HINT.format(name=name))
    try:
        info: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise WorkerHostError("worker_host_python_broken",
                              f"'{python}' on worker host '{name}' printed something unexpected: "
                              f"{res.stdout[-300:]!r}", INSTALL_HINT.format(name=name)) from None
    if tuple(info["python"][:2]) < MIN_PYTHON:
        have = ".".join(map(str, info["python"]))
        raise WorkerHostError("worker_host_python_old",
                              f"'{python}' on worker host '{name}' is Python {have}; HexStudio's workers need "
                              f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer.", INSTALL_HINT.format(name=name))
    if info["missing"]:
        raise WorkerHostError("worker_host_packages_missing",
                              f"'{python}' on worker host '{name}' cannot import {', '.join(info['missing'])}, "
                              "which this stage needs.", INSTALL_HINT.format(name=name))
    return info


# -- files: upload what the worker reads, download what it wrote ---------------------------------

_FS_PY = r"""
import hashlib, json, os, shutil, sys
mode, root = sys.argv[1], sys.argv[2]
if mode == "list":
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                out[os.path.relpath(p, root)] = os.path.getsize(p)
    man = {}
    try:
        man = json.load(open(os.path.join(root, ".hexstudio-synced.json")))
    except (OSError, ValueError):
        pass
    print(json.dumps({"files": out, "manifest": man}))
elif mode == "hash":
    out = {}
    for rel in json.load(sys.stdin):
        h = hashlib.sha256()
        with open(os.path.join(root, rel), "rb") as fh:
            for b in iter(lambda: fh.read(1 << 20), b""):
                h.update(b)
        out[rel] = h.hexdigest()
    print(json.dumps(out))
elif mode == "prune":
    for rel in json.load(sys.stdin):
        try:
            os.remove(os.path.join(root, rel))
        except OSError:
            pass
elif mode == "promote":
    final = sys.argv[3]
    shutil.rmtree(final, ignore_errors=True)
    os.rename(root, final)
elif mode == "reset":
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
"""


async def _fs(transport: Any, python: str, mode: str, root: str, *extra: str,
              data: Any = None, timeout: float = 3600) -> Any:
    res = await transport.run([python, "-c", _FS_PY, mode, root, *extra], timeout=timeout,
                              stdin=None if data is None else json.dumps(data).encode())
    if res.exit_status != 0:
        raise WorkerHostError("worker_host_files_failed",
                              f"A file operation ({mode}) on the worker host failed in {root}: "
                              f"{(res.stderr or '').strip()[-400:]}",
                              "Check the host's free disk space and the worker host's root folder.")
    out = res.stdout.strip()
    return json.loads(out.splitlines()[-1]) if out else None


def _hash_cache_path() -> Path:
    from app.core.paths import config_dir

    return config_dir() / "remote-hash-cache.json"


class _LocalHashes:
    """sha256 of local files: from run.json's artifact records when given, else computed once per
    (path, size, mtime) and remembered in <config>/remote-hash-cache.json (a 16 GB model is not hashed
    again for every stage)."""

    def __init__(self) -> None:
        self.path = _hash_cache_path()
        try:
            self.cache: dict[str, list[Any]] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.cache = {}
        self.dirty = False

    def sha(self, p: Path) -> str:
        from app.core.atomic import sha256_file

        st = p.stat()
        key = str(p.resolve())
        hit = self.cache.get(key)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return str(hit[2])
        digest = sha256_file(p)
        self.cache[key] = [st.st_size, st.st_mtime_ns, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            from app.core.atomic import write_json_atomic

            with contextlib.suppress(OSError):
                write_json_atomic(self.path, self.cache)
            self.dirty = False


class SyncStats:
    """What an upload or download moved."""

    def __init__(self) -> None:
        self.sent_files = 0
        self.skipped_files = 0
        self.sent_bytes = 0
        self.total_bytes = 0


def _local_files(root: Path) -> dict[str, Path]:
    """Files under root by relative POSIX path, following symlinks (a Hugging Face cache snapshot is
    links to blobs: the content is what counts)."""
    out: dict[str, Path] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != SYNC_MANIFEST:
            out[p.relative_to(root).as_posix()] = p
    return out


async def upload_tree(transport: Any, python: str, local: Path, remote: str, hashes: _LocalHashes,
                      known: dict[str, str] | None = None, stats: SyncStats | None = None,
                      log: Callable[[str], None] | None = None) -> SyncStats:
    """Make `remote` hold exactly the files of `local`. A file already there with the same size and sha256
    is skipped (checked against the folder's sync record, else hashed on the host); the rest is sent with
    the transport's resumable put_file (as <file>.part, continued after a dropped connection, then renamed),
    the same primitive as the board's bundle push. Files the local folder lacks are removed.
    `known`: rel -> sha256 already known here (run.json's artifact records)."""
    stats = stats or SyncStats()
    files = _local_files(local)
    await transport.run(["mkdir", "-p", remote], timeout=60)
    listing = await _fs(transport, python, "list", remote)
    there: dict[str, int] = listing["files"]
    record: dict[str, list[Any]] = listing["manifest"] if isinstance(listing["manifest"], dict) else {}
    want: dict[str, tuple[int, str]] = {}
    for rel, p in files.items():
        size = p.stat().st_size
        sha: str = (known or {}).get(rel) or ""
        if not sha:
            sha = await asyncio.to_thread(hashes.sha, p)
        want[rel] = (size, sha)
        stats.total_bytes += size
    unsure = [rel for rel, (size, sha) in want.items()
              if there.get(rel) == size and record.get(rel) != [size, sha]]
    remote_sha: dict[str, str] = {}
    if unsure:
        remote_sha = await _fs(transport, python, "hash", remote, data=unsure)
    new_record: dict[str, list[Any]] = {}
    for rel, (size, sha) in want.items():
        if there.get(rel) == size and (record.get(rel) == [size, sha] or remote_sha.get(rel) == sha):
            stats.skipped_files += 1
            new_record[rel] = [size, sha]
    extra = [rel for rel in there if rel not in want and rel != SYNC_MANIFEST
             and not (rel.endswith(".part") and rel[:-5] in want)]
    if extra:
        await _fs(transport, python, "prune", remote, data=extra)
    man = posixpath.join(remote, SYNC_MANIFEST)
    if new_record != record:
        await transport.write_bytes(man, json.dumps(new_record).encode())
    for rel, (size, sha) in want.items():
        if rel in new_record:
            continue
        if log is not None and size >= 64 << 20:
            log(f"uploading {rel} ({size / 1e6:.0f} MB)")
        n = await transport.put_file(files[rel], posixpath.join(remote, rel))
        stats.sent_bytes += size if n is None else int(n)
        stats.sent_files += 1
        new_record[rel] = [size, sha]
        await transport.write_bytes(man, json.dumps(new_record).encode())   # resumable: record as we go
    hashes.save()
    return stats


async def download_tree(transport: Any, python: str, remote: str, local: Path,
                        stats: SyncStats | None = None) -> SyncStats:
    """Copy every file of the remote folder into `local` (which the pipeline just made empty)."""
    stats = stats or SyncStats()
    listing = await _fs(transport, python, "list", remote)
    for rel, size in sorted(listing["files"].items()):
        if rel == SYNC_MANIFEST:
            continue
        dst = local / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        await transport.get_file(posixpath.join(remote, rel), dst)
        if dst.stat().st_size != size:
            raise WorkerHostError("worker_host_download_failed",
                                  f"{rel} arrived with {dst.stat().st_size} bytes instead of {size}.",
                                  "Resume the run to run the stage again.")
        stats.sent_files += 1
        stats.sent_bytes += size
        stats.total_bytes += size
    return stats


def map_prefix(path: str, pairs: list[tuple[str, str]]) -> str:
    """`path` with the longest matching prefix of pairs (from, to) replaced; unchanged when none matches."""
    for src, dst in sorted(pairs, key=lambda p: -len(p[0])):
        src = src.rstrip("/") or "/"
        if path == src or path.startswith(src + "/"):
            return dst.rstrip("/") + path[len(src):]
    return path


def map_json_paths(folder: Path, pairs: list[tuple[str, str]]) -> list[str]:
    """Rewrite host paths inside the JSON files of a downloaded folder to this machine's (quantize.json's
    calibration text, validation.json's validation text...). Returns the files changed."""
    changed = []
    needles = [json.dumps(src)[1:-1].encode() for src, _ in pairs]

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return map_prefix(v, pairs)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    for p in sorted(folder.rglob("*.json")):
        raw = p.read_bytes()
        if not any(n in raw for n in needles):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        new = walk(doc)
        if new != doc:
            p.write_text(json.dumps(new, indent=2, ensure_ascii=False), encoding="utf-8")
            changed.append(p.relative_to(folder).as_posix())
    return changed


# Besides the heavy stages: preflight checks the machine that will do the heavy work (its memory, GPU,
# packages, AIMET smoke test and the free disk under the host's root), so a workstation too small for the
# model does not fail the gate for work it will not do.
HOST_CHECK_STAGES = ("preflight",)


def remote_host_for(manifest: RunManifest, stage: Stage) -> str | None:
    """The worker host this stage runs on, or None for this machine: heavy worker stages (and preflight) of
    a run whose `worker_host` setting names one ("" / "local" / none: this machine)."""
    name = str(manifest.settings.get("worker_host") or "").strip()
    if not name or name == "local" or stage.worker is None:
        return None
    return name if stage.heavy or stage.name in HOST_CHECK_STAGES else None


class RemoteStageJob:
    """A pipeline stage on a worker host: connect, check, upload, run (RemoteJob), download.
    Same shape as LocalJob for the pipeline: start(), wait() -> JobResult, cancel()."""

    def __init__(self, host: str, manifest: RunManifest, stage: Stage, spec_path: Path, *,
                 on_event: EventHandler | None = None, on_sample: SampleHandler | None = None,
                 log_path: Path | None = None, what: str | None = None, settings: Any = None,
                 grace_s: float = 5.0, term_s: float = 3.0) -> None:
        self.host = host
        self.m = manifest
        self.stage = stage
        self.spec_path = spec_path
        self.on_event = on_event
        self.on_sample = on_sample
        self.log_path = log_path
        self.what = what or f"The {stage.title} stage"
        self.settings = settings
        self.grace_s, self.term_s = grace_s, term_s
        self.remote: RemoteJob | None = None
        self.transport: Any = None
        self.remote_run_dir: str | None = None
        self.remote_out_dir: str | None = None
        self.host_info: dict[str, Any] = {}
        self._log: IO[str] | None = None
        self._cancelled = False
        self._task: asyncio.Task[JobResult] | None = None
        self._t0 = time.monotonic()

    # -- events from the studio's side of the job (labeled source "worker_host") -----------------
    def _emit(self, etype: str, **fields: Any) -> None:
        ev: dict[str, Any] = {"v": 1, "type": etype, "t": round(time.time(), 6), "source": "worker_host",
                              **{k: v for k, v in fields.items() if v is not None}}
        if self._log is not None:
            self._log.write(json.dumps(ev, ensure_ascii=False) + "\n")
        if self.on_event is not None:
            self.on_event(ev)

    def _say(self, message: str, phase: str) -> None:
        self._emit("log", message=message, level="info", phase=phase)

    async def start(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in _main
        self._t0 = time.monotonic()
        self._task = asyncio.ensure_future(self._main())

    async def wait(self) -> JobResult:
        assert self._task is not None, "start() first"
        return await asyncio.shield(self._task)

    async def cancel(self) -> None:
        if self._task is None or self._task.done():
            return
        self._cancelled = True
        if self.remote is not None and self.remote._task is not None and not self.remote._task.done():
            await self.remote.cancel()
        else:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(self._task)

    def _fail(self, code: str, message: str, hint: str | None = None) -> JobResult:
        self._emit("error", code=code, message=message, hint=hint)
        return JobResult("failed", None, None, message, hint=hint, code=code,
                         duration_s=time.monotonic() - self._t0)

    async def _main(self) -> JobResult:
        try:
            return await self._steps()
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            return JobResult("cancelled", None, None, f"{self.what} was cancelled.",
                             hint="Nothing from the cancelled attempt is kept. Start it again when ready.",
                             code="cancelled", duration_s=time.monotonic() - self._t0)
        except WorkerHostError as exc:
            return self._fail(exc.code, exc.message, exc.hint.replace("RUN_ID", self.m.run_id) if exc.hint else None)
        except Exception as exc:
            from app.core.device.transport import ConnectionLost

            dropped = isinstance(exc, (ConnectionLost, OSError, EOFError)) or \
                exc.__class__.__module__.startswith("paramiko")
            if not dropped:
                import traceback

                if self._log is not None:
                    self._log.write(json.dumps({"v": 1, "type": "log", "level": "debug", "t": time.time(),
                                                "stream": "stderr", "message": traceback.format_exc()}) + "\n")
                return self._fail("worker_host_failed",
                                  f"Running {self.what.lower()} on worker host '{self.host}' failed: "
                                  f"{type(exc).__name__}: {exc}",
                                  "This is a HexStudio bug: the traceback is in the stage log; please report it. "
                                  "Run the stage on this machine meanwhile (--worker-host local).")
            return self._fail("worker_host_disconnected",
                              f"The connection to worker host '{self.host}' dropped ({exc or type(exc).__name__}).",
                              f"Check the host and the network, then resume the run (`hexstudio run --resume "
                              f"{self.m.run_id}`): files already on the host are not sent again.")
        finally:
            if self.transport is not None:
                with contextlib.suppress(Exception):
                    await self.transport.close()
            if self._log is not None:
                self._log.close()
                self._log = None

    async def _steps(self) -> JobResult:
        cfg = host_config(self.host, self.settings)
        python = str(cfg.get("python") or "python3")
        self._say(f"connecting to worker host '{self.host}' ({cfg.get('user') or ''}@{cfg.get('host')}:"
                  f"{cfg.get('port') or 22})", "connect")
        self.transport = t = await connect_worker_host(self.host, cfg)
        self.host_info = info = await check_host(t, self.host, python, STAGE_PACKAGES.get(self.stage.name, ()))
        self._emit("metric", name="worker_host", value=self.host, scope="worker_host")
        self._emit("metric", name="worker_host_memory_bytes", value=info.get("memory_bytes"), unit="bytes",
                   scope="worker_host")
        self._emit("metric", name="worker_host_cpu_count", value=info.get("cpu_count"), scope="worker_host")
        self._say(f"{t.label}: Python {'.'.join(map(str, info['python']))}, {info.get('cpu_count')} CPUs, "
                  f"{(info.get('memory_bytes') or 0) / 2**30:.1f} GiB RAM", "connect")
        base = str(cfg.get("root") or posixpath.join(await t.home(), ".cache", "hexstudio"))
        workers_root = await install_workers(t, base)
        rrun = posixpath.join(base, "runs", self.m.run_id)
        self.remote_run_dir = rrun
        spec = json.loads(self.spec_path.read_text(encoding="utf-8"))
        local_out = Path(spec["out_dir"])
        rout = posixpath.join(rrun, "artifacts", f"{self.stage.name}.partial")
        self.remote_out_dir = rout
        await _fs(t, python, "reset", rout)    # never resume from half-written output, here either
        # 1. upload the upstream folders this stage reads, and the model's folder when it lives elsewhere
        hashes = _LocalHashes()
        stats = SyncStats()
        t_up = time.monotonic()
        upstream: dict[str, str] = {}
        forward: list[tuple[str, str]] = [(str(self.m.run_dir), rrun)]
        back: list[tuple[str, str]] = [(rout, str(local_out)), (rrun, str(self.m.run_dir)),
                                       (workers_root, str(REPO_DIR))]
        for need in self.stage.needs:
            if need not in spec["upstream"]:
                continue
            local = Path(spec["upstream"][need])
            remote = posixpath.join(rrun, "artifacts", need)
            self._say(f"uploading the {need} stage's output", "upload")
            await upload_tree(t, python, local, remote, hashes, self._known(need), stats,
                              log=lambda msg: self._say(msg, "upload"))
            upstream[need] = remote
            hf = self._external_hf_dir(local)
            if hf is not None:
                key = hashlib.sha256(str(hf).encode()).hexdigest()[:12]
                rhf = posixpath.join(base, "models", f"{key}-{hf.name}")
                self._say(f"uploading the model folder {hf}", "upload")
                await upload_tree(t, python, hf, rhf, hashes, None, stats, log=lambda msg: self._say(msg, "upload"))
                forward.append((str(hf), rhf))
                back.append((rhf, str(hf)))
        settings = dict(spec.get("settings") or {})
        for key in FILE_SETTINGS:
            value = settings.get(key)
            if value in (None, "", "builtin"):
                continue
            p = Path(str(value)).expanduser()
            if not p.is_file():
                continue    # the worker says clearly that the file is missing
            rfile = posixpath.join(rrun, "inputs", key, p.name)
            await t.put_file(p, rfile)
            stats.sent_files += 1
            stats.sent_bytes += p.stat().st_size
            settings[key] = rfile
            back.append((rfile, str(p)))
        self._emit("metric", name="worker_host_upload_bytes", value=stats.sent_bytes, unit="bytes",
                   scope="worker_host")
        self._emit("metric", name="worker_host_upload_skipped_files", value=stats.skipped_files,
                   scope="worker_host")
        self._say(f"upload: {stats.sent_files} file(s), {stats.sent_bytes / 1e6:.1f} MB sent; "
                  f"{stats.skipped_files} already there ({time.monotonic() - t_up:.1f} s)", "upload")
        # 2. run the worker there, on remote paths
        rspec = {**spec, "run_dir": rrun, "out_dir": rout, "upstream": upstream, "settings": settings}
        env = {"HEXSTUDIO_PATH_MAP": json.dumps([list(p) for p in forward])}
        if os.environ.get("HEXSTUDIO_THREADS"):
            env["HEXSTUDIO_THREADS"] = os.environ["HEXSTUDIO_THREADS"]
        self.remote = RemoteJob(t, str(self.stage.worker), rspec, python=python, on_event=self.on_event,
                                on_sample=self.on_sample, what=f"{self.what} (on worker host '{self.host}')",
                                grace_s=self.grace_s, term_s=self.term_s, env=env, log=self._log,
                                workers_base=base)
        self.remote.remote_root = workers_root     # the very copy the path maps name
        await self.remote.start()
        res = await self.remote.wait()
        if res.kind in ("killed", "oom") and res.signal == "SIGKILL":
            res = self._judge_kill(res, int(info.get("memory_bytes") or 0))
        if not res.ok:
            if not t.connected and res.kind == "failed":
                res = JobResult("failed", res.exit_code, None,
                                f"The connection to worker host '{self.host}' dropped while {self.what.lower()} "
                                "ran there.", hint=f"Resume the run when the host answers (`hexstudio run --resume "
                                f"{self.m.run_id}`): the stage starts again from a clean state.",
                                code="worker_host_disconnected", peak_rss_bytes=res.peak_rss_bytes,
                                duration_s=res.duration_s, events=res.events, bad_lines=res.bad_lines)
            with contextlib.suppress(Exception):
                await _fs(t, python, "reset", rout, timeout=120)
            res.duration_s = time.monotonic() - self._t0
            return res
        # 3. bring the output home; the pipeline then renames <stage>.partial and hashes it
        t_down = time.monotonic()
        down = await download_tree(t, python, rout, local_out)
        changed = map_json_paths(local_out, back)
        self._emit("metric", name="worker_host_download_bytes", value=down.sent_bytes, unit="bytes",
                   scope="worker_host")
        self._say(f"download: {down.sent_files} file(s), {down.sent_bytes / 1e6:.1f} MB "
                  f"({time.monotonic() - t_down:.1f} s)"
                  + (f"; host paths mapped to this machine's in {', '.join(changed)}" if changed else ""),
                  "download")
        # keep the host's copy as the stage's folder there: the next stage's upload finds it and sends nothing
        with contextlib.suppress(WorkerHostError):
            await _fs(t, python, "promote", rout, posixpath.join(rrun, "artifacts", self.stage.name), timeout=300)
        res.duration_s = time.monotonic() - self._t0
        return res

    def _judge_kill(self, res: JobResult, host_memory: int) -> JobResult:
        """A SIGKILL on the host: out of memory judged against the HOST's RAM, not this machine's."""
        from app.core.jobs import human_bytes

        oom = bool(host_memory) and res.peak_rss_bytes >= 0.6 * host_memory
        res.kind = "oom" if oom else "killed"
        if oom:
            res.code = "out_of_memory"
            res.message = (f"{self.what} was killed (SIGKILL) on worker host '{self.host}' at "
                           f"{human_bytes(res.peak_rss_bytes)} RSS: likely out of memory there "
                           f"(the host has {human_bytes(host_memory)} RAM).")
            res.hint = ("Use a worker host with more RAM or swap, or lower the stage's need: more parts "
                        "(--set parts=N), fewer calibration samples or a shorter context length.")
        else:
            res.code = "killed"
            res.message = f"{self.what} was killed by SIGKILL on worker host '{self.host}'."
            res.hint = ("Something on the host killed the worker (kill -9, a watchdog, or the OOM killer). "
                        "Resume the run to restart the stage from a clean state.")
        return res

    def _known(self, stage: str) -> dict[str, str]:
        prefix = f"artifacts/{stage}/"
        return {a["path"][len(prefix):]: a["sha256"] for a in self.m.stage(stage).artifacts
                if str(a.get("path", "")).startswith(prefix) and a.get("sha256")}

    def _external_hf_dir(self, upstream_dir: Path) -> Path | None:
        """The model's Hugging Face folder when model.json points outside the run (a Hugging Face cache
        snapshot or a local folder); None when it is inside the model stage's folder (uploaded with it)."""
        try:
            doc = json.loads((upstream_dir / "model.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        raw = str(doc.get("hf_dir") or "")
        p = Path(raw)
        if not raw or not p.is_absolute() or not p.is_dir():
            return None
        try:
            p.resolve().relative_to(self.m.run_dir.resolve())
            return None
        except ValueError:
            return p

    async def group_alive(self) -> bool:
        return bool(self.remote is not None and await self.remote.group_alive())


async def start_worker_job(runner: JobRunner, manifest: RunManifest, stage: Stage, spec_path: Path, *,
                           on_event: EventHandler | None = None, on_sample: SampleHandler | None = None,
                           log_path: Path | None = None, what: str | None = None,
                           env: dict[str, str] | None = None) -> LocalJob | RemoteStageJob:
    """The pipeline's one way to start a stage's worker: on the run's worker host for heavy stages when the
    run names one (RemoteStageJob), else on this machine (LocalJob). Both are started when returned."""
    assert stage.worker is not None
    host = remote_host_for(manifest, stage)
    if host is None:
        return await runner.start_local(stage.worker, spec_path, on_event=on_event, on_sample=on_sample,
                                        log_path=log_path, what=what, env=env)
    job = RemoteStageJob(host, manifest, stage, spec_path, on_event=on_event, on_sample=on_sample,
                         log_path=log_path, what=what)
    await job.start()
    return job
