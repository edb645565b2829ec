"""Persistent chat sessions against the test-only libGenie (tests/genie/fake_genie, built with cc):
the helper keeps the dialog loaded, later turns skip the init, stop, context full, fallback."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.board import Board
from hexstudio.core.device.transport import LocalTransport
from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.run import Chunk
from hexstudio.core.genie.session import ChatSession, TurnResult
from tests.genie.conftest import FakeGenie
from tests.support.scripted import use_scripted_helper


def fake_board(root: Path, fake: FakeGenie, **cfg: object) -> Board:
    """A board whose runtime is the test libGenie (a fake EVK on this machine; nothing here is a device)."""
    return Board(
        "fake-evk",
        LocalTransport(root / "home"),
        False,
        genie_command=[str(fake.t2t)],
        config=fake.board_config(**cfg),
    )


def one_turn(tmp_path: Path, fake_genie: FakeGenie, message: str, **bundle: Any) -> TurnResult:
    """One message to a persistent session on the fake board, over a fake bundle with `bundle`'s knobs."""
    path = fake_genie.bundle(tmp_path / "bundle", **bundle)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> TurnResult:
        async with ChatSession(board, str(path), Conversation(template="qa"), max_tokens=8) as s:
            assert s.mode == "persistent", s.fallback_reason
            return await s.send(message)

    return asyncio.run(go())


def queries(echo: Path) -> list[str]:
    return [q for q in echo.read_bytes().decode("utf-8").split("\x1e") if q]


def test_second_turn_starts_generating_in_a_tenth_of_the_init(tmp_path: Path, fake_genie: FakeGenie) -> None:
    echo = tmp_path / "queries.txt"
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=1500, token_ms=20, tokens=10, echo=echo)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[ChatSession, list[TurnResult], list[list[Chunk]]]:
        seen: list[list[Chunk]] = [[], []]
        async with ChatSession(
            board, str(bundle), Conversation(template="llama3", system="Be brief."), max_tokens=10
        ) as s:
            assert s.mode == "persistent", s.fallback_reason
            r1 = await s.send("Hello there", on_chunk=seen[0].append)
            r2 = await s.send("And a second question?", on_chunk=seen[1].append)
        return s, [r1, r2], seen

    s, (r1, r2), seen = asyncio.run(go())
    assert s.init_ms is not None and s.init_ms >= 1400
    for r, chunks in ((r1, seen[0]), (r2, seen[1])):
        assert r.state == "complete" and r.mode == "persistent" and not r.simulated
        assert len(chunks) == 10 and "".join(c.text for c in chunks) == r.text
        assert chunks[0].t < chunks[-1].t - 0.1  # streamed: the first chunk arrived well before the last
        assert r.kpis is not None and r.kpis.generated_tokens == 10 and r.kpis.source == "device"
        assert r.kpis.gen_tok_s is not None and r.kpis.gen_time_ms is not None
        assert abs(r.kpis.gen_tok_s - 10 / (r.kpis.gen_time_ms / 1000)) <= 0.01 * r.kpis.gen_tok_s
    assert r2.first_chunk_ms is not None and r2.first_chunk_ms < s.init_ms / 10
    assert r1.kpis is not None and r1.kpis.init_ms == s.init_ms
    assert r2.kpis is not None and r2.kpis.init_ms == 0.0
    # the first query is the whole templated prompt; the second only the new turn (the KV holds the rest)
    q1, q2 = queries(echo)
    assert (
        q1.startswith("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
        and "Hello there" in q1
    )
    assert q2 == (
        "<|start_header_id|>user<|end_header_id|>\n\nAnd a second question?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # the kept-loaded helper takes the sampler as an argument: no copy of the bundle's config is left behind
    assert not list(bundle.glob("genie_config.hexstudio-*.json"))


def test_fallback_to_one_run_per_turn_when_the_helper_cannot_start(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    echo = tmp_path / "queries.txt"
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=400, token_ms=5, tokens=6, echo=echo)
    board = fake_board(tmp_path, fake_genie, python="/nonexistent/python3")
    statuses: list[str] = []

    async def go() -> tuple[ChatSession, TurnResult, TurnResult]:
        async with ChatSession(
            board, str(bundle), Conversation(template="llama3"), max_tokens=6, on_status=statuses.append
        ) as s:
            return s, await s.send("First message"), await s.send("Second message")

    s, r1, r2 = asyncio.run(go())
    assert s.mode == "per_turn" and s.fallback_reason and "could not start" in s.fallback_reason
    assert any("pays the init" in m for m in statuses)
    for r in (r1, r2):
        assert r.state == "complete" and r.mode == "per_turn" and len(r.chunks) >= 1
        assert (
            r.kpis is not None and r.kpis.init_ms is not None and r.kpis.init_ms >= 390
        )  # every run loads again
    q1, q2 = queries(echo)
    assert "First message" in q1 and "First message" in q2 and "Second message" in q2  # history re-sent
    assert r1.text in q2


def test_stop_mid_reply_keeps_the_model_loaded(tmp_path: Path, fake_genie: FakeGenie) -> None:
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=800, token_ms=20, tokens=12)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[ChatSession, TurnResult, TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=300) as s:
            stop = asyncio.Event()

            def on_chunk(c: Chunk) -> None:
                if len(s.conversation.turns[-1].reply) > 10:
                    stop.set()

            r1 = await s.send("Tell me a long story", on_chunk=on_chunk, stop=stop)
            s.max_tokens = 5
            r2 = await s.send("Short one")
            return s, r1, r2

    s, r1, r2 = asyncio.run(go())
    assert r1.state == "aborted" and r1.text and r1.kpis is not None
    assert r1.kpis.generated_tokens is not None and r1.kpis.generated_tokens < 50
    assert r2.state == "complete" and r2.mode == "persistent"
    assert r2.first_chunk_ms is not None and s.init_ms is not None and r2.first_chunk_ms < s.init_ms / 10
    assert s.conversation.turns[0].state == "aborted"


def test_context_full_clears_the_dialog_and_says_so(tmp_path: Path, fake_genie: FakeGenie) -> None:
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=1, tokens=8, context=80)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> list[TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="qa"), max_tokens=8) as s:
            assert s.conversation.context_length == 80
            return [await s.send(f"What is item number {i} of the list?") for i in range(6)]

    results = asyncio.run(go())
    assert all(r.state == "complete" for r in results), [r.error for r in results]
    notes = [r.note for r in results if r.note]
    assert notes and "context is full (80 tokens)" in notes[0] and "cleared" in notes[0]


