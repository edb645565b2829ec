"""Redaction: a report never carries a secret, and host/user names only when asked.

Secrets are removed three ways: values of keys whose name says secret (token, password, secret,
api_key, ...), every known keyring secret's value wherever it appears in text, and values that look
like bearer tokens in text (`Authorization: Bearer ...`, `api_token = ...`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"
# a key is secret when one of its words (split at _ - . : or camelCase) is one of these
SECRET_WORDS = {
    "token",
    "password",
    "passwd",
    "pwd",
    "secret",
    "apikey",
    "credential",
    "credentials",
    "authorization",
    "passphrase",
    "cookie",
}
SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "key"), ("session", "key")}
TOKENIZER_WORDS = {"bos", "eos", "pad", "unk", "sep", "cls", "mask"}  # bos_token = "<s>" is no secret
# `token_rate_unit`, `token_count`, `token_ids` count or label LLM tokens: no secret
TOKEN_MEASURE_WORDS = {"rate", "rates", "count", "counts", "unit", "units", "id", "ids", "limit", "budget"}
SECRET_TEXT = re.compile(
    r"(?i)(bearer\s+|\b(?:api|access|auth|hf|aihub)[_-]?token\s*[=:]\s*|\btoken\s*=\s*|"
    r"\bpass(?:word|wd)\s*[=:]\s*)([^\s\"',;]+)"
)


def is_secret_key(key: str) -> bool:
    """`api_token`, `sudo_password`, `clientSecret`, `api-key` are secret; `prompt_tokens`, `tokenizer` are not."""
    words = [w.lower() for w in re.split(r"[_\-.:\s]+|(?<=[a-z])(?=[A-Z])", key) if w]
    for i, w in enumerate(words):
        if w == "token" and (
            (i > 0 and words[i - 1] in TOKENIZER_WORDS)
            or (i + 1 < len(words) and words[i + 1] in TOKEN_MEASURE_WORDS)
        ):
            continue
        if w in SECRET_WORDS:
            return True
    return any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def secret_values_in(obj: Any, key: str | None = None) -> list[str]:
    """String values of secret-named keys anywhere in `obj` (e.g. a password typed into the settings file)."""
    if isinstance(obj, dict):
        return [v for k, x in obj.items() for v in secret_values_in(x, str(k))]
    if isinstance(obj, list):
        return [v for x in obj for v in secret_values_in(x, key)]
    return [obj] if isinstance(obj, str) and obj and key is not None and is_secret_key(key) else []


def scrub_secret_text(text: str, values: Iterable[str], names: Iterable[tuple[str, str]] = ()) -> str:
    """`text` without the secret `values` (longest first; one under 4 characters as a whole word only), token and
    password assignments, and the `names` (a host or user name, with its placeholder)."""
    values = sorted(values, key=len, reverse=True)
    for v in values:
        if len(v) >= 4:
            text = text.replace(v, REDACTED)
        else:  # a very short secret: whole words only, or every "a" in the report would go
            text = re.sub(rf"(?<!\w){re.escape(v)}(?!\w)", REDACTED, text)
    text = SECRET_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
    for n, placeholder in names:
        if len(n) >= 2:
            text = re.sub(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", placeholder, text)
    return text


def scrub(
    obj: Any, secret_values: Iterable[str] = (), names: Iterable[str] = (), users: Iterable[str] = ()
) -> Any:
    """A deep copy of `obj` with secrets replaced, and the given host names and user names (whole words only:
    `/home/alice/x` -> `/home/[user]/x`) replaced by placeholders."""
    values = sorted({v for v in secret_values if v}, key=len, reverse=True)
    pairs = {n: "[host]" for n in names if n}
    pairs.update({u: "[user]" for u in users if u})
    hide = sorted(pairs.items(), key=lambda kv: len(kv[0]), reverse=True)

    def walk(x: Any, key: str | None = None) -> Any:
        if key is not None and isinstance(x, str) and x and is_secret_key(key):
            return REDACTED
        if isinstance(x, dict):
            return {k: walk(v, str(k)) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return scrub_secret_text(x, values, hide)
        return x

    return walk(obj)
