"""The model's own chat template rendered exactly as transformers renders it (real Qwen3 and Llama-3.1
templates: tests/genie/data), and the prompts Genie gets from it: BOS left to Genie, later turns of one
dialog carrying only the new turn, stop ids and strings from generation_config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared import bundle as gb
from hexstudio.shared.bundle.dialog_tokens import dialog_tokens
from hexstudio.shared.chat_template import ChatFormat, ChatTemplateError, load_chat_format
from tests.support.configs import LLAMA_31_8B

DATA = Path(__file__).parent / "data"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get the current temperature at a location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": 'The location, in the format "City, Country".'},
                "unit": {
                    "type": "string",
                    "enum": ["celsius", "fahrenheit"],
                    "description": "The unit (ünits).",
                },
            },
            "required": ["location", "unit"],
        },
    },
}
SECOND_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4."},
    {"role": "user", "content": "And 3+3?"},
]
TOOL_TURN = [
    {"role": "user", "content": "Temperature in Paris, France?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "get_current_temperature",
                    "arguments": {"location": "Paris, France", "unit": "celsius"},
                },
            }
        ],
    },
    {"role": "tool", "content": "22.0"},
    {"role": "user", "content": "Thanks"},
]


def _hf_tokenizer(model: str, tmp: Path) -> Any:
    """A transformers tokenizer with the model's tokenizer_config.json (its real chat template) over a tiny
    vocabulary: the rendered text does not depend on the vocabulary."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer

    d = tmp / model
    shutil.copytree(DATA / model, d)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    specials = sorted({v["content"] for v in tc["added_tokens_decoder"].values()})
    vocab = {"[UNK]": 0, **{t: i + 1 for i, t in enumerate(specials)}}
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(d / "tokenizer.json"))
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"  # no vocab.json/merges.txt needed
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    return AutoTokenizer.from_pretrained(str(d))


CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("single turn", [{"role": "user", "content": "Hi there!"}], {}),
    ("system + user", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], {}),
    ("second turn", SECOND_TURN, {}),
    (
        "tool definition",
        [
            {"role": "system", "content": "You answer weather queries."},
            {"role": "user", "content": "Hey, what's the temperature in Paris right now?"},
        ],
        {"tools": [WEATHER_TOOL]},
    ),
    ("tool call and result", TOOL_TURN, {"tools": [WEATHER_TOOL]}),
    ("no generation prompt", SECOND_TURN[:3], {"add_generation_prompt": False}),
]


@pytest.mark.parametrize("model", ["qwen3", "llama-3.1"])
def test_renders_exactly_what_transformers_renders(model: str, tmp_path: Path) -> None:
    tok = _hf_tokenizer(model, tmp_path)
    fmt = load_chat_format(DATA / model)
    assert fmt.mode == "model" and fmt.source == "tokenizer_config.json"
    extra: list[dict[str, Any]] = [{}]
    if model == "qwen3":
        extra += [{"enable_thinking": False}, {"enable_thinking": True}]
    else:
        extra += [{"date_string": "25 Nov 2026"}, {"tools_in_user_message": False}]
    n = 0
    for label, messages, kw in CASES:
        for more in extra:
            args = {"add_generation_prompt": True, **kw, **more}
            if model == "llama-3.1" and label == "tool call and result":
                continue  # Llama 3.1's template puts tool results under the ipython role: below
            want = tok.apply_chat_template(messages, tokenize=False, **args)
            got = fmt.render(messages, **args)
            assert got == want, f"{model}: {label} {more}"
            n += 1
    assert n >= 15


def test_llama31_tool_result_and_raise_exception(tmp_path: Path) -> None:
    tok = _hf_tokenizer("llama-3.1", tmp_path)
    fmt = load_chat_format(DATA / "llama-3.1")
    msgs = [
        {"role": "user", "content": "Temperature in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_current_temperature",
                        "arguments": {"location": "Paris, France", "unit": "celsius"},
                    },
                }
            ],
        },
        {"role": "ipython", "content": {"temperature": 22.0}},
    ]
    args: dict[str, Any] = {"tools": [WEATHER_TOOL], "add_generation_prompt": True}
    assert fmt.render(msgs, **args) == tok.apply_chat_template(msgs, tokenize=False, **args)
    # two tool calls at once: the template's raise_exception, as transformers raises it
    two = [msgs[0], {"role": "assistant", "tool_calls": msgs[1]["tool_calls"] * 2}]
    with pytest.raises(ChatTemplateError, match="single tool-calls"):
        fmt.render(two, **args)
    with pytest.raises(Exception, match="single tool-calls"):
        tok.apply_chat_template(two, tokenize=False, **args)


