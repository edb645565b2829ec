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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.eval.render import PromptRenderer
from app.core.eval.suites import Case
from app.core.genie.conversation import Conversation
from app.core.genie.run import Chunk
from app.core.genie.session import SAMPLER_PRESETS, ChatSession, SessionError
from workers.shared.errors import ActionableError


class BridgeError(ActionableError):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class _Raw(Conversation):
    """Prompts arrive rendered: the first turn and a later one are sent as given."""

    def prompt_for(self, user: str) -> str:
        self.dropped_turns = 0
        return user

    def continuation(self, user: str) -> str:
        return user


def genie_sampler(body: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """OpenAI sampling fields as Genie's sampler keys; temperature 0 is greedy (top-k 1)."""
    s = dict(default)
    if body.get("temperature") is not None:
        t = float(body["temperature"])
        if not 0 <= t <= 2:
            raise BridgeError(400, "temperature must be between 0 and 2")
        s["temp"] = t
        if t == 0:
            s["top-k"] = 1
        elif s.get("top-k") == 1:
            s["top-k"] = 40
    if body.get("top_p") is not None:
        p = float(body["top_p"])
        if not 0 < p <= 1:
            raise BridgeError(400, "top_p must be in (0, 1]")
        s["top-p"] = p
    if body.get("top_k") is not None:
        s["top-k"] = max(1, int(body["top_k"]))
    if body.get("seed") is not None:
        s["seed"] = int(body["seed"])
    return s


@dataclass
class Reply:
    text: str
    state: str
    kpis: dict[str, Any]
    finish_reason: str
    stats: dict[str, Any] = field(default_factory=dict)


class DialogBridge:
    def __init__(self, board: Any, remote_bundle: str, renderer: PromptRenderer, *, model_id: str,
                 runtime: str | None = None, sampler: str = "deterministic", max_tokens: int = 256,
                 on_status: Callable[[str], None] | None = None) -> None:
        self.board = board
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
        self._content: list[dict[str, Any]] | None = None   # the messages the dialog's KV cache holds now
        self._tools_key: Any = None
        self._sampler: dict[str, Any] = dict(self.default_sampler)
        self.waiting = 0
        self.served = 0
        self.inits: list[dict[str, Any]] = []                # every dialog load: when and why, its init_ms
        self.history: deque[dict[str, Any]] = deque(maxlen=200)
        self._turn_tokens: list[dict[str, Any]] = []         # the turns the KV cache holds: their token counts

    @property
    def simulated(self) -> bool:
        return bool(self.session.simulated) if self.session is not None else bool(self.board.simulated)

    @property
    def context_length(self) -> int:
        return self.session.conversation.context_length if self.session is not None else 0

    async def open(self, why: str = "start") -> None:
        s = ChatSession(self.board, self.remote_bundle, _Raw(template="plain"), mode="persistent",
                        max_tokens=self.max_tokens, sampler=dict(self._sampler), on_status=self.on_status,
                        runtime=self.runtime)
        try:
            await s.open()
        except SessionError as exc:
            raise BridgeError(503, f"The model could not be loaded on {self.board.label}: {exc.message}"
                              + (f" ({exc.hint})" if exc.hint else ""), "server_error") from None
        self.session = s
        self._content = None
        self.inits.append({"t": time.time(), "why": why, "init_ms": s.init_ms})

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
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                raise BridgeError(400, "each message needs a role: system, user, assistant or tool")
            c = m.get("content")
            if isinstance(c, list):   # content parts: the text ones
                c = "".join(str(p.get("text", "")) for p in c if isinstance(p, dict) and p.get("type") == "text")
            n: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"], "content": c or ""}
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
            return user
        if r.template == "model" and r.fmt.mode == "model":
            system = "".join(str(m["content"]) for m in msgs if m["role"] == "system")
            rest = [m for m in msgs[:-1] if m["role"] != "system"]
            if len(rest) % 2 or any(a["role"] != "user" or b["role"] != "assistant"
                                    for a, b in zip(rest[::2], rest[1::2], strict=True)):
                return None
            turns = [(str(a["content"]), str(b["content"])) for a, b in zip(rest[::2], rest[1::2], strict=True)]
            try:
                return r.fmt.genie_continuation(turns, user, system=system)
            except Exception:
                return None
        return None

    def chat_prompt(self, body: dict[str, Any]) -> tuple[str, str | None, list[dict[str, Any]], Any]:
        msgs = self._norm(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(
                isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str) for t in tools)):
            raise BridgeError(400, "tools must be a list of {\"type\": \"function\", \"function\": {\"name\": ...}}")
        if body.get("tool_choice") == "none":
            tools = None
        case = Case(id="request", scorer="exact", messages=msgs, tools=tools)
        try:
            full = self.renderer.prompt(case)
        except Exception as exc:
            raise BridgeError(400, f"the model's chat template refused these messages: {exc}") from None
        key = repr(tools)
        return full, self._continuation(msgs, key), msgs, key

    # -- running a request -------------------------------------------------------------------------
    async def run(self, *, prompt: str, continuation: str | None, max_tokens: int | None,
                  sampler: dict[str, Any], stop_strings: list[str], on_text: Callable[[str], None] | None,
                  cancelled: asyncio.Event, content_after: Callable[[str], list[dict[str, Any]] | None],
                  tools_key: Any = None) -> Reply:
        t_arrive = time.monotonic()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        try:
            waited = (time.monotonic() - t_arrive) * 1000
            return await self._run_locked(prompt, continuation, max_tokens, sampler, stop_strings, on_text,
                                          cancelled, content_after, tools_key, waited)
        finally:
            self._lock.release()

    async def _run_locked(self, prompt: str, continuation: str | None, max_tokens: int | None,
                          sampler: dict[str, Any], stop_strings: list[str], on_text: Callable[[str], None] | None,
                          cancelled: asyncio.Event, content_after: Callable[[str], list[dict[str, Any]] | None],
                          tools_key: Any, waited_ms: float) -> Reply:
        reinit = None
        if self.session is None:
            await self.open("reload")
            reinit = "reload"
        s = self.session
        assert s is not None
        if sampler != self._sampler:
            why = await s.apply_sampler(sampler)
            if why is not None:   # this runtime cannot change it in place: reload with it (and say so)
                await self.close()
                self._sampler = dict(sampler)
                await self.open(f"sampler ({why})")
                reinit = "sampler"
                s = self.session
                assert s is not None
                continuation = None
            self._sampler = dict(sampler)
        budget = max_tokens or self.max_tokens
        count = s.token_counter or (lambda t: max(1, len(t) // 3))
        used = sum(int(x.get("prompt_tokens") or 0) + int(x.get("generated_tokens") or 0)
                   for x in self._turn_tokens)
        if continuation is not None and used + count(continuation) + budget + 8 > self.context_length:
            continuation = None
        kv_reused = continuation is not None
        if not kv_reused:
            await s.reset()
            self._turn_tokens = []
        text_in = continuation if continuation is not None else prompt
        if count(text_in) + budget + 2 > self.context_length:
            budget = self.context_length - count(text_in) - 2
            if budget < 1:
                raise BridgeError(400, f"the prompt is about {count(text_in)} tokens: it does not fit in the "
                                       f"context ({self.context_length} tokens) with room for a reply",
                                  "context_length_exceeded")
        s.max_tokens = budget
        s.conversation.max_reply_tokens = budget
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(cancelled.wait())
        watcher.add_done_callback(lambda _f: stop.set())
        emitted = ""
        full = ""
        hit_stop = False

        def chunk(c: Chunk) -> None:
            nonlocal emitted, full, hit_stop
            if hit_stop:
                return
            full += c.text
            cut = min((i for i in (full.find(x) for x in stop_strings if x) if i >= 0), default=-1)
            if cut >= 0:
                hit_stop = True
                stop.set()
                new = full[len(emitted):cut]
                full = full[:cut]
            else:
                keep = max((len(x) - 1 for x in stop_strings if x), default=0)   # a stop string may be starting
                new = full[len(emitted):len(full) - keep] if keep else full[len(emitted):]
            if new and on_text is not None:
                on_text(new)
            emitted += new

        t0 = time.monotonic()
        try:
            r = await s.send(text_in, on_chunk=chunk, stop=stop)
        except SessionError as exc:
            self._content = None
            raise BridgeError(500, f"the board's dialog failed: {exc.message}", "server_error") from None
        finally:
            watcher.cancel()
        if not hit_stop and len(full) > len(emitted) and on_text is not None:
            on_text(full[len(emitted):])
        text = full if (hit_stop or full) else r.text
        if r.state == "failed":
            self._content = None
            raise BridgeError(500, f"the board's dialog failed: {r.error}", "server_error")
        k = r.kpis.as_json() if r.kpis else {}
        self._turn_tokens.append({"prompt_tokens": k.get("prompt_tokens"), "generated_tokens": k.get("generated_tokens")})
        aborted = r.state == "aborted" and not hit_stop
        self._content = None if aborted or hit_stop else content_after(text)
        self._tools_key = tools_key
        gen = int(k.get("generated_tokens") or 0)
        finish = "stop" if hit_stop or (r.state == "complete" and gen < budget) else "length"
        self.served += 1
        stats = {"request": self.served, "queue_wait_ms": round(waited_ms, 3), "kv_reused": kv_reused,
                 "dialog_reset": not kv_reused, "reinit": reinit,
                 "init_ms": (self.inits[-1]["init_ms"] if reinit else 0.0),
                 "start_ms": r.first_chunk_ms, "wall_ms": round((time.monotonic() - t0) * 1000, 3),
                 "ttft_ms": k.get("ttft_ms"), "prompt_tokens": k.get("prompt_tokens"),
                 "prompt_tok_s": k.get("prompt_tok_s"), "generated_tokens": k.get("generated_tokens"),
                 "gen_tok_s": k.get("gen_tok_s"), "source": "simulated" if r.simulated else "device",
                 "runtime": r.runtime, "sampler": dict(self._sampler), "state": r.state}
        self.history.append(stats)
        return Reply(text, r.state, k, finish, stats)

    def stats(self) -> dict[str, Any]:
        s = self.session
        return {"board": self.board.name, "board_label": self.board.label, "simulated": self.simulated,
                "model": self.model_id, "runtime": s.runtime.name if s else None,
                "runtime_version": s.runtime_version if s else None, "context_length": self.context_length,
                "prompt_format": self.renderer.label(), "tool_format": self.renderer.tool_format,
                "loads": list(self.inits), "served": self.served, "waiting": self.waiting,
                "busy": self._lock.locked(), "requests": list(self.history)}
