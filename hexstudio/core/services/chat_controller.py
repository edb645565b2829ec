"""The Chat page's controller, without Qt: the open run's conversations, the open conversation and its record, the
chat session on the board and when it must load again, and the context accounting.

One `ChatController` per page. The page builds the widgets, forwards what the user does to the controller and shows
what it holds; the controller decides:
- sessions: a session is opened on the first message and kept between turns; it is closed when the run, the
  conversation or the template changes, and closed and loaded again (the conversation kept) when the runtime, the
  sampler or the dialog changes, since Genie fixes them at load time (`reopen_reason`). A session closed without
  waiting is detached at once and closed in the background; a new one never opens before it has closed.
- the conversation and its record in the run (hexstudio.core.genie.chat_store): made on the first message, kept at
  once, again when the reply starts and when it ends; Regenerate's earlier replies kept as versions.
- the context: the model's context length, what the next prompt fills of it (`context_use`).

What the controller needs from its face comes in as plain callables (`ChatHooks`, `TurnHooks`); the session on the
board comes from `connect` (the real one: `connect_board`; tests pass a fake).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from hexstudio.core.device.errors import BoardError
from hexstudio.core.genie.chat_store import ChatRecord, ChatStore, ChatTurn
from hexstudio.core.genie.conversation import Conversation, Turn, token_counter
from hexstudio.core.genie.journal import ChatJournal
from hexstudio.core.genie.prompts import template_for
from hexstudio.core.genie.run import Chunk
from hexstudio.core.genie.session import ChatSession, SessionError, TurnResult
from hexstudio.core.manifest import RunManifest
from hexstudio.core.services.chat import (
    DIALOG_LABELS,
    ContextUse,
    SessionSetup,
    context_use,
    record_conversation,
    reopen_reason,
    run_context_length,
    shown_reply,
    version_of,
)
from hexstudio.core.services.chat_target import open_run_board
from hexstudio.core.settings import Settings
from hexstudio.shared.chat_template import ChatFormat
from hexstudio.shared.errors import ActionableError

log = logging.getLogger("hexstudio.chat")

# sync_run: the same run as before; another run (a new store and an empty conversation); the same run with a new
# Run Chat benchmark reply to list; another run while a reply is on its way (the switch waits for the reply's end)
RunSync = Literal["same", "switched", "listed", "waiting"]
# change_settings: nothing really changed; not now (a reply streams); ask first (the chat has messages); applied
# (no messages yet: the next message loads the model with them)
SettingsChange = Literal["same", "busy", "ask", "applied"]


class Chosen(NamedTuple):
    """What a conversation is started with: the template (as chosen: auto, llama3, ...), the system prompt and
    the thinking switch (None where the template has none). A change of any asks for a new chat."""

    template: str
    system: str
    thinking: bool | None


@dataclass(frozen=True)
class SentWith:
    """What the conversation's messages are sent with, as the settings show it now (kept in its record)."""

    template: str = "auto"
    system: str = ""
    thinking: bool | None = None
    sampler: dict[str, Any] | None = None
    runtime: str | None = None
    dialog: str = "basic"


@dataclass(frozen=True)
class Rendering:
    """What the open conversation's prompts are rendered with."""

    template: str  # resolved from auto (conversation_template)
    chat_format: ChatFormat | None
    thinking: bool | None
    system: str
    max_reply_tokens: int


class LiveSession(Protocol):
    """What the controller uses of a chat session on a board (hexstudio.core.genie.session.ChatSession)."""

    conversation: Conversation
    max_tokens: int
    dialog: str
    runtime: Any  # the BoardRuntime (its title)
    board: Any  # the Board (its transport is closed with the session)
    fallback_reason: str | None

    @property
    def simulated(self) -> bool: ...

    async def send(
        self, user: str, *, on_chunk: Callable[[Chunk], None] | None = None, stop: asyncio.Event | None = None
    ) -> TurnResult: ...

    async def close(self) -> None: ...


def _quiet(_text: str) -> None:
    pass