def test_strftime_now_and_tojson_options() -> None:
    fmt = ChatFormat(
        mode="model",
        template="{{ strftime_now('%Y') }}|{{ messages[0] | tojson(indent=2, "
        "sort_keys=True) }}|{{ 'é' | tojson }}",
        source="test",
    )
    out = fmt.render([{"role": "user", "content": "x"}])
    year, obj, e = out.split("|")
    assert len(year) == 4 and year.isdigit()
    assert obj == '{\n  "content": "x",\n  "role": "user"\n}' and e == '"é"'


def test_the_sandbox_refuses_unsafe_templates() -> None:
    fmt = ChatFormat(mode="model", template="{{ messages.__class__.__mro__ }}", source="test")
    with pytest.raises(Exception, match=r"unsafe|not safely|access"):
        fmt.render([{"role": "user", "content": "x"}])


def _dialog_context(model: str) -> dict[str, Any]:
    """genie_config.json's `context` HexStudio writes for the model's ids and tokenizer (the shapes: Llama's;
    the test data's config.json holds only the ids)."""
    cfg = {**LLAMA_31_8B, **json.loads((DATA / model / "config.json").read_text())}
    doc = gb.genie_config(cfg, 4096, ["m.bin"], 128, tokens=dialog_tokens(DATA / model))
    return dict(doc["dialog"]["context"])


