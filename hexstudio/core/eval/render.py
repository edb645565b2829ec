"""A case's prompt as Genie gets it: rendered with the model's own chat template, tool definitions included
where the template takes them (hexstudio.shared.chat_template), without the BOS Genie pushes itself.

The same text goes to the board and to both host legs, so the three legs see identical tokens."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexstudio.core.eval.suites import Case
from hexstudio.core.eval.toolcall import detect_format
from hexstudio.core.genie.prompts import chat_format_for, template_for
from hexstudio.shared.chat_template import ChatFormat

GENERIC_TOOLS = (
    "You can call these functions:\n{tools}\n\nTo call one or more, reply with only JSON: "
    '{{"name": <function name>, "arguments": {{...}}}} (a list for several calls). If none of '
    "them fits, answer in plain text."
)


@dataclass
class PromptRenderer:
    template: str  # model | plain | qa | llama3 | nemotron
    fmt: ChatFormat
    tool_format: str
    model_name: str = ""

    @classmethod
    def for_model(cls, model_dir: Path | None, template: str = "auto") -> PromptRenderer:
        t = template_for(model_dir) if template == "auto" else template
        fmt = chat_format_for(model_dir)
        name = ""
        if model_dir is not None:
            try:
                name = str(json.loads((model_dir / "model.json").read_text()).get("model", ""))
            except (OSError, ValueError):
                pass
        # the model's own call format where its template takes the tools; otherwise the prompt asks for bare JSON
        # in words (GENERIC_TOOLS), and bare JSON is what is parsed
        native = t == "model" and fmt.mode == "model" and fmt.supports_tools
        tool_fmt = detect_format(fmt.template, name) if native else "json"
        return cls(t, fmt, tool_fmt, name)

    def label(self) -> str:
        if self.template == "model":
            return self.fmt.label(False)
        return {"qa": "the built-in model's Question/Answer format", "plain": "plain completion"}.get(
            self.template, self.template
        )

    def _messages(self, case: Case) -> list[dict[str, Any]]:
        if case.messages is not None:
            return [dict(m) for m in case.messages]
        return [{"role": "user", "content": case.prompt or ""}]

    def _model_inputs(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
        """What the model's own template renders: tools it cannot show said in the system text, thinking off
        by the template's switch."""
        if tools and not self.fmt.supports_tools:
            # the template cannot show tools: say them in the system text
            msgs = _with_tool_system(msgs, tools)
            tools = None
        thinking: dict[str, Any] = (
            {"enable_thinking": False} if self.fmt.thinking_switch == "enable_thinking" else {}
        )
        if self.fmt.thinking_switch == "system" and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": "detailed thinking off"}, *msgs]
        return msgs, tools, thinking

    def continuation(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
        """The last user message of `msgs` alone, as a later query of a Genie dialog that holds the rest as
        `prompt` rendered it (the same tools and thinking switch); None when the model's template is not in use
        or `msgs` is not (system,) user/assistant pairs and a user message."""
        if self.template != "model" or self.fmt.mode != "model" or not msgs or msgs[-1]["role"] != "user":
            return None
        msgs, tools, thinking = self._model_inputs(msgs, tools)
        system = "".join(str(m["content"]) for m in msgs if m["role"] == "system")
        rest = [m for m in msgs[:-1] if m["role"] != "system"]
        if len(rest) % 2 or any(
            a["role"] != "user" or b["role"] != "assistant"
            for a, b in zip(rest[::2], rest[1::2], strict=True)
        ):
            return None
        turns = [(str(a["content"]), str(b["content"])) for a, b in zip(rest[::2], rest[1::2], strict=True)]
        try:
            return self.fmt.genie_continuation(
                turns, str(msgs[-1]["content"]), system=system, tools=tools, **thinking
            )
        except Exception:
            return None

    def prompt(self, case: Case) -> str:
        msgs = self._messages(case)
        tools = case.tools
        if self.template == "model" and self.fmt.mode == "model":
            msgs, tools, thinking = self._model_inputs(msgs, tools)
            text = self.fmt.render(msgs, add_generation_prompt=True, tools=tools, **thinking)
            return self.fmt.strip_bos(text)
        # no chat template in use: tools in words, the conversation in the model's format turn by turn
        if tools:
            msgs = _with_tool_system(msgs, tools)
        return _fallback_prompt(msgs, self.template)


def _text(m: dict[str, Any]) -> str:
    """A message's text; an assistant turn that only called tools says its calls as the JSON it was asked for."""
    text = str(m.get("content") or "")
    calls = m.get("tool_calls")
    if not text and m["role"] == "assistant" and isinstance(calls, list):
        text = json.dumps([c.get("function", c) for c in calls if isinstance(c, dict)], ensure_ascii=False)
    return text


def _fallback_prompt(msgs: list[dict[str, Any]], template: str) -> str:
    """The whole conversation in a hand-written format (`plain`, `qa`, `llama3`, `nemotron`): every turn in
    order, the assistant's earlier replies included, ending where the model's next reply starts. Tool results
    are the user's turns (these formats have no role of their own for them)."""
    system = "\n".join(_text(m) for m in msgs if m["role"] == "system")
    turns = [
        ("assistant" if m["role"] == "assistant" else "user", _text(m)) for m in msgs if m["role"] != "system"
    ]
    if template == "plain":
        return "\n\n".join(([system] if system else []) + [t for _, t in turns])
    if template == "qa":
        qa = " ".join(
            f"Answer: {t.strip()}" if role == "assistant" else f"Question: {t}" for role, t in turns
        )
        ask = "" if turns and turns[-1][0] == "assistant" else " Answer:"
        return (system + "\n" if system else "") + qa + ask
    nemotron = template.startswith("nemotron")
    head = system
    if nemotron:
        # Llama-Nemotron's system text is its reasoning switch, and its model card asks for every instruction in
        # the user's turn: the system text goes before the first one
        head = "detailed thinking off"
        if system:
            first = next((i for i, (role, _) in enumerate(turns) if role == "user"), None)
            if first is None:
                turns.insert(0, ("user", system))
            else:
                turns[first] = ("user", f"{system}\n\n{turns[first][1]}")
    text = f"<|start_header_id|>system<|end_header_id|>\n\n{head}<|eot_id|>"
    for role, t in turns:
        text += f"<|start_header_id|>{role}<|end_header_id|>\n\n{t}<|eot_id|>"
    text += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    return text + "<think>\n</think>\n" if nemotron else text


def _with_tool_system(msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = GENERIC_TOOLS.format(tools=json.dumps([t["function"] for t in tools], ensure_ascii=False))
    if msgs and msgs[0]["role"] == "system":
        return [{"role": "system", "content": f"{msgs[0].get('content') or ''}\n\n{text}"}, *msgs[1:]]
    return [{"role": "system", "content": text}, *msgs]
