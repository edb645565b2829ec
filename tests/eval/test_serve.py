"""`hexstudio serve` with the official openai client against the simulator board: streaming, a second request
waiting for the first, a turn-2 request that reuses the loaded dialog (no re-init), a tool call, the bind rules.
The dialog is the onnxruntime twin's (twin_workspace: these need replies of tens of tokens in seconds); one
test serves a bundle of real QNN context binaries through Qualcomm's libGenie on the HTP simulator."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from hexstudio.serve.server import BindRefused, check_bind  # noqa: E402
from tests.support.scripted import use_scripted_helper  # noqa: E402
from tests.support.serve import start_serve  # noqa: E402


@pytest.fixture(scope="module")
def server(twin_workspace: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ws, run_dir = twin_workspace
    proc, port = start_serve(ws, run_dir.name, tmp_path_factory.mktemp("serve") / "port")
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
        assert "SIMULATED" in out


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url, api_key="unused-on-loopback", max_retries=0, timeout=120)


def ask(c: Any, text: str, **kw: Any) -> Any:
    """One chat request of one user message to the built-in model (kw: stream, tools, max_tokens ...)."""
    return c.chat.completions.create(
        model="builtin:tiny-llama", messages=[{"role": "user", "content": text}], **kw
    )


def stats(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/stats") as r:
        return json.loads(r.read())


def test_models_stream_and_turn2_reuses_the_dialog(server: str) -> None:
    c = client(server)
    model = c.models.list().data[0].id
    assert model == "builtin:tiny-llama"
    first = [{"role": "user", "content": "What is the capital of France?"}]
    parts: list[str] = []
    last: Any = None
    for ch in c.chat.completions.create(model=model, messages=first, stream=True, max_tokens=24):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        last = ch
    assert len(parts) > 3, parts  # streamed piece by piece
    assert last is not None
    k1 = last.model_extra["hexstudio"]
    assert k1["source"] == "simulated" and k1["generated_tokens"] > 0
    reply = "".join(parts)
    raw = c.chat.completions.with_raw_response.create(
        model=model,
        max_tokens=16,
        messages=[
            *first,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And of Spain?"},
        ],
    )
    r2 = raw.parse()
    k2 = r2.model_extra["hexstudio"]
    assert raw.headers["x-hexstudio-kv-reused"] == "true" and k2["kv_reused"] and k2["reinit"] is None
    # usage counts the whole prompt, as OpenAI does: the turns the KV cache held are in it, as cached tokens
    assert k2["cached_tokens"] >= k1["prompt_tokens"] + k1["generated_tokens"] > 0, (k1, k2)
    assert r2.usage.prompt_tokens == k2["prompt_tokens"] + k2["cached_tokens"], (r2.usage, k2)
    assert r2.usage.prompt_tokens_details.cached_tokens == k2["cached_tokens"]
    assert k2["init_ms"] == 0.0
    st = stats(server)
    assert len(st["loads"]) == 1 and st["simulated"] is True  # the model was loaded once, at start
    assert k2["start_ms"] < st["loads"][0]["init_ms"]


def test_a_large_max_tokens_still_continues_the_dialog(server: str) -> None:
    """A follow-up asking for more tokens than the context has left (max_tokens 4096 is a common client default)
    went to a reset dialog with the whole conversation again; its budget is now the room left, as a fresh
    dialog's is, and the cache is kept."""
    c = client(server)
    first = [{"role": "user", "content": "Where does the sun rise?"}]
    r1 = c.chat.completions.create(model="builtin:tiny-llama", messages=first, max_tokens=8)
    follow = [*first, {"role": "assistant", "content": r1.choices[0].message.content}]
    r2 = c.chat.completions.create(
        model="builtin:tiny-llama",
        messages=[*follow, {"role": "user", "content": "Why?"}],
        max_tokens=100_000,
    )
    k2 = r2.model_extra["hexstudio"]
    assert k2["kv_reused"] is True and k2["cached_tokens"] > 0, k2


