"""Model-native tool calling: which format a model writes its calls in, parsing a reply in that format,
and BFCL-style AST matching of the parsed calls against the expected ones.

Formats (as each model's own chat template and model card define them):
- `llama3`  Llama 3.1/3.2/3.3: a JSON object `{"name": ..., "parameters": {...}}` as the whole reply
            (several separated by ";" or new lines), or after `<|python_tag|>` (built-in tools, also
            `tool.call(arg=...)`), ending with `<|eom_id|>` / `<|eot_id|>`;
- `nemotron` Llama-Nemotron: `<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>`;
- `qwen`    Qwen2.5/Qwen3 (Hermes style): one `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
            a call;
- `mistral` `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (v3 tokenizer) or
            `[TOOL_CALLS]name[ARGS]{...}` or `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` (v11+);
- `json`    no native format known (e.g. the built-in toy model): a bare JSON object or list of them.

A reply is `calls` (parsed), `none` (a plain answer: no call attempted) or `malformed` (it started a
call but the call cannot be read): malformed is scored wrong and reported as such, never raised.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexstudio.shared.families import families

FORMATS = ("llama3", "nemotron", "qwen", "mistral", "json")


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class Parsed:
    kind: str  # calls | none | malformed
    calls: list[Call] = field(default_factory=list)
    error: str | None = None
    content: str = ""  # the text outside the calls

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "calls": [c.as_json() for c in self.calls], "error": self.error}


# model-name pieces of formats that are no model family's (fine-tunes of one): a family's own are its
# ModelFamily.tool_calls.name_hints (hexstudio.shared.families)
_NAME_HINTS = {"nemotron": ("nemotron",), "qwen": ("hermes",)}
# the first whose template marker matches wins; only a template without any marker falls back to the name hints
_DETECT_ORDER = ("nemotron", "qwen", "mistral", "llama3")


def _template_marks(fmt: str, t: str) -> bool:
    if fmt == "nemotron":
        return "<TOOLCALL>" in t
    if fmt == "qwen":
        return "<tool_call>" in t
    if fmt == "mistral":
        return "[TOOL_CALLS]" in t
    if fmt == "llama3":
        return "<|python_tag|>" in t or ("<|start_header_id|>" in t and "tools" in t)
    return False


def _name_hints(fmt: str) -> tuple[str, ...]:
    own = tuple(
        h for f in families() if f.tool_calls and f.tool_calls.format == fmt for h in f.tool_calls.name_hints
    )
    return _NAME_HINTS.get(fmt, ()) + own


def detect_format(template: str | None, model_name: str = "") -> str:
    """The tool-call format from the model's chat template (its markers), else from its name (the model
    families' name hints). Every marker is tried before any name: a fine-tune keeps its base's template under
    another family's name (nvidia/OpenReasoning-Nemotron-7B is a Qwen2.5 that writes <tool_call>)."""
    t = template or ""
    name = model_name.lower()
    for fmt in _DETECT_ORDER:
        if _template_marks(fmt, t):
            return fmt
    for fmt in _DETECT_ORDER:
        if any(h in name for h in _name_hints(fmt)):
            return fmt
    return "json"


_END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|im_end|>", "</s>", "<|end_of_text|>", "<|endoftext|>")