def _genie_tokens(model: str, queries: list[str], replies: list[str]) -> str:
    """What Genie's KV cache holds after these queries, as text, with the BOS and EOS of the genie_config.json
    HexStudio writes for the model: BOS before every query, between queries the first eos-token (qualla
    dialog.cpp / context.cpp), each reply as generated (hexstudio/workers/genie_sim/t2t.py does the same)."""
    ctx = _dialog_context(model)
    decoder = json.loads((DATA / model / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    text = {int(k): v["content"] for k, v in decoder.items()}
    bos = text[ctx["bos-token"]] if ctx["bos-token"] >= 0 else ""
    eos = ctx["eos-token"][0] if isinstance(ctx["eos-token"], list) else ctx["eos-token"]
    out = ""
    for i, q in enumerate(queries):
        if i:
            out += text[eos]
        out += bos + q + replies[i]
    return out


def test_the_bundle_pushes_the_templates_turn_end_and_no_bos_the_tokenizer_lacks() -> None:
    """Genie pushes the first eos-token between turns: config.json's first for Llama-3.1 is <|end_of_text|>,
    while its template ends a turn with <|eot_id|>. Qwen's config.json names a bos_token_id its tokenizer never
    adds: Genie started every query with <|endoftext|>."""
    llama = _dialog_context("llama-3.1")
    assert llama["eos-token"] == [128009, 128001, 128008] and llama["bos-token"] == 128000
    qwen = _dialog_context("qwen3")
    # config.json's 151645, then <|endoftext|>, which its generation_config.json adds (transformers stops there)
    assert qwen["bos-token"] == -1 and qwen["eos-token"] == [151645, 151643]
    # without a tokenizer folder config.json's ids stay as they are
    assert dialog_tokens(DATA / "nowhere") is None


@pytest.mark.parametrize(
    ("config_eos", "generation_eos", "tokenizer_eos", "genie_eos"),
    [
        # Meta-Llama-3-8B-Instruct's first release: only generation_config.json named <|eot_id|>
        (128001, [128001, 128009], "<|end_of_text|>", [128001, 128009]),
        # the tokenizer's turn end in neither file: Genie must still stop there, and push it between turns
        (128001, None, "<|eot_id|>", [128009, 128001]),
        # nothing to add: an integer stays one
        (128009, 128009, "<|eot_id|>", 128009),
    ],
    ids=["generation_config", "tokenizer", "nothing to add"],
)
def test_genie_stops_where_transformers_generate_stops(
    tmp_path: Path, config_eos: int, generation_eos: Any, tokenizer_eos: str, genie_eos: Any
) -> None:
    """config.json's eos ids alone went to Genie: an id only generation_config.json (what generate reads) or the
    tokenizer names never stopped a reply, and every reply ran to the token limit."""
    tc = json.loads((DATA / "llama-3.1" / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**tc, "eos_token": tokenizer_eos}))
    if generation_eos is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    cfg = {**LLAMA_31_8B, "bos_token_id": 128000, "eos_token_id": config_eos}
    doc = gb.genie_config(cfg, 4096, ["m.bin"], 128, tokens=dialog_tokens(tmp_path))
    assert doc["dialog"]["context"]["eos-token"] == genie_eos


def test_a_bos_the_tokenizer_names_but_does_not_add_is_not_pushed(tmp_path: Path) -> None:
    """A tokenizer that names a bos_token with add_bos_token false (its chat template writes the BOS, or no model
    input starts with one) got that token from Genie before every query, and the template's own BOS was cut off
    the first query only: later turns read `reply<eot><bos><header>`, a BOS the template never writes there."""
    for f in ("config.json", "generation_config.json", "tokenizer_config.json"):
        (tmp_path / f).write_text((DATA / "llama-3.1" / f).read_text())
    tc = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**tc, "add_bos_token": False}))
    cfg = {**LLAMA_31_8B, **json.loads((tmp_path / "config.json").read_text())}
    doc = gb.genie_config(cfg, 4096, ["m.bin"], 128, tokens=dialog_tokens(tmp_path))
    assert doc["dialog"]["context"]["bos-token"] == -1
    fmt = load_chat_format(tmp_path)
    first = fmt.genie_prompt([], "Hi", system="You are terse.")
    assert not fmt.genie_bos and first.startswith("<|begin_of_text|>"), "the template's BOS stays in the text"
    # the same tokenizer adding its BOS (the key true or absent): Genie pushes it, and the text starts after it
    assert _dialog_context("llama-3.1")["bos-token"] == 128000
    assert not load_chat_format(DATA / "llama-3.1").genie_prompt([], "Hi").startswith("<|begin_of_text|>")


