"""Chat sessions on a board: multi-turn history within the context length, with the model kept
loaded between turns.

Persistent mode starts a small helper on the board that keeps one GenieDialog open (libGenie's C API
through ctypes: hexstudio/workers/board/genie_session.py; on the simulator board the simulator's own
session mode, hexstudio.workers.genie_sim.session) and talks JSON lines over the process's stdin/stdout (the
SSH channel for a real board; hexstudio.core.genie.helper copies it there and reads its events). Only the
first turn pays the model's init; later turns send only the new message (the dialog's KV cache holds the
history). When the helper cannot start (no python3 or no libGenie on the board, an old QAIRT...), the
session falls back to one genie-t2t-run per turn, which re-sends the whole conversation each turn and pays
the init every time.

    session = ChatSession(board, remote_bundle_dir, Conversation(template="llama3"))
    await session.open()                      # mode: "persistent" or "per_turn" (+ fallback_reason)
    res = await session.send("Hello", on_chunk=lambda c: print(c.text, end=""), stop=stop_event)
    res.kpis, res.first_chunk_ms, res.note    # note: "the context was full..." when it happens
    await session.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hexstudio.core.device.board import Board
from hexstudio.core.genie.conversation import _HEADER, Conversation, Turn
from hexstudio.core.genie.helper import HelperProcess, push_helper
from hexstudio.core.genie.profile import Kpis, ProfileError, accepted_from_token_times, parse_profile
from hexstudio.core.genie.run import Chunk, ChunkTokenCounter, load_token_counter, run_query
from hexstudio.core.genie.runtime import RuntimeError_, resolve_runtime, runtime_for, select_runtime
from hexstudio.shared.bundle.speculative import DIALOG_TYPES, config_name, spd_sampler
from hexstudio.shared.errors import ActionableError

MODES = ("auto", "persistent", "per_turn")
SAMPLER_PRESETS: dict[str, dict[str, Any] | None] = {
    "deterministic": {"seed": 42, "temp": 0.0, "top-k": 1, "top-p": 1.0},
    "thinking": {"seed": 42, "temp": 0.6, "top-k": 40, "top-p": 0.95},  # Nemotron reasoning on
    "bundle": None,  # the bundle's own sampler
}


def session_config_name(data: bytes) -> str:
    """The bundle's config with a session's chosen sampler (and dialog), named by its content: two sessions on
    one bundle with other samplers or dialogs (two studios, a studio and `hexstudio serve`) each read their own,
    where one shared file made each run the other's."""
    return f"genie_config.hexstudio-{hashlib.sha256(data).hexdigest()[:12]}.json"


log = logging.getLogger("hexstudio.genie.session")


def with_sampler(cfg: dict[str, Any], values: dict[str, Any], dialog: str = "basic") -> bytes:
    """A dialog's config (genie_config[.<type>].json, parsed) with `values` (Genie's keys: seed, temp, top-k,
    top-p) in its dialog.sampler, as the file to write."""
    # Genie's spd needs temp > 0 in its draft sampler
    values = spd_sampler(values, genie_keys=True) if dialog == "spd" else values
    cfg.setdefault("dialog", {}).setdefault("sampler", {}).update(values)
    return json.dumps(cfg, indent=2).encode("utf-8")


async def write_sampler_config(
    board: Board, bundle_dir: str, values: dict[str, Any], dialog: str = "basic"
) -> str:
    """A copy of the bundle's dialog config with this sampler, beside it and named by its content (so runs with
    other samplers on one bundle never share one); returns its name. OSError / ValueError when the config cannot be
    read or the copy written."""
    t = board.transport
    cfg = json.loads((await t.read_bytes(posixpath.join(bundle_dir, config_name(dialog)))).decode("utf-8"))
    if not isinstance(cfg, dict):
        raise ValueError(f"{config_name(dialog)} is not a JSON object")
    data = with_sampler(cfg, values, dialog)
    name = session_config_name(data)
    await t.write_bytes(posixpath.join(bundle_dir, name), data)
    return name


class SessionError(ActionableError):
    """A chat session cannot go on (bad message, board gone, dialog refused): message and hint."""


MAX_MESSAGE_CHARS = 1 << 20  # 1 Mi characters: far beyond any context; refused before it reaches the board


def check_message(user: object) -> str:
    """A chat message as Genie can take it, or SessionError saying why not: not empty, valid UTF-8 text
    (a command-line argument with undecodable bytes holds lone surrogates), no NUL (Genie's C API takes a
    NUL-terminated string and would silently cut the message there), not absurdly long."""
    if not isinstance(user, str) or not user.strip():
        raise SessionError("The message is empty.", "Type a message, then send it.")
    if "\x00" in user:
        raise SessionError(
            f"The message holds a NUL character (at position {user.index(chr(0))}): Genie would "
            "see only the text before it.",
            "Remove the NUL character (paste the text again).",
        )
    try:
        user.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SessionError(
            f"The message is not valid UTF-8 text (bytes at position {exc.start} cannot be decoded).",
            "Save the prompt file as UTF-8, or set a UTF-8 locale (e.g. LANG=C.UTF-8), then send it again.",
        ) from None
    if len(user) > MAX_MESSAGE_CHARS:
        raise SessionError(
            f"The message has {len(user):,} characters, more than any context can hold "
            f"({MAX_MESSAGE_CHARS:,} at most).",
            "Send a shorter message.",
        )
    return user


