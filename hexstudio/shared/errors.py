"""The one error base of HexStudio: a failure a person can act on.

Every layer's error class derives from `ActionableError` (the workers', the core's, the CLI's, the GUI's):
    code     a short string a program can branch on ("spec_invalid", "board_unreachable", ...)
    message  what happened, one or two sentences
    hint     what to do about it, or None
The same three fields, under the same names, are what a worker's `error` event carries (hexstudio/shared/protocol.py)
and what `hexstudio ... --json` prints under "error" when a command fails: `error_fields()` builds both.

Stdlib only and no other workers import: this file is copied to remote worker hosts and imported by the
studio's GUI process, which must stay light.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from typing import Any

ERROR_KEYS = ("code", "message", "hint")  # the error's shape, everywhere; hint may be absent


def error_fields(code: str, message: str, hint: str | None = None) -> dict[str, str]:
    """The one error shape: {"code", "message"[, "hint"]} (an absent hint is left out, as the protocol does)."""
    out = {"code": str(code), "message": str(message)}
    if hint:
        out["hint"] = str(hint)
    return out


class ActionableError(Exception):
    """A failure a person can act on: `code`, `message` and `hint` (what to do).

    A subclass's `code` is its name in snake case (BoardError: "board_error", RunNotFound: "run_not_found")
    unless it sets its own; an instance may carry another (`code=`, as WorkerError does). Subclasses keep
    whatever constructor their callers use and pass `message`, `hint` (and `code=`) up here.
    `str(exc)` is the message."""

    code: str = "error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            cls.code = snake_case(cls.__name__)

    def __init__(self, message: str = "", hint: str | None = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def fields(self) -> dict[str, str]:
        """This error in the one shape (error_fields)."""
        return error_fields(self.code, self.message, self.hint)

    def __reduce__(self) -> tuple[Any, ...]:
        # subclasses have their own constructors: rebuild from the fields (a process pool sends errors back)
        return (_rebuild, (type(self), self.message, self.hint, self.code, dict(self.__dict__)))


# why a file or folder could not be written, in words, by errno: the disk and its owner, not a bug
_NOT_WRITTEN = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "it is not writable by you",
    errno.EPERM: "it is not writable by you",
    errno.ENOTDIR: "a part of its path is a file, not a folder",
}


def why_not_written(exc: OSError) -> str | None:
    """The words for an OSError a person fixes on their disk (full, read-only, not theirs), None for another."""
    return _NOT_WRITTEN.get(exc.errno or 0)


def disk_hint(exc: OSError, folder: object, then: str = "try again") -> str:
    """What to do about `exc` raised in `folder`, and `then`: free space, or take the folder back (a run once started
    with sudo leaves root's folders), where why_not_written knows it; else a general word with the error itself."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"Free space on that disk (`df -h`; old runs can go with `hexstudio runs delete RUN`), then {then}."
    if exc.errno == errno.EROFS:
        return f"Put the workspace on a writable disk (--workspace or HEXSTUDIO_WORKSPACE), then {then}."
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"Make {folder} yours again (a run once started with sudo is root's: `sudo chown -R $USER {folder}`), or "
            f"choose a workspace you can write; then {then}."
        )
    if exc.errno == errno.ENOENT:
        return f"{folder} or a part of it is gone (deleted from another window?): open the run again."
    return f"Check {folder} ({exc.strerror or exc}), then {then}."


def find_cause(
    exc: BaseException, pred: Callable[[BaseException], bool], *, context: bool = True
) -> BaseException | None:
    """The first of `exc` and the errors behind it (`raise ... from`: __cause__; with `context`, also the one being
    handled when it was raised: __context__) that `pred` accepts; None when none does."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if pred(cur):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or (cur.__context__ if context else None)
    return None


def snake_case(name: str) -> str:
    """ "BoardError" -> "board_error", "RuntimeError_" -> "runtime_error", "_NeedPassphrase" -> "need_passphrase"."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name.strip("_")).lower()


def _rebuild(
    cls: type[ActionableError], message: str, hint: str | None, code: str, state: dict[str, Any]
) -> ActionableError:
    exc = cls.__new__(cls)
    ActionableError.__init__(exc, message, hint, code=code)
    exc.__dict__.update(state)
    return exc


def fields_of(exc: BaseException, code: str = "internal_error") -> dict[str, str]:
    """Any exception in the one error shape: an ActionableError's own fields; anything else (a bug) as
    `code` with its type and text."""
    if isinstance(exc, ActionableError):
        return exc.fields()
    return error_fields(code, f"{type(exc).__name__}: {exc}")


# Set by the studio (hexstudio.core.stage_api.worker_env) when the keyring could not be read for a secret the
# worker needs: its failure and what to do. A worker that then finds no token says so, not "not in the keyring".
KEYRING_UNREAD_ENV = "HEXSTUDIO_KEYRING_UNREAD"


def keyring_unread() -> str | None:
    """Why the studio could not read the keyring for this worker, or None."""
    return os.environ.get(KEYRING_UNREAD_ENV) or None
