"""The Chat page's work, without Qt: which conversation is open and where it is kept, when the model must load
again, and how much of the model's context the conversation fills.

One `ChatController` per page. It holds the run's conversation store (hexstudio.core.genie.chat_store), the open
conversation and its record, and the chat session on the board (hexstudio.core.genie.session); the page shows what
it holds and asks it what to do. The reopen policy lives here: a session is loaded with a sampler and a
runtime that Genie fixes at load time, so a change of either closes it and the next message loads the model
again with the conversation so far.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.core.genie.chat_store import ChatRecord, ChatStore, ChatTurn
from hexstudio.core.genie.conversation import Conversation, Turn, token_counter
from hexstudio.core.manifest import RunManifest
from hexstudio.core.settings import Settings
from hexstudio.core.units import fmt_ms, fmt_rate
from hexstudio.workers.shared.bundle.speculative import DIALOG_TYPES, config_name

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
        + (f" · {float(accepted):.2f} tokens/step accepted" if isinstance(accepted, (int, float)) else "")
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
        from hexstudio.workers.shared.run_settings import AUTO_CONTEXT_LENGTH

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
    kept = list(history)
    used = conv.count_tokens(conv._render(kept, "")) if kept else 0
    while kept and used > budget:
        kept = kept[1:]
        used = conv.count_tokens(conv._render(kept, "")) if kept else 0
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
    return t.reply + f"\n\n*(failed: {t.error or t.state})*"


def version_of(t: Turn | ChatTurn) -> dict[str, Any]:
    """A reply as one of its message's versions (Regenerate keeps the earlier ones: ChatTurn.versions)."""
    return {
        "reply": t.reply,
        "kpis": dict(t.kpis),
        "state": t.state,
        "kpi_line": kpi_line(t.kpis) if t.kpis else "",
    }