@pytest.mark.parametrize("model", ["qwen3", "llama-3.1"])
def test_later_turns_send_only_the_new_turn(model: str) -> None:
    fmt = load_chat_format(DATA / model)
    turns = [("What is 2+2?", "4."), ("And 3+3?", "6.")]
    q1 = fmt.genie_prompt([], turns[0][0], system="You are terse.", thinking=False)
    q2 = fmt.genie_continuation(turns[:1], turns[1][0], system="You are terse.", thinking=False)
    q3 = fmt.genie_continuation(turns, "And 4+4?", system="You are terse.", thinking=False)
    bos = fmt.special.get("bos_token")
    if bos:
        assert not q1.startswith(bos), "Genie pushes BOS itself"
    assert q2.count("3+3") == 1 and "2+2" not in q2 and "4." not in q2
    # the dialog Genie holds reads as the whole conversation rendered by the template
    full = fmt.render(
        [
            {"role": "system", "content": "You are terse."},
            *[
                m
                for u, r in turns
                for m in ({"role": "user", "content": u}, {"role": "assistant", "content": r})
            ],
            {"role": "user", "content": "And 4+4?"},
        ],
        add_generation_prompt=True,
        **({"enable_thinking": False} if model == "qwen3" else {}),
    )
    held = _genie_tokens(model, [q1, q2, q3], ["4.", "6.", ""])
    if model == "llama-3.1":
        # Llama: Genie's BOS between turns is the only difference from the template's text
        assert held.replace(f"<|eot_id|>{bos}", "<|eot_id|>") == full
    else:
        # Qwen3 strips earlier turns' empty thinking blocks from its render; the turn structure is the same
        assert held.count("<|im_start|>user") == full.count("<|im_start|>user") == 3
        assert held.startswith("<|im_start|>system") and "<|im_end|><|im_start|>" not in held
        assert held.endswith(
            "<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )


def test_thinking_switch_and_stop_conditions() -> None:
    qwen = load_chat_format(DATA / "qwen3")
    assert qwen.thinking_switch == "enable_thinking" and qwen.supports_tools
    assert qwen.genie_prompt([], "Hi", thinking=False).endswith("<think>\n\n</think>\n\n")
    assert qwen.genie_prompt([], "Hi", thinking=True).endswith("<|im_start|>assistant\n")
    assert qwen.eos_token_ids == [151645, 151643] and "thinking off" in qwen.label(False)
    llama = load_chat_format(DATA / "llama-3.1")
    assert llama.thinking_switch is None and llama.eos_token_ids == [128001, 128008, 128009]
    nemotron = ChatFormat(mode="model", template="{{ messages[0]['content'] }} detailed thinking", source="t")
    assert nemotron.thinking_switch == "system"
    assert nemotron.genie_prompt([], "Hi", thinking=True).startswith("detailed thinking on")


def test_nemotrons_thinking_switch_holds_with_a_system_prompt() -> None:
    """Llama-Nemotron's system text is its reasoning switch: with a system prompt set, "detailed thinking on" was
    left out (the label still said "thinking on") and the fallback templates dropped the user's system text.
    The model card asks for every instruction in the user's turn: it goes before the first user message."""
    from hexstudio.core.genie.conversation import Conversation, Turn
    from hexstudio.core.genie.prompts import chat_prompt

    h = "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>"
    tpl = (
        "{#- detailed thinking on/off #}{%- for m in messages %}"
        "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
        "{%- endfor %}"
    )
    fmt = ChatFormat(mode="model", template=tpl, source="t", special={"eos_token": "<|eot_id|>"})
    first = fmt.genie_prompt([], "Hi", system="Be a pirate.", thinking=True)
    assert first == h.format("system", "detailed thinking on") + h.format("user", "Be a pirate.\n\nHi")
    # a later turn: the cache holds the first turn as rendered above, the new message alone follows
    later = fmt.genie_continuation([("Hi", "Arr.")], "Bye", system="Be a pirate.", thinking=True)
    assert later == h.format("user", "Bye")
    # without a switch asked for, the system text stays the system text
    assert fmt.genie_prompt([], "Hi", system="Be a pirate.").startswith(h.format("system", "Be a pirate."))
    # the fallback templates (no chat template of the model's)
    assert "Be a pirate.\n\nHi" in chat_prompt(
        "Hi", system="Be a pirate.", template="nemotron", reasoning=True
    )
    conv = Conversation(template="nemotron-on", system="Be a pirate.")
    assert "Be a pirate.\n\nHi" in conv._render([], "Hi")
    again = conv._render([Turn("Hi", "Arr.", state="complete")], "Bye")
    assert again.count("Be a pirate.") == 1 and "Be a pirate.\n\nHi" in again
    assert h.format("system", "detailed thinking on") in again


def test_base_models_and_the_builtin_get_plain_completion(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 2, "stop_strings": ["\n\n"]})
    )
    fmt = load_chat_format(tmp_path)
    assert fmt.mode == "plain" and fmt.stop_strings == ["\n\n"] and fmt.eos_token_ids == [2]
    assert fmt.genie_prompt([], "Once upon a time") == "Once upon a time"
    assert fmt.genie_continuation([("Once", " there was")], " a dragon") == " a dragon"
    assert "plain" in fmt.label()


def test_a_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    shutil.copytree(DATA / "llama-3.1", tmp_path / "m")
    (tmp_path / "m" / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    )
    fmt = load_chat_format(tmp_path / "m")
    assert fmt.source == "chat_template.jinja" and fmt.render([{"role": "user", "content": "a"}]) == "[a]"