@dataclass
class SessionRequest:
    """Where the next session opens and what it is loaded with."""

    doc: dict[str, Any]  # the Board stage's result (board, remote_bundle, simulated, ...)
    settings: Settings
    workspace_root: Path
    setup: SessionSetup
    max_tokens: int
    run_dir: Path | None = None  # the turns go into the run's chat journal (<run>/chats/), for its report
    on_status: Callable[[str], None] = _quiet
    on_genie_log: Callable[[str, str], None] | None = None  # Genie's own lines (the Board page's console)


@dataclass
class OpenedSession:
    session: LiveSession
    mode: str  # persistent | per_turn
    journal: ChatJournal | None = None


Connect = Callable[[Conversation, str, SessionRequest], Awaitable[OpenedSession]]


async def connect_board(conversation: Conversation, mode: str, req: SessionRequest) -> OpenedSession:
    """Connect to the run's board and open a chat session on its bundle with `conversation`: the model stays loaded
    between turns where the board allows it (else one genie-t2t-run per turn)."""
    target = await open_run_board(req.doc, req.settings, req.workspace_root)
    board = target.board
    session = ChatSession(
        board,
        target.remote_bundle,
        conversation,
        mode=mode,
        max_tokens=req.max_tokens,
        sampler=req.setup.sampler if req.setup.sampler is not None else "bundle",
        on_status=req.on_status,
        runtime=req.setup.runtime,
        dialog=req.setup.dialog,
    )
    if req.on_genie_log is not None:
        session.on_genie_log = req.on_genie_log
    try:
        opened = await session.open()
    except BaseException:  # refused (a dialog the runtime cannot run, a bundle gone): let the board go too
        with contextlib.suppress(Exception):
            await session.close()
        with contextlib.suppress(Exception):
            await board.transport.close()
        raise
    journal = None
    if req.run_dir is not None:
        try:
            journal = ChatJournal(req.run_dir, session, board.label)
        except OSError as exc:  # a run folder this user cannot write: the chat goes on, without its journal
            log.warning("chat journal not kept in %s: %s", req.run_dir, exc)
        else:
            session.on_turn = journal.record
    return OpenedSession(session, opened, journal)


def _nothing() -> None:
    pass


@dataclass
class ChatHooks:
    """What the controller asks of its face, or tells it."""

    sent_with: Callable[[], SentWith] = SentWith  # the settings as shown now
    save_failed: Callable[[OSError], None] | None = (
        None  # the run could not keep the conversation (None: raise)
    )
    session_closed: Callable[[], None] = _nothing  # no session is loaded any more


@dataclass
class TurnHooks:
    """What the face does while one message is answered."""

    reloading: Callable[[str], None] = _quiet  # the session loads again: why
    opening: Callable[[], None] = _nothing  # a session opens now (the conversation takes the settings shown)
    opened: Callable[[str], None] = _quiet  # a session opened, in this mode
    sending: Callable[[], None] = _nothing  # the message goes out now
    chunk: Callable[[Chunk], None] = field(default=lambda _c: None)  # a piece of the reply


@dataclass(frozen=True)
class Notice:
    """A line for the person: what happened to the message (plain text; `failed` ones are shown as such)."""

    text: str
    failed: bool = False
    hint: str | None = None  # what to do


@dataclass
class TurnOutcome:
    """How one message was answered."""

    shown: str  # the reply as the transcript shows it (Markdown), or why there is none
    turn: Turn | None = None  # the conversation's turn (None: the message never reached the model)
    kpis: dict[str, Any] | None = None
    notice: Notice | None = None


def conversation_template(choice: str, model_dir: Path | None) -> str:
    """The template a conversation renders with: the chosen one, or for auto the model's own (Nemotron with
    reasoning off, as `hexstudio chat` does)."""
    if choice != "auto":
        return choice
    auto = template_for(model_dir)
    return {"nemotron": "nemotron-reasoning-off"}.get(auto, auto)


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # between the studio's callbacks: its qasync loop, set as the current one
        return asyncio.get_event_loop()