def test_second_request_waits_for_the_first(server: str) -> None:
    c = client(server)
    out: dict[str, dict] = {}

    def ask(name: str, text: str) -> None:
        r = c.completions.create(
            model="builtin:tiny-llama", prompt=f"Question: {text} Answer:", max_tokens=48
        )
        out[name] = r.model_extra["hexstudio"]

    a = threading.Thread(target=ask, args=("a", "Tell me about the workshop."))
    b = threading.Thread(target=ask, args=("b", "Tell me about the harbour."))
    a.start()
    time.sleep(0.05)
    b.start()
    a.join(120)
    b.join(120)
    first, second = sorted(out.values(), key=lambda s: s["request"])
    assert second["queue_wait_ms"] > 0.5 * first["wall_ms"], (first, second)  # it waited for the first


def test_a_follow_up_queued_behind_another_client_does_not_continue_its_dialog(server: str) -> None:
    """Alice's follow-up extends what the dialog held when it arrived, but Bob's request runs first and resets
    the dialog for his own prompt. Whether the cache can be continued is decided when Alice's turn comes: her
    follow-up must go to a reset dialog with her whole conversation, never as a bare new turn on Bob's."""
    c = client(server)
    model = "builtin:tiny-llama"
    alice = [{"role": "user", "content": "Tell me about the workshop."}]
    a1 = c.chat.completions.create(model=model, messages=alice, max_tokens=16).choices[0].message.content
    follow_up = [*alice, {"role": "assistant", "content": a1}, {"role": "user", "content": "And then?"}]
    got: dict[str, Any] = {}
    bob_started = threading.Event()

    def bob() -> None:
        last = None
        for ch in c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "The harbour at night"}],
            stream=True,
            max_tokens=48,
        ):
            if ch.choices and ch.choices[0].delta.content:
                bob_started.set()
            last = ch
        got["bob"] = last.model_extra["hexstudio"] if last is not None else None

    def alice_again() -> None:
        got["alice"] = c.chat.completions.create(model=model, messages=follow_up, max_tokens=8).model_extra[
            "hexstudio"
        ]

    tb = threading.Thread(target=bob)
    tb.start()
    assert bob_started.wait(60), "Bob's reply never started"
    ta = threading.Thread(target=alice_again)
    ta.start()
    tb.join(120)
    ta.join(120)
    assert got["bob"]["request"] < got["alice"]["request"], got
    assert got["alice"]["kv_reused"] is False and got["alice"]["dialog_reset"] is True, got["alice"]
    assert got["alice"]["cached_tokens"] == 0


def test_per_request_sampler_and_completions(server: str) -> None:
    c = client(server)
    a = c.completions.create(
        model="builtin:tiny-llama",
        prompt="Question: What is the capital of France? Answer:",
        max_tokens=8,
        temperature=0,
    )
    assert a.choices[0].text.strip()
    b = c.completions.create(
        model="builtin:tiny-llama", prompt="The harbour", max_tokens=8, temperature=1.2, seed=7
    )
    k = b.model_extra["hexstudio"]
    assert k["sampler"]["temp"] == 1.2 and k["sampler"]["seed"] == 7 and k["reinit"] is None
    assert len(stats(server)["loads"]) == 1  # applied to the loaded dialog, not by reloading it
    with pytest.raises(openai.NotFoundError) as nf:
        c.completions.create(model="another-model", prompt="x", max_tokens=1)
    # OpenAI's shape: the type is invalid_request_error, the code says which (clients branch on the type)
    assert nf.value.type == "invalid_request_error" and nf.value.code == "model_not_found", nf.value.body


