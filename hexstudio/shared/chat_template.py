"""The model's own chat template, rendered exactly as transformers' `apply_chat_template` renders it, and
the prompts Genie needs from it. Shared by the studio (chat, evaluation) and the simulator board's GenieX
face, which applies the template as GenieX's qairt plugin does (hexstudio/workers/genie_sim/geniex_model.py).

Rendering (transformers `utils/chat_template_utils.py`): a jinja2 ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks and the loopcontrols extension (plus transformers' `{% generation %}`
block, rendered as its body), the `tojson` filter replaced by json.dumps (ensure_ascii=False, with its
indent/separators/sort_keys options), the globals `raise_exception` and `strftime_now`; the template
sees `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's special tokens
(`bos_token`, `eos_token`, ...) as strings and any extra template variables (e.g. `enable_thinking`).
The template comes from `chat_template.jinja` when the model folder has one (what transformers saves
since 4.43), else tokenizer_config.json's `chat_template` (a string, or a list of named templates:
"default", or "tool_use" when tools are given).

Genie (facts/genie.md; hexstudio/workers/genie_sim/t2t.py is its twin): when the dialog's bos-token is >= 0 it
pushes BOS before every query, and on a later query of the same dialog it first pushes an EOS (the
reply's end was sampled, not fed back). So the first prompt is the rendered conversation without the
BOS text the template writes, and a later turn sends only what the template puts after the previous
reply's text, less the end-of-turn token Genie supplies as that EOS.

Stop conditions come from generation_config.json (`eos_token_id`, int or list; `stop_strings`) with
config.json's eos_token_id and the tokenizer's eos_token as fallbacks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SENTINEL = "\u2063HEXSTUDIO-REPLY-END\u2063"  # marks where the previous reply's text ends in a render


class ChatTemplateError(ActionableError):
    """The template refused the conversation (its raise_exception) or is not valid Jinja."""


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def added_bos(tc: dict[str, Any]) -> str | None:
    """The BOS the tokenizer adds before a text (tokenizer_config.json), or None: its bos_token, unless that is null
    or `add_bos_token` is false. A tokenizer that names a BOS but does not add it (its chat template writes the BOS
    where the model wants one, or never) must not get one from Genie before every query."""
    return None if tc.get("add_bos_token") is False else token_text(tc.get("bos_token"))


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        """transformers' `{% generation %}...{% endgeneration %}` (assistant-mask tracking): the body as is."""

        tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension declares it so)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env, env.from_string(source)


