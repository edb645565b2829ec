"""The simulator board's `geniex serve`: GenieX's OpenAI-compatible server over the simulator's SimDialog.

What it reproduces (read from GenieX's sources, docs/genie.md "GenieX"; cli/server/route.go,
handler/{chat,chat_stream,chat_response,chat_messages,model}.go, middleware/gil.go, service/keepalive.go):

- routes: `GET /` redirects to `/docs/ui/`; `GET /v1/` answers `GenieX-CLI is running`; `POST
  /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /v1/models/{name}`; CORS open.
- only pulled models are served (`geniex pull NAME --local-path DIR` first); an unknown name is a 400
  `{"error": "SDKError(File not found or inaccessible)"}`; a bundle the plugin cannot load a 500
  `{"error": "SDKError(Model loading failed)", "code": -100201}`.
- one request at a time (the server's global lock); one model kept loaded (`--keepalive` seconds idle,
  default 300), its KV cache reset before each request unless the request sends `GenieX-KeepCache: true`.
- a request with no messages, or only a system message, loads the model and answers `null` (warm-up).
- the model's chat template (tokenizer_config.json beside the bundle) is applied as the qairt plugin
  applies it (SimGenieX.apply_chat_template): on a fresh cache the whole history, with the plugin's default
  system prompt when there is none; with `GenieX-KeepCache: true` only the messages since the last
  assistant reply. Text content parts only (`{"error": "not support content part type"}` otherwise).
- `max_completion_tokens` (default 2048) bounds the reply; `max_tokens` is not read (GenieX's handler reads
  only max_completion_tokens); `temperature`, `top_p`, `top_k`, `seed` set the sampler.
- streaming: server-sent events as gin writes them (`data:{json}` and a blank line, no space after the
  colon), chunked; each `chat.completion.chunk` has `finish_reason: null` until a final chunk holding
  only the finish reason; with `stream_options.include_usage` a usage chunk (empty choices); then
  `data:[DONE]`. A failure mid-stream is an event `{"error", "code"}` and the stream ends.
- the blocking reply is a `chat.completion` with usage (prompt, completion, total tokens); a prompt longer
  than the context is a 400 `context_length_exceeded` in OpenAI's error shape; finish reasons map as
  GenieX maps them (`length` -> length, everything else -> stop).

Labeled: every response carries `X-HexStudio-Simulated: true` and `GET /v1/` says it is the simulator.
The legacy `/v1/completions` takes the prompt verbatim (no template), `max_tokens` (default 16), `echo`,
and refuses what GenieX refuses (an empty or missing prompt, several prompts, token prompts, suffix,
n/best_of > 1, logprobs, logit_bias) with its texts.
Not reproduced: the Swagger UI, tool-call parsing, reasoning separation, stop strings, `/v1/logits`,
HTTPS, VLMs.

    python -m hexstudio.workers.genie_sim.geniex serve [--host 127.0.0.1:18181] [--keepalive 300] [--data-dir DIR]
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hexstudio.shared.chat_template import ChatTemplateError
from hexstudio.workers.genie_sim.geniex_model import SIM_LABEL, GenieXError, SimGenieX, _registry

ERR_FILE_NOT_FOUND = -100004
ERR_MODEL_LOAD = -100201
ERR_PROMPT_TOO_LONG = -200103
DEFAULT_MAX_COMPLETION_TOKENS = 2048  # chat: ChatCompletionNewParams.MaxCompletionTokens
DEFAULT_COMPLETION_MAX_TOKENS = 16  # completions: OpenAI's documented default for the legacy endpoint
CHUNK = "chat.completion.chunk"


def finish_reason(stop_reason: str) -> str:
    """GenieX's mapFinishReason: only a length stop is `length`."""
    return "length" if stop_reason == "length" else "stop"


