"""`hexstudio serve`: an OpenAI-compatible HTTP endpoint over one board's persistent dialog (bridge.py).

    GET  /v1/models                 the bundle's model
    POST /v1/chat/completions       messages (+ tools), stream or not; tool calls parsed in the model's format
    POST /v1/completions            a raw prompt (no chat template), stream or not
    GET  /v1/stats                  the dialog (loads and their init_ms) and the last requests' KPIs
    GET  /health

Each response carries its request's KPIs: headers `x-hexstudio-*` (queue wait, TTFT, tok/s, whether the KV
cache was reused, source simulated|device) on a whole response, and a `hexstudio` object in the body or in
the last streamed chunk.

The HTTP side is Starlette on uvicorn (docs/serve.md says why): HTTP/1.1 parsing (Content-Length, chunked,
header size) is h11's, and the limits are ours (`Limits`): header size and time, body size and time, idle
keep-alive, connections, the request queue (429 + Retry-After when full; 503 + Retry-After while the model
is reloading or the server stops), and a client that goes away stops its generation at once. Every request
body is validated (schema.py): a bad field is a 400 in OpenAI's error shape, and never reaches the dialog.

Binding: 127.0.0.1 by default. Any other address needs --allow-remote AND an API key (the clients then
send `Authorization: Bearer KEY`); the key is read from an environment variable, never the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import h11
import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from hexstudio.core.eval.toolcall import parse_reply
from hexstudio.serve.bridge import BridgeError, DialogBridge, genie_sampler
from hexstudio.serve.limits import Limits
from hexstudio.serve.schema import ChatRequest, CompletionRequest, _Request, first_error
from hexstudio.shared.errors import ActionableError

M = TypeVar("M", bound=_Request)  # an OpenAI request schema (hexstudio.serve.schema)

log = logging.getLogger("hexstudio.serve")
_ROLE = {"role": "assistant", "content": ""}  # a chat stream's first delta
# the tags a model's tool call can start with after some text (hexstudio.core.eval.toolcall's formats)
_CALL_TAGS = ("<|python_tag|>", "<TOOLCALL>", "<tool_call>", "[TOOL_CALLS]")


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
        raise BindRefused(
            f"{host} is not a loopback address: anyone who can reach it could use the board.",
            "Serve on 127.0.0.1 (the default), or pass --allow-remote together with an API key "
            "(--api-key-env VAR naming an environment variable that holds it).",
        )
    if not api_key:
        raise BindRefused(
            f"Serving on {host} needs an API key.",
            "Put a long random key in an environment variable (e.g. export HEXSTUDIO_API_KEY=$(openssl "
            "rand -hex 24)) and pass --api-key-env HEXSTUDIO_API_KEY; clients send it as the API key.",
        )


def _error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(doc, ensure_ascii=False).encode("utf-8"),
        status,
        headers=headers,
        media_type="application/json",
    )


def _fail(exc: BridgeError) -> Response:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return _json(exc.status, _error(exc.status, exc.message, exc.kind, exc.param, exc.openai_code), headers)


def kpi_headers(stats: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k in (
        "queue_wait_ms",
        "start_ms",
        "ttft_ms",
        "prompt_tokens",
        "prompt_tok_s",
        "generated_tokens",
        "gen_tok_s",
        "init_ms",
        "kv_reused",
        "source",
        "request",
    ):
        v = stats.get(k)
        if v is not None:
            out[f"x-hexstudio-{k.replace('_', '-')}"] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone away (the body was read already: nothing else arrives before that)."""
    while True:
        m = await receive()
        if m["type"] == "http.disconnect":
            return


# -- the HTTP connection: uvicorn's h11 protocol with a header deadline and a connection cap ----------------
_RAW_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n"
)
_RAW_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n"
)


def _raw(head: bytes, status: int, message: str) -> bytes:
    body = json.dumps(
        _error(status, message, "server_error" if status >= 500 else "invalid_request_error")
    ).encode()
    return head % len(body) + body


# h11's RemoteProtocolError carries the status it suggests; these are the ones it uses (400 otherwise)
_FRAMING_STATUS = {
    400: b"400 Bad Request",
    413: b"413 Content Too Large",
    414: b"414 URI Too Long",
    431: b"431 Request Header Fields Too Large",
    501: b"501 Not Implemented",
    505: b"505 HTTP Version Not Supported",
}
HEADERS_TOO_LARGE = "headers_too_large"  # the error code of every 431, from h11 or from the app's check
_LINGER_S = 2.0  # after a framing error: seconds to read and drop what the client still sends, then close


