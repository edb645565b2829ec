"""The tool-calling scorer on hand-written replies of every model format: correct, wrong and malformed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hexstudio.core.eval.suites import SHIPPED_DIR, load_suite
from hexstudio.core.eval.toolcall import Call, detect_format, parse_reply, render_calls, score_tool_call

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIMER = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "parameters": {
            "type": "object",
            "properties": {"minutes": {"type": "integer"}},
            "required": ["minutes"],
        },
    },
}
TOOLS = [WEATHER, TIMER]
ONE = {
    "calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": {"$any": ["celsius", None]}}}]
}
TWO = {
    "calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "set_timer", "arguments": {"minutes": 5}},
    ]
}
EITHER = {  # the first expected call fits either timer
    "calls": [
        {"name": "set_timer", "arguments": {"minutes": {"$any": [1, 2]}}},
        {"name": "set_timer", "arguments": {"minutes": 1}},
    ]
}

CORRECT = {
    "llama3": [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}<|eom_id|>',
        '<|python_tag|>get_weather.call(city="Paris")',
    ],
    "nemotron": ['<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>'],
    "qwen": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        # the schema's enum says "celsius": values are compared without case, the enum was not
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "Celsius"}}\n</tool_call>',
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        # the name was read as 'get_weather[CALL_ID]abc123456'
        '[TOOL_CALLS]get_weather[CALL_ID]abc123456[ARGS]{"city":"Paris"}',
    ],
    "json": ['{"name": "get_weather", "arguments": {"city": "Paris"}}'],
}
WRONG = {  # parseable, but not the expected call
    "llama3": '{"name": "get_weather", "parameters": {"city": "Lyon"}}',
    "nemotron": '<TOOLCALL>[{"name": "set_timer", "arguments": {"minutes": 3}}]</TOOLCALL>',
    "qwen": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}\n</tool_call>',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"town": "Paris"}}]',
    "json": '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
}
MALFORMED = {
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"',
    "nemotron": '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "qwen": '<tool_call>\n{"name": get_weather}\n</tool_call>',
    "mistral": '[TOOL_CALLS][{"arguments": {"city": "Paris"}}]',
    "json": '{"name": "get_weather", "arguments": "city=Paris"}',
}


@pytest.mark.parametrize("fmt,text", [(f, t) for f, ts in CORRECT.items() for t in ts])
def test_correct_replies_score_right(fmt: str, text: str) -> None:
    p = parse_reply(text, fmt)
    assert p.kind == "calls", p.error
    ok, why = score_tool_call(p, ONE, TOOLS)
    assert ok, why


@pytest.mark.parametrize("fmt", list(WRONG))
def test_wrong_calls_score_wrong(fmt: str) -> None:
    p = parse_reply(WRONG[fmt], fmt)
    assert p.kind == "calls"
    ok, why = score_tool_call(p, ONE, TOOLS)
    assert not ok and why


@pytest.mark.parametrize("fmt", list(MALFORMED))
def test_malformed_replies_are_scored_as_such(fmt: str) -> None:
    p = parse_reply(MALFORMED[fmt], fmt)
    assert p.kind == "malformed", p
    ok, why = score_tool_call(p, ONE, TOOLS)
    assert not ok and why.startswith("malformed")
    ok, _ = score_tool_call(p, {"abstain": True}, TOOLS)
    assert not ok  # a broken call attempt is not an abstention


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("llama3", "<|python_tag|>f(a={[1]: 2})"),  # literal_eval: TypeError (a list as a dict key)
        ("llama3", "<|python_tag|>f(a=[" * 2000),
        ("json", "[" * 100_000),  # json: RecursionError
        ("qwen", "<tool_call>" + "[" * 100_000 + "</tool_call>"),
        ("nemotron", "<TOOLCALL>" + "{" * 100_000),
    ],
    ids=["unhashable-key", "deep-python", "deep-json", "deep-qwen", "deep-nemotron"],
)
def test_any_text_a_model_writes_parses_to_an_answer(fmt: str, text: str) -> None:
    """The server parses every reply to a request with tools: a parser that raised on the model's text made a
    500, and left the board's dialog described as the previous request's."""
    parsed = parse_reply(text, fmt)
    assert parsed.kind in ("malformed", "none"), parsed


@pytest.mark.parametrize("fmt", list(CORRECT))
def test_plain_answers_abstain_and_miss_calls(fmt: str) -> None:
    p = parse_reply("The weather is nice today.", fmt)
    assert p.kind == "none"
    assert score_tool_call(p, {"abstain": True}, TOOLS)[0]
    assert score_tool_call(p, ONE, TOOLS) == (False, "no call made")


@pytest.mark.parametrize("fmt", list(CORRECT))
def test_parallel_calls_any_order(fmt: str) -> None:
    calls = [Call("set_timer", {"minutes": 5}), Call("get_weather", {"city": "paris"})]
    p = parse_reply(render_calls(calls, fmt), fmt)
    assert p.kind == "calls" and len(p.calls) == 2
    assert score_tool_call(p, TWO, TOOLS)[0]
    one = parse_reply(render_calls(calls[:1], fmt), fmt)
    assert score_tool_call(one, TWO, TOOLS) == (False, "1 call(s), expected 2")
    # set_timer(1 or 2) and set_timer(1) expected: the call set_timer(1) was paired with the first, and
    # set_timer(2) then fit nothing
    replies = {(1, 2): (True, "every call matches"), (3, 2): (False, "set_timer: minutes=3, expected 1")}
    for minutes, want in replies.items():
        timers = [Call("set_timer", {"minutes": m}) for m in minutes]
        assert score_tool_call(parse_reply(render_calls(timers, fmt), fmt), EITHER, TOOLS) == want, minutes


def test_python_tag_calls_are_read_as_code_not_cut_at_every_semicolon() -> None:
    """Llama 3.1's built-in tool call `brave_search.call(query="a; b")` was cut at the ";" inside its string and
    read as malformed."""
    p = parse_reply('<|python_tag|>brave_search.call(query="a; b")<|eom_id|>', "llama3")
    assert p.kind == "calls" and p.calls == [Call("brave_search", {"query": "a; b"})], p
    p = parse_reply(
        '<|python_tag|>get_weather.call(city="Paris"); set_timer(minutes=5)\nf(a="x;y")', "llama3"
    )
    assert [c.name for c in p.calls] == ["get_weather", "set_timer", "f"], p
    assert p.calls[2].arguments == {"a": "x;y"}
    for code, why in (('get_weather.call(city="Paris"', "never closed"), ("x = 1", "not a function call")):
        p = parse_reply(f"<|python_tag|>{code}", "llama3")
        assert p.kind == "malformed" and why in (p.error or ""), p


def test_type_slips_and_calls_where_none_fits_are_wrong() -> None:
    p = parse_reply('{"name": "set_timer", "arguments": {"minutes": "5"}}', "json")
    assert not score_tool_call(p, {"calls": [{"name": "set_timer", "arguments": {"minutes": 5}}]}, TOOLS)[0]
    p = parse_reply('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', "qwen")
    ok, why = score_tool_call(p, {"abstain": True}, TOOLS)
    assert not ok and "no tool fits" in why
    p = parse_reply(WRONG["qwen"], "qwen")
    assert score_tool_call(p, ONE, TOOLS) == (
        False,
        "get_weather: unit='kelvin' is not one of the enum values ['celsius', 'fahrenheit']",
    )


def test_format_from_template_and_name() -> None:
    assert detect_format("{% if tools %}<tool_call>{% endif %}") == "qwen"
    assert detect_format("... <TOOLCALL> ...") == "nemotron"
    assert detect_format("[TOOL_CALLS]") == "mistral"
    assert detect_format("<|python_tag|>") == "llama3"
    assert detect_format(None, "meta-llama/Llama-3.1-8B-Instruct") == "llama3"
    assert detect_format(None, "") == "json"
    # a Qwen2.5 fine-tune named Nemotron writes Qwen's <tool_call>: its template's marker wins over its name
    qwen_template = "{% if tools %}<tool_call>\n{{ tool_call }}\n</tool_call>{% endif %}"
    assert detect_format(qwen_template, "nvidia/OpenReasoning-Nemotron-7B") == "qwen"
    assert detect_format(None, "nvidia/OpenReasoning-Nemotron-7B") == "nemotron"


def test_shipped_tool_suite_expected_calls_pass_their_own_scorer() -> None:
    """Every expected call, written in every format, scores right: the suite and the scorer agree."""
    s = load_suite(SHIPPED_DIR / "tool_calling.jsonl")
    cats = {c.category for c in s.cases}
    assert cats == {"simple", "multiple", "parallel", "irrelevance"}
    for c in s.cases:
        for fmt in CORRECT:
            if c.expected.get("abstain"):
                assert score_tool_call(
                    parse_reply("I cannot do that with these tools.", fmt), c.expected, c.tools or []
                )[0]
                continue
            calls = [
                Call(
                    w["name"],
                    {
                        k: (v["$any"][0] if isinstance(v, dict) and "$any" in v else v)
                        for k, v in w["arguments"].items()
                        if not (isinstance(v, dict) and v.get("$any", [0])[0] is None)
                    },
                )
                for w in c.expected["calls"]
            ]
            ok, why = score_tool_call(parse_reply(render_calls(calls, fmt), fmt), c.expected, c.tools or [])
            assert ok, (c.id, fmt, why)


@pytest.mark.parametrize("fmt", list(CORRECT))
def test_a_call_without_its_marker_or_as_an_indented_list_is_still_a_call(fmt: str) -> None:
    """A JSON call whose format marker a decoder dropped ([TOOL_CALLS] and <|python_tag|> are special tokens), or a
    model asked in words for bare JSON, made a call: on an abstain case it was scored 'abstained, right'. An
    indented list ('[\\n  {...}') was not read as calls at all."""
    listed = '[\n  {"name": "get_weather", "arguments": {"city": "Paris"}},\n  {"name": "set_timer", "arguments": {"minutes": 5}}\n]'
    p = parse_reply(listed, fmt)
    assert p.kind == "calls" and len(p.calls) == 2
    assert score_tool_call(p, TWO, TOOLS)[0]
    assert not score_tool_call(p, {"abstain": True}, TOOLS)[0]


def test_a_reasoning_block_is_not_scored() -> None:
    from hexstudio.core.eval.scoring import answer_of, score_case
    from hexstudio.core.eval.suites import Case

    assert answer_of("<think>\nthe user wants Paris\n</think>\n\nParis.") == "Paris."
    assert answer_of("<think></think>Paris") == "Paris"
    assert answer_of("<think>cut at the limit") == ""
    assert answer_of("Paris") == "Paris"
    tool = Case(id="t", scorer="tool_call", tools=TOOLS, expected={"abstain": True})
    reply = '<think>no tool fits</think>{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert not score_case(tool, reply, "llama3")["correct"]  # a call after the reasoning is a call
    short = Case(id="s", scorer="instruction", checks=[{"type": "max_words", "n": 3}])
    assert score_case(short, "<think>" + "word " * 50 + "</think>Just three words", "json")["correct"]


def test_reasoning_a_prompt_opened_and_the_token_limit_cut_is_no_answer() -> None:
    """A DeepSeek-R1 distill's template ends the prompt with <think>: its reply starts inside the reasoning block.
    Cut at max_tokens before </think>, the reply had no tag at all, and its reasoning was scored as the answer."""
    from hexstudio.core.eval.render import PromptRenderer
    from hexstudio.core.eval.scoring import answer_of
    from hexstudio.core.eval.stage import Plan, score_all
    from hexstudio.core.eval.suites import Case, Suite
    from hexstudio.shared.chat_template import ChatFormat

    r1 = "{% for m in messages %}<｜User｜>{{ m.content }}{% endfor %}{{ '<｜Assistant｜><think>\\n' }}"
    opened = "<｜User｜>Capital of France?<｜Assistant｜><think>\n"
    assert answer_of("the user asks for Paris", opened) == ""
    assert answer_of("the user asks for Paris\n</think>\n\nParis.", opened) == "Paris."
    case = Case(
        id="fr", scorer="contains", prompt="Capital of France?", expected={"answer": "Paris"}, max_tokens=8
    )
    plan = Plan(
        [Suite("s", "s", "", Path("s.jsonl"), [case], "contains", False)],
        PromptRenderer("model", ChatFormat("model", r1), "json"),
    )
    job = plan.by_case[("s", "fr")]
    assert job["prompt"] == opened
    for text, want in (
        ("so the answer is Paris, unless", "no answer: the reasoning did not finish within max_tokens (8)"),
        ("so Paris</think>Paris", "matches"),
    ):
        per, _ = score_all(plan, {f"float\0{job['key']}": {"text": text}}, "json", None)
        assert per["s"]["float"]["fr"]["score"]["why"] == want, text


def test_a_template_without_tools_is_asked_and_scored_in_bare_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt of a template that cannot show tools asks for bare JSON in words: it was then parsed in the
    model's native format (Qwen's <tool_call>), so every correct call was 'no call made'."""
    import json

    from hexstudio.core.eval import render
    from hexstudio.core.eval.suites import Case
    from hexstudio.shared.chat_template import ChatFormat

    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = ChatFormat("model", chatml)
    assert not fmt.supports_tools and detect_format(chatml, "Qwen/Qwen2-1.5B-Instruct") == "qwen"
    (tmp_path / "model.json").write_text(json.dumps({"model": "Qwen/Qwen2-1.5B-Instruct"}))
    monkeypatch.setattr(render, "chat_format_for", lambda _d: fmt)
    monkeypatch.setattr(render, "template_for", lambda _d: "model")
    r = render.PromptRenderer.for_model(tmp_path)
    assert r.tool_format == "json"
    case = Case(id="x", scorer="tool_call", prompt="Weather in Paris?", tools=TOOLS, expected=ONE)
    assert "reply with only JSON" in r.prompt(case)
