"""Prompt templates. `model`: the model's own chat template, rendered as transformers renders it
(hexstudio/shared/chat_template.py); `plain`: completion, the text as typed (base models without a chat
template); `qa`: the built-in toy model's completion format ("Question: ... Answer:", what its corpus
taught it). The hand-written `llama3` and `nemotron` strings remain for a bundle with no model files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.shared.chat_template import ChatFormat, load_chat_format
from hexstudio.shared.families import family_of

LLAMA3 = (
    "<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
DETERMINISTIC = {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0}
NEMOTRON_THINKING_ON = {"seed": 42, "temp": 0.6, "top_k": 40, "top_p": 0.95}


def chat_prompt(user: str, system: str = "", template: str = "llama3", reasoning: bool | None = None) -> str:
    """Genie injects BOS itself: the text starts at the first header, with real newlines."""
    if template == "nemotron":  # the system text is the reasoning switch: the user's goes before the message
        user = f"{system}\n\n{user}" if system else user
        system = "detailed thinking on" if reasoning else "detailed thinking off"
        text = LLAMA3.format(system=system, user=user)
        return text if reasoning else text + "<think>\n</think>\n"
    if template == "qa":
        return f"Question: {user} Answer:"
    return LLAMA3.format(system=system, user=user)


def _hf_dir(model_dir: Path) -> Path | None:
    try:
        doc: dict[str, Any] = json.loads((model_dir / "model.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not doc.get("hf_dir"):
        return None
    hf = Path(str(doc["hf_dir"]))
    return hf if hf.is_absolute() else model_dir / hf


def chat_format_for(model_dir: Path | None) -> ChatFormat:
    """The model's chat format (its chat template, stop ids and strings) from a run's model artifacts folder
    (model.json + hf/), or from a model/bundle folder holding tokenizer_config.json itself."""
    if model_dir is None:
        return ChatFormat(mode="plain")
    name = ""
    try:
        name = str(json.loads((model_dir / "model.json").read_text()).get("model", ""))
    except (OSError, json.JSONDecodeError, AttributeError):
        pass
    hf = _hf_dir(model_dir)
    if hf is None and (model_dir / "tokenizer_config.json").is_file():
        hf = model_dir
    return load_chat_format(hf, name=name.split("/")[-1])


def template_for(model_dir: Path | None) -> str:
    """'qa' (built-in toy model), 'model' (the model has a chat template), 'plain' (it has none: a base
    model); only when its files cannot be read, from the model's name ('nemotron'), else its family's
    fallback (ModelFamily.chat_template_fallback, the family from model.json's info), else 'llama3'.
    `model_dir` is a run's model artifacts folder (model.json) or a bundle folder (bundle.json)."""
    if model_dir is None:
        return "llama3"
    try:
        doc: dict[str, Any] = json.loads((model_dir / "model.json").read_text())
    except (OSError, json.JSONDecodeError):
        return _bundle_template(model_dir)
    if doc.get("source") == "builtin":
        return "qa"
    hf = _hf_dir(model_dir)
    if hf is not None and (hf / "tokenizer_config.json").is_file():
        return "model" if load_chat_format(hf).mode == "model" else "plain"
    name = str(doc.get("model", "")).lower()
    if "nemotron" in name:
        return "nemotron"
    return _family_fallback(doc.get("info")) or "llama3"


def _bundle_template(bundle: Path) -> str:
    """A bundle folder's template ('qa', 'model', 'plain', 'nemotron', 'llama3'): the bundle carries the model's
    tokenizer_config.json, and bundle.json names the model."""
    try:
        doc = json.loads((bundle / "bundle.json").read_text())
    except (OSError, json.JSONDecodeError):
        doc = {}
    name = str(doc.get("model", "") if isinstance(doc, dict) else "").lower()
    if name.startswith("builtin:"):
        return "qa"
    if (bundle / "tokenizer_config.json").is_file():
        return "model" if load_chat_format(bundle).mode == "model" else "plain"
    return "nemotron" if "nemotron" in name else "llama3"


def _family_fallback(info: Any) -> str | None:
    """The chat-template fallback of the model family model.json's info names (architecture, model_type)."""
    if not isinstance(info, dict):
        return None
    arch = info.get("architecture")
    fam = family_of(
        {"architectures": [arch] if isinstance(arch, str) else [], "model_type": info.get("model_type")}
    )
    return fam.chat_template_fallback if fam is not None else None


def format_prompt(user: str, model_dir: Path | None, template: str = "auto", thinking: bool = False) -> str:
    """One fresh query's text (the chat stage's benchmark prompt)."""
    t = template_for(model_dir) if template == "auto" else template
    if t == "model":
        return chat_format_for(model_dir).genie_prompt([], user, thinking=thinking)
    if t == "plain":
        return user
    return chat_prompt(user, template=t, reasoning=False)
