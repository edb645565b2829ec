"""One board's persistent dialog behind an OpenAI-style request: the model is loaded once (ChatSession,
persistent mode) and every request is a turn of that dialog.

- Requests queue: the dialog is single-threaded, so one runs at a time, first come first served
  (asyncio.Lock is FIFO); each request's wait is measured.
- A chat request whose messages extend what the dialog already holds (the previous request's messages plus
  the reply it got, then one new user message) sends only the new turn: the KV cache keeps the rest. Any
  other request clears the KV cache (GenieDialog_reset: milliseconds, never a reload) and sends its whole
  prompt.
- Per-request sampler (temperature, top_p, top_k, seed) is applied to the loaded dialog (the helper's
  "sampler" op); where the runtime cannot, the dialog is reopened with it and the request says so
  (`reinit: "sampler"`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from hexstudio.core.eval.render import PromptRenderer
from hexstudio.core.eval.suites import Case
from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.run import Chunk
from hexstudio.core.genie.session import SAMPLER_PRESETS, ChatSession, SessionError, check_message
from hexstudio.shared.errors import ActionableError


class BridgeError(ActionableError):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.openai_code = (
            code  # OpenAI's error.code ("queue_full", "model_not_found"); `code` is HexStudio's
        )
        self.retry_after = retry_after


class _Raw(Conversation):
    """Prompts arrive rendered: the first turn and a later one are sent as given."""

    renders_history = False

    def prompt_for(self, user: str) -> str:
        self.dropped_turns = 0
        return user

    def continuation(self, user: str) -> str:
        return user


def genie_sampler(body: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """OpenAI sampling fields as Genie's sampler keys; temperature 0 is greedy (top-k 1). The body was validated
    (schema.py); the bounds are checked again here because a value Genie refuses must never reach the dialog."""
    s = dict(default)

    def number(key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
        v = body.get(key)
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v != v
            or not (lo < v if lo_open else lo <= v)
            or v > hi
        ):
            raise BridgeError(400, f"{key} must be a number from {lo} to {hi} (got {v!r})", param=key)
        return float(v)

    def whole(key: str, lo: int, hi: int) -> int | None:
        v = body.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise BridgeError(400, f"{key} must be a whole number from {lo} to {hi} (got {v!r})", param=key)
        return v

    t = number("temperature", 0, 2)
    if t is not None:
        s["temp"] = t
        if t == 0:
            s["top-k"] = 1
        elif s.get("top-k") == 1:
            s["top-k"] = 40
    p = number("top_p", 0, 1, lo_open=True)
    if p is not None:
        s["top-p"] = p
    k = whole("top_k", 0, 100_000)
    if k is not None:
        s["top-k"] = max(1, k)
    seed = whole("seed", 0, 2**32 - 1)
    if seed is not None:
        s["seed"] = seed
    return s


@dataclass
class Reply:
    text: str
    state: str
    kpis: dict[str, Any]
    finish_reason: str
    stats: dict[str, Any] = field(default_factory=dict)


class DialogBridge:
    def __init__(
        self,
        board: Any,
        remote_bundle: str,
        renderer: PromptRenderer,
        *,
        model_id: str,
        runtime: str | None = None,
        sampler: str = "deterministic",
        max_tokens: int = 256,
        on_status: Callable[[str], None] | None = None,
        dialog: str = "basic",
    ) -> None:
        self.board = board
        self.dialog = dialog  # Genie's dialog type: basic, lade or spd (genie_config.<type>.json)
        self.remote_bundle = remote_bundle
        self.renderer = renderer
        self.model_id = model_id
        self.runtime = runtime
        preset = SAMPLER_PRESETS.get(sampler) or SAMPLER_PRESETS["deterministic"]
        assert preset is not None
        self.default_sampler: dict[str, Any] = dict(preset)
        self.max_tokens = max_tokens
        self.on_status = on_status
        self.session: ChatSession | None = None
        self._lock = asyncio.Lock()
        self._content: list[dict[str, Any]] | None = None  # the messages the dialog's KV cache holds now
        self._tools_key: Any = None
        self._sampler: dict[str, Any] = dict(self.default_sampler)
        self.waiting = 0
        self.max_queue = 16  # requests waiting beyond the running one: 429 above
        self.draining = False  # the server is stopping: waiting requests get 503
        self._drain = asyncio.Event()
        self.served = 0
        self.inits: list[dict[str, Any]] = []  # every dialog load: when and why, its init_ms
        self.history: deque[dict[str, Any]] = deque(maxlen=200)

    @property
    def simulated(self) -> bool:
        return bool(self.session.simulated) if self.session is not None else bool(self.board.simulated)

    @property
    def context_length(self) -> int:
        return self.session.conversation.context_length if self.session is not None else 0

    async def open(self, why: str = "start") -> None:
        s = ChatSession(
            self.board,
            self.remote_bundle,
            _Raw(template="plain"),
            mode="persistent",
            max_tokens=self.max_tokens,
            sampler=dict(self._sampler),
            on_status=self.on_status,
            runtime=self.runtime,
            dialog=self.dialog,
        )
        try:
            await s.open()
        except SessionError as exc:
            raise BridgeError(
                503,
                f"The model could not be loaded on {self.board.label}: {exc.message}"
                + (f" ({exc.hint})" if exc.hint else ""),
                "server_error",
                retry_after=10,
            ) from None
        self.session = s
        self._content = None
        self.inits.append({"t": time.time(), "why": why, "init_ms": s.init_ms})

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _retry_after(self, ahead: int) -> int:
        walls = [float(x.get("wall_ms") or 0) for x in list(self.history)[-8:]]
        per = (sum(walls) / len(walls) / 1000) if walls else 2.0
        return max(1, min(600, int(per * (ahead + 1) + 0.999)))

    def admit(self) -> None:
        """Raises 429 (the queue is full) or 503 (stopping) with a Retry-After, before a request starts."""
        if self.draining:
            raise BridgeError(
                503,
                "the server is stopping; send the request to its next start",
                "server_error",
                retry_after=5,
            )
        # only a request that has to wait takes a place in the queue: `--max-queue 0` still takes one at a time
        if (self.busy or self.waiting) and self.waiting >= self.max_queue:
            raise BridgeError(
                429,
                f"{self.waiting} requests are waiting for the board's dialog already (at most "
                f"{self.max_queue}); retry after the Retry-After seconds",
                "rate_limit_exceeded",
                code="queue_full",
                retry_after=self._retry_after(self.waiting),
            )

    def drain(self) -> None:
        """The server stops: requests still waiting for the dialog are answered 503 now."""
        self.draining = True
        self._drain.set()

    async def close(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
            self.session = None

    # -- prompts -----------------------------------------------------------------------------------
    def _norm(self, messages: Any) -> list[dict[str, Any]]:
        if not isinstance(messages, list) or not messages:
            raise BridgeError(400, "messages must be a non-empty list")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in (
                "system",
                "developer",
                "user",
                "assistant",
                "tool",
            ):
                raise BridgeError(400, "each message needs a role: system, user, assistant or tool")
            c = m.get("content")
            if isinstance(
                c, list
            ):  # content parts: text only (a model on a Genie bundle reads no image or audio)
                for j, p in enumerate(c):
                    kind = p.get("type") if isinstance(p, dict) else None
                    if kind != "text":
                        raise BridgeError(
                            400,
                            f"messages[{i}].content[{j}] is {kind or 'not a content part'!r}: this model "
                            "takes text only (send the content as text parts or a string)",
                            param=f"messages[{i}].content[{j}]",
                        )
                c = "".join(str(p.get("text") or "") for p in c)
            n: dict[str, Any] = {
                "role": "system" if m["role"] == "developer" else m["role"],
                "content": c or "",
            }
            if m.get("tool_calls"):
                n["tool_calls"] = m["tool_calls"]
            if m.get("tool_call_id"):
                n["tool_call_id"] = m["tool_call_id"]
            if m.get("name"):
                n["name"] = m["name"]
            out.append(n)
        return out

    def _continuation(self, msgs: list[dict[str, Any]], tools_key: Any) -> str | None:
        """The new turn alone, when `msgs` extends what the dialog holds by one user message; else None."""
        held = self._content
        if held is None or tools_key != self._tools_key or len(msgs) != len(held) + 1:
            return None
        if msgs[:-1] != held or msgs[-1]["role"] != "user":
            return None
        if any(m["role"] == "tool" or m.get("tool_calls") for m in msgs):
            return None
        r = self.renderer
        user = str(msgs[-1]["content"])
        if r.template == "qa":
            return f" Question: {user} Answer:"
        if r.template == "plain":
            return "\n\n" + user  # the whole prompt's separator between turns (render._fallback_prompt)
        # the same tools and thinking switch as the whole prompt the dialog holds (chat_prompt)
        return r.continuation(msgs, tools_key)

    def chat_prompt(self, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], Any]:
        """The request's whole prompt, its messages and its tools' key. Whether the dialog's KV cache can be
        continued instead is decided in `run`, under the dialog's lock: another client may change the dialog
        while this request waits."""
        msgs = self._norm(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and not (
            isinstance(tools, list)
            and all(
                isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str) for t in tools
            )
        ):
            raise BridgeError(400, 'tools must be a list of {"type": "function", "function": {"name": ...}}')
        if body.get("tool_choice") == "none":
            tools = None
        case = Case(id="request", scorer="exact", messages=msgs, tools=tools)
        try:
            full = self.renderer.prompt(case)
        except Exception as exc:
            raise BridgeError(400, f"the model's chat template refused these messages: {exc}") from None
        # the tools are the key: a later turn continues the dialog only with the same ones
        return full, msgs, tools

    def precheck(self, prompt: str) -> None:
        """What `run` would refuse with a 400 about the prompt itself, checked before a stream's 200 goes out:
        text Genie cannot take (empty, a NUL, not UTF-8, too long), or a prompt that leaves no room in the
        context for a reply."""
        try:
            check_message(prompt)
        except SessionError as exc:
            raise BridgeError(400, exc.message) from None
        s = self.session
        # no dialog loaded (a reload failed): `run` loads it first, and checks the fit then
        if s is None:
            return
        n = s.conversation.count_tokens(prompt)
        if n + 3 > self.context_length:
            raise self._no_room(n)

    def _no_room(self, tokens: int | None) -> BridgeError:
        """OpenAI's answer to a prompt longer than the context: 400, invalid_request_error, context_length_exceeded.
        `tokens` None: Genie itself found the prompt alone fills the context (no max_tokens makes room)."""
        if tokens is None:
            said = (
                f"the prompt alone fills the context ({self.context_length} tokens): shorten the conversation"
            )
        else:
            said = (
                f"the prompt is about {tokens} tokens: it does not fit in the context ({self.context_length} "
                "tokens) with room for a reply: shorten the conversation or lower max_tokens"
            )
        return BridgeError(
            400,
            said,
            param="messages",
            code="context_length_exceeded",
        )

    async def _dialog_lost(self, s: ChatSession, exc: BaseException) -> BridgeError:
        """The helper's pipe broke (it died on the board, the link dropped) or it stopped answering: the dialog is
        gone with it, and the next request loads it again."""
        self._content = None
        self.session = None
        with contextlib.suppress(Exception):
            await s.close()
        return BridgeError(
            502, f"the board's dialog stopped answering ({exc or type(exc).__name__})", "server_error"
        )

    # -- running a request -------------------------------------------------------------------------
    async def run(
        self,
        *,
        prompt: str,
        messages: list[dict[str, Any]] | None,
        max_tokens: int | None,
        sampler: dict[str, Any],
        stop_strings: list[str],
        on_text: Callable[[str], None] | None,
        cancelled: asyncio.Event,
        content_after: Callable[[str], list[dict[str, Any]] | None],
        tools_key: Any = None,
        on_start: Callable[[], None] | None = None,
    ) -> Reply:
        """One request's reply. `on_start` is called when the dialog is the request's and its text goes to the
        board: until then every refusal (429 queue full, 503 stopping or not loaded, 400 sampler) is a status a
        stream can still answer with."""
        async with self._turn(cancelled) as waited_ms:
            reinit = None
            if cancelled.is_set():
                raise BridgeError(499, "the client went away before its turn", "cancelled")
            if self.session is None:
                try:
                    await self.open("reload")
                except BridgeError as exc:
                    exc.retry_after = 10
                    raise
                reinit = "reload"
            # reloaded with it
            if sampler != self._sampler and await self._set_sampler(sampler) is not None:
                reinit = "sampler"
            s = self.session
            assert s is not None
            budget = max_tokens or self.max_tokens
            # the bundle's tokenizer where it can be read, else about 3 characters a token
            count = s.conversation.count_tokens
            # decided now, holding the dialog: what it holds is what the last request left in it, and only a
            # dialog that still holds it (not reloaded, not cleared by the session itself: a full context, a stop
            # string cut on the host) can take the new turn alone
            continuation = None
            if messages is not None and reinit is None and s.kv_tokens > 0:
                continuation = self._continuation(messages, tools_key)
            # the session's own rule for a dialog too full for the new turn and its reply (it would clear the
            # dialog and send the new turn alone, without the history the cache held): the reply's budget is
            # clamped to the room left, as a fresh dialog's is below, so a client's large max_tokens (4096 is a
            # common default) does not turn the cache off; only a turn with no room at all goes fresh
            if continuation is not None:
                room = self.context_length - s.kv_tokens - count(continuation) - 8
                if room >= 1:
                    budget = min(budget, room)
                else:
                    continuation = None
            kv_reused = continuation is not None
            cached = s.kv_tokens if kv_reused else 0
            # what the dialog will hold after this turn is known only once it ended well: until then, no request
            # may be sent to it as a continuation (a failure anywhere below leaves this None)
            self._content = None
            if not kv_reused:
                try:
                    await s.reset()
                except (OSError, TimeoutError, asyncio.TimeoutError) as exc:  # two classes on Python 3.10
                    raise await self._dialog_lost(s, exc) from None
            text_in = continuation if continuation is not None else prompt
            if count(text_in) + budget + 2 > self.context_length:
                budget = self.context_length - count(text_in) - 2
                if budget < 1:
                    raise self._no_room(count(text_in))
            s.max_tokens = budget
            s.conversation.max_reply_tokens = budget
            stop = asyncio.Event()
            watcher = asyncio.ensure_future(cancelled.wait())
            watcher.add_done_callback(lambda _f: stop.set())
            full = ""

            def chunk(c: Chunk) -> None:
                # the stop strings are the session's: Genie's own stop sequences where the dialog takes them, else
                # cut on the host (StopCut); either way what arrives here ends before a stop string
                nonlocal full
                full += c.text
                if c.text and on_text is not None:
                    on_text(c.text)

            try:
                check_message(text_in)
            except SessionError as exc:  # empty, a NUL, not UTF-8, too long: Genie cannot take it
                raise BridgeError(400, exc.message) from None
            if on_start is not None:
                on_start()
            t0 = time.monotonic()
            loads = s.loads
            try:
                r = await s.send(text_in, on_chunk=chunk, stop=stop, stop_strings=stop_strings)
            except SessionError as exc:
                self._content = None
                raise BridgeError(500, f"the board's dialog failed: {exc.message}", "server_error") from None
            except ValueError as exc:  # the message alone does not fit, or Genie cannot take it
                self._content = None
                raise BridgeError(400, str(exc), param="messages", code="context_length_exceeded") from None
            except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
                raise await self._dialog_lost(s, exc) from None
            finally:
                watcher.cancel()
            hit_stop = r.stop_hit
            text = full or r.text
            if r.state == "failed":
                self._content = None
                if r.extra.get("prompt_too_long"):
                    # the token count above is an estimate where the bundle's tokenizer cannot be read: Genie's
                    # own refusal is the client's to fix (a 500 would be retried, prefilling it again each time)
                    raise self._no_room(None)
                raise BridgeError(500, f"the board's dialog failed: {r.error}", "server_error")
            k = r.kpis.as_json() if r.kpis else {}
            if s.loads > loads:
                # the session loaded the model again itself (after a reply it could not stop, or a reset that
                # failed): this request's times include that load, and /v1/stats counts it
                reinit = reinit or "reload"
                self.inits.append({"t": time.time(), "why": "reloaded by the session", "init_ms": s.init_ms})
            aborted = r.state == "aborted" and not hit_stop
            gen = int(k.get("generated_tokens") or 0)
            # Genie's own stop does not say whether a stop sequence or the end of the turn ended the reply, and a
            # stop sequence's first tokens stay in the KV cache: a reply that may have ended at one is not continued
            # from the cache (the next request re-sends its prompt), like one cut on the host
            maybe_stopped = r.stop == "genie" and r.state == "complete" and gen < budget
            cleared = s.kv_tokens == 0
            self._content = None if aborted or hit_stop or maybe_stopped or cleared else content_after(text)
            self._tools_key = tools_key
            # a reply cut short by a full context comes back complete, its dialog cleared by the session: "length"
            ended = r.state == "complete" and gen < budget and not cleared
            finish = "stop" if hit_stop or ended else "length"
            self.served += 1
            stats = {
                "request": self.served,
                "queue_wait_ms": round(waited_ms, 3),
                "kv_reused": kv_reused,
                "dialog_reset": not kv_reused,
                "reinit": reinit,
                "init_ms": (self.inits[-1]["init_ms"] if reinit else 0.0),
                "start_ms": r.first_chunk_ms,
                "wall_ms": round((time.monotonic() - t0) * 1000, 3),
                "ttft_ms": k.get("ttft_ms"),
                # Genie's profile count; without one (a reply cut short by a full context, a libGenie without
                # GenieProfile) the bundle tokenizer's count of what was sent, or about 3 characters a token
                "prompt_tokens": k["prompt_tokens"] if k.get("prompt_tokens") is not None else count(text_in),
                "prompt_tokens_estimated": k.get("prompt_tokens") is None,
                # the tokens of earlier turns the KV cache held, not processed again (usage counts them)
                "cached_tokens": cached,
                "prompt_tok_s": k.get("prompt_tok_s"),
                "generated_tokens": k.get("generated_tokens"),
                "gen_tok_s": k.get("gen_tok_s"),
                "source": "simulated" if r.simulated else "device",
                "runtime": r.runtime,
                "sampler": dict(self._sampler),
                "state": r.state,
                "stop_by": r.stop,
            }
            self.history.append(stats)
            return Reply(text, r.state, k, finish, stats)

    @contextlib.asynccontextmanager
    async def _turn(self, cancelled: asyncio.Event) -> AsyncIterator[float]:
        """One request's turn at the dialog, in arrival order: admitted (else 429), waited for (else 499 or 503),
        released when done; yields the milliseconds it waited."""
        t_arrive = time.monotonic()
        self.admit()
        self.waiting += 1
        try:
            await self._acquire(cancelled)
        finally:
            self.waiting -= 1
        try:
            yield (time.monotonic() - t_arrive) * 1000
        finally:
            self._lock.release()

    async def _acquire(self, cancelled: asyncio.Event) -> None:
        """Wait for the dialog (FIFO), unless the client goes away or the server stops first."""
        acq = asyncio.ensure_future(self._lock.acquire())
        gone = asyncio.ensure_future(cancelled.wait())
        drain = asyncio.ensure_future(self._drain.wait())
        try:
            await asyncio.wait({acq, gone, drain}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            drain.cancel()
            if not acq.done():
                acq.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acq
        if acq.cancelled():
            if cancelled.is_set():
                raise BridgeError(499, "the client went away before its turn", "cancelled")
            raise BridgeError(
                503,
                "the server is stopping; send the request to its next start",
                "server_error",
                retry_after=5,
            )

    async def _set_sampler(self, sampler: dict[str, Any]) -> str | None:
        """Apply `sampler` to the loaded dialog, reloading it when the runtime cannot change it in place. A value
        the runtime refuses leaves the dialog as it was (reloaded with the last good sampler) and is a 400: one
        request must never leave the server unable to answer the next (issue 27: "seed": -1)."""
        s = self.session
        assert s is not None
        good = dict(self._sampler)
        try:
            why = await s.apply_sampler(sampler)
        except Exception as exc:  # the helper refused or died on it
            why = f"failed: {exc}"
        if why is None:
            self._sampler = dict(sampler)
            return None
        await self.close()
        self._sampler = dict(sampler)
        try:
            await self.open(f"sampler ({why})")
            return "sampler"
        except BridgeError as exc:
            self._sampler = good
            try:
                await self.open("sampler refused: back to the last good one")
            except BridgeError:
                # the last good sampler does not load either: the board or its runtime is the trouble, not these
                # values (a 400 is never retried). The next request tries again (503 with Retry-After meanwhile)
                raise exc from None
            raise BridgeError(
                400, f"the board's runtime refused these sampler values ({exc.message})", param="sampler"
            ) from None

    def stats(self) -> dict[str, Any]:
        s = self.session
        return {
            "board": self.board.name,
            "board_label": self.board.label,
            "simulated": self.simulated,
            "model": self.model_id,
            "runtime": s.runtime.name if s else None,
            "runtime_version": s.runtime_version if s else None,
            "context_length": self.context_length,
            "prompt_format": self.renderer.label(),
            "tool_format": self.renderer.tool_format,
            "loads": list(self.inits),
            "served": self.served,
            "waiting": self.waiting,
            "busy": self._lock.locked(),
            "requests": list(self.history),
        }
