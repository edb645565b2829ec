"""Errors a person can act on: what happened (message) and what to do (hint)."""

from __future__ import annotations

from hexstudio.shared.errors import ActionableError


class BoardError(ActionableError):
    """A board operation failed: what happened (`message`) and what to do (`hint`)."""


def link_failure(exc: BaseException) -> bool:
    """An error of the link to the board (or of a write over it): the socket, SFTP or paramiko, or the
    transport's ConnectionLost; not a HexStudio fault."""
    return (
        isinstance(exc, (OSError, EOFError))
        or exc.__class__.__module__.startswith("paramiko")
        or exc.__class__.__name__ == "ConnectionLost"
    )


class SudoRefused(BoardError):
    """sudo on the board refused the password given (or stored) for it."""


class ConnectionDropped(BoardError):
    """The connection to the board went away in the middle of an operation (push, upload); running it
    again resumes."""


class EmulatedBundle(BoardError):
    """An AI Hub EMULATOR bundle offered to a real board: its .bin files are not context binaries."""


class LocalBundleError(BoardError):
    """A file of the local bundle is missing, unreadable or not what bundle.json says: nothing to do with
    the board or the connection."""


class UnsafeBundle(BoardError):
    """A bundle (or a board's answer) names a path HexStudio refuses: absolute, with '..', outside the
    safe character set, or leading outside its folder. Nothing was written for it."""


class BoardWriteFailed(BoardError):
    """The board refused a write while the connection stayed up (its disk is full, a folder is not
    writable)."""