class StopCut:
    """The reply cut at the first stop string, on the host: the fallback for runtimes that cannot take stop strings
    (the onnxruntime twin, GenieX, one-shot genie-t2t-run, a libGenie without GenieDialog_setStopSequence). A tail
    that may be the start of a stop string is held back until it is not; at a match only the text before it is
    kept (OpenAI's and Genie's rule: the stop string itself is not part of the reply)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [x for x in stops if x]
        self.keep = max((len(x) - 1 for x in self.stops), default=0)
        self.full = ""
        self.emitted = 0
        self.hit = False

    def feed(self, text: str) -> str:
        """The part of the reply that can be released now."""
        if self.hit:
            return ""
        self.full += text
        # a match starts at or after what was released: `keep` characters are always held back
        cut = min((i for i in (self.full.find(x, self.emitted) for x in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            self.full = self.full[:cut]
            end = cut
        else:  # hold back the longest tail that is the start of a stop string
            n = len(self.full)
            held = next(
                (
                    k
                    for k in range(min(self.keep, n - self.emitted), 0, -1)
                    if any(x.startswith(self.full[n - k :]) for x in self.stops)
                ),
                0,
            )
            end = n - held
        new = self.full[self.emitted : end]
        self.emitted = end
        return new

    def flush(self) -> str:
        """What was held back, once the reply has ended without a match."""
        new = self.full[self.emitted :]
        self.emitted = len(self.full)
        return new


@dataclass
class TurnResult:
    turn: Turn
    text: str
    state: str  # complete | aborted | failed
    kpis: Kpis | None
    chunks: list[Chunk]
    mode: str  # persistent | per_turn
    simulated: bool
    first_chunk_ms: float | None  # from send() to the first text chunk
    wall_ms: float
    error: str | None = None
    note: str | None = None  # e.g. the context was full and history was dropped
    extra: dict[str, Any] = field(default_factory=dict)
    runtime: str = "genie"  # which runtime produced these numbers (hexstudio.core.genie.runtime)
    runtime_version: str | None = None  # as the runtime reported it
    stop: str | None = None  # who applied the stop strings: "genie" (GenieDialog_setStopSequence),
    # "host" (StopCut, for runtimes that cannot), None when none were given
    stop_hit: bool = False  # the host cut the reply at a stop string (Genie's own stop does not say)

    def as_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "state": self.state,
            "kpis": self.kpis.as_json() if self.kpis else None,
            "runtime": self.runtime,
            "runtime_version": self.runtime_version,
            "mode": self.mode,
            "simulated": self.simulated,
            "first_chunk_ms": self.first_chunk_ms,
            "wall_ms": round(self.wall_ms, 1),
            "error": self.error,
            "note": self.note,
            "chunks": [{"t": round(c.t, 4), "text": c.text, "tokens": c.tokens} for c in self.chunks],
        }


def continuation_prompt(conv: Conversation, user: str) -> str:
    """A later turn of one dialog: only the new message (Genie adds EOS + BOS between queries and the
    KV cache already holds the earlier turns)."""
    t = conv.template
    if t in ("model", "plain"):
        return conv.continuation(user)
    if t == "qa":
        return f" Question: {user} Answer:"
    text = _HEADER.format(role="user", text=user) + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    if t.startswith("nemotron") and not t.endswith("on"):
        text += "<think>\n</think>\n"
    return text


def template_for_bundle(bundle_doc: dict[str, Any]) -> str:
    model = str(bundle_doc.get("model", "")).lower()
    if model.startswith("builtin:"):
        return "qa"
    if "nemotron" in model:
        return "nemotron-reasoning-off"
    return "llama3"


@dataclass
class _Streamed:
    """How one query's stream ended (ChatSession._stream_reply)."""

    chunks: list[Chunk]
    state: str
    error: str | None
    end: dict[str, Any] | None  # the helper's "end" event (profile, n_past, overran...), None if none came
    cut: StopCut | None  # the host's stop-string cut, if the reply was cut on the host
    stop_by: str | None  # "genie" or "host": who applied the stop strings