def test_dialog_that_cannot_load_falls_back_and_the_failure_is_explained(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=10, fail_create=True)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[ChatSession, TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="llama3")) as s:
            return s, await s.send("hi")

    s, r = asyncio.run(go())
    assert s.mode == "per_turn" and s.fallback_reason and "Failed to create the dialog" in s.fallback_reason
    assert r.state == "failed" and r.error is not None
    assert "Failed to create the dialog" in r.error and "What to do" in r.error


def _overflowing_turns(tmp_path: Path, fake: FakeGenie, n: int, **bundle: Any) -> list[TurnResult]:
    """`n` turns on a 40-token context whose token counter underestimates, so the session's own check lets the
    dialog overflow (a full context mid-reply)."""
    folder = fake.bundle(tmp_path / "bundle", token_ms=1, tokens=8, context=40, **bundle)
    board = fake_board(tmp_path, fake)
    conv = Conversation(template="qa", count_tokens=lambda text: 1)

    async def go() -> list[TurnResult]:
        async with ChatSession(board, str(folder), conv, max_tokens=8) as s:
            s.conversation.count_tokens = lambda text: 1
            return [await s.send(f"Tell me about thing number {i}, please?") for i in range(n)]

    return asyncio.run(go())


def test_context_exceeded_mid_reply_is_said_and_the_next_turn_starts_afresh(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    # the dialog a full context ended is made again (genie_session) before the next turn, not within this one
    init = 600
    results = _overflowing_turns(tmp_path, fake_genie, 4, init_ms=init)
    cut = [r for r in results if r.note and "cut short" in r.note]
    assert cut, [(r.state, r.note, r.error) for r in results]
    assert cut[0].state == "complete" and cut[0].text
    assert cut[0].wall_ms < init, "the cut reply waited for the dialog to be made again"
    after = results[results.index(cut[0]) + 1 :]
    assert after and all(r.state == "complete" for r in after)
    # the re-sent history overflowed the dialog (the counter was wrong): the turn went out without it, and says so
    assert any("sent without them" in (r.note or "") for r in after)


def test_a_dialog_that_ignores_max_tokens_is_cut_there_and_its_memory_cleared(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """Genie 1.21's lade dialog ignores GenieDialog_setMaxNumTokens (measured on the x86 simulator: docs/genie.md).
    The helper sends no token past max_tokens, asks the dialog to stop (this libGenie honours ABORT, so it does
    at once), and says how many it dropped; the session clears the dialog, whose KV cache holds them, and the
    next turn re-sends the history instead of continuing from it."""
    echo = tmp_path / "queries.txt"
    bundle = fake_genie.bundle(
        tmp_path / "bundle", init_ms=50, token_ms=5, tokens=12, ignore_limit=True, echo=echo
    )
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[TurnResult, TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=4) as s:
            assert s.mode == "persistent", s.fallback_reason
            return await s.send("First question"), await s.send("Second question")

    r1, r2 = asyncio.run(go())
    for r in (r1, r2):
        assert r.state == "complete" and len(r.text.split()) == 4, r.text
        assert r.error is None
    q1, q2 = queries(echo)
    assert "First question" in q1 and "First question" in q2 and "Second question" in q2  # history re-sent


def test_a_dialog_that_ignores_max_tokens_and_abort_is_stopped_by_the_helper_exiting(
    tmp_path: Path, fake_genie: FakeGenie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Genie 1.21's lade ignores ABORT too (docs/genie.md): it would generate to EOS or a full context, minutes on
    a board. Past a grace period the helper ends the reply itself and exits; the next turn starts a new helper and
    re-sends the history, and each reply is max_tokens long and complete."""
    monkeypatch.setenv("HEXSTUDIO_OVERRUN_GRACE_S", "0.5")
    echo = tmp_path / "queries.txt"
    bundle = fake_genie.bundle(
        tmp_path / "bundle",
        init_ms=50,
        token_ms=20,
        tokens=3000,  # a minute of tokens if nothing stopped it
        ignore_limit=True,
        ignore_abort=True,
        echo=echo,
    )
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[TurnResult, TurnResult, float]:
        t0 = time.monotonic()
        async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=4) as s:
            assert s.mode == "persistent", s.fallback_reason
            r1 = await s.send("First question")
            r2 = await s.send("Second question")
        return r1, r2, time.monotonic() - t0

    r1, r2, took = asyncio.run(go())
    for r in (r1, r2):
        assert r.state == "complete" and len(r.text.split()) == 4 and r.error is None, (
            r.state,
            r.text,
            r.error,
        )
    assert took < 20, took  # not the minute the dialog would have run
    assert r2.kpis is not None and r2.kpis.init_ms, r2.kpis  # the second turn loaded the model again
    q1, q2 = queries(echo)
    assert "First question" in q1 and "First question" in q2 and "Second question" in q2  # history re-sent


def test_stop_ends_a_reply_whose_dialog_ignores_the_abort(tmp_path: Path, fake_genie: FakeGenie) -> None:
    """A dialog that keeps sending tokens after the abort (Genie 1.21's lade ignores it): the helper is stopped
    hard once the grace is over, whether or not tokens keep arriving, and the next turn loads the model again."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=20, tokens=3000, ignore_abort=True)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[TurnResult, TurnResult, float]:
        async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=2000) as s:
            s.abort_grace_s = 2.0
            stop = asyncio.Event()

            def on_chunk(c: Chunk) -> None:
                stop.set()

            t0 = time.monotonic()
            r1 = await s.send("Tell me a long story", on_chunk=on_chunk, stop=stop)
            took = time.monotonic() - t0
            s.max_tokens = 3
            r2 = await s.send("Short one")
            return r1, r2, took

    r1, r2, took = asyncio.run(go())
    assert r1.state == "aborted" and took < 8, (r1.state, took)  # not the minute of tokens the dialog had
    assert r2.state == "complete" and r2.text, (r2.state, r2.error)


def test_stop_pressed_before_the_reply_starts_still_stops_it(tmp_path: Path, fake_genie: FakeGenie) -> None:
    """Stop pressed while the query is on its way (the model still busy): the helper drops an abort that arrives
    before its query begins, so the session sends it again until the reply ends."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=20, tokens=1500)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[TurnResult, float]:
        async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=1500) as s:
            stop = asyncio.Event()
            stop.set()
            t0 = time.monotonic()
            r = await s.send("Tell me a long story", stop=stop)
            return r, time.monotonic() - t0

    r, took = asyncio.run(go())
    assert r.state == "aborted" and took < 8, (r.state, took)  # not the 30 s the reply would take


def test_a_turn_the_full_dialog_refuses_goes_again_with_its_history(
    tmp_path: Path, fake_genie: FakeGenie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new turn alone, sent to a dialog that holds the history, is refused (its KV cache is fuller than the
    session's count: a token estimate that was off). That dialog is cleared; the turn goes again with the whole
    history to the empty one and is answered, instead of failing until the person sends it a second time."""
    use_scripted_helper(monkeypatch, {"cont please": "<refuse-continuation>"})
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> tuple[TurnResult, TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="qa"), max_tokens=8) as s:
            return await s.send("hello there"), await s.send("cont please")

    r1, r2 = asyncio.run(go())
    assert r1.state == "complete", (r1.state, r1.error)
    assert r2.state == "complete" and r2.text == "OK.", (r2.state, r2.error)


def test_a_failed_turn_carries_no_figures_of_the_turn_before(
    tmp_path: Path, fake_genie: FakeGenie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query the dialog refuses logs nothing in Genie's profile, whose last entry is the turn before (the helper
    sends the whole profile with every end): the failed turn must not show that turn's TTFT and tokens/s as its
    own. The dialog here is the scripted helper (tests/eval/scripted_helper.py) refusing the query."""
    use_scripted_helper(monkeypatch, {"refuse": "<refuse>"})
    r = one_turn(tmp_path, fake_genie, "please refuse this", init_ms=50)
    assert r.state == "failed" and r.kpis is None, (r.state, r.kpis)
    assert "status -8" in (r.error or ""), r.error


def test_a_failed_query_says_the_runtimes_own_reason(
    tmp_path: Path, fake_genie: FakeGenie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GenieX's generate() raised (a sampler value its plugin refuses): the helper's end carries the reason, and
    the turn's error shows it, not only "geniex generate failed (status 1)"."""
    use_scripted_helper(monkeypatch, {"refuse": "<refuse:ValueError: top_p must be in (0, 1]>"})
    r = one_turn(tmp_path, fake_genie, "please refuse this", init_ms=50)
    assert r.state == "failed" and "status 1" in (r.error or ""), r.error
    assert "top_p must be in (0, 1]" in (r.error or ""), r.error


def test_without_a_profile_the_rate_counts_tokens_over_their_intervals(
    tmp_path: Path, fake_genie: FakeGenie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A libGenie that cannot profile: the helper's own measure gives the figures. 8 tokens 20 ms apart come in
    7 intervals: 8 tokens over those 140 ms read 57 tok/s for a 50 tok/s runtime. The count is Genie's token
    callbacks, not the text pieces (a character in pieces is one piece of several tokens)."""
    monkeypatch.setenv("FAKE_GENIE_NO_PROFILE", "1")
    r = one_turn(tmp_path, fake_genie, "Hi", init_ms=10, token_ms=20, tokens=8)
    assert r.state == "complete" and r.kpis is not None, (r.state, r.error)
    k = r.kpis
    assert k.origin == "helper_timing" and k.generated_tokens == 8 and k.gen_time_ms and k.gen_tok_s, k
    assert k.gen_tok_s == pytest.approx(7 / (k.gen_time_ms / 1000), rel=1e-3) and k.gen_tok_s <= 51, k


def _running_in(folder: Path) -> list[int]:
    """The processes whose working folder is `folder` (the helper runs in its bundle folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(proc / "cwd").resolve() == folder.resolve():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_a_load_cancelled_part_way_leaves_no_helper_loading_on_the_board(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """Quitting (or a new chat) while the model still loads cancels the open: the helper, not yet the session's,
    was left to finish loading and hold the NPU and the board's RAM, with nothing left to close it."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=30000)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> None:
        s = ChatSession(board, str(bundle), Conversation(template="qa"), max_tokens=8, mode="persistent")
        task = asyncio.ensure_future(s.open())
        deadline = time.monotonic() + 20
        while not _running_in(bundle) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _running_in(bundle), "the helper never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while _running_in(bundle) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running_in(bundle), "the cancelled load's helper still runs"


def test_a_message_refused_twice_keeps_the_conversation_in_order(
    tmp_path: Path, fake_genie: FakeGenie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same message refused earlier and again: each retry took out the first turn equal to the refused one
    (list.remove compares values), the earlier refused turn, so the conversation's turns came out of order."""
    use_scripted_helper(monkeypatch, {"refuse": "<refuse>"})
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50)
    board = fake_board(tmp_path, fake_genie)

    async def go() -> list[tuple[str, str]]:
        async with ChatSession(board, str(bundle), Conversation(template="qa"), max_tokens=8) as s:
            for m in ("hello", "refuse me", "next", "refuse me"):
                await s.send(m)
            return [(t.user, t.state) for t in s.conversation.turns]

    turns = asyncio.run(go())
    assert [u for u, _ in turns] == ["hello", "refuse me", "next", "refuse me"], turns
    assert [st for _, st in turns] == ["complete", "failed", "complete", "failed"], turns


def test_two_sessions_on_one_bundle_each_keep_their_own_sampler(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """Every session wrote one shared genie_config.hexstudio.json: a second studio (or `hexstudio serve`) on the
    same bundle replaced the first one's sampler, and the first ran its per-turn queries with the second's."""
    import json

    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=10, token_ms=1, tokens=3)
    board = fake_board(tmp_path, fake_genie)
    hot = {"seed": 7, "temp": 1.5, "top-k": 1000, "top-p": 1.0}

    async def go() -> tuple[str, str]:
        async with (
            ChatSession(board, str(bundle), Conversation(template="llama3"), mode="per_turn") as a,
            ChatSession(
                board, str(bundle), Conversation(template="llama3"), mode="per_turn", sampler=hot
            ) as b,
        ):
            assert (await a.send("Hi")).state == "complete"
            assert (await b.send("Hi")).state == "complete"
            return a._config, b._config

    first, second = asyncio.run(go())
    assert first != second
    assert json.loads((bundle / first).read_text())["dialog"]["sampler"]["temp"] == 0.0
    assert json.loads((bundle / second).read_text())["dialog"]["sampler"]["temp"] == 1.5


def test_old_session_configs_are_removed_and_a_live_ones_comes_back(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """Each distinct sampler a studio or `serve` chose left a genie_config.hexstudio-<hash>.json in the bundle
    folder for good, and each reply budget a hidden copy of it. A per-turn session now writes its copy before each
    run, and copies no one wrote for a week are removed; one removed under a live session is written again at its
    next turn."""
    import json
    import os
    import time

    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=10, token_ms=1, tokens=3)
    board = fake_board(tmp_path, fake_genie)
    week_old = time.time() - 8 * 86400
    stale, recent = (
        bundle / "genie_config.hexstudio-0123456789ab.json",
        bundle / "genie_config.hexstudio-ba9876543210.json",
    )
    # genie-t2t-run's reply budget travels in a hidden copy of each config (run.budget_config): one per budget
    stale_budget = bundle / ".hexstudio-genie_config.hexstudio-0123456789ab-max77.json"
    for f in (stale, recent, stale_budget):
        f.write_text("{}")
        if f is not recent:
            os.utime(f, (week_old, week_old))

    async def go() -> str:
        async with ChatSession(board, str(bundle), Conversation(template="llama3"), mode="per_turn") as s:
            assert (await s.send("Hi")).state == "complete"
            own = bundle / s._config
            own.unlink()  # another session's clean-up, had this one been idle for a week
            assert (await s.send("Again")).state == "complete"
            return s._config

    own = bundle / asyncio.run(go())
    assert json.loads(own.read_text())["dialog"]["sampler"]["temp"] == 0.0
    assert not stale.exists() and not stale_budget.exists() and recent.exists()
    assert list(bundle.glob(".hexstudio-genie_config.hexstudio-*-max*.json"))  # this session's own, kept
    assert (bundle / "genie_config.json").exists()  # the bundle's own config is never a candidate


def test_each_end_event_carries_only_the_latest_query_of_the_profile(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """libGenie's bound profile keeps every query until it is freed and writes them all (Profile.cpp): each
    end event of a long `serve` session grew by one query. The helper sends the latest event of each type."""
    import json
    import subprocess
    import sys

    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=10, token_ms=1, tokens=3)
    lines = [json.dumps({"op": "query", "id": n, "prompt": f"turn {n}", "max_tokens": 3}) for n in (1, 2, 3)]
    helper = ["hexstudio.workers.board.genie_session", "--config", "genie_config.json"]
    out = subprocess.run(
        [sys.executable, "-m", *helper, "--lib", str(fake_genie.lib)],
        input="\n".join([*lines, json.dumps({"op": "quit"})]) + "\n",
        capture_output=True,
        text=True,
        cwd=bundle,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    ends = [e for e in map(json.loads, out.stdout.splitlines()) if e.get("event") == "end"]
    assert [e["state"] for e in ends] == ["complete"] * 3, ends
    for end in ends:
        (component,) = end["profile"]["components"]
        kinds = [ev["type"] for ev in component["events"]]
        assert kinds == ["GenieDialog_create", "GenieDialog_query"], kinds
    starts = [e["profile"]["components"][0]["events"][1]["start"] for e in ends]
    assert starts == sorted(starts) and len(set(starts)) == 3  # each the query just made


class _Helper:
    """The board's chat helper (genie_session.py) on the test libGenie, driven over its JSON-lines protocol."""

    def __init__(self, bundle: Path, lib: Path) -> None:
        import subprocess
        import sys

        import hexstudio.workers.board.genie_session as gs

        self.p = subprocess.Popen(
            [sys.executable, gs.__file__, "--config", str(bundle / "genie_config.json"), "--lib", str(lib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.next("ready")["event"] == "ready"

    def send(self, **op: object) -> float:
        import json

        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(op) + "\n")
        self.p.stdin.flush()
        return time.monotonic()

    def exit(self) -> tuple[int, str]:
        """The helper's exit status and what it wrote to stderr, once it has ended (its pipes closed)."""
        _out, err = self.p.communicate(timeout=30)
        return self.p.returncode, err

    def next(self, event: str) -> dict:
        import json

        assert self.p.stdout is not None
        for line in self.p.stdout:
            ev = json.loads(line)
            if ev.get("event") == event:
                return dict(ev)
        return {"event": "eof"}


def test_a_full_context_remakes_the_dialog_once_on_its_next_use(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """Genie 1.21 leaves a dialog a full context ended with its query still counted active (Dialog.cpp), so the
    helper makes it again. It did so inside the query, before the reply's end went out (a whole load added to the
    reply), unchecked (a failed create left no dialog), again at the host's reset for spd (two loads), and in the
    per-turn genie_t2t just before exiting. It is now made once, at the next reset or query."""
    init = 800
    long_prompt = "word " * 28  # 35 tokens of a 40-token context: the 8-token reply overflows it
    for kind in ("basic", "spd"):
        bundle = fake_genie.bundle(
            tmp_path / kind, init_ms=init, token_ms=1, tokens=8, context=40, dialog_type=kind
        )
        h = _Helper(bundle, fake_genie.lib)
        t0 = h.send(op="reset")
        ev = h.next("reset")
        # a dialog nothing ran on since it was made is not made again, spd or not
        assert not ev.get("recreated") and (time.monotonic() - t0) * 1000 < init / 2, (kind, ev)
        t0 = h.send(op="query", id=1, prompt=long_prompt, max_tokens=8)
        end = h.next("end")
        assert end["state"] == "context_full", end
        assert (time.monotonic() - t0) * 1000 < init / 2, f"{kind}: the end waited for a load"
        t0 = h.send(op="reset")
        ev = h.next("reset")
        took = (time.monotonic() - t0) * 1000
        assert ev["recreated"] is True and ev["status"] == 0 and init <= took < 2 * init, (kind, ev, took)
        h.send(op="query", id=2, prompt="Hi there", max_tokens=4)
        assert h.next("end")["state"] == "complete"
        h.send(op="quit")
        assert h.exit()[0] == 0
    # a dialog that cannot be made again: the helper says so and exits, and the host loads the model afresh
    bundle = fake_genie.bundle(tmp_path / "once", init_ms=50, token_ms=1, tokens=8, context=40, creates_ok=1)
    h = _Helper(bundle, fake_genie.lib)
    h.send(op="query", id=1, prompt=long_prompt, max_tokens=8)
    assert h.next("end")["state"] == "context_full"
    h.send(op="reset")
    ev = h.next("reset")
    assert ev["recreated"] is True and ev["status"] != 0, ev
    rc, err = h.exit()
    assert rc == 5 and "making the dialog again" in err, (rc, err)


def test_a_dialog_that_cannot_be_made_again_loads_afresh_for_the_same_turn(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """After a full context the helper makes the dialog again; when that fails it says so and exits. The session
    sent the next query to the dying helper anyway: the turn failed and the person's message was lost (and a
    `serve` stream got its 200, then an error). The same turn now starts a new helper."""
    # every helper process may make its dialog once: the remake after the full context fails
    results = _overflowing_turns(tmp_path, fake_genie, 3, init_ms=50, creates_ok=1)
    cut = next(i for i, r in enumerate(results) if r.note and "cut short" in (r.note or ""))
    after = results[cut + 1]
    assert after.state == "complete" and after.text, (after.state, after.error)


def test_a_dialog_cleared_for_a_long_turn_that_cannot_be_made_again_loads_afresh(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """An spd dialog is made again when cleared for a turn that would overflow it; when that fails the helper
    exits. The turn sent its query to the closed helper and raised ConnectionResetError to the chat page or
    `serve`. It loads afresh instead."""
    bundle = fake_genie.bundle(
        tmp_path / "bundle", init_ms=50, token_ms=1, tokens=8, context=40, creates_ok=1, dialog_type="spd"
    )
    board = fake_board(tmp_path, fake_genie)

    async def go() -> list[TurnResult]:
        conv = Conversation(template="qa", count_tokens=lambda text: 20)
        async with ChatSession(board, str(bundle), conv, max_tokens=8) as s:
            s.conversation.count_tokens = lambda text: 20
            return [await s.send("First?"), await s.send("Second?")]

    first, second = asyncio.run(go())
    assert first.state == "complete" and second.state == "complete", (second.state, second.error)


def test_a_reset_genie_refuses_loads_the_model_again_rather_than_keep_the_old_cache(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """GenieDialog_reset failing (or missing: the helper binds it as optional) was taken for a reset: the session
    counted an empty KV cache and sent the next conversation on top of the old one. Evaluate resets before every
    case, so each case was answered with the earlier ones still in the cache, and scored as if nothing was wrong."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=1, tokens=4, fail_reset=True)
    board = fake_board(tmp_path, fake_genie)
    said: list[str] = []

    async def go() -> list[TurnResult]:
        async with ChatSession(board, str(bundle), Conversation(template="qa"), max_tokens=4) as s:
            s.on_status = said.append
            first = await s.send("First?")
            await s.reset()
            return [first, await s.send("Second?")]

    first, second = asyncio.run(go())
    assert first.state == "complete" and second.state == "complete", (second.state, second.error)
    assert any("could not be reset (Genie status -1)" in line for line in said), said
    loads = [line for line in said if line.startswith("model loaded in")]
    assert len(loads) == 1, said  # the second load, for the turn after the failed reset


def test_a_context_filled_during_an_abort_is_said_full_and_limits_do_not_linger(
    tmp_path: Path, fake_genie: FakeGenie
) -> None:
    """Two faults of the board helper (hexstudio/workers/board/genie_session.py). A reply stopped as the context
    filled ended "aborted": the helper made the dialog again (empty), but the host kept its copy of the
    conversation and sent only the next turn, so the history was gone. And a query's max_tokens stayed on the
    dialog: a later query without one was cut at the old limit."""
    import json

    bundle = fake_genie.bundle(
        tmp_path / "full", init_ms=20, token_ms=40, tokens=40, context=60, ignore_abort=True
    )
    h = _Helper(bundle, fake_genie.lib)
    h.send(op="query", id=1, prompt="word " * 28, max_tokens=40)
    time.sleep(0.3)
    h.send(op="abort")
    assert h.next("end")["state"] == "context_full"
    h.send(op="quit")
    assert h.exit()[0] == 0
    bundle = fake_genie.bundle(tmp_path / "limit", init_ms=20, token_ms=1, tokens=12)
    cfg = json.loads((bundle / "genie_config.json").read_text())
    cfg["dialog"]["max-num-tokens"] = 6  # the config's own limit
    (bundle / "genie_config.json").write_text(json.dumps(cfg))
    h = _Helper(bundle, fake_genie.lib)
    lengths = []
    for qid, limit in ((1, 3), (2, None), (3, 0)):
        h.send(op="query", id=qid, prompt="Hi", max_tokens=limit)
        lengths.append(h.next("end")["measured"]["tokens"])
        h.send(op="reset")
        h.next("reset")
    h.send(op="quit")
    assert h.exit()[0] == 0
    assert lengths == [3, 6, 6], lengths


def test_an_abort_as_the_query_starts_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Genie drops an ABORT that comes before its query counts as active (Dialog::signalAction): the helper said
    in_query before calling GenieDialog_query, so an abort in between was lost and the reply ran to its end."""
    import hexstudio.workers.board.genie_session as gs

    h = object.__new__(gs.Helper)
    state = {"active": False, "abort": False}

    def query(dialog: object, prompt: bytes, code: int, cb: Any, user: object) -> int:
        h.abort()  # the host's abort arrives now, before the query is active: Genie drops it
        state["active"] = True
        n = 0
        for n in range(50):
            if state["abort"]:
                cb(b"", gs.SENTENCE_ABORT, None)
                return gs.WARNING_ABORTED
            cb(b" w", gs.SENTENCE_BEGIN if n == 0 else gs.SENTENCE_CONTINUE, None)
        cb(b"", gs.SENTENCE_END, None)
        return gs.SUCCESS

    def signal(dialog: object, action: int) -> int:
        state["abort"] = state["abort"] or state["active"]
        return gs.SUCCESS

    h.f = {"GenieDialog_query": query, "GenieDialog_signal": signal}
    h.dialog, h.profile, h.in_query = None, None, threading.Event()
    h.limited, h.remake = False, False
    ends: list[dict[str, Any]] = []
    monkeypatch.setattr(gs, "emit", lambda ev: ends.append(ev) if ev.get("event") == "end" else None)
    h.query(1, "Hi", 0)
    assert ends and ends[0]["state"] == "aborted" and ends[0]["measured"]["tokens"] < 50, ends


def test_stop_strings_come_back_only_where_the_host_does_not_see_the_dialog_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dialog made again at the host's reset holds the config's stop strings only, as the host counts it (it
    sends its own again when they differ); one made again at a query the host does not see gets the last ones
    back, or replies would run past them."""
    import hexstudio.workers.board.genie_session as gs

    applied: list[str] = []
    h = object.__new__(gs.Helper)
    h.f = {
        "GenieDialog_free": lambda d: gs.SUCCESS,
        "GenieDialog_create": lambda cfg, out: gs.SUCCESS,
        "GenieDialog_setStopSequence": lambda d, doc: applied.append(doc.decode()) or gs.SUCCESS,
    }
    h.dialog, h.cfg, h.sampler_values, h.dialog_type = None, None, None, "basic"
    monkeypatch.setattr(gs, "emit", lambda ev: None)
    h.stop_values, h.remake, h.used = ["###"], True, True
    h.recreate()  # at a query: the host does not know
    assert applied == ['{"stop-sequence": ["###"]}'] and h.stop_values == ["###"]
    applied.clear()
    h.remake = True
    h.reset()  # at the host's reset: "recreated", the host's count is the config's stops
    assert applied == [] and h.stop_values is None


def test_a_helper_whose_parent_dies_during_the_load_stops(tmp_path: Path, fake_genie: FakeGenie) -> None:
    """The helper watched for its parent (the studio, `serve`, the SSH session) only once the dialog was loaded: a
    parent stopped during the load (minutes on the simulator, a big model on the board) left the load running and
    the NPU held for no one, a restarted `serve` loading a second copy beside it."""
    import os
    import signal
    import subprocess
    import sys

    import hexstudio.workers.board.genie_session as gs

    bundle = fake_genie.bundle(tmp_path / "b", init_ms=60_000)  # a minute's load
    pidfile = tmp_path / "helper.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, {gs.__file__!r}, '--config', {str(bundle / 'genie_config.json')!r},"
            f" '--lib', {str(fake_genie.lib)!r}], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(600)\n",
        ]
    )
    try:
        t0 = time.monotonic()
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)
        helper = int(pidfile.read_text())
        time.sleep(1.5)  # the helper is in GenieDialog_create now
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            try:
                os.kill(helper, 0)
            except ProcessLookupError:
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(helper, os.WNOHANG)  # reaped by init normally; here, should we be its subreaper
            time.sleep(0.2)
        else:
            os.kill(helper, signal.SIGKILL)
            raise AssertionError("the helper kept loading after its parent died")
    finally:
        if parent.poll() is None:
            parent.kill()
