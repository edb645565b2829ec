"""What every worker shares: reading its spec, the main wrapper, failures.

A worker module looks like:

    from hexstudio.workers.runtime import WorkerSpec, WorkerError, worker_main
    from hexstudio.shared.protocol import Emitter

    def run(spec: WorkerSpec, em: Emitter) -> dict:   # returns the done summary
        ...

    if __name__ == "__main__":
        worker_main("quantize", run)

The spec (JSON, written by the studio's stage launcher) is declared once, typed, in
hexstudio/shared/worker_spec.py: `spec.settings` is a RunSettings, never a dict.
Stdlib only: this file is copied to remote hosts.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError, disk_hint, find_cause, why_not_written
from hexstudio.shared.protocol import LIVENESS_ENV, PARENT_ENV, Emitter
from hexstudio.shared.worker_spec import SPEC_SCHEMA, SpecError, WorkerSpec


class WorkerError(ActionableError):
    """A failure a person can act on: code, message and what to do."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, code=code)


class Cancelled(Exception):
    """Raised inside a worker when the studio asked it to stop (SIGINT/SIGTERM)."""


def map_path(path: str) -> str:
    """A path written on the studio's machine (e.g. model.json's hf_dir), as this worker sees it. On a
    remote worker host the studio sets HEXSTUDIO_PATH_MAP to a JSON list of [studio prefix, host prefix]
    pairs (hexstudio/core/remote/sync.py); without it paths are unchanged."""
    raw = os.environ.get("HEXSTUDIO_PATH_MAP")
    if not raw or not path:
        return path
    try:
        pairs = [(str(a).rstrip("/") or "/", str(b)) for a, b in json.loads(raw)]
    except (ValueError, TypeError):
        return path
    for src, dst in sorted(pairs, key=lambda p: -len(p[0])):
        if path == src or path.startswith(src + "/"):
            return dst.rstrip("/") + path[len(src) :]
    return path


PR_SET_PDEATHSIG = 1
# Runs beside the worker, in its process group: waits for the end of stdin, then kills the whole group
# (the worker and anything it started) at once, even when the worker is busy in native code for minutes.
_WATCH = 'cat >/dev/null 2>&1; /bin/kill -s KILL -- "-$1" 2>/dev/null || kill -9 "$2" 2>/dev/null'


_watcher: Any = None


def _stop_watcher() -> None:
    global _watcher
    if _watcher is not None:
        try:
            os.killpg(_watcher.pid, signal.SIGKILL)
            _watcher.wait()
        except OSError:
            pass
        _watcher = None


def die_with_parent() -> None:
    """Make this worker end at once when the process that started it ends (issue 18: no orphans).

    - PARENT_ENV set (a local job): prctl(PR_SET_PDEATHSIG, SIGKILL), so the kernel kills this process the
      moment its parent dies, whatever it is doing; a parent already gone ends it now.
    - LIVENESS_ENV == "stdin" and stdin a pipe or socket (local and remote jobs): a small `sh` watcher waits
      for the end of stdin and then SIGKILLs our process group, children included (a remote worker thus
      dies with its SSH channel).
    Both are opt-in through the environment the job runner sets; a worker started by hand is left alone."""
    import stat
    import subprocess

    parent = os.environ.get(PARENT_ENV)
    if parent and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if str(os.getppid()) != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(LIVENESS_ENV) != "stdin":
        return
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return
    pgid = os.getpgid(0)
    if pgid != os.getpid():  # not our own process group: kill only this process, never the starter's group
        pgid = 0
    global _watcher
    # in a session of its own, so the worker's group holds only the worker's processes (cancel and "is the
    # group gone" checks see no watcher); the worker ends it when it ends (worker_main)
    _watcher = subprocess.Popen(
        ["sh", "-c", _WATCH, "hexstudio-liveness", str(pgid or os.getpid()), str(os.getpid())],
        stdin=0,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )
    # this process never reads stdin again: a stray read must not eat the watcher's end-of-file
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _raise_cancelled(signum: int, _frame: Any) -> None:
    raise Cancelled(signal.Signals(signum).name)


