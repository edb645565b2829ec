"""Prompt templates: picked from the model's chat template, rendered with the right special tokens
and real newlines; later turns of a persistent dialog carry only the new message."""

from __future__ import annotations

import json
from pathlib import Path

from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.prompts import chat_format_for, chat_prompt, format_prompt, template_for
from hexstudio.core.genie.session import SAMPLER_PRESETS, continuation_prompt

LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
)
NEMOTRON_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- else %}{%- set system_message = 'detailed thinking off' %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\\n\\n{{ system_message }}<|eot_id|>"
)


def model_dir(tmp: Path, name: str, chat_template: object | None, source: str = "hf") -> Path:
    d = tmp / name.replace("/", "_")
    (d / "hf").mkdir(parents=True)
    (d / "model.json").write_text(json.dumps({"model": name, "source": source, "hf_dir": "hf"}))
    if chat_template is not None:
        (d / "hf" / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template}))
    return d


def test_template_comes_from_the_models_chat_template(tmp_path: Path) -> None:
    # a model with a chat template chats with it (rendered as transformers renders it); without one: plain
    assert template_for(model_dir(tmp_path, "acme/tuned-8b", LLAMA3_TEMPLATE)) == "model"
    assert template_for(model_dir(tmp_path, "acme/reasoner", NEMOTRON_TEMPLATE)) == "model"
    multi = model_dir(
        tmp_path,
        "acme/multi",
        [{"name": "tool_use", "template": "x"}, {"name": "default", "template": NEMOTRON_TEMPLATE}],
    )
    assert template_for(multi) == "model"
    assert chat_format_for(multi).thinking_switch == "system"  # Nemotron's "detailed thinking on/off"
    base = model_dir(tmp_path, "acme/base-8b", None)
    (base / "hf" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert template_for(base) == "plain" and format_prompt("Once upon", base) == "Once upon"
    # no model files: from the name
    assert template_for(model_dir(tmp_path, "nvidia/Llama-3.1-Nemotron-Nano-8B-v1", None)) == "nemotron"
    assert template_for(model_dir(tmp_path, "builtin:tiny-llama", None, source="builtin")) == "qa"
    assert template_for(None) == "llama3"


def test_conversation_with_the_models_template_sends_only_new_turns(tmp_path: Path) -> None:
    d = model_dir(tmp_path, "acme/tuned-8b", LLAMA3_TEMPLATE)
    (d / "hf" / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": LLAMA3_TEMPLATE, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
        )
    )
    (d / "hf" / "config.json").write_text(
        json.dumps({"bos_token_id": 128000})
    )  # the bundle's bos-token: Genie pushes it
    conv = Conversation(template="model", system="Be brief.", chat_format=chat_format_for(d))
    first = conv.prompt_for("One?")
    assert first == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nOne?<|eot_id|>"
    )  # this template has no gen prompt
    t = conv.add("One?")
    t.reply, t.state = "1.", "complete"
    assert continuation_prompt(conv, "Two?") == "<|start_header_id|>user<|end_header_id|>\n\nTwo?<|eot_id|>"
    assert Conversation(template="plain").prompt_for("Once") == "Once"


def test_llama3_and_nemotron_render_special_tokens_and_real_newlines() -> None:
    p = chat_prompt("Hi", system="Be brief.")
    assert p == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert "\\n" not in p and not p.startswith("<|begin_of_text|>")  # Genie adds BOS itself
    off = chat_prompt("Hi", template="nemotron", reasoning=False)
    assert "detailed thinking off" in off and off.endswith("<think>\n</think>\n")
    on = chat_prompt("Hi", template="nemotron", reasoning=True)
    assert "detailed thinking on" in on and not on.endswith("</think>\n")


def test_history_and_continuation_prompts() -> None:
    conv = Conversation(template="nemotron-reasoning-off")
    t = conv.add("One?")
    t.reply, t.state = "1.", "complete"
    full = conv.prompt_for("Two?")
    assert (
        full.count("<|start_header_id|>user") == 2
        and "1.<|eot_id|>" in full
        and "detailed thinking off" in full
    )
    cont = continuation_prompt(conv, "Two?")
    assert cont == (
        "<|start_header_id|>user<|end_header_id|>\n\nTwo?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n</think>\n"
    )
    assert continuation_prompt(Conversation(template="qa"), "Why?") == " Question: Why? Answer:"


def test_sampler_presets() -> None:
    assert SAMPLER_PRESETS["deterministic"] == {"seed": 42, "temp": 0.0, "top-k": 1, "top-p": 1.0}
    assert SAMPLER_PRESETS["thinking"] == {"seed": 42, "temp": 0.6, "top-k": 40, "top-p": 0.95}
