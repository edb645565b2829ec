"""The simulator board's `geniex serve` (hexstudio/workers/genie_sim/geniex_serve.py): GenieX's OpenAI-compatible server as
its handlers behave (docs/genie.md, "GenieX"), driven by the openai client and read raw, labeled simulated."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.board import python_env
from tests.genie.conftest import SimWorkspace
from tests.genie.test_geniex import _bundle_local, _turns

QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(
    sim_workspace: SimWorkspace, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """`geniex serve` on a free port with the run's bundle pulled as local/tiny, and a copy without a chat template
    pulled as local/notemplate."""
    bundle = _bundle_local(sim_workspace)
    if not (bundle / "metadata.json").exists():
        _turns(sim_workspace, "geniex", ["Hi"])  # HexStudio writes metadata.json on first GenieX use
    root = tmp_path_factory.mktemp("geniex-serve")
    bare = root / "notemplate"
    shutil.copytree(bundle, bare)
    tc = json.loads((bare / "tokenizer_config.json").read_text())
    tc.pop("chat_template")
    (bare / "tokenizer_config.json").write_text(json.dumps(tc))
    env = {**python_env(), "GENIEX_DATADIR": str(root / "cache"), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "hexstudio.workers.genie_sim.geniex"]
    for name, path in (("local/tiny", bundle), ("local/notemplate", bare)):
        subprocess.run(
            [*cmd, "pull", name, "--local-path", str(path)],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
    proc = subprocess.Popen(
        [*cmd, "serve", "--host", "127.0.0.1:0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "listening on http://127.0.0.1:" in line and "simulator" in line, (line, proc.stderr)
        yield line.split("http://", 1)[1].split()[0], bare
    finally:
        proc.terminate()
        proc.wait(20)


class Reply:
    """An HTTP answer read whole (http.client decodes the chunked body): status, headers, text."""

    def __init__(self, status: int, headers: dict[str, str], text: str) -> None:
        self.status_code, self.headers, self.text = status, headers, text

    def json(self) -> Any:
        return json.loads(self.text)


def _request(base: str, method: str, path: str, body: Any = None, **headers: str) -> Reply:
    host, port = base.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode())
    finally:
        conn.close()


def _get(base: str, path: str) -> Reply:
    return _request(base, "GET", path)


def _post(base: str, path: str, body: dict[str, Any], **headers: str) -> Reply:
    return _request(base, "POST", path, body, **headers)


def test_routes_models_and_refusals(server: tuple[str, Path]) -> None:
    base, _ = server
    r = _get(base, "/v1/")
    assert r.status_code == 200 and r.text.startswith("GenieX-CLI is running")
    assert r.headers["x-hexstudio-simulated"] == "true" and r.headers["access-control-allow-origin"] == "*"
    assert _get(base, "/").status_code == 302
    models = _get(base, "/v1/models").json()
    assert models["object"] == "list"
    assert {m["id"]: m["owned_by"] for m in models["data"]} == {
        "local/notemplate": "local",
        "local/tiny": "local",
    }
    assert _get(base, "/v1/models/local/tiny").json()["id"] == "local/tiny"
    missing = _get(base, "/v1/models/local/none")
    assert missing.status_code == 404 and missing.text == "null"
    # only pulled models are served; non-text content is refused; a bundle without a chat template does not load
    r = _post(base, "/v1/chat/completions", {"model": "local/none", "messages": QUESTION})
    assert r.status_code == 400 and r.json() == {"error": "SDKError(File not found or inaccessible)"}
    r = _post(
        base,
        "/v1/chat/completions",
        {
            "model": "local/tiny",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
    )
    assert r.status_code == 400 and r.json() == {"error": "not support content part type"}
    r = _post(base, "/v1/chat/completions", {"model": "local/notemplate", "messages": QUESTION})
    assert r.status_code == 500 and r.json() == {"error": "SDKError(Model loading failed)", "code": -100201}
    assert _post(base, "/v1/chat/completions", {"model": "local/tiny", "messages": "x"}).status_code == 400
    # a warm-up (no messages, or only a system message) loads the model and answers null
    r = _post(base, "/v1/chat/completions", {"model": "local/tiny", "messages": []})
    assert r.status_code == 200 and r.text == "null"


def test_chat_blocking_and_streamed_with_the_openai_client(server: tuple[str, Path]) -> None:
    import openai

    base, _ = server
    client = openai.OpenAI(base_url=f"http://{base}/v1", api_key="unused", max_retries=0)
    full = client.chat.completions.create(model="local/tiny", messages=QUESTION, max_completion_tokens=16)
    text = full.choices[0].message.content or ""
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant" and text.strip()
    u = full.usage
    assert u is not None and 0 < u.completion_tokens <= 16 and u.prompt_tokens > 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert full.choices[0].finish_reason == ("length" if u.completion_tokens == 16 else "stop")
    # the KV cache is reset before each request: the same request streams the same greedy reply
    parts, finish, usage_seen = [], None, None
    for ch in client.chat.completions.create(
        model="local/tiny",
        messages=QUESTION,
        max_completion_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if ch.usage is not None:
            usage_seen = ch.usage
        for c in ch.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == text and finish == full.choices[0].finish_reason
    assert usage_seen is not None and usage_seen.completion_tokens == u.completion_tokens
    # `max_tokens` is not what GenieX's chat handler reads: the reply is bounded by max_completion_tokens alone
    capped = client.chat.completions.create(model="local/tiny", messages=QUESTION, max_completion_tokens=2)
    assert (
        capped.usage is not None
        and capped.usage.completion_tokens == 2
        and capped.choices[0].finish_reason == "length"
    )
    if u.completion_tokens > 2:
        loose = client.chat.completions.create(model="local/tiny", messages=QUESTION, max_tokens=2)
        assert loose.usage is not None and loose.usage.completion_tokens > 2


def test_the_event_stream_as_gin_writes_it(server: tuple[str, Path]) -> None:
    base, _ = server
    body = {
        "model": "local/tiny",
        "messages": QUESTION,
        "max_completion_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = _post(base, "/v1/chat/completions", body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers.get("transfer-encoding") == "chunked"
    raw = r.text
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data:") and not e.startswith("data: ") for e in events), events[:3]
    payloads = [e[len("data:") :] for e in events]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    *tokens, fin, usage = chunks
    assert tokens and all(
        c["choices"][0]["finish_reason"] is None and c["choices"][0]["delta"]["role"] == "assistant"
        for c in tokens
    )
    assert fin["choices"] == [{"index": 0, "delta": {}, "finish_reason": fin["choices"][0]["finish_reason"]}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(tokens) <= 6


def test_legacy_completions(server: tuple[str, Path]) -> None:
    base, _ = server
    for body, error in (
        ({"model": "local/tiny"}, "prompt is required"),
        ({"model": "local/tiny", "prompt": ""}, "prompt must be non-empty"),
        ({"model": "local/tiny", "prompt": ["a", "b"]}, "only a single non-empty prompt is supported"),
        ({"model": "local/tiny", "prompt": [1, 2]}, "token prompts are not supported; send a string prompt"),
        ({"model": "local/tiny", "prompt": "a", "n": 2}, "n > 1 is not supported"),
        ({"model": "local/tiny", "prompt": "a", "logprobs": 2}, "logprobs is not supported"),
    ):
        r = _post(base, "/v1/completions", body)
        assert r.status_code == 400 and r.json() == {"error": error}, (body, r.text)
    prompt = "Question: What is the capital of France? Answer:"
    r = _post(base, "/v1/completions", {"model": "local/tiny", "prompt": prompt, "echo": True})
    doc = r.json()
    assert (
        r.status_code == 200
        and doc["object"] == "text_completion"
        and set(doc) == {"object", "choices", "usage"}
    )
    assert (
        doc["choices"][0]["text"].startswith(prompt) and 0 < doc["usage"]["completion_tokens"] <= 16
    )  # default 16


def test_a_prompt_longer_than_the_context(server: tuple[str, Path], sim_workspace: SimWorkspace) -> None:
    base, _ = server
    size = json.loads((_bundle_local(sim_workspace) / "genie_config.json").read_text())["dialog"]["context"][
        "size"
    ]
    long = [{"role": "user", "content": "capital " * (int(size) + 50)}]
    r = _post(base, "/v1/chat/completions", {"model": "local/tiny", "messages": long})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "prompt is longer than the model's context window",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
    raw = _post(base, "/v1/chat/completions", {"model": "local/tiny", "messages": long, "stream": True}).text
    assert json.loads(raw.strip().split("data:", 1)[1]) == {
        "error": "SDKError(Input prompt too long)",
        "code": -200103,
    }


def test_keep_cache_formats_only_what_is_new(server: tuple[str, Path]) -> None:
    """Without `GenieX-KeepCache: true` the cache is reset and the whole history is formatted (the plugin's
    default system prompt first); with it, only the messages after the last assistant reply are prefilled."""
    base, _ = server
    q1 = _post(
        base,
        "/v1/chat/completions",
        {"model": "local/tiny", "messages": QUESTION, "max_completion_tokens": 4},
    ).json()
    reply = q1["choices"][0]["message"]["content"]
    history = [
        *QUESTION,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And of Italy?"},
    ]
    kept = _post(
        base,
        "/v1/chat/completions",
        {"model": "local/tiny", "messages": history, "max_completion_tokens": 4},
        **{"GenieX-KeepCache": "true"},
    ).json()
    fresh = _post(
        base, "/v1/chat/completions", {"model": "local/tiny", "messages": history, "max_completion_tokens": 4}
    ).json()
    assert kept["usage"]["prompt_tokens"] < q1["usage"]["prompt_tokens"] < fresh["usage"]["prompt_tokens"]