class ChatController:
    """The open run's conversations and the chat session on its board (see the module's docstring)."""

    def __init__(self) -> None:
        self.store: ChatStore | None = None
        self.record: ChatRecord | None = None
        self.conversation = Conversation()
        self.session: Any = None  # hexstudio.core.genie.session.ChatSession, once a message was sent
        self.loaded: SessionSetup | None = None  # what the open session was loaded with
        self.journal: Any = None  # the session's turns, kept in the run for its report
        self.mode = "auto"  # auto | persistent | per_turn (ChatSession modes)
        self._counters: dict[str, Callable[[str], int]] = {}
        self._context_length: tuple[Path | None, int | None] = (None, None)

    # -- the run ------------------------------------------------------------------------------------
    def open_run(self, run_dir: Path | None) -> None:
        """Another run was opened: its store, a new empty conversation (the caller closes the session)."""
        self.store = ChatStore(run_dir) if run_dir is not None else None
        self.record = None
        self.conversation = Conversation()
        self._context_length = (None, None)

    def context_length(self, m: RunManifest | None) -> int | None:
        """The open run's context length (read once per run: it takes a few file reads)."""
        if m is None:
            return None
        if self._context_length[0] != m.run_dir or self._context_length[1] is None:
            self._context_length = (m.run_dir, run_context_length(m))
        return self._context_length[1]

    def token_counter(self, model_dir: Path | None) -> Callable[[str], int] | None:
        """The model's tokenizer as a counter (loaded once per model), None before the Model stage ran."""
        if model_dir is None or not (model_dir / "model.json").is_file():
            return None
        try:
            md = json.loads((model_dir / "model.json").read_text())
        except (OSError, ValueError):
            md = {}
        key = str(model_dir / str(md.get("hf_dir", "hf")))
        if key not in self._counters:
            self._counters[key] = token_counter(Path(key))
        return self._counters[key]

    # -- conversations --------------------------------------------------------------------------------
    def new_conversation(self) -> None:
        self.conversation = Conversation()
        self.record = None

    def show_record(self, rec: ChatRecord) -> Conversation:
        """A stored conversation becomes the open one; the next message continues it."""
        self.record = rec
        self.conversation = record_conversation(rec)
        return self.conversation

    def ensure_record(self, template: str, system: str) -> ChatRecord | None:
        """The open conversation's record, made on its first message (None without a run)."""
        if self.record is None and self.store is not None:
            self.record = self.store.new(template=template, system=system)
        return self.record

    def save_record(
        self,
        *,
        template: str,
        system: str,
        thinking: bool | None,
        sampler: dict[str, Any] | None,
        runtime: str | None,
        dialog: str = "basic",
    ) -> None:
        """Keep the open conversation in the run with what it was sent with. Raises OSError (a read-only run)."""
        if self.store is None or self.record is None:
            return
        rec = self.record
        rec.template, rec.system, rec.thinking, rec.sampler, rec.runtime = (
            template,
            system,
            thinking,
            sampler,
            runtime,
        )
        rec.dialog = dialog
        if self.journal is not None and self.journal.path.stem not in rec.journals and self.journal.turns:
            rec.journals.append(self.journal.path.stem)
        self.store.save(rec)

    def conversations(self) -> list[ChatRecord]:
        return self.store.conversations() if self.store is not None else []

    def delete_record(self) -> None:
        if self.store is not None and self.record is not None:
            self.store.delete(self.record.id)

    # -- the session on the board ---------------------------------------------------------------------
    def reopen_reason(self, wanted: SessionSetup) -> str | None:
        """Why the open session cannot take the next message as it is (None: no session, or it can)."""
        if self.session is None or self.loaded is None:
            return None
        return reopen_reason(self.loaded, wanted)

    async def open_session(
        self,
        doc: dict[str, Any],
        settings: Settings,
        workspace_root: Path,
        setup: SessionSetup,
        *,
        max_tokens: int,
        run_dir: Path | None,
        on_status: Callable[[str], None],
        on_genie_log: Callable[[str, str], None] | None = None,
    ) -> Any:
        """Connect to the run's board and open a chat session on its bundle: the model stays loaded between turns
        where the board allows it (else one genie-t2t-run per turn). Returns the session's mode."""
        from hexstudio.core.genie.journal import ChatJournal
        from hexstudio.core.genie.session import ChatSession
        from hexstudio.core.services.chat_target import open_run_board

        target = await open_run_board(doc, settings, workspace_root)
        board = target.board
        session = ChatSession(
            board,
            target.remote_bundle,
            self.conversation,
            mode=self.mode,
            max_tokens=max_tokens,
            sampler=setup.sampler if setup.sampler is not None else "bundle",
            on_status=on_status,
            runtime=setup.runtime,
            dialog=setup.dialog,
        )
        if on_genie_log is not None:
            session.on_genie_log = on_genie_log  # Genie's own lines, into the Board page's console
        mode = await session.open()
        self.journal = None
        if run_dir is not None:  # the turns go into the run, for its report (<run>/chats/)
            self.journal = ChatJournal(run_dir, session, board.label)
            session.on_turn = self.journal.record
        self.session, self.loaded = session, setup
        self.conversation = session.conversation
        return mode

    def mode_text(self, mode: str) -> str:
        """How the open session runs, in a line (the runtime, and whether the model stays loaded)."""
        s = self.session
        runtime = getattr(getattr(s, "runtime", None), "title", "")
        dialog = getattr(s, "dialog", "basic")
        return (
            (f"{runtime}: " if runtime else "")
            + (
                "model stays loaded between turns"
                if mode == "persistent"
                else f"one genie-t2t-run per turn ({getattr(s, 'fallback_reason', None) or 'chosen'})"
            )
            + (f"; {DIALOG_LABELS.get(dialog, dialog)} dialog" if dialog != "basic" else "")
        )

    async def close_session(self) -> None:
        s, self.session, self.loaded = self.session, None, None
        if s is not None:
            try:
                await s.close()
            finally:
                await s.board.transport.close()
