"""A multi-turn conversation kept within the context length, rendered with the model's template.

Genie's one-shot runner gets the whole conversation as one prompt each turn; when history plus
the reply budget would not fit in the context length, the oldest turns are dropped and the
caller is told (`dropped_turns`), never silently truncated mid-turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from hexstudio.core.genie.prompts import LLAMA3
from hexstudio.core.units import fmt_ms, fmt_rate
from hexstudio.shared.chat_template import ChatFormat

# model: the model's own chat template (conversation.chat_format); plain: completion, the text as typed
TEMPLATES = ("auto", "model", "plain", "llama3", "nemotron-reasoning-off", "nemotron-reasoning-on", "qa")

_HEADER = "<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"


@dataclass
class Turn:
    user: str
    reply: str = ""
    kpis: dict[str, Any] = field(default_factory=dict)
    state: str = "pending"  # pending | complete | aborted | failed


def token_counter(model_hf_dir: Path | None) -> Callable[[str], int]:
    """Counts tokens with the model's tokenizer.json when there is one (tokenizers is light); else ~4
    characters a token, which overestimates for English and so stays on the safe side."""
    if model_hf_dir is not None and (model_hf_dir / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(model_hf_dir / "tokenizer.json"))
            return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
        except Exception:
            pass
    return lambda text: max(1, len(text) // 3)


@dataclass
class Conversation:
    # whether prompt_for renders the turns so far (a prompt that arrives rendered, as the server's and the
    # Evaluate stage's do, is sent as given: its history cannot be sent again from here)
    renders_history: ClassVar[bool] = True
    template: str = "llama3"
    system: str = ""
    context_length: int = 4096
    max_reply_tokens: int = 256
    turns: list[Turn] = field(default_factory=list)
    count_tokens: Callable[[str], int] = field(default=lambda t: max(1, len(t) // 3))
    dropped_turns: int = 0
    chat_format: ChatFormat | None = None  # the model's chat format, for the "model" and "plain" templates
    thinking: bool | None = None  # where the chat template has a thinking switch

    def _render(self, turns: list[Turn], user: str) -> str:
        t = self.template
        if t in ("model", "plain"):
            fmt = self.chat_format or ChatFormat(mode="plain")
            if t == "plain":
                fmt = ChatFormat(mode="plain")
            return fmt.genie_prompt(
                [(x.user, x.reply) for x in turns], user, system=self.system, thinking=self.thinking
            )
        if t == "qa":
            past = "".join(f"Question: {x.user} Answer:{x.reply} " for x in turns)
            return f"{past}Question: {user} Answer:"
        system = self.system
        suffix = ""
        if t.startswith("nemotron"):
            reasoning = t.endswith("on")
            # the system text is the reasoning switch: the user's goes before the first user message, as the model
            # card asks (ChatFormat does the same with the model's own template)
            if system and turns:
                turns = [replace(turns[0], user=f"{system}\n\n{turns[0].user}"), *turns[1:]]
            elif system:
                user = f"{system}\n\n{user}"
            system = "detailed thinking on" if reasoning else "detailed thinking off"
            suffix = "" if reasoning else "<think>\n</think>\n"
        if not turns:
            return LLAMA3.format(system=system, user=user) + suffix
        parts = [_HEADER.format(role="system", text=system)]
        for x in turns:
            parts.append(_HEADER.format(role="user", text=x.user))
            parts.append(_HEADER.format(role="assistant", text=x.reply))
        parts.append(_HEADER.format(role="user", text=user))
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
        return "".join(parts) + suffix

    def fewest_dropped(self, history: list[Turn], user: str, budget: int) -> tuple[int, str, int]:
        """(how many of the oldest turns go, the prompt without them, its tokens): the fewest that bring it within
        `budget`, all of them when none do. A binary search (fewer turns never render longer): a long chat is
        rendered and counted a dozen times, not once per turn dropped (seconds, on every keystroke of the reply
        budget and every send)."""
        lo, hi = 0, len(history)  # the answer is in [lo, hi]; `hi` turns dropped is the last resort
        known: dict[int, tuple[str, int]] = {}

        def fit(k: int) -> tuple[str, int]:
            if k not in known:
                text = self._render(history[k:], user)
                known[k] = (text, self.count_tokens(text))
            return known[k]

        while lo < hi:
            mid = (lo + hi) // 2
            if fit(mid)[1] <= budget:
                hi = mid
            else:
                lo = mid + 1
        return (lo, *fit(lo))

    def prompt_for(self, user: str) -> str:
        """The prompt for the next turn; drops the oldest complete turns until it fits."""
        history = [t for t in self.turns if t.state == "complete"]
        budget = self.context_length - self.max_reply_tokens
        dropped, text, tokens = self.fewest_dropped(history, user, budget)
        if tokens > budget:
            raise ValueError(
                f"This message alone is about {tokens} tokens; with a reply budget of "
                f"{self.max_reply_tokens} it does not fit in the context length "
                f"({self.context_length}). Shorten it or start a new chat."
            )
        self.dropped_turns = dropped
        return text

    def add(self, user: str) -> Turn:
        t = Turn(user)
        self.turns.append(t)
        return t

    def continuation(self, user: str) -> str:
        """A later turn of one dialog with the model's chat format: only the new turn's text."""
        fmt = self.chat_format if self.template == "model" and self.chat_format else ChatFormat(mode="plain")
        done = [(x.user, x.reply) for x in self.turns if x.state == "complete"]
        return fmt.genie_continuation(done, user, system=self.system, thinking=self.thinking)

    def as_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "system": self.system,
            "context_length": self.context_length,
            "turns": [
                {"user": t.user, "reply": t.reply, "state": t.state, "kpis": t.kpis} for t in self.turns
            ],
        }

    def as_markdown(self) -> str:
        out = [f"# Conversation ({self.template})", ""]
        if self.system:
            out += [f"_System_: {self.system}", ""]
        for t in self.turns:
            out += [f"**You**: {t.user}", "", f"**Model**: {t.reply}", ""]
            if t.kpis:
                k = t.kpis
                out += [
                    f"_TTFT {fmt_ms(k.get('ttft_ms'))} ms, prompt {fmt_rate(k.get('prompt_tok_s'))} tok/s, "
                    f"generation {fmt_rate(k.get('gen_tok_s'))} tok/s, init {fmt_ms(k.get('init_ms'))} ms "
                    f"({k.get('source')})_",
                    "",
                ]
        return "\n".join(out)

    def save(self, path: Path) -> None:
        from hexstudio.core.atomic import write_text_atomic

        if path.suffix == ".md":
            write_text_atomic(path, self.as_markdown())
        else:
            write_text_atomic(path, json.dumps(self.as_json(), indent=2, ensure_ascii=False))
