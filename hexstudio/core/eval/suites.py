"""Evaluation suites: JSONL files of cases, checked before anything runs.

A suite is one JSON object a line. An optional first line `{"suite": {...}}` names it (name, title,
description, default scorer, max_tokens); every other line is a case:

    {"id": "simple-weather",                         # unique in the suite (default: its line number)
     "prompt": "What's the weather in Lyon?",         # or "messages": [{"role": ..., "content": ...}, ...]
     "tools": [{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}],
     "expected": {"calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}]}
                 | {"abstain": true} | {"answer": "Paris"},
     "scorer": "tool_call" | "exact" | "contains" | "regex" | "instruction" | "perplexity" | "parity",
     "checks": [{"type": "max_words", "n": 12}, ...],   # instruction
     "text": "...",                                    # perplexity
     "max_tokens": 64, "category": "simple"}

Shipped suites are package data in hexstudio/core/eval/shipped_suites/ (importlib.resources); a user's own in <workspace>/suites/ (`hexstudio eval add FILE`,
or the Evaluate page's "Add suite…"). A suite with the same name as a shipped one replaces it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.shared.data import package_path
from hexstudio.shared.errors import ActionableError
from hexstudio.shared.records import fields_dict

SHIPPED_DIR = package_path("hexstudio.core.eval", "shipped_suites")  # package data (importlib.resources)
SCORERS = ("tool_call", "exact", "contains", "regex", "instruction", "perplexity", "parity")
DEFAULT_SUITES = ("tool_calling", "instruction_following", "perplexity", "greedy_parity")
# the field each check reads beside its type
CHECK_FIELDS = {
    "max_words": "n",
    "min_words": "n",
    "max_sentences": "n",
    "bullets": "n",
    "contains": "text",
    "not_contains": "text",
    "starts_with": "text",
    "ends_with": "text",
}
CHECK_TYPES = (
    "lowercase",
    "uppercase",
    "max_words",
    "min_words",
    "max_sentences",
    "bullets",
    "no_comma",
    "contains",
    "not_contains",
    "starts_with",
    "ends_with",
    "json",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_CASES = 5000


class SuiteError(ActionableError):
    """An evaluation suite file cannot be used: message and hint."""


@dataclass
class Case:
    id: str
    scorer: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    expected: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    text: str | None = None
    max_tokens: int = 64
    category: str | None = None

    def digest(self) -> str:
        """What the case asks, hashed: a finished case is reused on resume only while it is unchanged."""
        doc = {
            "scorer": self.scorer,
            "prompt": self.prompt,
            "messages": self.messages,
            "tools": self.tools,
            "text": self.text,
            "max_tokens": self.max_tokens,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Suite:
    name: str
    title: str
    description: str
    path: Path
    cases: list[Case]
    scorer: str
    shipped: bool

    @property
    def replaces_shipped(self) -> bool:
        """A user's suite with a shipped suite's name: runs that name it evaluate this one instead."""
        return not self.shipped and (SHIPPED_DIR / f"{self.name}.jsonl").is_file()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def summary(self) -> dict[str, Any]:
        told = fields_dict(self, ("name", "title", "description", "scorer"))
        return {**told, "cases": len(self.cases), "path": str(self.path), "shipped": self.shipped}


def _bad(path: Path, line: int, what: str, hint: str | None = None) -> SuiteError:
    return SuiteError(
        f"{path.name} line {line}: {what}",
        hint
        or "Fix that line (one JSON object a line; the "
        "format is in docs/evaluate.md), then add the suite again.",
    )


def _check_tools(path: Path, n: int, tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not tools:
        raise _bad(path, n, '"tools" must be a non-empty list of function definitions.')
    out = []
    for t in tools:
        f = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise _bad(
                path,
                n,
                'every tool needs a function name: {"type": "function", "function": '
                '{"name": ..., "parameters": {...}}}.',
            )
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise _bad(path, n, f'tool {f["name"]!r}: "parameters" must be a JSON schema object.')
        required = params.get("required") or []
        if not isinstance(params.get("properties") or {}, dict) or not (
            isinstance(required, list) and all(isinstance(k, str) for k in required)
        ):
            raise _bad(
                path,
                n,
                f'tool {f["name"]!r}: "properties" must be an object and "required" a list of parameter names.',
            )
        out.append({"type": "function", "function": {**f, "parameters": params}})
    return out


def _check_texts(path: Path, n: int, prompt: str | None, messages: list[dict[str, Any]] | None) -> None:
    """What the case asks, as Genie can take it (hexstudio.core.genie.session.check_message): no NUL character in
    any text, and a prompt that asks something (a blank one is an empty query in plain completion). Either passed
    here, then failed on the board at every run."""
    texts = [('"prompt"', prompt)] + [
        (f"the content of message {i} ({m['role']})", m.get("content"))
        for i, m in enumerate(messages or [], 1)
    ]
    for where, text in texts:
        if isinstance(text, str) and "\x00" in text:
            raise _bad(
                path,
                n,
                f"{where} holds a NUL character (\\u0000): Genie would see only the text before it.",
                "Remove the \\u0000 from that text, then add the suite again.",
            )
    if messages is None and prompt is not None and not prompt.strip():
        raise _bad(
            path,
            n,
            '"prompt" is blank: the model would be asked nothing.',
            'Write the question in "prompt" (or the chat in "messages"), then add the suite again.',
        )


def _check_expected_arguments(path: Path, n: int, call: dict[str, Any], params: dict[str, Any]) -> None:
    """An expected call the tool's schema allows, as the scorer reads it (toolcall.match_call): a call with an
    argument the schema does not name, or without one it requires, can never be scored right."""
    props = params.get("properties") or {}
    args = call.get("arguments") or {}
    for k in args:
        if props and k not in props:
            raise _bad(
                path,
                n,
                f"the expected call {call['name']!r} passes {k!r}, which is not among the tool's parameters "
                f"({', '.join(props)}).",
                f'Name one of the tool\'s parameters, or add {k!r} to its "properties".',
            )
    for k in params.get("required") or []:
        if k not in args:
            raise _bad(
                path,
                n,
                f"the expected call {call['name']!r} leaves out {k!r}, which the tool requires.",
                f'Add {k!r} to the expected call\'s "arguments", or take it out of the tool\'s "required".',
            )


def _case(path: Path, n: int, doc: dict[str, Any], default_scorer: str | None, default_max: int) -> Case:
    scorer = doc.get("scorer", default_scorer)
    if scorer is None:
        raise _bad(
            path,
            n,
            "no scorer: neither the suite's header nor this case says how to score it.",
            f'Set "scorer" in the header line ({{"suite": {{"name": ..., "scorer": ...}}}}) or in the case; one of: '
            f"{', '.join(SCORERS)}.",
        )
    if scorer not in SCORERS:
        raise _bad(path, n, f"unknown scorer {scorer!r}.", f"Use one of: {', '.join(SCORERS)}.")
    cid = str(doc.get("id", f"line-{n}"))
    prompt, messages, text = doc.get("prompt"), doc.get("messages"), doc.get("text")
    if scorer == "perplexity" and (not isinstance(text, str) or len(text.split()) < 3):
        raise _bad(path, n, 'a perplexity case needs "text" (a passage of at least a few words).')
    if scorer != "perplexity" and prompt is None and messages is None:
        raise _bad(path, n, 'a case needs "prompt" (text) or "messages" (a chat).')
    if prompt is not None and not isinstance(prompt, str):
        raise _bad(path, n, '"prompt" must be text.')
    if messages is not None and (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant", "tool") for m in messages
        )
    ):
        raise _bad(
            path,
            n,
            '"messages" must be a list of {"role": system|user|assistant|tool, "content": ...} objects.',
        )
    if scorer != "perplexity":
        _check_texts(path, n, prompt, messages)
    tools = _check_tools(path, n, doc["tools"]) if doc.get("tools") is not None else None
    expected = doc.get("expected") or {}
    if not isinstance(expected, dict):
        raise _bad(
            path, n, '"expected" must be an object: {"calls": [...]}, {"abstain": true} or {"answer": ...}.'
        )
    if scorer == "tool_call":
        if tools is None:
            raise _bad(path, n, 'a tool_call case needs "tools".')
        calls = expected.get("calls")
        if not expected.get("abstain") and not (
            isinstance(calls, list)
            and calls
            and all(
                isinstance(c, dict)
                and isinstance(c.get("name"), str)
                and isinstance(c.get("arguments", {}), dict)
                for c in calls
            )
        ):
            raise _bad(
                path,
                n,
                'a tool_call case expects {"calls": [{"name": ..., "arguments": {...}}]} or '
                '{"abstain": true}.',
            )
        params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        for c in calls or []:
            if c["name"] not in params:
                raise _bad(
                    path,
                    n,
                    f"the expected call {c['name']!r} is not among the case's tools "
                    f"({', '.join(sorted(params))}).",
                )
            _check_expected_arguments(path, n, c, params[c["name"]])
    if scorer in ("exact", "contains", "regex") and not isinstance(expected.get("answer"), (str, list)):
        raise _bad(path, n, f'a {scorer} case needs {{"expected": {{"answer": "..."}}}}.')
    if scorer == "regex":
        for a in expected["answer"] if isinstance(expected["answer"], list) else [expected["answer"]]:
            try:
                re.compile(str(a))
            except re.error as exc:
                raise _bad(path, n, f"the expected regex {a!r} does not compile: {exc}.") from None
    checks = doc.get("checks") or []
    if scorer == "instruction":
        if not isinstance(checks, list) or not checks:
            raise _bad(path, n, 'an instruction case needs "checks", e.g. [{"type": "max_words", "n": 12}].')
        for c in checks:
            if not isinstance(c, dict) or c.get("type") not in CHECK_TYPES:
                raise _bad(path, n, f"unknown check {c!r}.", f"Checks are: {', '.join(CHECK_TYPES)}.")
            # what each check reads (a check without it was accepted, then scored every case wrong)
            need = CHECK_FIELDS.get(c["type"])
            if need == "n" and not (
                isinstance(c.get("n"), int) and not isinstance(c.get("n"), bool) and c["n"] > 0
            ):
                raise _bad(path, n, f'the check {c["type"]} needs "n", a whole number above 0: {c!r}.')
            if need == "text" and not (isinstance(c.get("text"), str) and c["text"]):
                raise _bad(path, n, f'the check {c["type"]} needs "text", a non-empty string: {c!r}.')
            if c["type"] == "ends_with" and not str(c.get("text", "")).rstrip(".!? "):
                raise _bad(
                    path,
                    n,
                    f"the check ends_with needs text besides end punctuation (any reply ends so): {c!r}.",
                )
            keys = c.get("keys")
            if (
                c["type"] == "json"
                and keys is not None
                and not (isinstance(keys, list) and all(isinstance(k, str) and k for k in keys))
            ):
                raise _bad(
                    path, n, f'the check json takes "keys" as a list of names, e.g. ["name", "age"]: {c!r}.'
                )
    mt = doc.get("max_tokens", default_max)
    if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= 4096:
        raise _bad(path, n, '"max_tokens" must be a whole number from 1 to 4096.')
    return Case(
        id=cid,
        scorer=scorer,
        prompt=prompt,
        messages=messages,
        tools=tools,
        expected=expected,
        checks=checks,
        text=text,
        max_tokens=mt,
        category=str(doc["category"]) if doc.get("category") is not None else None,
    )


def _header_max_tokens(path: Path, header: dict[str, Any]) -> int:
    mt = header.get("max_tokens", 64)
    if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= 4096:
        raise SuiteError(
            f'{path.name}: the suite\'s "max_tokens" is {mt!r}; it must be a whole number from 1 to 4096.',
            'Fix {"suite": {"max_tokens": ...}} on the first line.',
        )
    return mt


def load_suite(path: Path, *, shipped: bool = False) -> Suite:
    """Read and check a suite file; SuiteError names the line and what is wrong with it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SuiteError(f"Cannot read {path}: {exc.strerror or exc}.", "Check the path.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SuiteError(
            f"{path.name} is not UTF-8 text (byte {exc.start}).", "Save it as UTF-8 JSONL."
        ) from None
    header: dict[str, Any] = {}
    cases: list[Case] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _bad(path, n, f"not valid JSON ({exc.msg} at column {exc.colno}).") from None
        if not isinstance(doc, dict):
            raise _bad(path, n, "each line must be a JSON object.")
        if "suite" in doc and not cases and not header:
            if not isinstance(doc["suite"], dict):
                raise _bad(
                    path, n, '"suite" must be an object (name, title, description, scorer, max_tokens).'
                )
            header = doc["suite"]
            continue
        c = _case(path, n, doc, header.get("scorer"), _header_max_tokens(path, header))
        if c.id in seen:
            raise _bad(path, n, f"the case id {c.id!r} is used twice.", 'Give every case its own "id".')
        seen.add(c.id)
        cases.append(c)
        if len(cases) > MAX_CASES:
            raise SuiteError(f"{path.name} has more than {MAX_CASES} cases.", "Split it into smaller suites.")
    if not cases:
        raise SuiteError(f"{path.name} has no cases.", "Add one JSON object a line (docs/evaluate.md).")
    name = str(header.get("name") or path.stem)
    if not _NAME.match(name):
        raise SuiteError(
            f"The suite name {name!r} is not usable (letters, digits, '_', '-', '.'; 64 at most).",
            'Rename the file or set {"suite": {"name": ...}} on its first line.',
        )
    scorers = {c.scorer for c in cases}
    # a suite's score adds its cases up one way: right answers over cases, a perplexity over all tokens, or a
    # parity over all compared tokens; cases of two of these kinds cannot make one figure
    kinds = sorted({sc if sc in ("perplexity", "parity") else "accuracy" for sc in scorers})
    if len(kinds) > 1:
        raise SuiteError(
            f"{path.name} mixes {' and '.join(kinds)} cases: their scores cannot be added up into one figure.",
            "Put the perplexity and the parity cases each in a suite of their own (cases that are right or "
            "wrong, whatever their scorer, can share one).",
        )
    return Suite(
        name=name,
        title=str(header.get("title") or name),
        description=str(header.get("description") or ""),
        path=path,
        cases=cases,
        # from the cases themselves: the header's scorer is only their default
        scorer=scorers.pop() if len(scorers) == 1 else "mixed",
        shipped=shipped,
    )