def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads from outside (messages, tools, enable_thinking, ...)."""
    from jinja2 import meta

    env, _ = _compile(source)
    return frozenset(meta.find_undeclared_variables(env.parse(source)))


@dataclass
class ChatFormat:
    """How to turn a conversation into Genie's query text for one model."""

    mode: str  # "model" (its chat template) | "plain" (completion)
    template: str | None = None
    source: str = ""  # where the template came from (a file name)
    named: dict[str, str] = field(default_factory=dict)  # other named templates (e.g. tool_use)
    special: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... as text
    eos_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    genie_bos: bool = True  # Genie pushes BOS before each query (bos-token >= 0)
    name: str = ""  # the model's name, for the label

    @property
    def variables(self) -> frozenset[str]:
        return template_variables(self.template) if self.template else frozenset()

    @property
    def thinking_switch(self) -> str | None:
        """'enable_thinking' (Qwen3-style template variable), 'system' (Nemotron's "detailed thinking on/off"
        system text) or None."""
        if self.template is None:
            return None
        if "enable_thinking" in self.variables:
            return "enable_thinking"
        if "detailed thinking" in self.template:
            return "system"
        return None

    @property
    def supports_tools(self) -> bool:
        return "tools" in self.variables or "tool_use" in self.named

    def label(self, thinking: bool | None = None) -> str:
        if self.mode != "model":
            return "plain completion (no chat template)"
        what = f"{self.name}'s chat template" if self.name else "the model's chat template"
        text = f"{what} ({self.source})"
        if self.thinking_switch and thinking is not None:
            text += f" · thinking {'on' if thinking else 'off'}"
        return text

    # -- rendering ---------------------------------------------------------------------------------
    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """Exactly what transformers' apply_chat_template(messages, tokenize=False, ...) returns."""
        if self.mode != "model" or self.template is None:
            return "".join(str(m.get("content", "")) for m in messages)
        source = self.named.get("tool_use", self.template) if tools is not None else self.template
        _, tpl = _compile(source)
        import jinja2

        try:
            return str(
                tpl.render(
                    messages=[_alias_reasoning(dict(m)) for m in messages],
                    tools=tools,
                    documents=documents,
                    add_generation_prompt=add_generation_prompt,
                    **{**self.special, **variables},
                )
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.label()}: {exc}") from None

    def _messages(
        self,
        turns: list[tuple[str, str]],
        user: str,
        system: str,
        thinking: bool | None,
        variables: dict[str, Any],
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and template variables for the conversation, with the template's thinking switch set."""
        opts = dict(variables)
        if thinking is not None and self.thinking_switch == "enable_thinking":
            opts.setdefault("enable_thinking", thinking)
        if thinking is not None and self.thinking_switch == "system":
            # Llama-Nemotron's system text is its reasoning switch, and its model card asks for every instruction in
            # the user's turn: the user's system text goes before the first one (core/eval/render.py does the same)
            if system and turns:
                turns = [(f"{system}\n\n{turns[0][0]}", turns[0][1]), *turns[1:]]
            elif system:
                user = f"{system}\n\n{user}"
            system = "detailed thinking on" if thinking else "detailed thinking off"
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for u, r in turns:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": r}]
        msgs.append({"role": "user", "content": user})
        return msgs, opts

    def genie_prompt(
        self,
        turns: list[tuple[str, str]],
        user: str,
        *,
        system: str = "",
        thinking: bool | None = None,
        tools: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """A fresh dialog's query: the conversation so far (`turns` = (user, reply) pairs) and the new message,
        rendered with the generation prompt, without the BOS text Genie pushes itself."""
        if self.mode != "model":
            return "".join(f"{u}{r}" for u, r in turns) + user
        msgs, opts = self._messages(turns, user, system, thinking, variables)
        text = self.render(msgs, add_generation_prompt=True, tools=tools, **opts)
        return self.strip_bos(text)

    def genie_continuation(
        self,
        turns: list[tuple[str, str]],
        user: str,
        *,
        system: str = "",
        thinking: bool | None = None,
        tools: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """A later query of the same dialog: only what the template puts after the last reply's text (the
        KV cache holds everything before), less the end-of-turn token Genie pushes as EOS, and less a BOS
        the template writes there (Genie pushes that too)."""
        if not turns:
            return self.genie_prompt(turns, user, system=system, thinking=thinking, tools=tools, **variables)
        if self.mode != "model":
            return user
        marked = [*turns[:-1], (turns[-1][0], turns[-1][1] + _SENTINEL)]
        msgs, opts = self._messages(marked, user, system, thinking, variables)
        text = self.render(msgs, add_generation_prompt=True, tools=tools, **opts)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ChatTemplateError(
                f"{self.label()} drops the previous reply's text: a later turn cannot be sent "
                "alone (start a new chat, or use per-turn mode)"
            )
        rest = text[at + len(_SENTINEL) :]
        eos = self.special.get("eos_token")
        for end in [t for t in (eos, *self.eot_texts()) if t]:
            if rest.startswith(end):
                rest = rest[len(end) :]
                break
        return self.strip_bos(rest)

    def eot_texts(self) -> list[str]:
        """Texts that end a turn in this template and are among the model's EOS tokens (e.g. <|eot_id|>,
        <|im_end|>): what Genie's pushed EOS stands for."""
        return [
            t
            for t in ("<|eot_id|>", "<|im_end|>", "<|end|>", "</s>", "<|endoftext|>", "<end_of_turn>")
            if self.template and t in self.template
        ]

    def strip_bos(self, text: str) -> str:
        """`text` without a leading BOS text when the runtime pushes BOS itself."""
        bos = self.special.get("bos_token")
        if self.genie_bos and bos and text.startswith(bos):
            return text[len(bos) :]
        return text


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """As transformers: a message's reasoning under `reasoning_content` (and `thinking`) from older names."""
    for key in ("reasoning_content", "thinking", "reasoning"):
        if message.get(key) is not None:
            return {"thinking": message[key], **message, "reasoning_content": message[key]}
    return message


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def load_chat_format(hf_dir: Path | None, *, name: str = "", genie_bos: bool | None = None) -> ChatFormat:
    """The model's chat format from its folder (tokenizer_config.json, chat_template.jinja,
    generation_config.json, config.json); "plain" when it has no chat template (a base model)."""
    if hf_dir is None:
        return ChatFormat(mode="plain", name=name)
    tc = read_json_object(hf_dir / "tokenizer_config.json")
    gc = read_json_object(hf_dir / "generation_config.json")
    cfg = read_json_object(hf_dir / "config.json")
    special = {k: t for k in SPECIAL_TOKENS if (t := token_text(tc.get(k))) is not None}
    eos_ids = _ids(gc.get("eos_token_id")) or _ids(cfg.get("eos_token_id"))
    stops = (
        [s for s in (gc.get("stop_strings") or []) if isinstance(s, str)]
        if isinstance(gc.get("stop_strings"), list)
        else ([gc["stop_strings"]] if isinstance(gc.get("stop_strings"), str) else [])
    )
    if genie_bos is None:
        bos_id = cfg.get("bos_token_id", gc.get("bos_token_id"))
        genie_bos = isinstance(bos_id, int) and bos_id >= 0 and added_bos(tc) is not None
    template, source, named = None, "", {}
    jinja = hf_dir / "chat_template.jinja"
    if jinja.is_file():
        template, source = jinja.read_text(encoding="utf-8"), "chat_template.jinja"
    ct = tc.get("chat_template")
    if template is None and isinstance(ct, str):
        template, source = ct, "tokenizer_config.json"
    elif template is None and isinstance(ct, list):
        named = {
            str(t["name"]): str(t["template"])
            for t in ct
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        }
        if "default" in named:
            template, source = named.pop("default"), "tokenizer_config.json (default)"
    if template is None:
        return ChatFormat(
            mode="plain",
            special=special,
            eos_token_ids=eos_ids,
            stop_strings=stops,
            genie_bos=bool(genie_bos),
            name=name,
        )
    return ChatFormat(
        mode="model",
        template=template,
        source=source,
        named=named,
        special=special,
        eos_token_ids=eos_ids,
        stop_strings=stops,
        genie_bos=bool(genie_bos),
        name=name,
    )
