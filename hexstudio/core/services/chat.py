"""What the Chat page and `hexstudio chat` need to know about a chat, without Qt: a reply's KPI line, the dialogs
a bundle carries, the bundle's context length, when a loaded session must load again (`reopen_reason`: Genie
fixes the sampler, the runtime and the dialog at load time), how much of the context a conversation fills
(`context_use`) and how a stored turn reads in the transcript.

The page's controller (the open conversation, its record, the session on the board) is
hexstudio.core.services.chat_controller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.genie.chat_store import ChatRecord, ChatTurn
from hexstudio.core.genie.conversation import Conversation, Turn
from hexstudio.core.manifest import RunManifest
from hexstudio.core.units import fmt_ms, fmt_rate
from hexstudio.shared.bundle.speculative import DIALOG_TYPES, config_name

# Genie's dialog types as the chat's settings name them (hexstudio.core.genie.session runs them)
DIALOG_LABELS = {"basic": "Basic", "lade": "Lookahead (lade)", "spd": "Draft model (spd)"}


def kpi_line(k: dict[str, Any]) -> str:
    """One reply's KPIs in a line, labelled SIMULATED where no device measured them."""
    src = k.get("source", "device")
    tag = "SIMULATED" if src == "simulated" else "device"
    accepted = k.get("accepted_per_step")  # a speculative dialog's (lade, spd) tokens accepted per step
    return (
        f"TTFT {fmt_ms(k.get('ttft_ms'))} ms · prompt {fmt_rate(k.get('prompt_tok_s'))} tok/s · generation "
        f"{fmt_rate(k.get('gen_tok_s'))} tok/s · init {fmt_ms(k.get('init_ms'))} ms · "
        f"{k.get('generated_tokens')} tokens"
        + (
            f" · {float(accepted):.2f} tokens/step accepted"
            + (" (from token times)" if k.get("accepted_source") == "token times" else "")
            if isinstance(accepted, (int, float))
            else ""
        )
        + f" [{tag}]"
    )


def bundle_dialogs(bundle_dir: Path | None) -> list[str]:
    """The dialog types a bundle carries: basic always, and each speculative one whose config the Compile stage
    wrote beside genie_config.json (genie_config.lade.json, genie_config.spd.json)."""
    return [
        "basic",
        *(
            t
            for t in DIALOG_TYPES
            if t != "basic" and bundle_dir is not None and (bundle_dir / config_name(t)).is_file()
        ),
    ]


def run_bundle_dir(run_dir: Path, board_doc: dict[str, Any] | None = None) -> Path | None:
    """The open run's bundle as chat runs it: the pushed one where it is a folder on this machine (the simulator
    board), else the Compile stage's (what was pushed to a board over SSH)."""
    candidates = [run_dir / "artifacts" / "compile" / "bundle"]
    if board_doc and board_doc.get("remote_bundle"):
        candidates.insert(0, Path(str(board_doc["remote_bundle"])))
    return next((c for c in candidates if c.is_dir()), None)


