"""A message re-sent without the history (the context is full) keeps the conversation's own template, context and
token counter: it was rendered with a bare Conversation (context 4096, a len/3 counter, no chat format), so a
model's message went out without its chat template and the fit check used another context."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hexstudio.core.device.board import sim_board
from hexstudio.core.genie.conversation import Conversation, Turn
from hexstudio.core.genie.session import ChatSession
from hexstudio.shared.chat_template import ChatFormat

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_message_sent_without_the_history_keeps_the_conversations_settings(tmp_path: Path) -> None:
    fmt = ChatFormat(mode="model", template=TEMPLATE, source="test")
    conv = Conversation(
        template="model",
        system="Be brief.",
        context_length=300,
        max_reply_tokens=100,
        count_tokens=len,
        chat_format=fmt,
    )
    conv.turns = [Turn("earlier question", "earlier answer", state="complete")]
    s = ChatSession(sim_board(tmp_path), "bundle", conv)
    prompt, note = asyncio.run(s._turn_prompt("What is 2 + 2?", history=False, fresh=True))
    # the model's own chat template, without the earlier turns
    assert prompt == "<|system|>Be brief.<|end|><|user|>What is 2 + 2?<|end|><|assistant|>", prompt
    assert note is not None and "(300 tokens)" in note
    with pytest.raises(ValueError, match=r"context length \(300\)"):  # its own context, not 4096
        asyncio.run(s._turn_prompt("x" * 400, history=False, fresh=True))
    assert conv.turns and conv.dropped_turns == 0  # the conversation itself is untouched