def worker_main(
    stage: str, run: Callable[[WorkerSpec, Emitter], dict[str, Any] | None], argv: list[str] | None = None
) -> int:
    """Parse --spec, run, and always end with exactly one `done` event."""
    parser = argparse.ArgumentParser(prog=f"python -m hexstudio.workers.{stage}")
    parser.add_argument("--spec", required=True, help="spec JSON written by the studio")
    args = parser.parse_args(argv)
    die_with_parent()
    em = Emitter()
    signal.signal(signal.SIGINT, _raise_cancelled)
    signal.signal(signal.SIGTERM, _raise_cancelled)
    code = 0
    tmp: Path | None = None
    try:
        spec = WorkerSpec.load(args.spec)
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = private_tmp(spec.run_dir, stage)
        summary = run(spec, em)
        _drop_tmp(tmp)  # before `done`: the studio may move the stage's folder as soon as it reads it
        tmp = None
        em.done(True, summary or {})
    except Cancelled as exc:
        em.error(
            "cancelled",
            f"The {stage} stage was cancelled ({exc}).",
            "Nothing from this attempt is kept; start the stage again to redo it.",
        )
        em.done(False)
        code = 130
    except KeyboardInterrupt:
        em.error("cancelled", f"The {stage} stage was cancelled.", None)
        em.done(False)
        code = 130
    except (
        ActionableError
    ) as exc:  # WorkerError, or a library's error that says what to change (BundleError, ...)
        if not isinstance(exc, WorkerError):
            traceback.print_exc(file=sys.stderr)  # where it was raised, for the stage's log
        em.error(exc.code, exc.message, exc.hint)
        em.done(False)
        code = 1
    except OSError as exc:
        traceback.print_exc(file=sys.stderr)
        em.error(
            *(
                _not_written(stage, exc)
                or (
                    "internal",
                    f"The {stage} worker crashed: {type(exc).__name__}: {exc}",
                    "This is a HexStudio bug. The traceback is in the stage's log; please report it.",
                )
            )
        )
        em.done(False)
        code = 1
    except MemoryError:
        em.error(
            "out_of_memory",
            f"The {stage} worker ran out of memory.",
            "Close other programs, use fewer calibration samples or more parts, or raise the WSL "
            "memory limit in %UserProfile%\\.wslconfig and run `wsl --shutdown`.",
        )
        em.done(False)
        code = 1
    except Exception as exc:  # a bug: say so, with the traceback on stderr
        traceback.print_exc(file=sys.stderr)
        oom = out_of_memory_in(exc)
        if oom is not None:
            device, said = oom
            gpu = "Close other programs using the GPU (`nvidia-smi` lists them)"
            host = "raise the WSL memory limit in %UserProfile%\\.wslconfig and run `wsl --shutdown`"
            em.error(
                "out_of_memory",
                f"The {stage} worker ran out of {device} memory ({said}).",
                {
                    "GPU": f"{gpu}, or use fewer calibration samples or more parts; then resume the run.",
                    "host": f"Close other programs, use fewer calibration samples or more parts, or {host}; then "
                    "resume the run.",
                }.get(
                    device,
                    f"{gpu} and other programs, use fewer calibration samples or more parts, or {host}; then "
                    "resume the run.",
                ),
            )
        elif isinstance(
            disk := find_cause(
                exc, lambda e: isinstance(e, OSError) and why_not_written(e) is not None, context=False
            ),
            OSError,
        ):
            # a library's own error over a failed write (torch.save, safetensors: their type, the OSError inside,
            # `raise ... from`). Not __context__: a bug raised while handling such an error is still a bug.
            em.error(*(_not_written(stage, disk) or ("internal", str(exc), None)))
        else:
            em.error(
                "internal",
                f"The {stage} worker crashed: {type(exc).__name__}: {exc}",
                "This is a HexStudio bug. The traceback is in the stage's log; please report it.",
            )
        em.done(False)
        code = 1
    finally:
        _drop_tmp(tmp)
        try:
            sys.stdout.flush()
        except Exception:
            pass
        _stop_watcher()
    return code


