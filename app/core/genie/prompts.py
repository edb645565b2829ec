"""Prompt templates: the model's own chat template (Llama 3, Nemotron reasoning on/off), or a plain
question/answer completion for models without chat training (the built-in toy model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLAMA3 = ("<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n")
DETERMINISTIC = {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0}
NEMOTRON_THINKING_ON = {"seed": 42, "temp": 0.6, "top_k": 40, "top_p": 0.95}


def chat_prompt(user: str, system: str = "", template: str = "llama3", reasoning: bool | None = None) -> str:
    """Genie injects BOS itself: the text starts at the first header, with real newlines."""
    if template == "nemotron":
        system = "detailed thinking on" if reasoning else "detailed thinking off"
        text = LLAMA3.format(system=system, user=user)
        return text if reasoning else text + "<think>\n</think>\n"
    if template == "qa":
        return f"Question: {user} Answer:"
    return LLAMA3.format(system=system, user=user)


def template_from_chat_template(chat_template: Any) -> str | None:
    """The template family of a Hugging Face chat template (tokenizer_config.json), or None."""
    if isinstance(chat_template, list):  # [{"name": "default", "template": "..."}, ...]
        chat_template = next((t.get("template") for t in chat_template
                              if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(chat_template, str):
        return None
    if "detailed thinking" in chat_template:
        return "nemotron"
    if "<|start_header_id|>" in chat_template:
        return "llama3"
    return None


def template_for(model_dir: Path | None) -> str:
    """'qa' (built-in toy model), 'nemotron' or 'llama3': from the model's chat template when it has one,
    else from its name."""
    if model_dir is None:
        return "llama3"
    try:
        doc: dict[str, Any] = json.loads((model_dir / "model.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "llama3"
    if doc.get("source") == "builtin":
        return "qa"
    if doc.get("hf_dir"):
        hf = Path(str(doc["hf_dir"]))
        hf = hf if hf.is_absolute() else model_dir / hf
        try:
            tc = json.loads((hf / "tokenizer_config.json").read_text(encoding="utf-8"))
            found = template_from_chat_template(tc.get("chat_template"))
            if found:
                return found
        except (OSError, json.JSONDecodeError, AttributeError):
            pass
    name = str(doc.get("model", "")).lower()
    return "nemotron" if "nemotron" in name else "llama3"


def format_prompt(user: str, model_dir: Path | None, template: str = "auto") -> str:
    t = template_for(model_dir) if template == "auto" else template
    return chat_prompt(user, template=t, reasoning=False)