def headers_too_large(max_header: int, size: int | None = None) -> str:
    """The one message for headers over the limit, whether h11 refused them while they trickled in or the
    app's own check saw them arrive in one piece (which of the two answers depends on TCP segmentation)."""
    seen = f"; these were {size} bytes" if size is not None else ""
    return (
        f"the request line and headers are larger than this server takes ({max_header} bytes at most{seen})"
    )


def framing_answer(exc: h11.RemoteProtocolError | None, max_header: int) -> bytes:
    """The whole HTTP answer to a request h11 refused while parsing it, in OpenAI's error shape."""
    status = exc.error_status_hint if exc is not None else 400
    if status not in _FRAMING_STATUS:
        status = 400
    why = str(exc) if exc is not None and str(exc) else "malformed request"
    code = "malformed_http"
    if status == 431 or why == "Receive buffer too long":
        status, why, code = 431, headers_too_large(max_header), HEADERS_TOO_LARGE
    if len(why) > 200:
        why = why[:200] + "..."
    message = f"malformed HTTP request: {why}"
    body = json.dumps(
        _error(
            status,
            message,
            "server_error" if status >= 500 else "invalid_request_error",
            code=code,
        )
    ).encode()
    return (
        b"HTTP/1.1 "
        + _FRAMING_STATUS[status]
        + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )


class _Conn(h11.Connection):
    """h11's connection, keeping the protocol error it raised: uvicorn's handler drops it and answers a fixed
    plain-text 400, and the error says which status fits (431, 501 ...) and what was wrong."""

    protocol_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.protocol_error = exc
            raise


def protocol_for(limits: Limits) -> type[H11Protocol]:
    class Protocol(H11Protocol):
        """uvicorn's HTTP/1.1 connection, plus: the request line and headers must arrive within
        `header_timeout` of the connection opening or of the previous response (a half-open or trickling
        client is closed with a 408), and past `max_connections` a new connection gets 503 and is closed."""

        _timer: asyncio.TimerHandle | None = None
        _armed_cycle: Any = None
        _lingering = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _Conn(h11.SERVER, limits.max_header)

        def send_400_response(self, msg: str) -> None:
            """uvicorn calls this when h11 refuses the request's framing (Content-Length -1, abc or given twice
            with different values, headers over `max_header`, a bad request line or chunk, a Transfer-Encoding
            other than chunked, no Host): it would answer a plain-text 400. The studio answers in OpenAI's
            error shape with the status h11 suggests, then reads and drops what the client still sends for a
            moment before closing, so the answer is not lost to a reset while the client is still sending."""
            conn = self.conn
            exc = conn.protocol_error if isinstance(conn, _Conn) else None
            log.info("serve: malformed HTTP request from %s: %s", self.client, exc or msg)
            started = self.cycle is not None and self.cycle.response_started
            if self.transport.is_closing() or started or conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
                self.transport.close()  # an answer is already under way: all that is left is to close
                return
            if self.cycle is not None:
                self.cycle.disconnected = True  # the app waiting for this body is told the client is gone
                self.cycle.message_event.set()
            self.transport.write(framing_answer(exc, limits.max_header))
            self._linger()

        def _linger(self) -> None:
            self._lingering = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # the rest of a refused request: dropped
            super().data_received(data)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(
                    _raw(
                        _RAW_503,
                        503,
                        f"the server holds {limits.max_connections} connections "
                        "already; try again in a moment",
                    )
                )
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._armed_cycle = self.cycle
            self._timer = self.loop.call_later(limits.header_timeout, self._expired)

        def _expired(self) -> None:
            self._timer = None
            if self.cycle is not self._armed_cycle or self.transport.is_closing():
                return  # a request came in since: its body and response have their own limits
            if self.conn.their_state is h11.IDLE or self.conn.their_state is h11.DONE:
                self.transport.write(
                    _raw(
                        _RAW_408,
                        408,
                        f"the request headers did not arrive within {limits.header_timeout:g} s",
                    )
                )
            self.transport.close()

        def on_response_complete(self) -> None:
            self._arm()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

    return Protocol


