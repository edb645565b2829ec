"""The requests `hexstudio serve` takes, as pydantic models: every field typed and bounded, so a bad value is a
400 in OpenAI's error shape (naming the field) before anything reaches the board's dialog.

Fields this server does not use (`user`, `logprobs`, `presence_penalty`, ...) are accepted and ignored, as
OpenAI clients send them. Sampler bounds are the ones Genie takes: a value outside them used to reach
GenieSampler_applyConfig / the dialog's reload and leave the server unable to answer (issue 27).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

MAX_SEED = 2**32 - 1  # Genie's sampler seed is an unsigned 32-bit number
MAX_TOKENS = 1 << 20
MAX_TOP_K = 100_000
MAX_STOPS = 4  # as OpenAI

Temperature = Annotated[float, Field(ge=0, le=2, strict=True)]
TopP = Annotated[float, Field(gt=0, le=1, strict=True)]
TopK = Annotated[StrictInt, Field(ge=0, le=MAX_TOP_K)]
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]
Tokens = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
Stops = StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_STOPS)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Request(_Open):
    model: StrictStr | None = None
    stream: StrictBool | None = None
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stops | None = None
    n: Literal[1] | None = None
    stream_options: dict[str, Any] | None = None


class ContentPart(_Open):
    type: StrictStr
    text: StrictStr | None = None


class FunctionDef(_Open):
    name: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None


class ChatRequest(_Request):
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: (
        Annotated[StrictStr, Field(min_length=1)]
        | Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1, max_length=1)]
    )


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[str]", "list[ContentPart]", "function-after", "constrained-str") or str(
            part
        ).startswith(("list[", "constrained", "literal[")):
            continue  # pydantic's name for a union member, not a field
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(param, a sentence for the client) for the first thing wrong in a request."""
    e = exc.errors(include_url=False)[0]
    param = _where(tuple(e.get("loc") or ()))
    got = e.get("input")
    shown = repr(got) if isinstance(got, (str, int, float, bool)) or got is None else type(got).__name__
    if len(shown) > 60:
        shown = shown[:57] + "..."
    msg = str(e.get("msg") or "invalid")
    if e.get("type") == "missing":
        return param, f"{param} is required"
    if param == "seed":
        msg = f"seed must be a whole number from 0 to {MAX_SEED}"
    return param, f"{param}: {msg} (got {shown})"
