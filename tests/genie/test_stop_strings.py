"""Stop strings (issue 31): handed to Genie where the loaded dialog takes them (GenieDialog_setStopSequence, the
helper's "stop"), cut on the host only where it cannot. The host's cut (StopCut) here, and a session whose
libGenie lacks GenieDialog_setStopSequence (the test libGenie): the fallback path end to end. Real Genie's own
stop on the HTP simulator: tests/qnn/test_real_genie.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.run import Chunk
from hexstudio.core.genie.session import ChatSession, StopCut, TurnResult
from tests.genie.conftest import FakeGenie
from tests.genie.test_session import fake_board


def _stream(cut: StopCut, pieces: list[str]) -> str:
    return "".join(cut.feed(p) for p in pieces) + ("" if cut.hit else cut.flush())


@pytest.mark.parametrize(
    ("pieces", "stops", "want", "hit"),
    [
        (["Paris", ".", " The sky"], ["."], "Paris", True),
        (["Par", "is<|e", "ot|> more"], ["<|eot|>"], "Paris", True),  # a stop string split over chunks
        (["a <|eo", "t but not"], ["<|eot|>"], "a <|eot but not", False),  # a false start is released
        (["one two", " three"], ["three", "two"], "one ", True),  # the earliest match wins
        (["no stop here"], [], "no stop here", False),
        (["x", "y"], [""], "xy", False),  # an empty stop string is none
    ],
)
def test_host_cut_releases_everything_before_the_first_stop_string(
    pieces: list[str], stops: list[str], want: str, hit: bool
) -> None:
    cut = StopCut(stops)
    assert _stream(cut, pieces) == want and cut.hit is hit


def test_host_cut_holds_back_only_what_may_start_a_stop_string() -> None:
    cut = StopCut(["</s>"])
    assert cut.feed("Hello <") == "Hello "  # "<" may start "</s>": held
    assert cut.feed("b") == "<b"  # "<b" cannot: released at once
    assert cut.feed("old </") == "old "
    assert cut.feed("s> tail") == "" and cut.hit
    assert cut.feed("more") == "" and cut.flush() == ""


def test_a_libgenie_without_set_stop_sequence_is_cut_on_the_host(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """The test libGenie has no GenieDialog_setStopSequence: the helper says so at ready, the session cuts the
    reply itself, tells the dialog to stop there, reports a complete reply ended by the host, and the next turn
    runs on a cleared dialog."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=30, tokens=12)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[ChatSession, TurnResult, TurnResult, list[Chunk], TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="plain"), max_tokens=12) as s:
            whole = await s.send("Tell me about the board")
            await s.reset()
            seen: list[Chunk] = []
            words = whole.text.split(" ")
            stop = " " + words[3]
            cut = await s.send("Tell me about the board", on_chunk=seen.append, stop_strings=[stop, "never"])
            after = await s.send("Again")
            return s, whole, cut, seen, after

    s, whole, cut, seen, after = asyncio.run(go())
    assert s.stop_sequences is False  # this libGenie cannot: the fallback
    assert whole.stop is None and not whole.stop_hit and len(whole.text.split(" ")) == 12
    stop = " " + whole.text.split(" ")[3]
    assert cut.text == whole.text[: whole.text.index(stop)] and stop not in cut.text
    assert "".join(c.text for c in seen) == cut.text and all(c.text for c in seen)
    assert cut.stop == "host" and cut.stop_hit and cut.state == "complete"
    assert cut.kpis is not None and cut.kpis.generated_tokens is not None and cut.kpis.generated_tokens < 12
    assert after.state == "complete" and after.text


def test_the_models_own_stop_strings_are_the_default(tmp_path: Path, fake_genie: FakeGenie) -> None:
    """`hexstudio chat` passes no stop strings: the conversation's chat format (generation_config.json's
    stop_strings) gives them."""
    from hexstudio.shared.chat_template import ChatFormat

    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=10, tokens=12)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[TurnResult, TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="plain"), max_tokens=12) as s:
            whole = await s.send("What now")
            await s.reset()
            s.conversation.chat_format = ChatFormat(
                mode="plain", stop_strings=[" " + whole.text.split(" ")[2]]
            )
            return whole, await s.send("What now")

    whole, r = asyncio.run(go())
    assert r.stop == "host" and r.stop_hit and r.text == " ".join(whole.text.split(" ")[:2])


def test_the_bundles_own_stop_sequence_is_cut_on_the_host_where_genie_cannot(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """genie_config.json's dialog "stop-sequence" ends a reply on a board; where the loaded libGenie cannot take
    stop sequences (and on the simulator board) the host cut only the request's stop strings, so the reply ran
    on past the bundle's own."""
    import json

    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=10, tokens=12)
    board = fake_board(tmp_path, fake_genie)

    async def send() -> TurnResult:
        async with ChatSession(board, str(bundle), Conversation(template="plain"), max_tokens=12) as s:
            return await s.send("What now")

    whole = asyncio.run(send())
    stop = " " + whole.text.split(" ")[2]
    cfg_path = bundle / "genie_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dialog"]["stop-sequence"] = [stop]
    cfg_path.write_text(json.dumps(cfg))
    r = asyncio.run(send())
    assert r.stop == "host" and r.stop_hit and r.text == whole.text[: whole.text.index(stop)], r.text