@contextlib.contextmanager
def scripted_server(
    twin_workspace: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    script: dict[str, str],
    *,
    tool_format: str | None = None,
    max_queue: int | None = None,
    template: str | None = None,
    model_stops: list[str] | None = None,
) -> Iterator[str]:
    """The real bridge and server in this process (on a thread of their own) over a board whose dialog is the
    scripted helper (scripted_helper.py): the base URL."""
    import asyncio

    from hexstudio.core.device.board import open_board
    from hexstudio.core.eval.render import PromptRenderer
    from hexstudio.core.settings import Settings
    from hexstudio.serve.bridge import DialogBridge
    from hexstudio.serve.limits import Limits
    from hexstudio.serve.server import OpenAIServer

    ws, run_dir = twin_workspace
    use_scripted_helper(monkeypatch, script)
    board_doc = json.loads((run_dir / "artifacts" / "board" / "board.json").read_text())
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def serve() -> None:
        board = await open_board("sim", Settings.load(), ws)
        renderer = PromptRenderer.for_model(run_dir / "artifacts" / "model")
        # a model that writes its calls in another format (the toy model's is bare JSON)
        renderer.tool_format = tool_format or renderer.tool_format
        renderer.template = template or renderer.template  # a base model's prompt format (plain, qa)
        if model_stops is not None:  # generation_config.json's stop_strings
            renderer.fmt = dataclasses.replace(renderer.fmt, stop_strings=model_stops)
        bridge = DialogBridge(board, board_doc["remote_bundle"], renderer, model_id="builtin:tiny-llama")
        await bridge.open()
        limits = Limits() if max_queue is None else Limits(max_queue=max_queue)
        srv = OpenAIServer(bridge, limits=limits)
        box["port"] = await srv.start("127.0.0.1", 0)
        box["stop"] = asyncio.Event()
        started.set()
        await box["stop"].wait()
        await srv.close()
        await bridge.close()

    t = threading.Thread(target=lambda: loop.run_until_complete(serve()))
    t.start()
    assert started.wait(60)
    try:
        yield f"http://127.0.0.1:{box['port']}/v1"
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        t.join(30)


def test_tool_call_streams_as_tool_calls(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The toy model never calls a tool, so here the board's dialog is a scripted helper (scripted_helper.py)
    answering in the model's own format; everything else (bridge, server, parsing, the client) is real."""
    script = {"Paris": '{"name": "get_weather", "arguments": {"city": "Paris"}}'}
    with scripted_server(twin_workspace, monkeypatch, script) as url:
        c = client(url)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ]
        calls, finish = [], None
        for ch in c.chat.completions.create(
            model="builtin:tiny-llama",
            stream=True,
            tools=tools,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
        ):
            if ch.choices and ch.choices[0].delta.tool_calls:
                calls += ch.choices[0].delta.tool_calls
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        assert finish == "tool_calls" and calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
        r = c.chat.completions.create(
            model="builtin:tiny-llama", tools=tools, messages=[{"role": "user", "content": "Hello"}]
        )
        assert r.choices[0].message.content == "OK." and not r.choices[0].message.tool_calls


WEATHER = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {}}}},
    }
]