def run_context_length(m: RunManifest) -> int | None:
    """The bundle's context length: what the model was compiled for (the Compile stage's bundle), else what
    Quantize and the model resolved, else the run's setting, else the "auto" rule's figure."""
    cl: Any = None
    bundle = m.run_dir / "artifacts" / "compile" / "bundle" / "bundle.json"
    for doc_path, keys in (
        (bundle, ("context_length",)),
        (m.run_dir / "artifacts" / "model" / "model.json", ("resolved", "context_length")),
    ):
        try:
            doc: Any = json.loads(doc_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for k in keys:
            doc = doc.get(k) if isinstance(doc, dict) else None
        if isinstance(doc, int) and doc > 0:
            cl = doc
            break
    if cl is None:
        cl = m.stage("quantize").metric_value("context_length") or m.settings.get("context_length")
    if cl in (None, "auto"):  # not resolved yet (no Model stage): the "auto" rule's figure
        from hexstudio.shared.run_settings import AUTO_CONTEXT_LENGTH

        cl = AUTO_CONTEXT_LENGTH[
            "builtin" if str(m.inputs.get("model") or "").startswith("builtin:") else "other"
        ]
    return int(cl) if isinstance(cl, int) and cl > 0 else None


@dataclass(frozen=True)
class SessionSetup:
    """What a chat session is loaded with and cannot change without loading the model again."""

    runtime: str | None = None  # None: the board's setting
    sampler: dict[str, Any] | None = None  # Genie's keys; None: the bundle's own sampler
    dialog: str = "basic"  # Genie's dialog type: basic, lade, spd (the bundle's configs)


def reopen_reason(loaded: SessionSetup, wanted: SessionSetup) -> str | None:
    """Why the loaded session must be closed before the next message (None: it can go on as it is)."""
    changed = [
        what
        for what, a, b in (
            ("sampler", loaded.sampler, wanted.sampler),
            ("runtime", loaded.runtime, wanted.runtime),
            ("dialog", loaded.dialog, wanted.dialog),
        )
        if a != b
    ]
    if not changed:
        return None
    what = changed[0] if len(changed) == 1 else f"{', '.join(changed[:-1])} and {changed[-1]}"
    return (
        f"The {what} changed: the model loads again with {'them' if len(changed) > 1 else 'it'}; the "
        "conversation is kept."
    )


@dataclass
class ContextUse:
    """How the next prompt fills the model's context: the turns that still fit and the room kept for the reply."""

    total: int  # the model's context, in tokens
    reply: int  # kept for the reply
    used: int  # what the kept turns fill
    history: list[Turn] = field(default_factory=list)  # the complete turns
    kept: list[Turn] = field(default_factory=list)  # those the next prompt still holds (the newest)

    @property
    def dropped(self) -> int:
        return len(self.history) - len(self.kept)

    @property
    def free(self) -> int:
        return max(self.total - self.used - self.reply, 0)


def context_use(conv: Conversation, reply_tokens: int) -> ContextUse:
    """As Conversation.prompt_for: the oldest turns go first when the conversation and the reply's room no
    longer fit. Raises what the chat template raises when it cannot render."""
    history = [t for t in conv.turns if t.state == "complete"]
    total = max(int(conv.context_length), 1)
    budget = max(total - reply_tokens, 1)
    if not history:
        return ContextUse(total=total, reply=reply_tokens, used=0, history=history, kept=[])
    dropped, _text, used = conv.fewest_dropped(history, "", budget)
    kept = history[dropped:]
    used = used if kept else 0
    return ContextUse(total=total, reply=reply_tokens, used=used, history=history, kept=kept)


def record_conversation(rec: ChatRecord) -> Conversation:
    """A stored conversation as the model will read it again."""
    conv = Conversation()
    conv.turns = [Turn(user=t.user, reply=t.reply, kpis=dict(t.kpis), state=t.state) for t in rec.turns]
    return conv


def shown_reply(t: ChatTurn) -> str:
    """A stored turn's reply as the transcript shows it (Markdown): how it ended, where it did not complete."""
    if t.state == "complete":
        return t.reply
    if t.state == "aborted":
        return t.reply + "\n\n*(stopped)*"
    if t.state in ("pending", "streaming"):
        return t.reply + "\n\n*(interrupted: the studio stopped during this reply)*"
    return t.reply + (f"\n\n*(failed: {t.error})*" if t.error else "\n\n*(failed)*")


def version_of(t: Turn | ChatTurn) -> dict[str, Any]:
    """A reply as one of its message's versions (Regenerate keeps the earlier ones: ChatTurn.versions)."""
    return {
        "reply": t.reply,
        "kpis": dict(t.kpis),
        "state": t.state,
        "kpi_line": kpi_line(t.kpis) if t.kpis else "",
    }