class _Uvicorn(uvicorn.Server):
    """The studio's CLI owns SIGINT/SIGTERM (it stops the server, then the dialog and the board): uvicorn must
    neither install its own handlers nor raise the signal again after serving."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Events(Response):
    """A server-sent-events response fed by a generation task; when the client goes away, the generation is
    stopped (its `cancelled` event set) and awaited, so the dialog is free for the next request at once.

    The 200 goes out with the first event, which the producer sends once the dialog is the request's: a refusal
    before that (the queue filled meanwhile, the server stopping, the dialog not loading, a sampler the runtime
    refuses) is raised as a BridgeError and answered with its own status and Retry-After, as without a stream."""

    media_type = "text/event-stream"

    def __init__(
        self,
        produce: Callable[[Callable[[Any], None]], Awaitable[None]],
        cancelled: asyncio.Event,
        headers: dict[str, str],
    ) -> None:
        super().__init__(
            None, 200, {"Cache-Control": "no-cache", **headers}, self.media_type + "; charset=utf-8"
        )
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]  # chunked
        self.produce = produce
        self.cancelled = cancelled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        def emit(doc: Any) -> None:
            if isinstance(doc, str) and doc.startswith(":"):  # a comment line: clients skip it
                queue.put_nowait(f"{doc}\n\n".encode())
                return
            data = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False)
            queue.put_nowait(f"data: {data}\n\n".encode())

        async def run() -> None:
            try:
                await self.produce(emit)
            finally:
                queue.put_nowait(None)

        gen = asyncio.ensure_future(run())
        gone = asyncio.ensure_future(_disconnected(receive))

        async def next_chunk() -> tuple[bool, bytes | None]:
            """(whether the client is still there, the next chunk: None once the producer has ended)."""
            get = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                return False, None
            return True, get.result()

        try:
            here, first = await next_chunk()
            if not here:
                return
            if first is None:
                # refused before the dialog was the request's: a status of its own, not a 200 with an error event
                exc = gen.exception() if gen.done() and not gen.cancelled() else None
                err = exc if isinstance(exc, BridgeError) else BridgeError(500, f"the reply failed: {exc!r}")
                if not isinstance(exc, BridgeError):
                    log.error("stream failed before its first event: %r", exc)
                await _fail(err)(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            chunk: bytes | None = first
            while chunk is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                here, chunk = await next_chunk()
                if not here:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return
        finally:
            gone.cancel()
            if not gen.done():
                self.cancelled.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await gen


class OpenAIServer:
    def __init__(
        self, bridge: DialogBridge, *, api_key: str | None = None, limits: Limits | None = None
    ) -> None:
        self.bridge = bridge
        self.api_key = api_key
        self.limits = limits or Limits()
        self.bridge.max_queue = self.limits.max_queue
        self.created = int(time.time())
        self.app = self._app()
        self._server: _Uvicorn | None = None
        self._task: asyncio.Future[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> int:
        """Listen (raises OSError when the address cannot be had) and serve in the background; the port."""
        sock = _listen(host, port)
        lim = self.limits
        config = uvicorn.Config(
            self._guard,
            interface="asgi3",
            http=protocol_for(lim),
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_keep_alive=lim.keep_alive,  # type: ignore[arg-type]
            timeout_graceful_shutdown=max(1, math.ceil(lim.shutdown_grace)),
            h11_max_incomplete_event_size=lim.max_header,
            backlog=2048,
            ws="none",
        )
        self._server = _Uvicorn(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise OSError(f"the HTTP server on {host}:{port} stopped at start")
            await asyncio.sleep(0.01)
        return int(sock.getsockname()[1])

    def stop_now(self) -> None:
        """During close(): stop waiting for the running generation and the open connections (a second Ctrl-C)."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True

    async def close(self) -> None:
        """Graceful: no new connections, queued requests answered 503, the running generation gets
        `shutdown_grace` seconds to finish, then it is stopped."""
        self.bridge.drain()
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self.limits.shutdown_grace + 5)
        except (asyncio.TimeoutError, Exception):
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    # -- the application ----------------------------------------------------------------------------
    def _app(self) -> Starlette:
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/stats", self._stats, methods=["GET"]),
            Route("/stats", self._stats, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completion, methods=["POST"]),
        ]

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            what = {
                404: f"{request.method} {request.url.path} is not served here",
                405: f"{request.method} {request.url.path} is not allowed (see GET /v1/models, "
                "POST /v1/chat/completions, POST /v1/completions)",
            }.get(status, "request refused")
            return _json(
                status, _error(status, what, "invalid_request_error" if status < 500 else "server_error")
            )

        async def crash(request: Request, exc: Exception) -> Response:
            log.exception("serve: %s %s failed", request.method, request.url.path)
            return _json(
                500,
                _error(
                    500,
                    f"the server failed on this request ({type(exc).__name__}); it is "
                    "logged, and the next request is served as usual",
                    "server_error",
                ),
            )

        return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: crash})

    async def _guard(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app uvicorn runs: the header size, the API key (every path but /health), then the routes."""
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + sum(
                len(k) + len(v) + 4 for k, v in scope.get("headers") or []
            )
            if size > self.limits.max_header:
                resp = _json(
                    431,
                    _error(
                        431,
                        f"malformed HTTP request: {headers_too_large(self.limits.max_header, size)}",
                        code=HEADERS_TOO_LARGE,
                    ),
                    {"Connection": "close"},
                )
                await resp(scope, receive, send)
                return
        if scope["type"] == "http" and scope["path"] != "/health" and not self._authorized(scope):
            resp = _json(
                401,
                _error(
                    401, "missing or wrong API key (send Authorization: Bearer KEY)", "authentication_error"
                ),
            )
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        if not self.api_key:
            return True
        got = ""
        for k, v in scope.get("headers") or []:
            if k == b"authorization":
                got = v.decode("latin-1")
        token = got[7:] if got.lower().startswith("bearer ") else ""
        return hmac.compare_digest(token.encode(), self.api_key.encode())

    async def _health(self, request: Request) -> Response:
        b = self.bridge
        return _json(
            200,
            {
                "ok": not b.draining,
                "simulated": b.simulated,
                "busy": b.busy,
                "waiting": b.waiting,
                "loaded": b.session is not None,
            },
        )

    async def _models(self, request: Request) -> Response:
        return _json(200, {"object": "list", "data": [self._model()]})

    async def _stats(self, request: Request) -> Response:
        return _json(200, self.bridge.stats())

    def _model(self) -> dict[str, Any]:
        return {
            "id": self.bridge.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "hexstudio",
            "simulated": self.bridge.simulated,
            "board": self.bridge.board.name,
        }

    def _check_model(self, m: str | None) -> None:
        if m not in (None, "", self.bridge.model_id, "default"):
            raise BridgeError(
                404,
                f"this server serves {self.bridge.model_id!r}, not {m!r}",
                "invalid_request_error",  # OpenAI's type for it; the code says which
                param="model",
                code="model_not_found",
            )

    async def _body(self, request: Request) -> dict[str, Any]:
        lim = self.limits
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > lim.max_body:
            raise BridgeError(413, f"the body is {declared} bytes; this server takes at most {lim.max_body}")

        async def read() -> bytes:
            buf = bytearray()
            async for part in request.stream():
                buf += part
                if len(buf) > lim.max_body:
                    raise BridgeError(413, f"the body is larger than {lim.max_body} bytes")
            return bytes(buf)

        try:
            body = await asyncio.wait_for(read(), lim.body_timeout)
        except asyncio.TimeoutError:
            raise BridgeError(408, f"the request body did not arrive within {lim.body_timeout:g} s") from None
        except ClientDisconnect:
            # gone, or its body's framing was refused (answered already): nothing more can be sent
            raise BridgeError(400, "the client went away before its body arrived") from None
        try:
            doc = json.loads(body or b"{}")
        except (ValueError, RecursionError):
            raise BridgeError(
                400, "the body is not valid JSON (UTF-8, nested less than about 900 levels)"
            ) from None
        if not isinstance(doc, dict):
            raise BridgeError(400, "the body must be a JSON object")
        return doc

    # -- endpoints ----------------------------------------------------------------------------------
    async def _request(self, request: Request, schema: type[M]) -> tuple[dict[str, Any], M]:
        """The request's JSON body, checked against OpenAI's request schema and the served model's name."""
        doc = await self._body(request)
        try:
            req = schema.model_validate(doc)
        except ValidationError as exc:
            param, msg = first_error(exc)
            raise BridgeError(400, msg, param=param) from None
        self._check_model(req.model)
        return doc, req

    async def _chat(self, request: Request) -> Response:
        try:
            doc, _req = await self._request(request, ChatRequest)
            prompt, msgs, tools_key = self.bridge.chat_prompt(doc)
            tools = doc.get("tools") if doc.get("tool_choice") != "none" else None
            fmt = self.bridge.renderer.tool_format

            def content_after(text: str) -> list[dict[str, Any]] | None:
                parsed = parse_reply(text, fmt) if tools else None
                if parsed is not None and parsed.kind != "none":
                    return None  # a tool call: the next request carries tool results, rendered afresh
                return [*msgs, {"role": "assistant", "content": text}]

            return await self._generate(
                request, doc, "chat.completion", prompt, msgs, content_after, tools, tools_key
            )
        except BridgeError as exc:
            return _fail(exc)

    async def _completion(self, request: Request) -> Response:
        try:
            doc, req = await self._request(request, CompletionRequest)
            p = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
            return await self._generate(request, doc, "text_completion", p, None, lambda _t: None, None, None)
        except BridgeError as exc:
            return _fail(exc)

    async def _generate(
        self,
        request: Request,
        doc: dict[str, Any],
        kind: str,
        prompt: str,
        msgs: list[dict[str, Any]] | None,
        content_after: Callable[[str], list[dict[str, Any]] | None],
        tools: Any,
        tools_key: Any,
    ) -> Response:
        stream = bool(doc.get("stream"))
        stop = doc.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        # the model's own stop strings (generation_config.json) end its replies here as in `hexstudio chat`; a
        # request's `stop` adds to them
        stops = list(dict.fromkeys([*stops, *self.bridge.renderer.fmt.stop_strings]))
        # OpenAI's newer name wins where it is given (a null is not given)
        mt = doc.get("max_completion_tokens")
        if mt is None:
            mt = doc.get("max_tokens")
        sampler = genie_sampler(doc, self.bridge.default_sampler)
        # 429 / 503 with Retry-After before anything starts; a prompt the dialog cannot take is a 400 here, also for
        # a stream (once its 200 is sent, an error can only be an event)
        self.bridge.admit()
        self.bridge.precheck(prompt)
        rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model = self.bridge.model_id
        fmt = self.bridge.renderer.tool_format
        cancelled = asyncio.Event()
        if not stream:
            gen = asyncio.ensure_future(
                self.bridge.run(
                    prompt=prompt,
                    messages=msgs,
                    max_tokens=mt,
                    sampler=sampler,
                    stop_strings=stops,
                    on_text=None,
                    cancelled=cancelled,
                    content_after=content_after,
                    tools_key=tools_key,
                )
            )
            gone = asyncio.ensure_future(_disconnected(request.receive))
            try:
                await asyncio.wait({gen, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not gen.done():  # the client went away (or this task is cancelled): stop the generation
                    cancelled.set()
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await gen
            reply = gen.result()
            usage = self._usage(reply.stats)
            if kind == "text_completion":
                out = {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "text": reply.text,
                            "finish_reason": reply.finish_reason,
                            "logprobs": None,
                        }
                    ],
                    "usage": usage,
                    "hexstudio": reply.stats,
                }
            else:
                msg, finish = self._message(reply.text, reply.finish_reason, tools, fmt)
                out = {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                    "hexstudio": reply.stats,
                }
            return _json(200, out, kpi_headers(reply.stats))

        # streaming: server-sent events; text goes out as it is generated, except that with tools a reply that
        # starts like a tool call is held back and sent as tool_calls once it is complete
        obj = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"

        def base(extra: dict[str, Any]) -> dict[str, Any]:
            return {"id": rid, "object": obj, "created": created, "model": model, **extra}

        markers = ("{", "[", "<|python_tag|>", "<TOOLCALL>", "<tool_call>", "[TOOL_CALLS]", "```")

        async def produce(emit: Callable[[Any], None]) -> None:
            def send_text(piece: str) -> None:
                if kind == "chat.completion":
                    emit(
                        base({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                    )
                else:
                    emit(
                        base(
                            {
                                "choices": [
                                    {"index": 0, "text": piece, "finish_reason": None, "logprobs": None}
                                ]
                            }
                        )
                    )

            started = False

            def start() -> None:
                # the dialog is the request's: the 200 goes out with this first event
                nonlocal started
                started = True
                if kind == "chat.completion":
                    emit(base({"choices": [{"index": 0, "delta": _ROLE, "finish_reason": None}]}))
                else:
                    emit(": the board's dialog is answering")

            holding = bool(tools) and kind == "chat.completion"
            releasing = not holding
            buf = ""

            def on_text(piece: str) -> None:
                nonlocal releasing, buf
                if not holding:
                    send_text(piece)
                    return
                buf += piece
                if not releasing:
                    s = buf.lstrip()
                    if not s or any(s.startswith(m) or m.startswith(s) for m in markers):
                        return
                    releasing = True
                # a call may still follow the text: from where one could start, the text is held to the end
                cut = _before_call(buf)
                if cut:
                    send_text(buf[:cut])
                    buf = buf[cut:]

            try:
                reply = await self.bridge.run(
                    prompt=prompt,
                    messages=msgs,
                    max_tokens=mt,
                    sampler=sampler,
                    stop_strings=stops,
                    on_text=on_text,
                    cancelled=cancelled,
                    content_after=content_after,
                    tools_key=tools_key,
                    on_start=start,
                )
            except BridgeError as exc:
                if not started:
                    raise
                emit(
                    {"error": _error(exc.status, exc.message, exc.kind, exc.param, exc.openai_code)["error"]}
                )
                emit("[DONE]")
                return
            except Exception as exc:
                if not started:
                    raise
                # never a stream that just stops: a client would take the partial text for the whole reply
                log.exception("stream %s failed", rid)
                emit({"error": _error(500, f"the reply failed: {exc!r}", "server_error")["error"]})
                emit("[DONE]")
                return
            try:
                if kind == "chat.completion":
                    msg, finish = self._message(reply.text, reply.finish_reason, tools, fmt)
                    delta: dict[str, Any] | None = {"content": buf} if buf else None
                    if msg.get("tool_calls"):
                        # the text before the call's tag, when the reply said something first
                        before = buf[: max(_first_tag(buf), 0)]
                        if before.strip():
                            send_text(before)
                        delta = {"tool_calls": [{"index": i, **tc} for i, tc in enumerate(msg["tool_calls"])]}
                    if delta is not None:
                        emit(base({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
                    last: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": finish}
                else:
                    last = {"index": 0, "text": "", "finish_reason": reply.finish_reason, "logprobs": None}
                emit(base({"choices": [last], "usage": self._usage(reply.stats), "hexstudio": reply.stats}))
            except Exception as exc:
                # the reply is in: never a stream that just stops after it either
                log.exception("stream %s failed after its reply", rid)
                emit({"error": _error(500, f"the reply failed: {exc!r}", "server_error")["error"]})
            emit("[DONE]")

        return _Events(produce, cancelled, {"x-hexstudio-simulated": str(self.bridge.simulated).lower()})

    @staticmethod
    def _usage(stats: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's usage: the whole prompt's tokens, those the dialog's KV cache already held among them
        (prompt_tokens_details.cached_tokens, as OpenAI reports its prompt cache), and the reply's."""
        cached = int(stats.get("cached_tokens") or 0)
        p, g = int(stats.get("prompt_tokens") or 0) + cached, int(stats.get("generated_tokens") or 0)
        return {
            "prompt_tokens": p,
            "completion_tokens": g,
            "total_tokens": p + g,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    @staticmethod
    def _message(text: str, finish: str, tools: Any, fmt: str) -> tuple[dict[str, Any], str]:
        if not tools:
            return {"role": "assistant", "content": text}, finish
        parsed = parse_reply(text, fmt)
        if parsed.kind != "calls":
            # a malformed call is returned as text (the client sees what the model wrote)
            return {"role": "assistant", "content": text}, finish
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": x.name, "arguments": json.dumps(x.arguments, ensure_ascii=False)},
            }
            for x in parsed.calls
        ]
        return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, "tool_calls"


def _first_tag(text: str) -> int:
    """Where the first tool-call tag in `text` starts (-1: none)."""
    return min((text.find(t) for t in _CALL_TAGS if t in text), default=-1)


def _before_call(text: str) -> int:
    """How much of a streamed reply can go out as text: up to the first tool-call tag, or up to a tail that may
    be the start of one."""
    if (at := _first_tag(text)) >= 0:
        return at
    for n in range(min(len(text), max(map(len, _CALL_TAGS))), 0, -1):
        if any(t.startswith(text[-n:]) for t in _CALL_TAGS):
            return len(text) - n
    return len(text)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