def user_dir(workspace_root: Path) -> Path:
    return Path(workspace_root) / "suites"


def available(workspace_root: Path | None) -> dict[str, Path]:
    """Suite name -> file: the shipped ones, then the user's (which replace a shipped one of the same name)."""
    out = {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.jsonl"))}
    if workspace_root is not None and user_dir(workspace_root).is_dir():
        out.update({p.stem: p for p in sorted(user_dir(workspace_root).glob("*.jsonl"))})
    return out


def load_found(path: Path) -> Suite:
    """A suite `available()` found: shipped or the user's, as its folder says."""
    return load_suite(path, shipped=path.parent == SHIPPED_DIR)


def load_named(names: list[str] | tuple[str, ...], workspace_root: Path | None) -> list[Suite]:
    found = available(workspace_root)
    out = []
    for n in names:
        if n not in found:
            raise SuiteError(
                f"No suite named {n!r}.",
                f"Suites here: {', '.join(sorted(found))}. Add one with `hexstudio eval add FILE`.",
            )
        out.append(load_found(found[n]))
    return out


def add_suite(src: Path, workspace_root: Path, *, replace: bool = False) -> Suite:
    """Check a suite file and copy it into the workspace's suites folder, named after the suite."""
    suite = load_suite(src)
    dest_dir = user_dir(workspace_root)
    dest = dest_dir / f"{suite.name}.jsonl"
    if dest.exists() and not replace and dest.read_bytes() != Path(src).read_bytes():
        raise SuiteError(
            f"A suite named {suite.name!r} was already added ({dest}).",
            "Pass --replace to replace it, or give this one another name.",
        )
    if not dest.exists() and not replace and (SHIPPED_DIR / dest.name).is_file():
        # a user suite of a shipped suite's name takes its place in every run that evaluates it by name
        raise SuiteError(
            f"HexStudio ships a suite named {suite.name!r}; yours would be used in its place"
            + (" by every run's default Evaluate." if suite.name in DEFAULT_SUITES else "."),
            "Pass --replace to use yours instead of the shipped one, or give yours another name.",
        )
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".jsonl.tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dest)
    return load_suite(dest)
