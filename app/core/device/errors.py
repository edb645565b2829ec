"""Errors a person can act on: what happened (message) and what to do (hint)."""

from __future__ import annotations


class BoardError(Exception):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
