"""Redaction: a report never carries a secret, and host/user names only when asked.

Secrets are removed three ways: values of keys whose name says secret (token, password, secret,
api_key, ...), every known keyring secret's value wherever it appears in text, and values that look
like bearer tokens in text (`Authorization: Bearer ...`, `api_token = ...`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"
SECRET_KEY = re.compile(r"(token|password|passwd|secret|api[_-]?key|credential|authorization)", re.I)
SECRET_TEXT = re.compile(r"(?i)(bearer\s+|api[_-]?token\s*[=:]\s*|token\s*[=:]\s*|password\s*[=:]\s*)(\S+)")


def _scrub_text(text: str, values: list[str], names: list[str]) -> str:
    for v in values:
        if v and len(v) >= 4:
            text = text.replace(v, REDACTED)
    text = SECRET_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
    for n in names:
        if n and len(n) >= 2:
            text = re.sub(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", "[host]", text)
    return text


def scrub(obj: Any, secret_values: Iterable[str] = (), names: Iterable[str] = ()) -> Any:
    """A deep copy of `obj` with secrets (and the given host/user names) replaced."""
    values = sorted({v for v in secret_values if v}, key=len, reverse=True)
    hide = sorted({n for n in names if n}, key=len, reverse=True)

    def walk(x: Any, key: str | None = None) -> Any:
        if key is not None and isinstance(x, str) and x and SECRET_KEY.search(key) \
                and not key.endswith(("_tokens", "tokens")):
            return REDACTED
        if isinstance(x, dict):
            return {k: walk(v, str(k)) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return _scrub_text(x, values, hide)
        return x

    return walk(obj)