def _strip_end(text: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for t in _END_TOKENS:
            if text.endswith(t):
                text = text[: -len(t)].rstrip()
                changed = True
    return text


def _as_call(obj: Any) -> Call:
    if not isinstance(obj, dict):
        raise ValueError(f"a call must be a JSON object, not {type(obj).__name__}")
    if obj.get("type") == "function" and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("the call has no function name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError(f"the arguments of {name!r} are not an object")
    return Call(name, args)


def _json_calls(text: str) -> list[Call]:
    """One JSON value (an object or a list of objects), or several objects separated by ';' or new lines."""
    text = text.strip()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        dec = json.JSONDecoder()
        docs: list[Any] = []
        i = 0
        while i < len(text):
            while i < len(text) and text[i] in " \t\r\n;,":
                i += 1
            if i >= len(text):
                break
            obj, i = dec.raw_decode(text, i)
            docs.append(obj)
        doc = docs
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise ValueError("an empty list of calls")
    return [_as_call(o) for o in items]


def _python_calls(text: str) -> list[Call]:
    """Llama 3.1's built-in tool syntax: `brave_search.call(query="...")` (or plain `f(a=1)`), one a line or
    separated by ";". The code is parsed whole: a ";" inside a string is part of the string."""
    calls = []
    for stmt in ast.parse(text.strip(), mode="exec").body:
        node = stmt.value if isinstance(stmt, ast.Expr) else None
        if not isinstance(node, ast.Call):
            raise ValueError("not a function call")
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "call" and isinstance(f.value, ast.Name):
            name = f.value.id
        elif isinstance(f, ast.Name):
            name = f.id
        else:
            raise ValueError("cannot read the function name")
        if node.args:
            raise ValueError("positional arguments: the call must name its arguments")
        calls.append(Call(name, {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}))
    if not calls:
        raise ValueError("no call")
    return calls


def _parse_llama3(text: str) -> Parsed:
    body = _strip_end(text)
    if "<|python_tag|>" in body:
        before, _, code = body.partition("<|python_tag|>")
        code = _strip_end(code)
        try:
            return Parsed("calls", _json_calls(code), content=before.strip())
        except (ValueError, json.JSONDecodeError):
            try:
                return Parsed("calls", _python_calls(code), content=before.strip())
            except (ValueError, SyntaxError) as exc:
                return Parsed("malformed", error=f"after <|python_tag|>: {exc}", content=before.strip())
    return _parse_bare_json(body)


def _parse_bare_json(body: str) -> Parsed:
    s = body.strip()
    if s.startswith("```"):  # a fenced JSON block
        s = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", s)
    if not (s.startswith("{") or re.match(r"\[\s*\{", s)):
        return Parsed("none", content=body)
    try:
        return Parsed("calls", _json_calls(s))
    except (ValueError, json.JSONDecodeError) as exc:
        return Parsed("malformed", error=f"a call in JSON that cannot be read: {exc}")


def _parse_nemotron(text: str) -> Parsed:
    body = _strip_end(text)
    if "<TOOLCALL>" not in body:
        return _parse_bare_json(body)
    before, _, rest = body.partition("<TOOLCALL>")
    inner, closed, _after = rest.partition("</TOOLCALL>")
    if not closed:
        return Parsed("malformed", error="<TOOLCALL> without </TOOLCALL>", content=before.strip())
    try:
        return Parsed("calls", _json_calls(inner), content=before.strip())
    except (ValueError, json.JSONDecodeError) as exc:
        return Parsed("malformed", error=f"inside <TOOLCALL>: {exc}", content=before.strip())


_QWEN = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


def _parse_qwen(text: str) -> Parsed:
    body = _strip_end(text)
    if "<tool_call>" not in body:
        return _parse_bare_json(body)
    calls = []
    content = body[: body.index("<tool_call>")].strip()
    for m in _QWEN.finditer(body):
        if not m.group(2):
            return Parsed("malformed", error="<tool_call> without </tool_call>", content=content)
        try:
            calls += _json_calls(m.group(1))
        except (ValueError, json.JSONDecodeError) as exc:
            return Parsed("malformed", error=f"inside <tool_call>: {exc}", content=content)
    return Parsed("calls", calls, content=content)


def _parse_mistral(text: str) -> Parsed:
    body = _strip_end(text)
    if "[TOOL_CALLS]" not in body:
        return _parse_bare_json(body)
    content, _, rest = body.partition("[TOOL_CALLS]")
    rest = rest.strip()
    try:
        if "[ARGS]" in rest:  # v11+: name[ARGS]{...}, repeated after [TOOL_CALLS]
            calls = []
            for part in [p for p in rest.split("[TOOL_CALLS]") if p.strip()]:
                head, _, args = part.partition("[ARGS]")
                name = head.partition("[CALL_ID]")[0]  # name[CALL_ID]id[ARGS]: the id is no part of the name
                a = json.loads(args.strip() or "{}")
                if not isinstance(a, dict):
                    raise ValueError("the arguments are not an object")
                calls.append(Call(name.strip(), a))
            if not all(c.name for c in calls):
                raise ValueError("a call has no function name")
            return Parsed("calls", calls, content=content.strip())
        return Parsed("calls", _json_calls(rest), content=content.strip())
    except (ValueError, json.JSONDecodeError) as exc:
        return Parsed("malformed", error=f"after [TOOL_CALLS]: {exc}", content=content.strip())


def parse_reply(text: str, fmt: str) -> Parsed:
    """The calls in a reply, in the model's own format. A reply without the format's marker that is a JSON call
    (or list of calls) still counts as one: the marker can be a special token a decoder drops, and a model asked
    in words (a template without tools) answers in bare JSON. Total: whatever the model wrote, the answer is a
    Parsed (a call that cannot be read is "malformed"), never an exception in the caller."""
    parser = _PARSERS.get(fmt)
    try:
        return parser(text) if parser is not None else _parse_bare_json(_strip_end(text))
    except (
        Exception
    ) as exc:  # any text at all: literal_eval's TypeError on {[1]: 2}, json's RecursionError on [[[...
        return Parsed("malformed", error=f"the call cannot be read: {type(exc).__name__}: {exc}"[:300])


_PARSERS: dict[str, Callable[[str], Parsed]] = {
    "llama3": _parse_llama3,
    "nemotron": _parse_nemotron,
    "qwen": _parse_qwen,
    "mistral": _parse_mistral,
}


def render_calls(calls: list[Call], fmt: str) -> str:
    """Calls written the way `fmt` writes them (for tests and for feeding an assistant turn back)."""
    items = [{"name": c.name, "arguments": c.arguments} for c in calls]
    if fmt == "llama3":
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls)
    if fmt == "nemotron":
        return f"<TOOLCALL>{json.dumps(items)}</TOOLCALL>"
    if fmt == "qwen":
        return "\n".join(f"<tool_call>\n{json.dumps(i)}\n</tool_call>" for i in items)
    if fmt == "mistral":
        return f"[TOOL_CALLS]{json.dumps(items)}"
    return json.dumps(items[0] if len(items) == 1 else items)


# -- AST matching (BFCL's checker, in spirit) ----------------------------------------------------------------


def _norm(v: Any) -> Any:
    if isinstance(v, str):
        return v.strip().lower()
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _norm(x) for k, x in v.items()}
    return v