def usage(pd: dict[str, Any]) -> dict[str, Any]:
    gen, prompt = int(pd.get("generated_tokens") or 0), int(pd.get("prompt_tokens") or 0)
    drafted, accepted = int(pd.get("draft_n_total") or 0), int(pd.get("draft_n_accepted") or 0)
    return {
        "completion_tokens": gen,
        "prompt_tokens": prompt,
        "total_tokens": gen + prompt,
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        },
    }


def messages_of(body: dict[str, Any]) -> list[dict[str, str]] | None:
    """(role, text) messages as GenieX's buildLLMMessages flattens them; None for a non-text content part."""
    out: list[dict[str, str]] = []
    for m in body.get("messages") or []:
        role = str(m.get("role") or "user")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    return None
                out.append({"role": role, "content": str(part.get("text") or "")})
    return out


def completion_problem(body: dict[str, Any]) -> str | None:
    """The legacy endpoint's refusals (completionPrompt, completionUnsupported), in their order."""
    p = body.get("prompt")
    if isinstance(p, str):
        if not p:
            return "prompt must be non-empty"
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        if len(p) != 1 or not p[0]:
            return "only a single non-empty prompt is supported"
    elif isinstance(p, list) and p:
        return "token prompts are not supported; send a string prompt"
    else:
        return "prompt is required"
    if body.get("suffix"):
        return "suffix is not supported; send a prompt containing the model's FIM template instead"
    if (body.get("n") or 1) > 1:
        return "n > 1 is not supported"
    if (body.get("best_of") or 1) > 1:
        return "best_of > 1 is not supported"
    if body.get("logprobs") is not None:
        return "logprobs is not supported"
    if body.get("logit_bias"):
        return "logit_bias is not supported"
    return None


def is_warmup(body: dict[str, Any]) -> bool:
    msgs = body.get("messages") or []
    return not msgs or (len(msgs) == 1 and msgs[0].get("role") == "system")


class Keeper:
    """The one model kept loaded (service/keepalive.go), under the server's request lock."""

    def __init__(self, data_dir: Path, keepalive_s: float) -> None:
        self.data_dir, self.keepalive_s = data_dir, keepalive_s
        self.lock = threading.Lock()
        self.name: str | None = None
        self.model: SimGenieX | None = None
        self.last = time.monotonic()

    def get(self, name: str, bundle: str, reset: bool) -> SimGenieX:
        if self.model is None or self.name != name:
            self.model, self.name = None, None
            self.model = SimGenieX(Path(bundle))  # GenieXError when the plugin refuses
            self.name = name
        if reset:
            self.model.reset()
        return self.model

    def sweep(self) -> None:
        with self.lock:
            if self.model is not None and time.monotonic() - self.last > self.keepalive_s:
                self.model, self.name = None, None