class ChatController:
    """The open run's conversations and the chat session on its board (see the module's docstring)."""

    def __init__(self, hooks: ChatHooks | None = None, connect: Connect = connect_board) -> None:
        self.hooks = hooks or ChatHooks()
        self.connect = connect
        self.store: ChatStore | None = None
        self.record: ChatRecord | None = None
        self.conversation = Conversation()
        self.applied = Chosen("auto", "", None)  # what the open conversation was started with
        self.session: LiveSession | None = None  # once a message was sent
        self.loaded: SessionSetup | None = None  # what the open session was loaded with
        self.journal: ChatJournal | None = None  # the session's turns, kept in the run for its report
        self.mode = "auto"  # auto | persistent | per_turn (ChatSession modes) for the next session
        self.streamed = ""  # the reply so far
        self.turn: ChatTurn | None = None  # the record's turn being answered
        self.prior_versions: list[dict[str, Any]] | None = None  # Regenerate: the replies the next one joins
        self._prior: list[dict[str, Any]] | None = None
        self._stop: asyncio.Event | None = None
        self._run: Path | None = None
        self._bench_stamp: float | None = None
        self._closing: set[asyncio.Future[None]] = set()
        self._counters: dict[str, Callable[[str], int]] = {}
        self._context_length: tuple[Path | None, int | None] = (None, None)

    # -- the run ------------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path | None:
        """The run the conversations are of (the open run, or while a reply is on its way the run it was sent in)."""
        return self._run

    def sync_run(self, run_dir: Path | None, *, busy: bool) -> RunSync:
        """The run shown now: another one is opened (its store, an empty conversation, the session closed); the
        same one says whether the Chat stage wrote a new benchmark reply since (not while a reply streams).

        While a reply is on its way (`busy`: the model loading or the reply streaming) another run waits: the turn
        belongs to the run it was sent in, its session to that run's board, and its record to that run's store;
        switching under it would attach that session to the other run's conversation. Call again when it ends."""
        bench = run_dir / "artifacts" / "chat" / "chat.json" if run_dir is not None else None
        stamp = bench.stat().st_mtime if bench is not None and bench.is_file() else None
        if run_dir != self._run:
            if busy:
                return "waiting"
            self._run, self._bench_stamp = run_dir, stamp
            self.open_run(run_dir)
            return "switched"
        if stamp != self._bench_stamp and not busy:
            self._bench_stamp = stamp
            return "listed"
        return "same"

    def open_run(self, run_dir: Path | None) -> None:
        """Another run was opened: its store, a new empty conversation; the session goes."""
        self.close_later()
        self.store = ChatStore(run_dir) if run_dir is not None else None
        self.record = None
        self.conversation = Conversation()
        self._context_length = (None, None)

    def load_settings(self) -> dict[str, Any]:
        """The chat settings the run kept ({} when none)."""
        return self.store.load_settings() if self.store is not None else {}

    def save_settings(self, values: dict[str, Any]) -> None:
        if self.store is None:
            return
        try:
            self.store.save_settings(values)
        except OSError:  # a read-only run folder: the settings still apply to this session
            pass

    # -- the context ----------------------------------------------------------------------------------
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

    def render_with(self, r: Rendering, m: RunManifest | None, model_dir: Path | None) -> None:
        """The open conversation takes the template, system prompt, reply room and the model's context length (every
        conversation, new ones too: never the 4,096 default) and, before a session holds it, the model's
        tokenizer."""
        conv = self.conversation
        conv.template, conv.chat_format, conv.thinking = r.template, r.chat_format, r.thinking
        conv.system, conv.max_reply_tokens = r.system, r.max_reply_tokens
        cl = self.context_length(m)
        if cl is not None:
            conv.context_length = cl
        if m is not None and self.session is None:
            counter = self.token_counter(model_dir)
            if counter is not None:
                conv.count_tokens = counter

    def context_use(self, reply_tokens: int) -> ContextUse:
        """What the next prompt fills of the model's context (raises what a broken chat template raises)."""
        return context_use(self.conversation, reply_tokens)

    # -- conversations --------------------------------------------------------------------------------
    def conversations(self) -> list[ChatRecord]:
        return self.store.conversations() if self.store is not None else []

    def new_conversation(self, chosen: Chosen) -> None:
        """A new, empty conversation started with `chosen`; the session goes (it holds the old one)."""
        self.close_later()
        self.conversation = Conversation()
        self.record = None
        self.applied = chosen

    def pick(self, cid: str) -> ChatRecord | None:
        """The stored conversation `cid` when it is another than the open one (None: the same, or gone)."""
        rec = self.store.load(cid) if self.store is not None else None
        if rec is None or (self.record is not None and rec.id == self.record.id):
            return None
        return rec

    def show_record(self, rec: ChatRecord) -> Conversation:
        """A stored conversation becomes the open one; the next message continues it (the model loads it again)."""
        self.close_later()
        self.record = rec
        self.conversation = record_conversation(rec)
        return self.conversation

    def ensure_record(self, template: str, system: str) -> ChatRecord | None:
        """The open conversation's record, made on its first message (None without a run)."""
        if self.record is None and self.store is not None:
            self.record = self.store.new(template=template, system=system)
        return self.record

    def save(self) -> None:
        """Keep the open conversation in the run with what it is sent with (a read-only run: hooks.save_failed)."""
        if self.store is None or self.record is None:
            return
        rec, sent = self.record, self.hooks.sent_with()
        rec.template, rec.system, rec.thinking = sent.template, sent.system, sent.thinking
        rec.sampler, rec.runtime, rec.dialog = sent.sampler, sent.runtime, sent.dialog
        if self.journal is not None and self.journal.path.stem not in rec.journals and self.journal.turns:
            rec.journals.append(self.journal.path.stem)
        try:
            self.store.save(rec)
        except OSError as exc:
            if self.hooks.save_failed is None:
                raise
            self.hooks.save_failed(exc)

    def delete_record(self) -> None:
        if self.store is not None and self.record is not None:
            self.store.delete(self.record.id)

    def change_settings(self, chosen: Chosen, *, busy: bool) -> SettingsChange:
        """The template, system prompt or thinking switch shown now is `chosen`. Only a real change counts; while a
        reply streams it waits; with messages in the chat the face asks first (then `new_conversation`); without,
        it applies at once and the next message loads the model with it."""
        if chosen == self.applied:
            return "same"
        if busy:
            return "busy"
        if self.conversation.turns:
            return "ask"
        self.close_later()
        self.applied = chosen
        return "applied"

    # -- the session on the board ---------------------------------------------------------------------
    def reopen_reason(self, wanted: SessionSetup) -> str | None:
        """Why the open session cannot take the next message as it is (None: no session, or it can)."""
        if self.session is None or self.loaded is None:
            return None
        return reopen_reason(self.loaded, wanted)

    async def ensure_session(self, req: SessionRequest, hooks: TurnHooks) -> LiveSession:
        """The session the next message goes to: the open one where it was loaded with `req.setup`, else (closed
        first) a new one on the conversation so far."""
        why = self.reopen_reason(req.setup)
        if why is not None:
            await self.close_session()
            hooks.reloading(why)
        if self.session is None:
            await self.wait_closed()  # never two sessions on the board at once
            hooks.opening()
            opened = await self.connect(self.conversation, self.mode, req)
            self.session, self.loaded, self.journal = opened.session, req.setup, opened.journal
            self.conversation = opened.session.conversation
            hooks.opened(opened.mode)
        return self.session

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

    def _detach(self) -> LiveSession | None:
        s, self.session, self.loaded = self.session, None, None
        if s is not None:
            self.hooks.session_closed()
        return s

    @staticmethod
    async def _shut(s: LiveSession) -> None:
        try:
            await s.close()
        finally:
            await s.board.transport.close()

    async def _shut_quietly(self, s: LiveSession) -> None:
        try:
            await self._shut(s)
        except Exception as exc:  # it is gone from the page already: the next message opens another
            log.warning("closing the chat session failed: %s", exc)

    async def close_session(self) -> None:
        """Close the open session and wait until it is closed, and any closing in the background."""
        s = self._detach()
        try:
            if s is not None:
                await self._shut(s)
        finally:
            await self.wait_closed()

    def close_later(self) -> None:
        """Close the open session without waiting: it is detached now (the next message opens another) and closed
        in the background. Nothing is scheduled where no session is open."""
        s = self._detach()
        if s is None:
            return
        task = _event_loop().create_task(self._shut_quietly(s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def wait_closed(self) -> None:
        """Until the sessions closing in the background are closed."""
        pending = [t for t in self._closing if not t.done()]
        if pending:
            await asyncio.gather(*pending)

    # -- one message ----------------------------------------------------------------------------------
    def start_turn(self, user: str) -> ChatTurn:
        """A message goes out: it joins the conversation's record (made on the first message) and is kept in the
        run at once (a crash mid-reply still leaves it)."""
        sent = self.hooks.sent_with()
        self.streamed = ""
        self._stop = asyncio.Event()
        self._prior, self.prior_versions = self.prior_versions, None
        rec_turn = self.turn = ChatTurn(user=user, t=time.strftime("%Y-%m-%dT%H:%M:%S"))
        record = self.ensure_record(sent.template, sent.system)
        if record is not None:
            record.turns.append(rec_turn)
            self.save()
        return rec_turn

    def add_chunk(self, text: str) -> str:
        """A piece of the reply arrived; returns the reply so far. The first one is kept in the run at once."""
        first = not self.streamed
        self.streamed += text
        if first and self.turn is not None:
            self.turn.reply, self.turn.state = self.streamed, "streaming"
            self.save()
        return self.streamed

    def stop(self) -> None:
        """Stop the reply now (what came so far is kept)."""
        if self._stop is not None:
            self._stop.set()

    async def run_turn(self, user: str, req: SessionRequest, hooks: TurnHooks) -> TurnOutcome:
        """Answer the message `start_turn` began: load the model where it must, send, and say how it went. A message
        that does not fit, or a board or session that fails, is a failed turn (the session goes with the latter)."""
        rec_turn = self.turn
        assert rec_turn is not None, "start_turn first"
        try:
            session = await self.ensure_session(req, hooks)
            session.max_tokens = req.max_tokens
            hooks.sending()
            res = await session.send(user, on_chunk=hooks.chunk, stop=self._stop)
        except ValueError as exc:  # the message alone does not fit in the context
            rec_turn.state, rec_turn.error = "failed", str(exc)
            return TurnOutcome(f"*(not sent: {exc})*", notice=Notice(str(exc), failed=True))
        except (BoardError, SessionError) as exc:
            rec_turn.state, rec_turn.error = "failed", exc.message
            self.close_later()
            return TurnOutcome(f"*(failed: {exc.message})*", notice=Notice(exc.message, True, exc.hint))
        except (ActionableError, OSError, TimeoutError) as exc:
            # the link dropped (ConnectionLost), the helper's pipe broke, or it stopped answering: a failed turn
            # that says so, and the dead session goes (the next message loads the model again)
            why = exc.message if isinstance(exc, ActionableError) else f"{type(exc).__name__}: {exc}"
            hint = (
                exc.hint
                if isinstance(exc, ActionableError) and exc.hint
                else "Check the board (its power and network, the Board page's doctor), then send again: the "
                "model loads again."
            )
            rec_turn.state, rec_turn.error = "failed", why
            self.close_later()
            return TurnOutcome(f"*(failed: {why})*", notice=Notice(why, True, hint))
        except Exception as exc:  # a fault of HexStudio's own: a failed turn that says so, never a silent "…"
            log.exception("the chat turn failed unexpectedly")
            why = f"{type(exc).__name__}: {exc}"
            rec_turn.state, rec_turn.error = "failed", why
            self.close_later()  # the session may be half-way through a reply: the next message loads it again
            return TurnOutcome(
                f"*(failed: {why})*",
                notice=Notice(
                    f"HexStudio failed while answering: {why}",
                    True,
                    "This is a fault in HexStudio, not in your model: send the message again (the model loads "
                    "again), and if it repeats, report it with the studio's log (Help ▸ Open the log folder).",
                ),
            )
        return self._answered(rec_turn, res)

    def _answered(self, rec_turn: ChatTurn, res: TurnResult) -> TurnOutcome:
        turn = res.turn
        rec_turn.reply, rec_turn.state = res.text, res.state
        rec_turn.note, rec_turn.error = res.note, res.error
        out = TurnOutcome(shown_reply(rec_turn), turn)  # as a reloaded conversation shows it: how it ended
        if res.kpis is not None:
            turn.kpis = res.kpis.as_json()
            rec_turn.kpis = dict(turn.kpis)
            out.kpis = turn.kpis
        if self.record is not None:
            self.record.source = "simulated" if res.simulated else "device"
        if res.state == "aborted":
            out.notice = Notice("Reply stopped; what came so far is kept.")
        if res.note:
            out.notice = Notice(res.note)
        if res.state == "failed":
            out.notice = Notice(
                f"Genie failed: {res.error}"
                if res.error
                else "The reply failed; the runtime gave no reason.",
                failed=True,
                hint=None
                if res.error
                else "Look at the Board page's console for Genie's own lines, then send the message again.",
            )
        return out

    def end_turn(self) -> list[dict[str, Any]] | None:
        """The message is settled and kept in the run. Returns its versions (the new reply last) where it was a
        Regenerate."""
        rec_turn, self.turn, self._stop = self.turn, None, None
        prior, self._prior = self._prior, None
        if rec_turn is None:
            return None
        if rec_turn.state in ("pending", "streaming"):
            rec_turn.state = "failed"
        versions = None
        if prior:
            versions = [*prior, version_of(rec_turn)]
            rec_turn.versions, rec_turn.version = versions, len(versions) - 1
        self.save()
        return versions

    # -- versions of the last reply ---------------------------------------------------------------------
    def regenerate(self) -> str | None:
        """Take the last reply back to ask again (it is kept as a version; the model loads the conversation without
        it). Returns the message to send again, None when there is none.

        A last message that never reached the conversation (it did not fit in the context, or the board failed
        before it was sent) is the one asked again, not the message before it; the loaded dialog stays."""
        rec_turns = self.record.turns if self.record is not None else []
        if len(rec_turns) > len(self.conversation.turns):
            unsent = rec_turns.pop()
            self.prior_versions = (
                [dict(v) for v in unsent.versions] if unsent.versions else [version_of(unsent)]
            )
            return unsent.user
        if not self.conversation.turns:
            return None
        last = self.conversation.turns.pop()
        rt = self.record.turns.pop() if self.record is not None and self.record.turns else None
        self.prior_versions = (
            [dict(v) for v in rt.versions] if rt is not None and rt.versions else [version_of(last)]
        )
        self.close_later()  # the loaded dialog's KV cache still holds the old reply
        return last.user

    def choose_version(self, index: int) -> bool:
        """‹ › on the last reply: that version becomes the reply the conversation continues from (the loaded dialog's
        KV cache holds the other: the next message loads the conversation again). False: no such version."""
        rt = self.record.turns[-1] if self.record is not None and self.record.turns else None
        if rt is None or not self.conversation.turns or not 0 <= index < len(rt.versions):
            return False
        v = rt.versions[index]
        turn = self.conversation.turns[-1]
        turn.reply, turn.kpis = str(v.get("reply") or ""), dict(v.get("kpis") or {})
        turn.state = str(v.get("state") or "complete")
        rt.reply, rt.kpis, rt.state, rt.version = turn.reply, dict(turn.kpis), turn.state, index
        self.save()
        self.close_later()
        return True
