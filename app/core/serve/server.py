"""`hexstudio serve`: an OpenAI-compatible HTTP endpoint over one board's persistent dialog (bridge.py).

    GET  /v1/models                 the bundle's model
    POST /v1/chat/completions       messages (+ tools), stream or not; tool calls parsed in the model's format
    POST /v1/completions            a raw prompt (no chat template), stream or not
    GET  /v1/stats                  the dialog (loads and their init_ms) and the last requests' KPIs
    GET  /health

Each response carries its request's KPIs: headers `x-hexstudio-*` (queue wait, TTFT, tok/s, whether the KV
cache was reused, source simulated|device) on a whole response, and a `hexstudio` object in the body or in
the last streamed chunk. Plain asyncio HTTP/1.1 (keep-alive; a streamed response is server-sent events
and closes its connection), stdlib only.

Binding: 127.0.0.1 by default. Any other address needs --allow-remote AND an API key (the clients then
send `Authorization: Bearer KEY`); the key is read from an environment variable, never the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from app.core.eval.toolcall import parse_reply
from app.core.serve.bridge import BridgeError, DialogBridge, genie_sampler
from workers.shared.errors import ActionableError

MAX_BODY = 8 << 20
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BindRefused(ActionableError):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def check_bind(host: str, allow_remote: bool, api_key: str | None) -> None:
    if is_loopback(host):
        return
    if not allow_remote:
        raise BindRefused(f"{host} is not a loopback address: anyone who can reach it could use the board.",
                          "Serve on 127.0.0.1 (the default), or pass --allow-remote together with an API key "
                          "(--api-key-env VAR naming an environment variable that holds it).")
    if not api_key:
        raise BindRefused(f"Serving on {host} needs an API key.",
                          "Put a long random key in an environment variable (e.g. export HEXSTUDIO_API_KEY=$(openssl "
                          "rand -hex 24)) and pass --api-key-env HEXSTUDIO_API_KEY; clients send it as the API key.")


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.r, self.w = reader, writer

    async def send(self, status: int, body: bytes, ctype: str = "application/json",
                   headers: dict[str, str] | None = None, close: bool = False) -> None:
        h = {"Content-Type": ctype, "Content-Length": str(len(body)),
             "Connection": "close" if close else "keep-alive", **(headers or {})}
        head = f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
        self.w.write(head.encode("latin-1") + b"\r\n" + body)
        await self.w.drain()

    async def json(self, status: int, doc: Any, headers: dict[str, str] | None = None, close: bool = False) -> None:
        await self.send(status, json.dumps(doc, ensure_ascii=False).encode("utf-8"), headers=headers, close=close)

    async def start_events(self, headers: dict[str, str] | None = None) -> None:
        h = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "Connection": "close",
             **(headers or {})}
        head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
        self.w.write(head.encode("latin-1") + b"\r\n")
        await self.w.drain()

    async def event(self, doc: Any) -> None:
        data = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False)
        self.w.write(f"data: {data}\n\n".encode())
        await self.w.drain()


def _error(status: int, message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def kpi_headers(stats: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k in ("queue_wait_ms", "start_ms", "ttft_ms", "prompt_tokens", "prompt_tok_s", "generated_tokens",
              "gen_tok_s", "init_ms", "kv_reused", "source", "request"):
        v = stats.get(k)
        if v is not None:
            out[f"x-hexstudio-{k.replace('_', '-')}"] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


class OpenAIServer:
    def __init__(self, bridge: DialogBridge, *, api_key: str | None = None) -> None:
        self.bridge = bridge
        self.api_key = api_key
        self.server: asyncio.AbstractServer | None = None
        self.created = int(time.time())

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> int:
        self.server = await asyncio.start_server(self._handle, host, port)
        sock = self.server.sockets[0]
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)

    # -- HTTP ---------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        c = _Conn(reader, writer)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), 300)
                except asyncio.TimeoutError:
                    return
                if not line:
                    return
                try:
                    method, target, _version = line.decode("latin-1").split()
                except ValueError:
                    await c.json(400, _error(400, "malformed request line"), close=True)
                    return
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    await c.json(411, _error(411, "send the body with a Content-Length"), close=True)
                    return
                n = int(headers.get("content-length") or 0)
                if n > MAX_BODY:
                    await c.json(413, _error(413, f"the body is larger than {MAX_BODY} bytes"), close=True)
                    return
                body = await reader.readexactly(n) if n else b""
                keep = await self._route(c, method, target.split("?", 1)[0], headers, body)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _authorized(self, headers: dict[str, str]) -> bool:
        if not self.api_key:
            return True
        got = headers.get("authorization", "")
        token = got[7:] if got.lower().startswith("bearer ") else ""
        return hmac.compare_digest(token.encode(), self.api_key.encode())

    async def _route(self, c: _Conn, method: str, path: str, headers: dict[str, str], body: bytes) -> bool:
        if path == "/health":
            await c.json(200, {"ok": True, "simulated": self.bridge.simulated})
            return True
        if not self._authorized(headers):
            await c.json(401, _error(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                                     "authentication_error"))
            return True
        routes: dict[tuple[str, str], Callable[[_Conn, dict[str, Any]], Awaitable[bool]]] = {
            ("POST", "/v1/chat/completions"): self._chat, ("POST", "/v1/completions"): self._completion}
        if method == "GET" and path == "/v1/models":
            await c.json(200, {"object": "list", "data": [self._model()]})
            return True
        if method == "GET" and path in ("/v1/stats", "/stats"):
            await c.json(200, self.bridge.stats())
            return True
        fn = routes.get((method, path))
        if fn is None:
            known = any(p == path for _m, p in routes) or path in ("/v1/models", "/v1/stats")
            await c.json(405 if known else 404, _error(405 if known else 404, f"{method} {path} is not served here"))
            return True
        try:
            doc = json.loads(body or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("not an object")
        except ValueError:
            await c.json(400, _error(400, "the body is not a JSON object"))
            return True
        try:
            return await fn(c, doc)
        except BridgeError as exc:
            await c.json(exc.status, _error(exc.status, exc.message, exc.kind))
            return True

    def _model(self) -> dict[str, Any]:
        return {"id": self.bridge.model_id, "object": "model", "created": self.created, "owned_by": "hexstudio",
                "simulated": self.bridge.simulated, "board": self.bridge.board.name}

    def _check_model(self, doc: dict[str, Any]) -> None:
        m = doc.get("model")
        if m not in (None, "", self.bridge.model_id, "default"):
            raise BridgeError(404, f"this server serves {self.bridge.model_id!r}, not {m!r}", "model_not_found")

    # -- endpoints ----------------------------------------------------------------------------------
    async def _chat(self, c: _Conn, doc: dict[str, Any]) -> bool:
        self._check_model(doc)
        prompt, cont, msgs, tools_key = self.bridge.chat_prompt(doc)
        tools = doc.get("tools") if doc.get("tool_choice") != "none" else None
        fmt = self.bridge.renderer.tool_format

        def content_after(text: str) -> list[dict[str, Any]] | None:
            parsed = parse_reply(text, fmt) if tools else None
            if parsed is not None and parsed.kind != "none":
                return None   # a tool call: the next request carries tool results, rendered afresh
            return [*msgs, {"role": "assistant", "content": text}]

        return await self._generate(c, doc, "chat.completion", prompt, cont, content_after, tools, tools_key)

    async def _completion(self, c: _Conn, doc: dict[str, Any]) -> bool:
        self._check_model(doc)
        p = doc.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if not isinstance(p, str) or not p:
            raise BridgeError(400, "prompt must be a non-empty string")
        return await self._generate(c, doc, "text_completion", p, None, lambda _t: None, None, None)

    async def _generate(self, c: _Conn, doc: dict[str, Any], kind: str, prompt: str, cont: str | None,
                        content_after: Callable[[str], list[dict[str, Any]] | None], tools: Any,
                        tools_key: Any) -> bool:
        stream = bool(doc.get("stream"))
        stop = doc.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        mt = doc.get("max_completion_tokens", doc.get("max_tokens"))
        if mt is not None and (not isinstance(mt, int) or mt < 1):
            raise BridgeError(400, "max_tokens must be a positive whole number")
        sampler = genie_sampler(doc, self.bridge.default_sampler)
        rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model = self.bridge.model_id
        fmt = self.bridge.renderer.tool_format
        cancelled = asyncio.Event()
        if not stream:
            reply = await self.bridge.run(prompt=prompt, continuation=cont, max_tokens=mt, sampler=sampler,
                                          stop_strings=stops, on_text=None, cancelled=cancelled,
                                          content_after=content_after, tools_key=tools_key)
            usage = self._usage(reply.stats)
            if kind == "text_completion":
                out = {"id": rid, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": 0, "text": reply.text, "finish_reason": reply.finish_reason,
                                    "logprobs": None}], "usage": usage, "hexstudio": reply.stats}
            else:
                msg, finish = self._message(reply.text, reply.finish_reason, tools, fmt)
                out = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                       "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
                       "usage": usage, "hexstudio": reply.stats}
            await c.json(200, out, headers=kpi_headers(reply.stats))
            return True
        # streaming: server-sent events; text goes out as it is generated, except that with tools a reply that
        # starts like a tool call is held back and sent as tool_calls once it is complete
        obj = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        await c.start_events({"x-hexstudio-simulated": str(self.bridge.simulated).lower()})

        def base(extra: dict[str, Any]) -> dict[str, Any]:
            return {"id": rid, "object": obj, "created": created, "model": model, **extra}

        if kind == "chat.completion":
            await c.event(base({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]}))
        held: list[str] = []   # a reply that may be a tool call, held back until it is complete
        markers = ("{", "[", "<|python_tag|>", "<TOOLCALL>", "<tool_call>", "[TOOL_CALLS]", "```")

        async def send_text(piece: str) -> None:
            if kind == "chat.completion":
                await c.event(base({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
            else:
                await c.event(base({"choices": [{"index": 0, "text": piece, "finish_reason": None,
                                                 "logprobs": None}]}))

        async def pump() -> None:
            releasing = not (tools and kind == "chat.completion")
            buf = ""
            while (piece := await queue.get()) is not None:
                if releasing:
                    await send_text(piece)
                    continue
                buf += piece
                s = buf.lstrip()
                if not s or any(s.startswith(m) or m.startswith(s) for m in markers):
                    continue
                releasing = True
                await send_text(buf)
                buf = ""
            if buf:
                held.append(buf)

        pumper = asyncio.ensure_future(pump())
        try:
            reply = await self.bridge.run(prompt=prompt, continuation=cont, max_tokens=mt, sampler=sampler,
                                          stop_strings=stops, on_text=queue.put_nowait, cancelled=cancelled,
                                          content_after=content_after, tools_key=tools_key)
        except BridgeError as exc:
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await pumper
            await c.event({"error": _error(exc.status, exc.message, exc.kind)["error"]})
            await c.event("[DONE]")
            return False
        except (ConnectionError, asyncio.CancelledError):
            cancelled.set()
            raise
        queue.put_nowait(None)
        try:
            await pumper
        except ConnectionError:   # the client went away: the reply already ended or was aborted
            return False
        if kind == "chat.completion":
            msg, finish = self._message(reply.text, reply.finish_reason, tools, fmt)
            if msg.get("tool_calls"):
                calls = [{"index": i, **tc} for i, tc in enumerate(msg["tool_calls"])]
                await c.event(base({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]}))
            elif held:
                await c.event(base({"choices": [{"index": 0, "delta": {"content": "".join(held)},
                                                 "finish_reason": None}]}))
            await c.event(base({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                                "usage": self._usage(reply.stats), "hexstudio": reply.stats}))
        else:
            await c.event(base({"choices": [{"index": 0, "text": "", "finish_reason": reply.finish_reason,
                                             "logprobs": None}], "usage": self._usage(reply.stats),
                                "hexstudio": reply.stats}))
        await c.event("[DONE]")
        return False

    @staticmethod
    def _usage(stats: dict[str, Any]) -> dict[str, Any]:
        p, g = int(stats.get("prompt_tokens") or 0), int(stats.get("generated_tokens") or 0)
        return {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g}

    @staticmethod
    def _message(text: str, finish: str, tools: Any, fmt: str) -> tuple[dict[str, Any], str]:
        if not tools:
            return {"role": "assistant", "content": text}, finish
        parsed = parse_reply(text, fmt)
        if parsed.kind != "calls":
            # a malformed call is returned as text (the client sees what the model wrote)
            return {"role": "assistant", "content": text}, finish
        calls = [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                  "function": {"name": x.name, "arguments": json.dumps(x.arguments, ensure_ascii=False)}}
                 for x in parsed.calls]
        return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, "tool_calls"