def _not_written(stage: str, exc: OSError) -> tuple[str, str, str] | None:
    """(code, message, hint) for a write the disk or its owner refused (full, quota, read-only, not this user's):
    not a bug (issue 27: a disk filling during quantize was reported as one); None for another OSError."""
    why = why_not_written(exc)
    if why is None:
        return None
    where = f" {exc.filename}" if exc.filename else ""
    # EACCES / EPERM: a read as well as a write (a Hugging Face cache an earlier sudo run made root's)
    folder = (
        os.path.dirname(exc.filename) if isinstance(exc.filename, str) and exc.filename else "that folder"
    )
    hint = disk_hint(exc, folder, then="resume the run: finished stages are kept")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk_full", f"The {stage} worker could not write{where}: {why}.", hint
    if exc.errno == errno.EROFS:
        return "disk_read_only", f"The {stage} worker could not write{where}: the disk is read-only.", hint
    return (
        "not_writable",
        f"The {stage} worker was refused access to{where or ' a file'}: {exc.strerror or 'permission denied'}.",
        hint,
    )


# what torch and onnxruntime say when an allocation fails (their own exception types, not MemoryError):
# torch.OutOfMemoryError "CUDA out of memory", onnxruntime's BFC arena "Failed to allocate memory for requested
# buffer", its CUDA provider "CUDA failure 2: out of memory" / "cudaErrorMemoryAllocation", C++ std::bad_alloc
_OOM_TEXTS = ("out of memory", "failed to allocate memory", "cudaerrormemoryallocation", "bad_alloc")
# what only a failure on the GPU says (not "gpu" or "cuda" alone: a path such as /home/gpu-box/... holds them)
_GPU_TEXTS = (
    "cuda out of memory",
    "cuda failure",
    "cuda error",
    "cudaerror",
    "cudamalloc",
    "_status_alloc_failed",
)


def _cuda_in_use() -> bool:
    """Whether this process may have allocated on the GPU: onnxruntime's CUDA provider is installed, or torch has
    started CUDA. Read from what is loaded already: nothing is imported or started here."""
    ort = sys.modules.get("onnxruntime")
    torch = sys.modules.get("torch")
    try:
        if ort is not None and "CUDAExecutionProvider" in ort.get_available_providers():
            return True
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def out_of_memory_in(exc: BaseException) -> tuple[str, str] | None:
    """('GPU', 'host' or 'GPU or host', the library's words from the failed allocation on) when `exc` is a
    library's failed allocation, else None. onnxruntime's arena says the same words on the CPU and on the GPU: where
    the GPU may be in use, both are named."""
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    at = min((i for t in _OOM_TEXTS if (i := low.find(t)) >= 0), default=-1)
    if at < 0 and type(exc).__name__ != "OutOfMemoryError":
        return None
    said = " ".join(text[max(at, 0) :].split())[:160]
    if type(exc).__name__ == "OutOfMemoryError" or any(t in low for t in _GPU_TEXTS):
        return "GPU", said
    return ("GPU or host" if "failed to allocate memory" in low and _cuda_in_use() else "host"), said


def private_tmp(run_dir: Path, stage: str) -> Path | None:
    """The worker's temporary folder, inside its run folder (run_dir/tmp/<stage>, mode 0700) and set as TMPDIR for
    it and its children: the temporary files of the libraries it uses (the qai_hub client's `*.aimet.zip`
    uploads, onnx and aimet scratch files) stay with the run, unreadable to other users, and are removed when
    the worker ends (issue 27: they were left world-readable in /tmp). A folder left by a killed worker is
    emptied when the stage starts again. None (the system's) when the run folder cannot hold it."""
    tmp = Path(run_dir) / "tmp" / stage
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(tmp, 0o700)
    except OSError:
        return None
    _saved_tmp.append(({k: os.environ.get(k) for k in ("TMPDIR", "TMP", "TEMP")}, tempfile.tempdir))
    os.environ["TMPDIR"] = os.environ["TMP"] = os.environ["TEMP"] = str(tmp)
    tempfile.tempdir = str(tmp)
    return tmp


# what private_tmp replaced, put back when the worker ends: a worker run in-process (tests, the frozen build's
# dispatcher) must not leave TMPDIR and tempfile's cached folder pointing at a folder that is about to go
_saved_tmp: list[tuple[dict[str, str | None], str | None]] = []


def _drop_tmp(tmp: Path | None) -> None:
    if _saved_tmp and tmp is not None:
        env, cached = _saved_tmp.pop()
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = cached
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.parent.rmdir()  # run_dir/tmp, when no other stage's folder is left in it
        except OSError:
            pass


__all__ = [
    "SPEC_SCHEMA",
    "Cancelled",
    "SpecError",
    "WorkerError",
    "WorkerSpec",
    "map_path",
    "worker_main",
]