def test_a_tool_call_after_some_text_streams_the_text_then_the_call(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that says something and then calls a tool (Qwen's <tool_call>, Nemotron's <TOOLCALL> after text)
    streamed the call's markup as content, then the call again as tool_calls: a client showed the raw markup and
    ran the call. The text streams; from where a call's tag could start, it is held until the reply ends."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    script = {"Oslo": "Let me look that up." + call, "Hello": "Use <tool or a <tag> freely."}
    with scripted_server(twin_workspace, monkeypatch, script, tool_format="qwen") as url:
        c = client(url)

        def streamed(text: str) -> tuple[str, list[Any], str | None]:
            content, calls, finish = "", [], None
            for ch in c.chat.completions.create(
                model="builtin:tiny-llama",
                stream=True,
                tools=WEATHER,
                messages=[{"role": "user", "content": text}],
            ):
                d = ch.choices[0].delta if ch.choices else None
                content += (d.content or "") if d else ""
                calls += (d.tool_calls or []) if d else []
                finish = (ch.choices[0].finish_reason if ch.choices else None) or finish
            return content, calls, finish

        content, calls, finish = streamed("Weather in Oslo?")
        assert content == "Let me look that up." and "<tool_call>" not in content, content
        assert finish == "tool_calls" and json.loads(calls[0].function.arguments) == {"city": "Oslo"}
        # text that only looks like the start of a tag streams whole, as the reply
        content, calls, finish = streamed("Hello")
        assert content == "Use <tool or a <tag> freely." and not calls and finish == "stop", content


def test_null_fields_and_a_queue_of_none(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_completion_tokens: null` (what some clients send for "not set") hid `max_tokens`; a text part whose
    text is null put the word "None" into the prompt; `--max-queue 0` refused every request, even on an idle
    server, where it means "no waiting: one request at a time"."""
    script = {"None": "The prompt held the word None.", "count": "one two three four five six seven eight"}
    with scripted_server(twin_workspace, monkeypatch, script, max_queue=0) as url:
        c = client(url)
        r = c.chat.completions.create(
            model="builtin:tiny-llama",
            messages=[
                {"role": "user", "content": [{"type": "text", "text": None}, {"type": "text", "text": "Hi"}]}
            ],
        )
        assert r.choices[0].message.content == "OK.", r.choices[0].message.content
        msgs = [{"role": "user", "content": "count to eight"}]
        r = c.chat.completions.create(
            model="builtin:tiny-llama",
            messages=msgs,
            max_tokens=2,
            extra_body={"max_completion_tokens": None},
        )
        # the scripted helper does not stop at the budget: "length" says the reply was held to max_tokens
        assert r.choices[0].finish_reason == "length", r
        r = c.chat.completions.create(model="builtin:tiny-llama", messages=msgs, max_tokens=64)
        assert r.choices[0].finish_reason == "stop", r


def test_a_stream_refused_before_its_turn_gets_its_own_status(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board's dialog could not be loaded again for a streamed request: it got a 200 and then an error event,
    which clients read as a successful request and do not retry. It is a 503 with Retry-After, as without a
    stream, and the next request after the board is back is answered."""
    import sys

    from hexstudio.core.genie.runtime import BoardRuntime
    from hexstudio.core.genie.session import ChatSession

    real_send = ChatSession.send

    async def send(self: ChatSession, user: str, **kw: Any) -> Any:
        if "pipe" in user:
            raise BrokenPipeError(32, "Broken pipe")
        return await real_send(self, user, **kw)

    monkeypatch.setattr(ChatSession, "send", send)
    with scripted_server(twin_workspace, monkeypatch, {}) as url:
        c = client(url)
        with pytest.raises(openai.APIStatusError):
            ask(c, "pipe")
        # the helper no longer starts on the board: the dialog cannot be loaded again
        working = BoardRuntime.helper_argv
        dead = [sys.executable, "-c", "import sys; sys.exit(3)"]
        for cls in (BoardRuntime, *BoardRuntime.__subclasses__()):
            monkeypatch.setattr(cls, "helper_argv", lambda self, *a: (list(dead), None))
        with pytest.raises(openai.APIStatusError) as err:
            ask(c, "Hello", stream=True)
        assert err.value.status_code == 503 and int(err.value.response.headers["retry-after"]) >= 1, err.value
        assert "could not be loaded" in err.value.message, err.value.message
        for cls in (BoardRuntime, *BoardRuntime.__subclasses__()):
            monkeypatch.setattr(cls, "helper_argv", working)
        text = "".join(
            (ch.choices[0].delta.content or "") if ch.choices else "" for ch in ask(c, "Hello", stream=True)
        )
        assert text == "OK."


def test_a_reply_no_parser_can_read_leaves_no_client_on_anothers_dialog(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client B's request with tools gets a reply the llama3 parser raised on ({[1]: 2}: a TypeError). B got a
    500, and the bridge still described the dialog as A's conversation while it held B's: A's follow-up went to
    it as a bare new turn (kv_reused), on B's prompt. The reply is now B's answer, as text (what the model
    wrote), and A's follow-up is sent whole to a reset dialog."""
    odd = "<|python_tag|>get_weather(city={[1]: 2})"
    with scripted_server(twin_workspace, monkeypatch, {"Oslo": odd}, tool_format="llama3") as url:
        c = client(url)
        alice = [{"role": "user", "content": "Hello"}]
        r = c.chat.completions.create(model="builtin:tiny-llama", messages=alice)
        assert r.choices[0].message.content == "OK."
        for stream in (False, True):
            got = c.chat.completions.create(
                model="builtin:tiny-llama",
                tools=WEATHER,
                stream=stream,
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
            )
            text = (
                "".join((ch.choices[0].delta.content or "") for ch in got if ch.choices) if stream else None
            )
            if not stream:
                text = got.choices[0].message.content
            assert text == odd, text
        follow = [*alice, {"role": "assistant", "content": "OK."}, {"role": "user", "content": "Hi"}]
        r = c.chat.completions.create(model="builtin:tiny-llama", messages=follow)
        assert r.model_extra["hexstudio"]["kv_reused"] is False, r.model_extra


def test_a_reply_cut_short_by_a_full_context_finishes_with_length(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The context filled up during the reply: the text so far is the answer, its finish_reason "length" (as
    OpenAI says of a reply cut short), not "stop", and the next request does not continue the cleared dialog."""
    with scripted_server(twin_workspace, monkeypatch, {"fill": "<full>"}) as url:
        c = client(url)
        msgs = [{"role": "user", "content": "fill the context"}]
        r = c.chat.completions.create(model="builtin:tiny-llama", messages=msgs, max_tokens=64)
        assert r.choices[0].message.content == "Cut sh" and r.choices[0].finish_reason == "length", r
        # no Genie profile for a reply the context cut short: the prompt's tokens are counted on the host
        assert r.usage.prompt_tokens > 0 and r.model_extra["hexstudio"]["prompt_tokens_estimated"] is True, r
        follow = [*msgs, {"role": "assistant", "content": "Cut sh"}, {"role": "user", "content": "Hello"}]
        r2 = c.chat.completions.create(model="builtin:tiny-llama", messages=follow, max_tokens=8)
        assert r2.model_extra["hexstudio"]["kv_reused"] is False


def test_a_prompt_the_dialog_says_fills_the_context_is_the_clients_to_fix(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's token count is an estimate without the bundle's tokenizer, so Genie can still find a prompt too
    long: that was a 500 ("start a new chat"), which clients retry, prefilling it again each time. It is OpenAI's
    400 context_length_exceeded."""
    with scripted_server(twin_workspace, monkeypatch, {"long": "<too-long>"}) as url:
        c = client(url)
        with pytest.raises(openai.BadRequestError) as err:
            ask(c, "a long one")
        assert err.value.code == "context_length_exceeded", err.value
        assert "the prompt alone fills the context" in err.value.message, err.value.message
        assert "max_tokens" not in err.value.message  # no max_tokens makes room for it
        r = ask(c, "Hi")
        assert r.choices[0].message.content == "OK."


def test_a_load_the_session_does_itself_is_reported(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dialog could not be reset, so the session loaded the model again before the next reply: that request
    said reinit null and init_ms 0 while its times held a whole load, and /v1/stats did not count the load."""
    with scripted_server(twin_workspace, monkeypatch, {"first": "<then-reset-fails>"}) as url:
        c = client(url)
        r1 = ask(c, "first")
        assert r1.model_extra["hexstudio"]["reinit"] is None
        r2 = ask(c, "other")
        k2 = r2.model_extra["hexstudio"]
        assert r2.choices[0].message.content == "OK." and k2["reinit"] == "reload" and k2["init_ms"] > 0, k2
        loads = stats(url)["loads"]
        assert [x["why"] for x in loads][-1] == "reloaded by the session" and len(loads) == 2, loads


def test_a_helper_that_dies_mid_reply_ends_the_stream_with_an_error(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board's helper dies after a few tokens of a streamed reply. The stream must end with an error event
    (the openai client raises it), never just stop: a client would take the partial text for the whole reply.
    The next request loads the dialog again and is answered."""
    with scripted_server(twin_workspace, monkeypatch, {"crash": "<die>"}) as url:
        c = client(url)
        text = ""
        with pytest.raises(openai.APIError) as err:
            for ch in ask(c, "crash now", stream=True):
                if ch.choices and ch.choices[0].delta.content:
                    text += ch.choices[0].delta.content
        assert text == "Half a rep", text
        assert "dialog" in str(err.value.message), err.value
        r = ask(c, "Hello")
        assert r.choices[0].message.content == "OK."


def lost_then_loaded_again(c: Any, text: str) -> None:
    """`text` finds the board's dialog gone (a broken pipe, a time-out): a 502; the next request loads it again and
    is answered."""
    with pytest.raises(openai.APIStatusError) as err:
        ask(c, text)
    assert err.value.status_code == 502 and "stopped answering" in err.value.message, err.value
    r = ask(c, "Hello")
    assert r.choices[0].message.content == "OK." and r.model_extra["hexstudio"]["reinit"] == "reload"


def test_a_dialog_that_raises_gets_an_answer_and_the_next_request_reloads_it(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors the session does not turn into a reply state: a broken pipe to the helper (it died between turns)
    is a 502 and the dialog is loaded again for the next request; anything else in a stream ends it with an
    error event, never a stream that just stops after a 200."""
    from hexstudio.core.genie.session import ChatSession

    real_send = ChatSession.send

    async def send(self: ChatSession, user: str, **kw: Any) -> Any:
        if "pipe" in user:
            raise BrokenPipeError(32, "Broken pipe")
        if "boom" in user:
            on_chunk = kw.get("on_chunk")
            if on_chunk is not None:
                from hexstudio.core.genie.run import Chunk

                on_chunk(Chunk(0.01, "Par", None, 1))
            raise RuntimeError("boom")
        return await real_send(self, user, **kw)

    monkeypatch.setattr(ChatSession, "send", send)
    with scripted_server(twin_workspace, monkeypatch, {}) as url:
        c = client(url)
        lost_then_loaded_again(c, "pipe")
        with pytest.raises(openai.APIError) as err2:
            for _ in ask(c, "boom", stream=True):
                pass
        assert "the reply failed" in str(err2.value.message), err2.value
        r = ask(c, "Hi")
        assert r.choices[0].message.content == "OK."


def test_a_reset_that_never_answers_is_a_502_and_the_next_request_reloads(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper hung in a reset: the time-out escaped as a 500 saying the next request is served as usual, and
    the hung session was kept for every later request."""
    from hexstudio.core.genie.session import ChatSession

    real_reset, hangs = ChatSession.reset, [True]

    async def reset(self: ChatSession) -> None:
        if hangs and hangs.pop():
            raise TimeoutError()
        await real_reset(self)

    monkeypatch.setattr(ChatSession, "reset", reset)
    with scripted_server(twin_workspace, monkeypatch, {}) as url:
        c = client(url)
        lost_then_loaded_again(c, "Hi")


def test_a_plain_follow_up_is_separated_from_the_reply_the_dialog_holds(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base model's `plain` prompt joins turns with a blank line. Turn 2 continues the dialog that holds turn 1
    and its reply: the new message went in glued to that reply ("...OK.second"), so the same conversation read
    differently whether the KV cache was reused or not."""
    with scripted_server(twin_workspace, monkeypatch, {"\n\nsecond": "SEPARATED."}, template="plain") as url:
        c = client(url)
        first = [{"role": "user", "content": "first"}]
        assert c.chat.completions.create(model="builtin:tiny-llama", messages=first).choices[
            0
        ].message.content == ("OK.")
        r = c.chat.completions.create(
            model="builtin:tiny-llama",
            messages=[*first, {"role": "assistant", "content": "OK."}, {"role": "user", "content": "second"}],
        )
        assert r.model_extra["hexstudio"]["kv_reused"], r.model_extra
        assert r.choices[0].message.content == "SEPARATED."


def test_the_models_own_stop_strings_end_a_served_reply(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose generation_config.json lists stop_strings: `hexstudio chat` ends its replies there, and the
    server did not (it passed only the request's `stop`), so replies ran on past the model's end marker to
    max_tokens. A request's own `stop` adds to the model's."""
    script = {"Hi": "Hello<|END|> and more", "Bye": "See you. Later<|END|>"}
    with scripted_server(twin_workspace, monkeypatch, script, model_stops=["<|END|>"]) as url:
        c = client(url)
        r = ask(c, "Hi")
        assert r.choices[0].message.content == "Hello" and r.choices[0].finish_reason == "stop"
        assert ask(c, "Bye", stop=["."]).choices[0].message.content == "See you"


def test_a_sampler_change_on_a_board_that_cannot_load_is_a_503_not_the_clients_fault(
    twin_workspace: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new temperature needs the dialog loaded again, and the board cannot load it (gone, its helper died).
    The last good sampler does not load either, so these values are not what the runtime refused: a 503 to retry,
    not a 400 (which a client never retries) blaming them. Once the board loads again, the request is answered."""
    from hexstudio.core.genie.session import ChatSession
    from hexstudio.serve.bridge import BridgeError, DialogBridge

    async def not_in_place(self: ChatSession, values: dict[str, Any]) -> str | None:
        return "this runtime changes the sampler by loading the dialog again"

    real_open, down = DialogBridge.open, [False]

    async def open_(self: DialogBridge, why: str = "start") -> None:
        if down[0]:
            raise BridgeError(503, "The model could not be loaded on the board: gone", "server_error")
        await real_open(self, why)

    monkeypatch.setattr(ChatSession, "apply_sampler", not_in_place)
    monkeypatch.setattr(DialogBridge, "open", open_)
    with scripted_server(twin_workspace, monkeypatch, {}) as url:
        c = client(url)
        assert ask(c, "Hi").choices[0].message.content == "OK."
        down[0] = True
        with pytest.raises(openai.APIStatusError) as err:
            ask(c, "Hi", temperature=1.3)
        assert err.value.status_code == 503 and "could not be loaded" in err.value.message, err.value
        down[0] = False
        r = ask(c, "Hi", temperature=1.3)
        assert r.choices[0].message.content == "OK." and r.model_extra["hexstudio"]["sampler"]["temp"] == 1.3


def _serve_after_an_earlier_server(twin_workspace: tuple[Path, Path], tmp_path: Path) -> tuple[Any, Path]:
    """`hexstudio serve` started (its output on stdout) where an earlier server's port file names port 1."""
    import subprocess

    from tests.support.serve import serve_argv

    ws, run_dir = twin_workspace
    port_file = tmp_path / "port"
    port_file.write_text("1")  # an earlier server's
    proc = subprocess.Popen(
        serve_argv(port_file, run_dir.name),
        env={**os.environ, "HEXSTUDIO_WORKSPACE": str(ws)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, port_file


def test_the_port_file_holds_only_a_listening_servers_port(
    twin_workspace: tuple[Path, Path], tmp_path: Path
) -> None:
    """A script waits for --port-file. The file of an earlier server is removed before this one loads its model
    (a script must not read that old port meanwhile), the new port is written whole, and the file is removed
    when the server stops."""
    proc, port_file = _serve_after_an_earlier_server(twin_workspace, tmp_path)
    try:
        seen, deadline = set(), time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            text = port_file.read_text() if port_file.exists() else None
            seen.add(text)
            if text not in (None, "1"):
                break
            time.sleep(0.02)
        assert None in seen, "the earlier server's port file was still there while this one loaded"
        port = int(port_file.read_text())
        assert port > 1 and stats(f"http://127.0.0.1:{port}/v1")["model"] == "builtin:tiny-llama"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert not port_file.exists(), "a stopped server's port file was left for the next script to read"


def test_bind_rules() -> None:
    check_bind("127.0.0.1", False, None)
    check_bind("::1", False, None)
    with pytest.raises(BindRefused):
        check_bind("0.0.0.0", False, "k")
    with pytest.raises(BindRefused):
        check_bind("0.0.0.0", True, None)
    check_bind("0.0.0.0", True, "a-key")


def test_serve_on_the_eval_workspace_bundle(eval_workspace: tuple[Path, Path], tmp_path: Path) -> None:
    """The same server over the Evaluate tests' workspace (its bundle is the twin's where the fixture compiles with
    compile_target sim, real QNN binaries where local): whichever runtime serves, the same replies. Real Genie on
    the HTP simulator behind serve, asserted as such: tests/qnn/test_serve_real_genie.py."""
    ws, run_dir = eval_workspace
    proc, port = start_serve(ws, run_dir.name, tmp_path / "port")
    try:
        c = client(f"http://127.0.0.1:{port}/v1")
        raw = c.completions.with_raw_response.create(
            model="builtin:tiny-llama", prompt="The harbour", max_tokens=2, temperature=0
        )
        assert raw.headers["x-hexstudio-source"] == "simulated"
        k = raw.parse().model_extra["hexstudio"]
        assert k["runtime"] == "genie" and k["generated_tokens"] >= 1, k
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model="builtin:tiny-llama", prompt="x", max_tokens=1, seed=-1)
        again = c.completions.create(model="builtin:tiny-llama", prompt="The harbour", max_tokens=2, seed=5)
        assert again.model_extra["hexstudio"]["sampler"]["seed"] == 5
        # issue 31: the request's stop strings go to Genie (GenieDialog_setStopSequence), which ends the reply
        # there and leaves the matched text out; only a runtime that cannot (the twin) has them cut on the host.
        # Either way the client sees the same reply.
        free = c.completions.create(
            model="builtin:tiny-llama", prompt="The capital of France is", max_tokens=8, temperature=0
        )
        stopped = c.completions.create(
            model="builtin:tiny-llama",
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stop=["."],
        )
        real = "HTP simulator" in str(stats(f"http://127.0.0.1:{port}").get("runtime_version"))
        assert stopped.model_extra["hexstudio"]["stop_by"] == ("genie" if real else "host")
        assert free.model_extra["hexstudio"]["stop_by"] is None
        text = str(stopped.choices[0].text)
        assert "." not in text and str(free.choices[0].text).startswith(text), (text, free.choices[0].text)
        if "." in str(free.choices[0].text):
            assert (
                str(free.choices[0].text).startswith(text + ".")
                and stopped.choices[0].finish_reason == "stop"
            )
        else:  # the stop string never came: the reply ran to its budget
            assert stopped.choices[0].finish_reason == "length" and text == free.choices[0].text
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    assert "SIMULATED" in out and "Traceback" not in out, out


def test_sigterm_while_the_model_loads_closes_everything(
    twin_workspace: tuple[Path, Path], tmp_path: Path
) -> None:
    """`systemctl stop` (SIGTERM) while serve connected to the board or loaded the model killed it outright: the
    signal handlers came only after the load, so nothing was closed and the board kept loading for no one."""
    import signal

    # the earlier server's port file is removed once serve has begun (before it connects to the board)
    proc, port_file = _serve_after_an_earlier_server(twin_workspace, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not port_file.exists(), out  # it never served
    assert proc.returncode == 128 + signal.SIGTERM and "stopped (SIGTERM) before serving" in out, out