class ChatSession:
    def __init__(
        self,
        board: Board,
        bundle_dir: str,
        conversation: Conversation | None = None,
        *,
        mode: str = "auto",
        max_tokens: int = 256,
        sampler: str | dict[str, Any] = "deterministic",
        on_status: Callable[[str], None] | None = None,
        ready_timeout: float = 300.0,
        runtime: str | None = None,
        dialog: str = "basic",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if dialog not in DIALOG_TYPES:
            raise SessionError(f"Unknown dialog '{dialog}'.", f"Use one of: {', '.join(DIALOG_TYPES)}.")
        self.dialog = dialog  # basic, or a speculative one the bundle carries (lade, spd)
        # a preset name, or the sampler values themselves (Genie's keys: seed, temp, top-k, top-p)
        if isinstance(sampler, dict):
            self.sampler_values: dict[str, Any] | None = dict(sampler)
            sampler = "custom"
        elif sampler not in SAMPLER_PRESETS:
            raise ValueError(f"sampler must be one of {tuple(SAMPLER_PRESETS)} or a dict of sampler values")
        else:
            self.sampler_values = SAMPLER_PRESETS[sampler]
        self.board = board
        try:  # the implementation is settled in open(), from the bundle on the board (select_runtime)
            self.runtime = runtime_for(resolve_runtime(board, runtime), board, "qnn")
        except RuntimeError_ as exc:
            raise SessionError(exc.message, exc.hint) from None
        self._runtime_choice = runtime
        self.bundle_dir = bundle_dir
        self.conversation = conversation or Conversation()
        self.requested_mode = mode
        self.mode = "per_turn" if mode == "per_turn" else "persistent"
        self.max_tokens = max_tokens
        self.sampler = sampler
        self.on_status = on_status
        self.ready_timeout = ready_timeout
        # how long a reply may run on after Stop before its helper is stopped hard
        self.abort_grace_s = 10.0
        self.fallback_reason: str | None = None
        self.init_ms: float | None = None  # the persistent dialog's load time
        self.loads = (
            0  # how many times its helper loaded the model (it loads again after a reply it could not stop)
        )
        self.genie_version: str | None = None
        self.runtime_version: str | None = None  # e.g. "Genie API 1.17.0" or GenieX's CLI and plugin versions
        self._helper: HelperProcess | None = None
        self._n_past = 0  # tokens in the dialog's KV cache
        # the dialog still holds what a cleared turn left in it (a full context, a stop cut on the host): reset before
        # its next query, not at the end of that turn, whose reply would wait for it (a load, for spd or a full
        # context: genie_session makes the dialog again)
        self._stale = False
        self._config = "genie_config.json"
        # the session's own copy of it (another sampler), when it has one
        self._config_data: bytes | None = None
        self._lock = asyncio.Lock()
        self._opened = False
        self._runner_simulated = False  # the runner said so: helper hello, banner, profile
        self.token_counter: Callable[[str], int] | None = None  # the bundle's tokenizer, when readable
        self.on_turn: Callable[[TurnResult], None] | None = None  # e.g. the run's chat journal
        self.on_genie_log: Callable[[str, str], None] | None = None  # (level, line) of Genie's own log
        # the loaded dialog takes stop strings itself (its helper said so: GenieDialog_setStopSequence); where
        # not, replies are cut on the host (StopCut)
        self.stop_sequences = False
        self._config_stops: list[
            str
        ] = []  # genie_config.json's own dialog "stop-sequence", kept in every set
        self._stops_on_dialog: list[str] | None = []  # what the loaded dialog holds now (None: not known)

    @property
    def simulated(self) -> bool:
        """Simulated when the board is the simulator or its runner reported itself as one."""
        return bool(self.board.simulated or self._runner_simulated)

    def _status(self, text: str) -> None:
        if self.on_status is not None:
            self.on_status(text)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def open(self) -> str:
        """Read the bundle's config, start the helper (persistent) or prepare per-turn runs. Returns the mode."""
        t = self.board.transport
        cfg_path = posixpath.join(self.bundle_dir, config_name(self.dialog))
        if self.dialog != "basic":  # the runtime first: the twin cannot run a speculative dialog at all
            await self._select_runtime()
        if self.dialog != "basic" and not await t.exists(cfg_path):
            raise SessionError(
                f"The bundle on {self.board.label} has no {self.dialog} dialog ({cfg_path} is missing).",
                f"Compile with speculative_dialogs including {self.dialog} (Compile page, or "
                f"`hexstudio run --set speculative_dialogs={self.dialog}`), push it, or chat with the "
                "basic dialog.",
            )
        try:
            cfg = json.loads((await t.read_bytes(cfg_path)).decode("utf-8"))
        except FileNotFoundError:
            raise SessionError(
                f"{self.board.label} has no bundle at {self.bundle_dir} (no {config_name(self.dialog)} there).",
                "Push the run's bundle first: its Board stage (`hexstudio run --resume RUN_ID --only board`), or "
                "give the bundle folder on this machine (`--bundle runs/<RUN>/artifacts/compile/bundle`).",
            ) from None
        except (OSError, ValueError) as exc:
            raise SessionError(
                f"Cannot read {cfg_path} on {self.board.label}: {exc}.",
                "Push the bundle again (its Board stage: `hexstudio run --resume RUN_ID --only board`): a file "
                "that cannot be read or is not JSON was not written whole.",
            ) from None
        self._config = config_name(self.dialog)
        size = ((cfg.get("dialog") or {}).get("context") or {}).get("size")
        if isinstance(size, int) and size > 0:
            self.conversation.context_length = size
        own = (cfg.get("dialog") or {}).get("stop-sequence") if isinstance(cfg.get("dialog"), dict) else None
        self._config_stops = [x for x in own if isinstance(x, str) and x] if isinstance(own, list) else []
        self.conversation.max_reply_tokens = self.max_tokens
        await self._maybe_tokenizer(cfg)
        if self.sampler_values is not None:
            # only a per-turn run reads it (a kept-loaded helper takes the sampler as an argument): written then
            self._config_data = with_sampler(cfg, self.sampler_values, self.dialog)
            self._config = session_config_name(self._config_data)
        await self._select_runtime()
        self._opened = True
        if self.runtime.name != "genie":
            if self.mode == "per_turn":
                raise SessionError(
                    f"{self.runtime.title} has no per-turn mode in HexStudio.",
                    "Use --mode auto or persistent with GenieX, or --runtime genie.",
                )
            try:
                for note in await self.runtime.prepare(self.board, self.bundle_dir):
                    self._status(note)
            except RuntimeError_ as exc:
                raise SessionError(exc.message, exc.hint) from None
        if self.mode == "persistent":
            try:
                await self._start_helper()
            except SessionError as exc:
                if self.requested_mode == "persistent" or not self.runtime.per_turn_fallback:
                    raise
                self.mode = "per_turn"
                self.fallback_reason = exc.message
                self._status(
                    f"The model cannot stay loaded ({exc.message}); each turn runs genie-t2t-run "
                    "again and pays the init."
                )
        return self.mode

    async def _select_runtime(self) -> None:
        try:
            self.runtime = await select_runtime(self.board, self.bundle_dir, self._runtime_choice)
        except RuntimeError_ as exc:
            raise SessionError(exc.message, exc.hint) from None
        if self.dialog not in self.runtime.dialogs:
            raise SessionError(
                f"{self.runtime.title} runs only the {', '.join(self.runtime.dialogs)} dialog, not "
                f"{self.dialog}.",
                "Chat with the basic dialog, or compile a real bundle "
                "(compile_target local) for Qualcomm's Genie to run it.",
            )

    async def _maybe_tokenizer(self, cfg: dict[str, Any]) -> None:
        """Count tokens with the bundle's own tokenizer.json when it can be read (else ~3 chars a token)."""
        count = await load_token_counter(self.board, self.bundle_dir)
        self.token_counter = count
        if count is not None:
            self.conversation.count_tokens = count

    def helper_argv(self) -> tuple[list[str], dict[str, str] | None]:
        try:
            # a plug-in runtime that knows only the basic dialog takes no config name
            if self.dialog == "basic":
                return self.runtime.helper_argv(
                    self.board, self.sampler_values, self._helper_remote, self.bundle_dir
                )
            return self.runtime.helper_argv(
                self.board,
                self.sampler_values,
                self._helper_remote,
                self.bundle_dir,
                config=config_name(self.dialog),
            )
        except RuntimeError_ as exc:
            raise SessionError(exc.message, exc.hint) from None

    _helper_remote: str | None = None

    async def _start_helper(self) -> None:
        t = self.board.transport
        if not self.board.simulated:
            try:
                files = self.runtime.helper_files
                if not files:
                    raise SessionError(f"{self.runtime.title} has no helper to copy to a board.")
                self._helper_remote = await push_helper(self.board, files)
            except OSError as exc:
                raise SessionError(f"the chat helper could not be copied to the board: {exc}") from None
        argv, env = self.helper_argv()
        self._status(f"loading the model on {self.board.label} (kept loaded between turns)")
        t0 = time.monotonic()
        try:
            proc = await t.start(argv, cwd=self.bundle_dir, env=env)
        except Exception as exc:
            raise SessionError(f"the chat helper could not start: {exc}") from None
        h = HelperProcess(proc, self.on_genie_log)
        try:
            while True:
                try:
                    ev = await h.next_event(self.ready_timeout)
                except asyncio.TimeoutError:
                    raise SessionError(
                        f"the chat helper did not load the model within {self.ready_timeout:.0f} s"
                    ) from None
                kind = ev.get("event")
                if kind == "ready":
                    break
                if kind in ("error", "eof"):
                    why = ev.get("message") or h.stderr_tail() or "it exited without a message"
                    raise SessionError(f"the chat helper could not start: {_explain(str(why))}")
        except BaseException:
            # a load that failed, or was cancelled (quitting, a new chat): the helper is no one's to close later,
            # and left alone it would finish loading and hold the NPU and the board's RAM
            with contextlib.suppress(Exception):
                await asyncio.shield(h.close(graceful=False))
            raise
        self._helper = h
        if ev.get("simulated"):
            self._runner_simulated = True
        self.init_ms = float(ev.get("init_ms") or (time.monotonic() - t0) * 1000)
        self.loads += 1
        self.genie_version = ev.get("genie_version")
        self.stop_sequences = ev.get("stop_sequences") is True
        self._stops_on_dialog = list(self._config_stops)
        self.runtime_version = (
            ev.get("runtime_version")
            or ev.get("runner")
            or (f"Genie API {self.genie_version}" if self.genie_version else None)
        )
        self._n_past = 0
        self._stale = False
        self._status(f"model loaded in {self.init_ms / 1000:.1f} s; it stays loaded between turns")

    @property
    def genie_log(self) -> list[str]:
        """The runtime's own log lines so far (Genie's GenieLog output: what the console shows)."""
        return list(self._helper.log_lines) if self._helper is not None else []

    @property
    def kv_tokens(self) -> int:
        """Tokens the dialog's KV cache holds, as this session counts them: 0 for an empty dialog (loaded anew,
        reset, or cleared by the session itself after a full context or a stop string cut on the host)."""
        return self._n_past

    async def reset(self) -> None:
        """A new chat: forget the history and clear the dialog's KV cache."""
        async with self._lock:
            self.conversation.turns.clear()
            await self._reset_dialog()

    async def _reset_dialog(self) -> None:
        h = self._helper
        self._n_past = 0
        self._stale = False
        if h is None or not h.alive:
            return
        try:
            await h.send({"op": "reset"})
        except (ConnectionError, OSError):
            # it has just exited (it ends a reply it could not stop: genie_session)
            with contextlib.suppress(Exception):
                await h.close(graceful=False)
            return
        # the helper may make the dialog again (spd, or one a full context left stale): as long as a load
        wait = max(60.0, self.ready_timeout)
        while True:
            ev = await h.next_event(wait)
            if ev.get("event") in ("reset", "eof"):
                break
        if ev.get("status") not in (0, None):
            # not reset: the dialog could not be made again (and the helper is exiting: genie_session's
            # made_again), or GenieDialog_reset failed or is missing and its KV cache still holds the last
            # conversation. Either way the turn that asked for the reset starts a new helper (a fresh load), rather
            # than sending its query to a dying helper or on top of the old cache
            self._status(
                "the dialog could not be "
                + ("made again" if ev.get("recreated") else f"reset (Genie status {ev.get('status')})")
                + ": the model loads again for the next turn"
            )
            with contextlib.suppress(Exception):
                await h.close(graceful=False)
            return
        if ev.get("recreated") or (self.dialog == "spd" and "recreated" not in ev):
            # the new dialog has only its config's own stop sequences: the next query sets the others again (an
            # older helper says nothing and always makes an spd dialog again)
            self._stops_on_dialog = list(self._config_stops)

    async def apply_sampler(self, values: dict[str, Any]) -> str | None:
        """Sampler values (Genie's keys: seed, temp, top-k, top-p) for the next turns of the loaded dialog, without
        reloading it (the helper's "sampler" op). None when applied; else why not (a helper or libGenie without
        it): open a new session with `sampler=values` instead, which pays the init again."""
        async with self._lock:
            h = self._helper
            if self.mode != "persistent" or h is None or not h.alive:
                return "the model is not kept loaded (per-turn mode)"
            await h.send({"op": "sampler", "sampler": values})
            while True:
                try:
                    ev = await h.next_event(30)
                except asyncio.TimeoutError:
                    return "the chat helper did not answer the sampler request"
                kind = ev.get("event")
                if kind == "sampler":
                    if ev.get("applied"):
                        self.sampler_values = {**(self.sampler_values or {}), **values}
                        self.sampler = "custom"
                        return None
                    return str(ev.get("message") or "the runtime did not apply it")
                if kind == "error" and ev.get("code") == "bad_request":
                    return "this chat helper has no sampler op"
                if kind == "eof":
                    return "the chat helper exited"

    async def close(self) -> None:
        if self._helper is not None:
            await self._helper.close()
            self._helper = None

    async def __aenter__(self) -> ChatSession:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- turns -------------------------------------------------------------------------------------
    async def send(
        self,
        user: str,
        *,
        on_chunk: Callable[[Chunk], None] | None = None,
        stop: asyncio.Event | None = None,
        stop_strings: Sequence[str] | None = None,
    ) -> TurnResult:
        """One chat turn. `on_chunk(Chunk(t, text))` gets the reply as it is generated (t: seconds since
        the query went out). `stop_strings` (default: the model's own, generation_config.json's
        `stop_strings`) end the reply, the matched text left out: handed to Genie where the loaded dialog takes
        them (GenieDialog_setStopSequence), else cut here (StopCut). Raises ValueError when the message alone
        does not fit in the context, and SessionError for a message Genie cannot take (check_message)."""
        check_message(user)
        if not self._opened:
            await self.open()
        if stop_strings is None:
            fmt = self.conversation.chat_format
            stop_strings = fmt.stop_strings if fmt is not None else []
        stops = [x for x in stop_strings if isinstance(x, str) and x]
        async with self._lock:
            if self.mode == "persistent":
                r = await self._send_persistent(user, on_chunk, stop, stops=stops)
                # r.turn is the last turn: popped, not removed by value (an earlier refused turn of the same
                # message is equal to it)
                if r.extra.get("retry_with_history"):
                    self.conversation.turns.pop()
                    r = await self._send_persistent(user, on_chunk, stop, stops=stops)
                if r.extra.get("retry_without_history"):
                    # the re-sent history did not fit after all (the token count was off): once more, without it
                    self.conversation.turns.pop()
                    r = await self._send_persistent(user, on_chunk, stop, history=False, stops=stops)
            else:
                r = await self._send_per_turn(user, on_chunk, stop, stops)
        if self.on_turn is not None:
            self.on_turn(r)
        return r

    async def _write_session_config(self) -> None:
        """The session's copy of the bundle's config, written before each per-turn run: one that another session
        removed is back, and a copy's age says when it was last used (run.remove_old_configs removes those no
        session used for a week)."""
        if self._config_data is None:
            return
        path = posixpath.join(self.bundle_dir, self._config)
        try:
            await self.board.transport.write_bytes(path, self._config_data)
        except OSError as exc:
            raise SessionError(
                f"Cannot write the chat's sampler settings to {path} on {self.board.label}: {exc}.",
                "Check the board's free space (`df -h`) and that the bundle folder is yours, or choose the "
                "bundle's own sampler.",
            ) from None

    async def _send_per_turn(
        self,
        user: str,
        on_chunk: Callable[[Chunk], None] | None,
        stop: asyncio.Event | None,
        stops: list[str],
    ) -> TurnResult:
        await self._write_session_config()
        conv = self.conversation
        prompt = conv.prompt_for(user)
        note = self._full_note(conv.dropped_turns, cleared=False) if conv.dropped_turns else None
        turn = conv.add(user)
        t0 = time.monotonic()
        first: list[float] = []
        cut = StopCut(stops) if stops else None  # genie-t2t-run takes no stop strings per query: cut here
        halt, relay = _halt_on(stop)

        def chunk(c: Chunk) -> None:
            if not first:
                first.append((time.monotonic() - t0) * 1000)
            if cut is not None:
                c = replace(c, text=cut.feed(c.text))
                if cut.hit:
                    halt.set()
                if not c.text:
                    return
            turn.reply += c.text
            if on_chunk is not None:
                on_chunk(c)

        try:
            res = await run_query(
                self.board,
                self.bundle_dir,
                prompt,
                on_chunk=chunk,
                stop=halt,
                max_tokens=self.max_tokens,
                config=self._config,
                count_tokens=self.token_counter,
            )
        finally:
            if relay is not None:
                relay.cancel()
        text = res.text
        if cut is not None:
            if not cut.hit and (rest := cut.flush()):
                turn.reply += rest
                if on_chunk is not None:
                    on_chunk(Chunk(time.monotonic() - t0, rest, None, 0))
            text = turn.reply if cut.hit else cut.full
        turn.reply = text
        if res.simulated:
            self._runner_simulated = True
        state = (
            res.transcript.state if res.exit_status == 0 or res.transcript.state == "aborted" else "failed"
        )
        state = state if state in ("complete", "aborted") else "failed"
        if cut is not None and cut.hit and state == "aborted" and not (stop is not None and stop.is_set()):
            state = "complete"  # ended at a stop string: stopped here, a complete reply
        turn.state = state
        if res.kpis is not None:
            turn.kpis = res.kpis.as_json()
        if res.transcript.genie_version:
            self.runtime_version = f"Genie API {res.transcript.genie_version}"
        return TurnResult(
            turn,
            text,
            state,
            res.kpis,
            res.chunks,
            "per_turn",
            self.simulated,
            first[0] if first else None,
            (time.monotonic() - t0) * 1000,
            error=res.error if state == "failed" else None,
            note=note,
            runtime=self.runtime.name,
            runtime_version=self.runtime_version,
            stop="host" if cut is not None else None,
            stop_hit=bool(cut and cut.hit),
        )

    def _full_note(self, dropped: int, cleared: bool) -> str:
        cl = self.conversation.context_length
        what = (
            f"the oldest {dropped} turn(s) no longer fit and were left out"
            if dropped
            else "the conversation was re-sent"
        )
        head = (
            f"The context is full ({cl} tokens): the model's memory was cleared and "
            if cleared
            else f"The context is full ({cl} tokens): "
        )
        return head + what + ". Start a new chat to begin afresh."

    async def _send_persistent(
        self,
        user: str,
        on_chunk: Callable[[Chunk], None] | None,
        stop: asyncio.Event | None,
        history: bool = True,
        stops: list[str] | None = None,
    ) -> TurnResult:
        stops = stops or []
        conv = self.conversation
        if self._stale:
            await self._reset_dialog()  # it may find the helper gone (it exits to end a reply it cannot stop)
        if self._helper is None or not self._helper.alive:
            await self._start_helper()  # it died (or was stopped hard): load again, history re-sent below
        h = self._helper
        assert h is not None
        fresh = self._n_past == 0
        prompt, note = await self._turn_prompt(user, history, fresh)
        # what the query goes to: _turn_prompt clears a dialog too full for the turn and sends the history again
        sent_fresh = self._n_past == 0
        if self._helper is None or not self._helper.alive:
            # that clearing found the dialog could not be made again (the helper exited): load afresh
            await self._start_helper()
        h = self._helper
        assert h is not None
        turn = conv.add(user)
        h.queries += 1
        qid = h.queries
        t0 = time.monotonic()
        query: dict[str, Any] = {"op": "query", "id": qid, "prompt": prompt, "max_tokens": self.max_tokens}
        cut: StopCut | None = None
        stop_by: str | None = None
        wanted = [*self._config_stops, *(x for x in stops if x not in self._config_stops)]
        if self.stop_sequences and wanted != self._stops_on_dialog:
            # Genie's own: GenieDialog_setStopSequence (they stay set for later queries)
            query["stop"] = wanted
        if wanted:  # the config's own stop-sequence too: a runner without stop sequences has them cut here
            stop_by = "genie" if self.stop_sequences else "host"
            cut = None if self.stop_sequences else StopCut(wanted)
        await h.send(query)
        r = await self._stream_reply(h, qid, turn, t0, on_chunk, stop, wanted, stops, cut, stop_by)
        chunks, state, error, end, cut, stop_by = r.chunks, r.state, r.error, r.end, r.cut, r.stop_by
        if cut is not None and not cut.hit and (rest := cut.flush()):
            c = Chunk(time.monotonic() - t0, rest, None, 0)
            chunks.append(c)
            if on_chunk is not None:
                on_chunk(c)
        hit = cut is not None and cut.hit
        if hit and state == "aborted" and not (stop is not None and stop.is_set()):
            state = "complete"  # ended at a stop string, by the host: a complete reply
        text = "".join(c.text for c in chunks)
        turn.reply = text
        kpis = self._kpis(end, fresh_dialog=h.queries == 1)
        if kpis is not None and kpis.accepted_per_step is None and self.dialog in ("lade", "spd"):
            # no Genie profile for this reply (a lade reply the helper ended at max_tokens): from the token times
            est = accepted_from_token_times([c.mono for c in chunks if c.mono is not None and c.tokens == 1])
            if est is not None:
                kpis = replace(kpis, accepted_per_step=est, accepted_source="token times")
        if kpis is not None:
            turn.kpis = kpis.as_json()
            # KPIs without Genie's profile (the helper's own measure) count no prompt tokens: counted here, or the
            # check before the next turn would think the dialog emptier than it is
            prompt_tokens = (
                kpis.prompt_tokens if kpis.prompt_tokens is not None else conv.count_tokens(prompt)
            )
            self._n_past += int(prompt_tokens) + int(kpis.generated_tokens or 0)
        else:
            self._n_past += conv.count_tokens(prompt + text)
        if end is not None and isinstance(end.get("n_past"), int):
            self._n_past = int(end["n_past"])  # the simulator reports its KV fill exactly
        # after a host cut the dialog holds tokens past the stop string: cleared, the next turn re-sends the history
        # so does one whose dialog ran past max_tokens (Genie 1.21's lade ignores the limit: the helper dropped the
        # extra tokens, but they are in the KV cache)
        clear = state in ("context_full", "failed") or hit or bool(end and end.get("overran"))
        # no reply because the prompt itself fills the context: the same again gives the same (not the board's fault)
        too_long = False
        if state == "context_full":  # the context filled up during this reply
            if text:
                state = "complete"
                note = (
                    f"The context is full ({conv.context_length} tokens): this reply was cut short. The model's "
                    "memory is cleared for the next turn (what still fits of the history is re-sent)."
                )
            else:
                state, error = "failed", "The prompt does not fit in the context: start a new chat."
                too_long = True
        if state == "failed" and error is None:
            what = "GenieDialog_query" if self.runtime.name == "genie" else "geniex generate"
            error = f"{what} failed (status {end.get('status') if end else '?'})" + (
                f": {_explain(str(end['message']))}" if end and end.get("message") else "."
            )
        if state == "failed":
            # a refused query logs nothing in Genie's profile, whose last entry is then an earlier turn's: a failed
            # turn has no figures
            kpis = None
            turn.kpis = {}
        turn.state = state
        if clear:
            self._n_past = 0
            self._stale = h.alive
        refused = state == "failed" and not text and h.alive and end is not None
        # the history the dialog was sent whole did not fit after all (the token count was off): without it
        retry = refused and sent_fresh and history and any(t.state == "complete" for t in conv.turns[:-1])
        # the new turn alone, on a dialog that held the history, did not fit: that dialog is cleared (above), so
        # the history goes again, whole, to the empty one
        resend = refused and not sent_fresh and conv.renders_history
        return TurnResult(
            turn,
            text,
            state,
            kpis,
            chunks,
            "persistent",
            self.simulated,
            round(chunks[0].t * 1000, 3) if chunks else None,
            (time.monotonic() - t0) * 1000,
            error=error,
            note=note,
            extra={"retry_without_history": retry, "retry_with_history": resend, "prompt_too_long": too_long},
            runtime=self.runtime.name,
            runtime_version=self.runtime_version,
            stop=stop_by,
            stop_hit=hit,
        )

    async def _turn_prompt(self, user: str, history: bool, fresh: bool) -> tuple[str, str | None]:
        """What this turn sends the dialog, and the note the person gets with it: the whole conversation to a
        fresh dialog, only the new message to one that holds the history, the message alone when the history
        no longer fits (`history` False), or, when the reply would overflow the dialog, the history re-sent to a
        cleared one."""
        conv = self.conversation
        note = None
        if not history:
            # the same conversation without its turns: its template, chat format, context and token counter kept
            prompt = replace(conv, turns=[], dropped_turns=0).prompt_for(user)
            note = (
                f"The context is full ({conv.context_length} tokens): the earlier turns no longer fit, so this "
                "message was sent without them. Start a new chat to begin afresh."
            )
        else:
            prompt = conv.prompt_for(user) if fresh else continuation_prompt(conv, user)
        if history and fresh and conv.dropped_turns:
            note = self._full_note(conv.dropped_turns, cleared=False)
        if not fresh and self._n_past + conv.count_tokens(prompt) + 2 + self.max_tokens > conv.context_length:
            await self._reset_dialog()
            prompt = conv.prompt_for(user)
            note = self._full_note(conv.dropped_turns, cleared=True)
        return prompt, note

    async def _stream_reply(
        self,
        h: HelperProcess,
        qid: int,
        turn: Turn,
        t0: float,
        on_chunk: Callable[[Chunk], None] | None,
        stop: asyncio.Event | None,
        wanted: list[str],
        stops: list[str],
        cut: StopCut | None,
        stop_by: str | None,
    ) -> _Streamed:
        """The helper's events for query `qid` until its end: text as chunks (cut at a stop string on the host
        where the dialog cannot), Stop as an abort (the helper stopped hard if it does not honour it in 10 s),
        the dialog's answer to the stop strings, a lost connection as the error."""
        chunks: list[Chunk] = []
        counter = ChunkTokenCounter(self.token_counter) if self.token_counter is not None else None
        state, error, end = "failed", None, None
        halt, relay = _halt_on(stop)
        stop_task = asyncio.ensure_future(halt.wait())
        aborting_since: float | None = None
        last_abort = 0.0
        try:
            while True:
                if aborting_since is not None:
                    # checked on every event too: a dialog that ignores the abort keeps sending tokens
                    now = time.monotonic()
                    if now - aborting_since > self.abort_grace_s:
                        await h.close(graceful=False)  # abort not honoured: stop it hard (reloads next turn)
                        state = "aborted"
                        break
                    if now - last_abort >= 1.0:
                        # again each second: an abort that reached the helper before its query began was dropped
                        last_abort = now
                        with contextlib.suppress(Exception):
                            await h.send({"op": "abort"})
                get = asyncio.ensure_future(h.events.get())
                waits: set[asyncio.Future[Any]] = {get}
                if stop_task is not None and aborting_since is None:
                    waits.add(stop_task)
                done, _ = await asyncio.wait(
                    waits,
                    timeout=1.0 if aborting_since is not None else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if get not in done:
                    get.cancel()
                    if stop_task is not None and stop_task in done and aborting_since is None:
                        aborting_since = last_abort = time.monotonic()
                        with contextlib.suppress(Exception):
                            await h.send({"op": "abort"})
                    continue
                ev = get.result()
                kind = ev.get("event")
                if kind == "stop" and ev.get("id") == qid:  # before the query's text
                    if ev.get("applied"):
                        self._stops_on_dialog = wanted
                    else:
                        log.warning(
                            "the dialog did not take the stop strings %r (%s): cut on the host instead",
                            wanted,
                            ev.get("message"),
                        )
                        self._stops_on_dialog = None  # not known: set again on the next query
                        if stops:
                            cut, stop_by = StopCut(stops), "host"
                elif kind == "text" and ev.get("id") == qid:
                    text = str(ev.get("text", ""))
                    n = ev.get("tokens")  # the helper: one dialog callback a token
                    if not isinstance(n, int):
                        n = counter(text) if counter is not None else None
                    if cut is not None:
                        text = cut.feed(text)
                        if cut.hit and aborting_since is None:
                            halt.set()  # the reply reached a stop string: the dialog is told to abort
                    c = Chunk(time.monotonic() - t0, text, ev.get("mono"), n)
                    chunks.append(c)  # even when held back: its token count and time still count
                    turn.reply += c.text
                    if on_chunk is not None and c.text:
                        on_chunk(c)
                elif kind == "end" and ev.get("id") == qid:
                    end = ev
                    state = str(ev.get("state") or "failed")
                    if aborting_since is not None and state != "failed":
                        state = "aborted"
                    break
                elif kind == "eof" or (
                    kind == "error" and (ev.get("code") == "connection_lost" or ev.get("id") == qid)
                ):
                    error = _explain(str(ev.get("message") or h.stderr_tail() or "the chat helper exited"))
                    break
        finally:
            stop_task.cancel()
            if relay is not None:
                relay.cancel()
        return _Streamed(chunks, state, error, end, cut, stop_by)

    def _kpis(self, end: dict[str, Any] | None, fresh_dialog: bool) -> Kpis | None:
        if end is None:
            return None
        k: Kpis | None = self.runtime.kpis(end, self.simulated)
        if k is None and end.get("profile"):
            with contextlib.suppress(ProfileError, TypeError, KeyError):
                k = parse_profile(end["profile"])
        if k is None and end.get("measured"):
            m = end["measured"]
            # the helper's count of Genie's token callbacks; an older helper's count of text pieces else
            n = int(m["tokens"]) if isinstance(m.get("tokens"), int) else int(m.get("callbacks") or 0)
            k = Kpis(
                init_ms=None,
                prompt_tokens=None,
                prompt_tok_s=None,
                ttft_ms=m.get("ttft_ms"),
                generated_tokens=n,
                # gen_ms runs from the first token's text to the last's: n - 1 tokens came in it
                gen_tok_s=round((n - 1) / (m["gen_ms"] / 1000), 4) if m.get("gen_ms") and n > 1 else None,
                gen_time_ms=m.get("gen_ms"),
                source="simulated" if self.simulated else "device",
                origin="helper_timing",
            )
        if k is None:
            return None
        if k.source == "simulated":
            self._runner_simulated = True
        if self.simulated:
            k = replace(k, source="simulated")
        # the init was paid once, when the dialog was created: only the first turn carries it
        return replace(k, init_ms=self.init_ms if fresh_dialog else 0.0)


def _halt_on(stop: asyncio.Event | None) -> tuple[asyncio.Event, asyncio.Future[Any] | None]:
    """An event set when `stop` is (the caller's: the user pressed Stop, the client went away) or when the
    session sets it itself (a stop string reached); and the relay task to cancel afterwards."""
    halt = asyncio.Event()
    if stop is None:
        return halt, None
    if stop.is_set():
        halt.set()
        return halt, None
    relay = asyncio.ensure_future(stop.wait())
    relay.add_done_callback(lambda f: halt.set() if not f.cancelled() else None)
    return halt, relay


def _explain(text: str) -> str:
    try:
        from hexstudio.core.device.explain import summary

        found = summary(text)
        if found:
            return f"{text.strip().splitlines()[-1] if text.strip() else ''} — {found}"
    except ImportError:
        pass
    return text