def set_sampler(model: SimGenieX, body: dict[str, Any]) -> None:
    """The request's sampler, as the handler builds GenieX's SamplerConfig per request (an omitted value is 0:
    temperature 0 is greedy, top_k/top_p 0 leave the distribution whole, seed 0)."""
    top_k = int(body.get("top_k") or 0)
    top_p = float(body.get("top_p") or 0.0)
    model.dialog.apply_sampler(
        {
            "temp": float(body.get("temperature") or 0.0),
            "top-k": top_k if top_k > 0 else 1 << 30,
            "top-p": top_p if 0 < top_p <= 1 else 1.0,
            "seed": int(body.get("seed") or 0),
        }
    )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "GenieX-sim"
    keeper: Keeper

    def log_message(self, format: str, *args: Any) -> None:  # quiet, as gin in release mode
        pass

    # -- plumbing ------------------------------------------------------------------------------
    def _head(self, status: int, ctype: str, length: int | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("X-HexStudio-Simulated", "true")
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self._head(status, "application/json; charset=utf-8", len(data))
        self.wfile.write(data)

    def _text(self, status: int, text: str) -> None:
        data = text.encode("utf-8")
        self._head(status, "text/plain; charset=utf-8", len(data))
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, obj: Any) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        self._chunk(f"data:{payload}\n\n".encode())

    def _body(self) -> dict[str, Any] | None:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"null")
        except ValueError as exc:
            self._json(400, {"error": str(exc)})
            return None
        if not isinstance(body, dict):
            self._json(400, {"error": "json: cannot unmarshal into the request object"})
            return None
        return body

    # -- routes --------------------------------------------------------------------------------
    def do_OPTIONS(self) -> None:
        self.send_response(204)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "*")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/":
            self.send_response(302)
            self.send_header("Location", "/docs/ui/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path in ("/v1", "/v1/"):
            self._text(200, f"GenieX-CLI is running {SIM_LABEL}")
        elif path == "/v1/models":
            names = sorted(_registry(self.keeper.data_dir))
            self._json(200, {"object": "list", "data": [self._model(n) for n in names]})
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/") :].split(":", 1)[0]
            self._json(200, self._model(name)) if name in _registry(self.keeper.data_dir) else self._json(
                404, None
            )
        else:
            self._text(404, "404 page not found")

    @staticmethod
    def _model(name: str) -> dict[str, Any]:
        return {"id": name, "created": 0, "object": "model", "owned_by": name.split("/")[0]}

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._text(404, "404 page not found")
            return
        body = self._body()
        if body is None:
            return
        with self.keeper.lock:  # one request at a time (middleware.GIL)
            try:
                self._complete(body, chat=path == "/v1/chat/completions")
            except OSError:
                pass  # the client went away
            except Exception as exc:  # a bug of the simulator's, said as one, never a dropped connection
                self._json(
                    500, {"error": f"HexStudio simulator: {type(exc).__name__}: {exc}", "code": -100000}
                )
            finally:
                self.keeper.last = time.monotonic()

    def _complete(self, body: dict[str, Any], chat: bool) -> None:
        """handler.ChatCompletions / handler.Completions, in their order of checks."""
        prompt = ""
        msgs = body.get("messages")
        if (
            chat
            and msgs is not None
            and not (isinstance(msgs, list) and all(isinstance(m, dict) for m in msgs))
        ):
            # gin's ShouldBindJSON refuses a body that does not fit ChatCompletionNewParams
            self._json(
                400, {"error": "json: cannot unmarshal messages: expected an array of message objects"}
            )
            return
        if not chat:  # the legacy endpoint checks its prompt and parameters before the model
            problem = completion_problem(body)
            if problem:
                self._json(400, {"error": problem})
                return
            prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
        name = str(body.get("model") or "").split(":", 1)[0]
        bundle = _registry(self.keeper.data_dir).get(name)  # only pulled models are served
        if bundle is None:
            self._json(400, {"error": "SDKError(File not found or inaccessible)"})
            return
        messages = messages_of(body) if chat else []
        if messages is None:
            self._json(400, {"error": "not support content part type"})
            return
        try:
            model = self.keeper.get(name, bundle, reset=self.headers.get("GenieX-KeepCache") != "true")
        except GenieXError:
            self._json(500, {"error": "SDKError(Model loading failed)", "code": ERR_MODEL_LOAD})
            return
        if chat and is_warmup(body):
            self._json(200, None)
            return
        if chat:
            try:
                prompt = model.apply_chat_template(messages)
            except (
                ValueError,
                ChatTemplateError,
            ) as exc:  # nothing new since the last reply, or the template refused
                self._json(
                    500, {"error": f"SDKError(Invalid input parameters or handle), {exc}", "code": -100001}
                )
                return
        set_sampler(model, body)
        # chat: max_completion_tokens (default 2048; max_tokens is not read); completions: max_tokens (default 16)
        budget = (
            int(body.get("max_completion_tokens") or DEFAULT_MAX_COMPLETION_TOKENS)
            if chat
            else int(body.get("max_tokens") or DEFAULT_COMPLETION_MAX_TOKENS)
        )
        echo = prompt if not chat and body.get("echo") else ""
        if body.get("stream"):
            self._stream(
                model,
                prompt,
                budget,
                bool((body.get("stream_options") or {}).get("include_usage")),
                chat,
                echo,
            )
        else:
            self._blocking(model, prompt, budget, chat, echo)

    def _blocking(self, model: SimGenieX, prompt: str, budget: int, chat: bool, echo: str) -> None:
        parts: list[str] = []
        pd, q = model.generate(prompt, budget, lambda text, tokens=1: parts.append(text))
        if q["state"] == "context_full" and not q["generated"]:
            self._json(
                400,
                {
                    "error": {
                        "message": "prompt is longer than the model's context window",
                        "type": "invalid_request_error",
                        "code": "context_length_exceeded",
                    },
                    "usage": usage(pd),
                },
            )
            return
        text = "".join(parts)
        if chat:  # openai.ChatCompletion, with the fields GenieX leaves unset
            self._json(
                200,
                {
                    "id": "",
                    "choices": [
                        {
                            "finish_reason": finish_reason(pd["stop_reason"]),
                            "index": 0,
                            "message": {"content": text, "role": "assistant"},
                        }
                    ],
                    "created": 0,
                    "model": "",
                    "object": "chat.completion",
                    "usage": usage(pd),
                },
            )
        else:
            self._json(
                200,
                {
                    "object": "text_completion",
                    "choices": [
                        {"index": 0, "text": echo + text, "finish_reason": finish_reason(pd["stop_reason"])}
                    ],
                    "usage": usage(pd),
                },
            )

    def _stream(
        self, model: SimGenieX, prompt: str, budget: int, include_usage: bool, chat: bool, echo: str
    ) -> None:
        self._head(200, "text/event-stream", None)
        gone = threading.Event()
        if echo:
            self._event(
                {"object": "text_completion", "choices": [{"index": 0, "text": echo, "finish_reason": None}]}
            )

        def on_text(text: str, tokens: int = 1) -> None:
            if gone.is_set():
                return
            delta = (
                {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
                if chat
                else {"index": 0, "text": text, "finish_reason": None}
            )
            try:
                self._event({"object": CHUNK if chat else "text_completion", "choices": [delta]})
            except OSError:
                gone.set()  # the client went away: generation stops (stopGen)

        pd, q = model.generate(prompt, budget, on_text, gone.is_set)
        if gone.is_set():
            return
        try:
            if q["state"] == "context_full" and not q["generated"]:
                self._event({"error": "SDKError(Input prompt too long)", "code": ERR_PROMPT_TOO_LONG})
            else:
                fin = (
                    {"index": 0, "delta": {}, "finish_reason": finish_reason(pd["stop_reason"])}
                    if chat
                    else {"index": 0, "text": "", "finish_reason": finish_reason(pd["stop_reason"])}
                )
                self._event({"object": CHUNK if chat else "text_completion", "choices": [fin]})
                if include_usage:
                    self._event(
                        {"object": CHUNK if chat else "text_completion", "choices": [], "usage": usage(pd)}
                    )
                self._event("[DONE]")
            self._chunk(b"")
        except OSError:
            pass


def parse_host(host: str) -> tuple[str, int]:
    h, _, p = host.rpartition(":")
    return (h or "127.0.0.1"), int(p)


def serve(host: str, data_dir: Path, keepalive_s: float, ready: Any = None) -> int:
    """Serve until interrupted; `ready(port)` is called once listening (tests pass port 0)."""
    keeper = Keeper(data_dir, keepalive_s)
    handler = type("SimGenieXHandler", (Handler,), {"keeper": keeper})
    httpd = ThreadingHTTPServer(parse_host(host), handler)
    httpd.daemon_threads = True
    stop = threading.Event()

    def sweeper() -> None:
        while not stop.wait(5.0):
            keeper.sweep()

    threading.Thread(target=sweeper, daemon=True).start()
    port = httpd.server_address[1]
    print(f"GenieX server listening on http://{parse_host(host)[0]}:{port} {SIM_LABEL}", flush=True)
    if ready is not None:
        ready(port)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        httpd.server_close()
    return 0