def test_the_servers_later_turn_keeps_the_thinking_switch_and_tools() -> None:
    """`hexstudio serve` rendered a request's whole prompt with thinking off and its tools, and a later turn
    that continued the dialog without either: from turn 2 on, a served Qwen3 thought aloud."""
    from hexstudio.core.eval.render import PromptRenderer
    from hexstudio.core.eval.suites import Case

    r = PromptRenderer("model", load_chat_format(DATA / "qwen3"), "json")
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ]
    for t in (None, tools):
        whole = r.prompt(Case(id="c", scorer="exact", messages=msgs, tools=t))
        later = r.continuation(msgs, t)
        assert later is not None and later.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), later
        # the dialog holds the first prompt and the reply; the later turn completes it to the whole prompt
        assert whole.endswith("4." + "<|im_end|>" + later), (whole, later)
    # a conversation that is not user/assistant pairs is no continuation
    assert r.continuation(msgs[:1] + msgs[2:], None) is None


def test_the_hand_written_formats_keep_every_turn_of_a_conversation() -> None:
    """Without the model's chat template (the llama3, nemotron, qa and plain fallbacks) a multi-turn request's
    user turns were joined into one and the assistant's replies dropped: the model answered a conversation it
    was never shown. Nemotron's fallback also dropped the system text (the tools said in words among it)."""
    from hexstudio.core.eval.render import PromptRenderer
    from hexstudio.core.eval.suites import Case
    from hexstudio.shared.chat_template import ChatFormat

    msgs = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ]

    def render(template: str, m: list[dict[str, object]]) -> str:
        return PromptRenderer(template, ChatFormat(mode="plain"), "json").prompt(
            Case(id="c", scorer="exact", messages=m)
        )

    h = "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>"
    turns = h.format("user", "What is 2+2?") + h.format("assistant", "4.") + h.format("user", "And 3+3?")
    reply = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert render("llama3", msgs) == h.format("system", "Be terse.") + turns + reply
    nemo = render("nemotron", msgs)
    assert nemo.startswith(
        h.format("system", "detailed thinking off") + h.format("user", "Be terse.\n\nWhat is 2+2?")
    )
    assert nemo.endswith(
        h.format("assistant", "4.") + h.format("user", "And 3+3?") + reply + "<think>\n</think>\n"
    )
    assert render("qa", msgs) == "Be terse.\nQuestion: What is 2+2? Answer: 4. Question: And 3+3? Answer:"
    assert render("plain", msgs) == "Be terse.\n\nWhat is 2+2?\n\n4.\n\nAnd 3+3?"
    # one turn reads as it always did
    assert render("qa", msgs[1:2]) == "Question: What is 2+2? Answer:"
    # a turn that only called tools says its calls, as the JSON the fallback asks for
    called = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }
    assert '[{"name": "add", "arguments": "{}"}]' in render(
        "llama3", [msgs[1], called, {"role": "tool", "content": "4"}]
    )


def test_a_local_bundle_folder_chats_in_its_models_own_template(tmp_path: Path) -> None:
    """`hexstudio chat --bundle DIR` and `serve --bundle DIR` used Llama-3 header text for every model that was
    not Nemotron or the built-in one: Qwen or Mistral weights got a format they were never trained on."""
    import argparse

    from hexstudio.cli.target import model_dir_of
    from hexstudio.core.eval.render import PromptRenderer
    from hexstudio.core.genie.prompts import template_for

    bundle = tmp_path / "qwen_bundle"
    shutil.copytree(DATA / "qwen3", bundle)
    (bundle / "bundle.json").write_text(json.dumps({"model": "Qwen/Qwen3-0.6B"}))
    args = argparse.Namespace(bundle=str(bundle))
    assert model_dir_of(args, None) == bundle
    assert template_for(bundle) == "model"
    r = PromptRenderer.for_model(bundle)
    assert r.template == "model" and r.fmt.thinking_switch == "enable_thinking"
    # a folder only on the board, the built-in model, and a bundle without the model's files
    assert model_dir_of(argparse.Namespace(bundle="/home/user/bundle"), None) is None
    (bundle / "bundle.json").write_text(json.dumps({"model": "builtin:tiny-llama"}))
    assert template_for(bundle) == "qa"
    (bundle / "bundle.json").write_text(json.dumps({"model": "nvidia/Llama-3.1-Nemotron-Nano-8B-v1"}))
    (bundle / "tokenizer_config.json").unlink()
    assert template_for(bundle) == "nemotron"