def _value_ok(got: Any, want: Any) -> bool:
    if isinstance(want, dict) and "$any" in want:
        return any(_value_ok(got, w) for w in want["$any"] if w is not None)
    if isinstance(want, dict) and isinstance(got, dict):
        return set(got) == set(want) and all(_value_ok(got[k], want[k]) for k in want)
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want or (isinstance(got, str) and got.strip().lower() == str(want).lower())
    if isinstance(want, (int, float)) and isinstance(got, str):  # "12" for 12: a type slip BFCL counts wrong
        return False
    return bool(_norm(got) == _norm(want))


def _optional(want: Any) -> bool:
    return isinstance(want, dict) and "$any" in want and None in want["$any"]


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    t = schema.get("type")
    if t is None:
        return True
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    types = t if isinstance(t, list) else [t]
    return any(checks.get(x, lambda v: True)(value) for x in types)


def _enum_ok(value: Any, schema: dict[str, Any]) -> bool:
    """Whether the value is one of the schema's enum values, compared as values are (case and spaces aside)."""
    return "enum" not in schema or _norm(value) in [_norm(e) for e in schema["enum"]]


def match_call(got: Call, want: dict[str, Any], tools: list[dict[str, Any]]) -> str | None:
    """None when `got` matches the expected call; else why not."""
    if got.name != want["name"]:
        return f"called {got.name!r}, expected {want['name']!r}"
    schema = next(
        (t["function"].get("parameters") or {} for t in tools if t["function"]["name"] == got.name), {}
    )
    props = schema.get("properties") or {}
    for k in schema.get("required") or []:
        if k not in got.arguments:
            return f"{got.name}: the required argument {k!r} is missing"
    for k, v in got.arguments.items():
        if props and k not in props:
            return f"{got.name}: unknown argument {k!r}"
        if k in props and not _type_ok(v, props[k]):
            return f"{got.name}: {k}={v!r} does not fit the schema ({props[k].get('type')})"
        if k in props and not _enum_ok(v, props[k]):
            return f"{got.name}: {k}={v!r} is not one of the enum values {props[k]['enum']!r}"
    wargs = want.get("arguments") or {}
    for k, w in wargs.items():
        if k not in got.arguments:
            if _optional(w):
                continue
            return f"{got.name}: argument {k!r} is missing"
        if not _value_ok(got.arguments[k], w):
            return f"{got.name}: {k}={got.arguments[k]!r}, expected {_show(w)}"
    for k in got.arguments:
        if k not in wargs:
            return f"{got.name}: argument {k!r} was not expected"
    return None


def _show(w: Any) -> str:
    if isinstance(w, dict) and "$any" in w:
        return " or ".join("(omitted)" if x is None else repr(x) for x in w["$any"])
    return repr(w)


def score_tool_call(
    parsed: Parsed, expected: dict[str, Any], tools: list[dict[str, Any]]
) -> tuple[bool, str]:
    """(correct, why). Abstain cases are correct when no call was made; call cases need exactly the expected
    calls (any order for parallel calls), each matching by name and arguments."""
    if parsed.kind == "malformed":
        return False, f"malformed: {parsed.error}"
    if expected.get("abstain"):
        if parsed.kind == "none":
            return True, "abstained, as expected"
        return False, f"called {', '.join(c.name for c in parsed.calls)} where no tool fits"
    wants = list(expected.get("calls") or [])
    if parsed.kind == "none":
        return False, "no call made"
    if len(parsed.calls) != len(wants):
        return False, f"{len(parsed.calls)} call(s), expected {len(wants)}"
    why = [[match_call(got, w, tools) for w in wants] for got in parsed.calls]
    pairs = _pairing([[y is None for y in row] for row in why])
    if len(pairs) == len(wants):
        return True, "every call matches"
    # the pairing that matched the most calls: why its first call left over is not the expected one left over
    # (those two never fit, or they would have been paired)
    got = next(g for g in range(len(why)) if g not in pairs.values())
    return False, str(why[got][next(w for w in range(len(wants)) if w not in pairs)])


def _pairing(fits: list[list[bool]]) -> dict[int, int]:
    """The most calls paired with expected calls ({expected: call}), `fits[call][expected]` saying which pairs
    match. Every pairing is in reach: a call first paired with an expected call that a later call needs moves to
    another it fits (expected f(x=1 or 2) and f(x=1), and the calls f(x=1), f(x=2), pair across)."""
    pairs: dict[int, int] = {}

    def place(call: int, tried: set[int]) -> bool:
        for w, ok in enumerate(fits[call]):
            if ok and w not in tried:
                tried.add(w)
                if w not in pairs or place(pairs[w], tried):
                    pairs[w] = call
                    return True
        return False

    for call in range(len(fits)):
        place(call, set())
    return pairs
