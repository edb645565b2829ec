"""The Chat page's controller without Qt and without a board (issue 30): when a session opens, is kept, loads again
or closes; the conversation's record in the run (kept at once, when the reply starts and when it ends; Regenerate's
versions); the context accounting. The session is a fake with ChatSession's face."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hexstudio.core.device.errors import BoardError
from hexstudio.core.genie.chat_store import ChatStore, ChatTurn
from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.profile import Kpis
from hexstudio.core.genie.run import Chunk
from hexstudio.core.genie.session import SessionError, TurnResult
from hexstudio.core.services.chat import SessionSetup
from hexstudio.core.services.chat_controller import (
    ChatController,
    ChatHooks,
    Chosen,
    OpenedSession,
    Rendering,
    SentWith,
    SessionRequest,
    TurnHooks,
)

GREEDY = {"seed": 42, "temp": 0.0, "top-k": 1, "top-p": 1.0}


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class FakeSession:
    """ChatSession's face: replies "echo: <message>" in two chunks, with KPIs; or raises what it is told to."""

    def __init__(
        self, conversation: Conversation, setup: SessionSetup, raises: Exception | None = None
    ) -> None:
        self.conversation = conversation
        self.setup = setup
        self.max_tokens = 0
        self.dialog = setup.dialog
        self.runtime = SimpleNamespace(title="Fake runtime")
        self.board = SimpleNamespace(transport=FakeTransport())
        self.fallback_reason: str | None = None
        self.simulated = True
        self.raises = raises
        self.closed = False
        self.stop_at: int | None = None  # chunks before the stop event is set (as Esc would)

    async def send(self, user: str, *, on_chunk: Any = None, stop: asyncio.Event | None = None) -> TurnResult:
        if self.raises is not None:
            raise self.raises
        turn = self.conversation.add(user)
        chunks = [Chunk(0.1, "echo: "), Chunk(0.2, user)]
        state = "complete"
        for i, c in enumerate(chunks):
            if self.stop_at is not None and i == self.stop_at and stop is not None:
                stop.set()
            if stop is not None and stop.is_set():
                state = "aborted"
                break
            turn.reply += c.text
            if on_chunk is not None:
                on_chunk(c)
        turn.state = state
        kpis = Kpis(900.0, 5, 150.0, 120.0, 2, 20.0, 100.0, "simulated")
        return TurnResult(turn, turn.reply, state, kpis, chunks, "persistent", True, 1.0, 2.0)

    async def close(self) -> None:
        self.closed = True


class Board:
    """connect(): a FakeSession each time; what was opened, in order."""

    def __init__(self) -> None:
        self.opened: list[FakeSession] = []
        self.fail: Exception | None = None
        self.send_fails: Exception | None = None

    async def connect(self, conversation: Conversation, mode: str, req: SessionRequest) -> OpenedSession:
        if self.fail is not None:
            raise self.fail
        assert all(s.closed for s in self.opened), "a session opened while another was still loaded"
        s = FakeSession(conversation, req.setup, self.send_fails)
        self.opened.append(s)
        return OpenedSession(s, "persistent")


class SlowBoard(Board):
    """A board whose model loads until `loaded` is set; `loading` is set when the load starts."""

    def __init__(self) -> None:
        super().__init__()
        self.loading, self.loaded = asyncio.Event(), asyncio.Event()

    async def connect(self, conversation: Conversation, mode: str, req: SessionRequest) -> OpenedSession:
        self.loading.set()
        await self.loaded.wait()
        return await super().connect(conversation, mode, req)


def request(setup: SessionSetup | None = None, max_tokens: int = 32) -> SessionRequest:
    return SessionRequest(
        doc={"board": "sim", "remote_bundle": "/b"},
        settings=None,  # type: ignore[arg-type]  # the fake board reads none
        workspace_root=Path("/nowhere"),
        setup=setup or SessionSetup(sampler=GREEDY),
        max_tokens=max_tokens,
    )


def controller(run: Path | None, board: Board, sent: SentWith | None = None) -> ChatController:
    c = ChatController(ChatHooks(sent_with=lambda: sent or SentWith()), connect=board.connect)
    if run is not None:
        run.mkdir(parents=True, exist_ok=True)  # a run's folder (a deleted one gets no conversation saved)
    c.sync_run(run, busy=False)
    return c


def on_a_run(tmp_path: Path) -> tuple[Path, Board, ChatController]:
    """A run folder, a board and a controller on that run."""
    run, board = tmp_path / "run", Board()
    return run, board, controller(run, board)


async def ask(c: ChatController, text: str, setup: SessionSetup | None = None, **hooks: Any) -> Any:
    """As the page sends a message: start, run, end; returns (outcome, versions)."""
    c.start_turn(text)
    h = TurnHooks(chunk=lambda ch: c.add_chunk(ch.text), **hooks)
    try:
        out = await c.run_turn(text, request(setup), h)
    finally:
        versions = c.end_turn()
    return out, versions


def stored(run: Path, c: ChatController) -> dict[str, Any]:
    assert c.record is not None
    return json.loads((run / "chats" / "conversations" / f"{c.record.id}.json").read_text())


def test_a_session_opens_on_the_first_message_and_stays_loaded(tmp_path: Path) -> None:
    board = Board()
    c = controller(tmp_path / "run", board)
    opened: list[str] = []

    async def go() -> None:
        out, _ = await ask(c, "hello", opened=opened.append)
        assert out.turn is not None and out.turn.reply == "echo: hello" and out.shown == "echo: hello"
        assert out.kpis is not None and out.kpis["gen_tok_s"] == 20.0 and out.notice is None
        out, _ = await ask(c, "again", opened=opened.append)
        assert out.shown == "echo: again"

    asyncio.run(go())
    assert len(board.opened) == 1 and opened == ["persistent"]  # kept loaded between turns
    assert c.session is board.opened[0] and board.opened[0].max_tokens == 32
    assert [t.user for t in c.conversation.turns] == ["hello", "again"]
    assert "model stays loaded" in c.mode_text("persistent")


@pytest.mark.parametrize(
    "changed, named",
    [
        (SessionSetup(sampler={**GREEDY, "seed": 7}), "sampler"),
        (SessionSetup(sampler=GREEDY, runtime="geniex"), "runtime"),
        (SessionSetup(sampler=GREEDY, dialog="lade"), "dialog"),
        (SessionSetup(sampler=None, runtime="genie"), "sampler and runtime"),
    ],
)
def test_a_load_time_setting_changed_loads_the_model_again_keeping_the_conversation(
    tmp_path: Path, changed: SessionSetup, named: str
) -> None:
    board = Board()
    c = controller(tmp_path / "run", board)
    why: list[str] = []

    async def go() -> None:
        await ask(c, "first")
        await ask(c, "second", changed, reloading=why.append)

    asyncio.run(go())
    first, second = board.opened
    assert first.closed and first.board.transport.closed and not second.closed
    assert second.setup == changed and c.loaded == changed
    assert why and why[0].startswith(f"The {named} changed") and "conversation is kept" in why[0]
    assert [t.user for t in second.conversation.turns] == ["first", "second"]  # the history went along


def test_nothing_is_scheduled_to_close_without_a_session() -> None:
    """The cause of 'coroutine ChatPage.close_session was never awaited': a close was scheduled on every New chat,
    with or without a session, and outside a running loop it never ran. Now: no session, nothing scheduled."""
    c = ChatController()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asyncio.set_event_loop(None)  # no loop at all: scheduling anything would fail
        c.new_conversation(Chosen("llama3", "", None))
        c.close_later()
        assert c.change_settings(Chosen("plain", "", None), busy=False) == "applied"
        c.open_run(None)
    assert c.session is None and not c._closing


def test_a_session_closed_in_the_background_is_closed_before_the_next_opens(tmp_path: Path) -> None:
    board = Board()
    c = controller(tmp_path / "run", board)
    closed: list[bool] = []
    c.hooks.session_closed = lambda: closed.append(True)

    async def go() -> None:
        await ask(c, "first")
        c.new_conversation(Chosen("auto", "", None))  # detached at once, closed in the background
        assert c.session is None and closed and not c.conversation.turns and c.record is None
        await ask(c, "second")  # Board.connect asserts the first one was closed by then

    asyncio.run(go())
    assert len(board.opened) == 2 and board.opened[0].closed
    assert [t.user for t in board.opened[1].conversation.turns] == ["second"]


def test_another_run_or_a_new_benchmark_reply(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    c = ChatController()
    assert c.sync_run(None, busy=False) == "same" and c.store is None
    assert c.sync_run(a, busy=False) == "switched" and c.store is not None and c.store.run_dir == a
    assert c.sync_run(a, busy=False) == "same"
    bench = a / "artifacts" / "chat" / "chat.json"
    bench.parent.mkdir(parents=True)
    bench.write_text("{}")
    assert c.sync_run(a, busy=True) == "same"  # not while a reply streams
    assert c.sync_run(a, busy=False) == "listed"
    assert c.sync_run(a, busy=False) == "same"
    c.conversation.add("x")
    assert c.sync_run(b, busy=False) == "switched" and not c.conversation.turns and c.store.run_dir == b


def test_another_run_opened_while_the_model_loads_waits_for_the_reply(tmp_path: Path) -> None:
    """Run B opened while run A's message waits for its model: the session opened for A must not attach to B's
    conversation, and A's turn is kept in A's run, not B's."""
    a, b = tmp_path / "a", tmp_path / "b"
    board = SlowBoard()
    c = controller(a, board)

    async def go() -> None:
        reply = asyncio.ensure_future(ask(c, "hello from A"))
        await board.loading.wait()
        assert c.sync_run(b, busy=True) == "waiting"
        board.loaded.set()
        out, _ = await reply
        assert out.shown == "echo: hello from A"
        assert c.store is not None and c.store.run_dir == a
        assert [t.user for t in c.conversation.turns] == ["hello from A"]
        a_record = stored(a, c)
        assert [t["user"] for t in a_record["turns"]] == ["hello from A"]
        assert c.sync_run(b, busy=False) == "switched"
        assert c.session is None and not c.conversation.turns and c.store.run_dir == b
        await c.wait_closed()

    asyncio.run(go())
    assert board.opened[0].closed
    assert not (b / "chats" / "conversations").exists() or not any((b / "chats" / "conversations").iterdir())


def test_the_record_is_kept_at_once_when_the_reply_starts_and_when_it_ends(tmp_path: Path) -> None:
    run = tmp_path / "run"
    board = Board()
    sent = SentWith(template="llama3", system="Be brief.", sampler=GREEDY, runtime="genie", dialog="basic")
    c = controller(run, board, sent)
    seen: list[dict[str, Any]] = []

    def chunk(ch: Chunk) -> None:
        c.add_chunk(ch.text)
        seen.append(stored(run, c)["turns"][-1])

    async def go() -> None:
        c.start_turn("hello")
        assert stored(run, c)["turns"] == [
            {**stored(run, c)["turns"][0], "user": "hello", "state": "pending", "reply": ""}
        ]
        await c.run_turn("hello", request(), TurnHooks(chunk=chunk))
        c.end_turn()

    asyncio.run(go())
    assert seen[0]["state"] == "streaming" and seen[0]["reply"] == "echo: "  # the first chunk, kept at once
    doc = stored(run, c)
    assert doc["title"] == "hello" and doc["template"] == "llama3" and doc["system"] == "Be brief."
    assert doc["sampler"] == GREEDY and doc["runtime"] == "genie" and doc["source"] == "simulated"
    (t,) = doc["turns"]
    assert t["state"] == "complete" and t["reply"] == "echo: hello" and t["kpis"]["gen_tok_s"] == 20.0
    assert [r.id for r in c.conversations()] == [doc["id"]]


def test_a_stopped_reply_is_kept_and_said(tmp_path: Path) -> None:
    board = Board()
    c = controller(tmp_path / "run", board)

    async def go() -> Any:
        await ask(c, "first")
        board.opened[0].stop_at = 1
        return await ask(c, "second")

    out, _ = asyncio.run(go())
    assert out.shown == "echo: \n\n*(stopped)*" and out.notice.text.startswith("Reply stopped")
    assert c.record is not None and c.record.turns[-1].state == "aborted"


def test_a_message_that_does_not_fit_or_a_failing_board_is_a_failed_turn(tmp_path: Path) -> None:
    run, board, c = on_a_run(tmp_path)

    async def go() -> None:
        board.fail = SessionError("The runtime runs only the basic dialog, not lade.", "Choose basic.")
        out, _ = await ask(c, "refused")
        assert out.turn is None and out.shown.startswith("*(failed: The runtime runs only")
        assert out.notice is not None and out.notice.failed and out.notice.hint == "Choose basic."
        assert c.session is None
        board.fail = None
        board.send_fails = ValueError("The message alone does not fit in the context.")
        out, _ = await ask(c, "too long")
        assert c.session is not None  # the session goes on
        assert (
            out.shown == "*(not sent: The message alone does not fit in the context.)*" and out.notice.failed
        )
        board.opened[-1].raises = BoardError("The board went away.", "Check its cable.")
        out, _ = await ask(c, "gone")
        assert out.notice is not None and out.notice.hint == "Check its cable." and c.session is None
        await c.wait_closed()

    asyncio.run(go())
    assert all(s.closed for s in board.opened)
    assert [(t["state"], t["error"]) for t in stored(run, c)["turns"]] == [
        ("failed", "The runtime runs only the basic dialog, not lade."),
        ("failed", "The message alone does not fit in the context."),
        ("failed", "The board went away."),
    ]


def test_an_unfinished_turn_is_kept_as_failed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    c = controller(run, Board())
    c.start_turn("hello")
    c.add_chunk("par")
    assert c.end_turn() is None
    assert stored(run, c)["turns"][0]["state"] == "failed" and stored(run, c)["turns"][0]["reply"] == "par"


def test_regenerate_keeps_the_earlier_replies_as_versions(tmp_path: Path) -> None:
    run, board, c = on_a_run(tmp_path)

    async def go() -> Any:
        await ask(c, "hello")
        user = c.regenerate()
        assert user == "hello" and not c.conversation.turns and c.session is None  # the model loads it again
        assert c.record is not None and not c.record.turns
        board.opened[0].conversation.turns.clear()
        first = await ask(c, user)
        again = c.regenerate()
        assert again == "hello"
        return first, await ask(c, again)

    (_, v2), (_, v3) = asyncio.run(go())
    assert [v["reply"] for v in v2] == ["echo: hello"] * 2 and "tokens" in v2[0]["kpi_line"]
    assert len(v3) == 3  # the versions so far, and the new one
    doc = stored(run, c)
    assert (
        len(doc["turns"]) == 1 and doc["turns"][0]["version"] == 2 and len(doc["turns"][0]["versions"]) == 3
    )
    assert len(board.opened) == 3 and all(s.closed for s in board.opened[:2])


def test_regenerate_after_a_message_that_did_not_fit_asks_that_message_again(tmp_path: Path) -> None:
    """The refused message never joined the conversation: Regenerate asks it again (not the message before it),
    keeps the refusal as a version, and the loaded dialog stays (its KV cache does not hold the message)."""
    _run, board, c = on_a_run(tmp_path)

    async def go() -> None:
        await ask(c, "hello")
        board.opened[-1].raises = ValueError("The message alone does not fit in the context.")
        await ask(c, "a very long message")
        assert [t.user for t in c.conversation.turns] == ["hello"]
        assert c.regenerate() == "a very long message"
        assert c.session is not None and not board.opened[-1].closed
        assert [t.user for t in c.conversation.turns] == ["hello"] and c.record is not None
        assert [t.user for t in c.record.turns] == ["hello"]
        board.opened[-1].raises = None
        out, versions = await ask(c, "a very long message")
        assert out.turn is not None and out.turn.reply == "echo: a very long message"
        assert [v["state"] for v in versions] == ["failed", "complete"]
        assert c.regenerate() == "a very long message"  # now the usual case: the last reply is taken back
        assert [t.user for t in c.conversation.turns] == ["hello"]
        await c.wait_closed()

    asyncio.run(go())
    # the first message did not fit (no conversation turn at all): Regenerate asks it again too
    refusing = Board()
    refusing.send_fails = ValueError("The message alone does not fit in the context.")
    c2 = controller(tmp_path / "run2", refusing)

    async def first() -> None:
        assert c2.regenerate() is None  # nothing asked yet: nothing to ask again
        await ask(c2, "too long")
        assert not c2.conversation.turns and c2.regenerate() == "too long"
        await c2.wait_closed()

    asyncio.run(first())


def test_choosing_a_version_continues_from_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    store = ChatStore(run)
    rec = store.new(template="auto", system="")
    rec.turns = [
        ChatTurn(
            user="hi",
            reply="second",
            state="complete",
            versions=[
                {"reply": "first", "kpis": {"gen_tok_s": 1.0}, "state": "complete"},
                {"reply": "second", "kpis": {}, "state": "aborted"},
            ],
            version=1,
        )
    ]
    store.save(rec)
    c = controller(run, Board())
    c.show_record(store.conversations()[0])
    assert c.pick(rec.id) is None  # the open one
    assert not c.choose_version(5)
    assert c.choose_version(0)
    turn = c.conversation.turns[-1]
    assert (turn.reply, turn.kpis, turn.state) == ("first", {"gen_tok_s": 1.0}, "complete")
    kept = stored(run, c)["turns"][0]
    assert kept["version"] == 0 and kept["reply"] == "first"


def test_a_change_of_template_or_system_prompt_counts_only_when_real() -> None:
    c = ChatController()
    c.applied = Chosen("auto", "", None)
    assert c.change_settings(Chosen("auto", "", None), busy=False) == "same"
    assert c.change_settings(Chosen("auto", "Be brief.", None), busy=True) == "busy"
    c.conversation.add("hello")
    assert c.change_settings(Chosen("auto", "Be brief.", None), busy=False) == "ask"
    assert c.applied == ("auto", "", None)  # asking changes nothing yet
    c.new_conversation(Chosen("auto", "Be brief.", None))
    assert c.change_settings(Chosen("plain", "Be brief.", None), busy=False) == "applied"
    assert c.applied.template == "plain"


def test_the_context_is_the_models_and_the_oldest_turns_go_first(tmp_path: Path) -> None:
    from hexstudio.core.runs import Workspace

    m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim")
    c = ChatController()
    c.sync_run(m.run_dir, busy=False)
    c.render_with(Rendering("qa", None, None, "", 64), m, None)
    use = c.context_use(64)
    assert c.conversation.context_length == 512 and use.total == 512 and use.used == 0 and use.free == 448
    for i in range(40):
        t = c.conversation.add(f"question {i} " + "word " * 20)
        t.reply, t.state = "answer " + "word " * 20, "complete"
    use = c.context_use(64)
    assert use.dropped > 0 and use.used <= 512 - 64 and use.kept[-1] is c.conversation.turns[-1]


def test_a_run_that_cannot_keep_the_conversation_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[OSError] = []
    c = ChatController(ChatHooks(save_failed=failed.append))
    (tmp_path / "run").mkdir()
    c.sync_run(tmp_path / "run", busy=False)

    def refuse(*_a: Any) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(ChatStore, "save", refuse)
    monkeypatch.setattr(ChatStore, "save_settings", refuse)
    c.start_turn("hello")
    assert failed and isinstance(failed[0], PermissionError)
    c.save_settings({"max_tokens": 5})  # the settings still apply to this session; nothing is said
    assert len(failed) == 1


def test_a_reopened_chat_sends_only_its_complete_turns_as_history() -> None:
    """A stored conversation whose messages failed (one did not fit, one lost the board) or were stopped comes back
    with every turn shown, but the model reads only the complete ones: as Conversation.prompt_for does for a live
    chat. (Checked because a review suspected the failed turns went back as history with empty replies.)"""
    from hexstudio.core.genie.chat_store import ChatRecord
    from hexstudio.core.services.chat import record_conversation

    rec = ChatRecord(id="c1", template="plain")
    rec.turns = [
        ChatTurn(user="first question", reply="first answer", state="complete"),
        ChatTurn(user="too long " * 3, state="failed", error="does not fit"),
        ChatTurn(user="lost board", reply="half", state="failed", error="connection lost"),
    ]
    conv = record_conversation(rec)
    assert [t.state for t in conv.turns] == ["complete", "failed", "failed"]
    prompt = conv.prompt_for("next question")
    assert "first question" in prompt and "first answer" in prompt and "next question" in prompt
    assert "too long" not in prompt and "lost board" not in prompt and "half" not in prompt


def test_tokens_accepted_per_step_are_estimated_from_when_the_tokens_arrived() -> None:
    """Where Genie writes no profile (a lade reply the helper ended at max_tokens): a step's tokens arrive back to
    back, steps a graph run apart. Checked on real Genie against its own figure in tests/qnn/test_speculative.py;
    here the arithmetic, with the simulator's timings (1.9 s a step, ~1 ms inside one) and a board's (30 ms, 1 ms)."""
    from hexstudio.core.genie.profile import Kpis, accepted_from_token_times

    def times(step: float, inside: float, bursts: list[int]) -> list[float]:
        t, out = 0.0, [0.0]  # the prompt's token
        for k in bursts:
            t += step
            out += [t + i * inside for i in range(k)]
        return out

    assert accepted_from_token_times(times(1.9, 0.001, [1, 2, 1, 3])) == round(7 / 4, 3)
    assert accepted_from_token_times(times(0.03, 0.001, [2, 2, 2, 2, 1])) == round(9 / 5, 3)
    assert accepted_from_token_times(times(0.03, 0.0, [1, 1, 1, 1])) == 1.0  # one token a step: basic's rate
    assert accepted_from_token_times([0.0, 0.5]) is None  # too few to tell
    k = Kpis(
        None, None, None, None, 8, None, None, "device", accepted_per_step=1.75, accepted_source="token times"
    )
    assert k.as_json()["accepted_source"] == "token times"
    from hexstudio.core.services.chat import kpi_line

    assert "1.75 tokens/step accepted (from token times)" in kpi_line(k.as_json())
    assert "accepted_source" not in Kpis(None, None, None, None, 8, None, None, "device").as_json()


def test_the_cli_kpi_line_of_a_reply_genie_wrote_no_profile_for() -> None:
    """`hexstudio chat` on a lade reply the helper ended at max_tokens: the prompt's count is unknown (no Genie
    profile) and says so with a dash, not "None"; the acceptance is the labelled estimate."""
    from hexstudio.cli.chat_cmd import _kpi_line
    from hexstudio.core.genie.profile import Kpis

    k = Kpis(
        None,
        None,
        None,
        2287.0,
        12,
        0.82,
        14600.0,
        "simulated",
        accepted_per_step=1.57,
        accepted_source="token times",
    )
    r = SimpleNamespace(kpis=k, simulated=True, runtime="genie", mode="persistent")
    line = _kpi_line(r)  # type: ignore[arg-type]
    assert "None" not in line and "prompt — tok" in line
    assert "1.57 tokens accepted per step (from token times)" in line and line.startswith("[SIMULATED")


def test_a_dropped_link_or_a_dead_helper_is_a_failed_turn_not_a_traceback(tmp_path: Path) -> None:
    """The SSH link drops (ConnectionLost, an ActionableError but not a BoardError), the helper's pipe breaks
    (OSError), or it stops answering (TimeoutError): each is a failed turn that says what happened, and the dead
    session goes, so the next message loads the model again instead of failing the same way."""
    from hexstudio.core.device.transport import ConnectionLost

    run, board, c = on_a_run(tmp_path)

    async def go() -> None:
        for exc in (
            ConnectionLost("The SSH connection to evk dropped while running genie."),
            BrokenPipeError(32, "Broken pipe"),
            TimeoutError("the helper did not answer"),
        ):
            await ask(c, "warm up")
            board.opened[-1].raises = exc
            out, _ = await ask(c, "and now")
            assert out.turn is None and out.shown.startswith("*(failed: "), out.shown
            assert out.notice is not None and out.notice.failed and out.notice.hint, out.notice
            assert c.session is None
        out, _ = await ask(c, "back again")
        assert out.shown == "echo: back again"
        await c.wait_closed()

    asyncio.run(go())
    errors = [t["error"] for t in stored(run, c)["turns"] if t["state"] == "failed"]
    assert len(errors) == 3 and "dropped" in errors[0] and "Broken pipe" in errors[1], errors


def test_a_failed_reply_is_marked_in_the_live_transcript_as_when_reloaded(tmp_path: Path) -> None:
    """Only a stopped reply got a mark in the live bubble: a failed one looked complete until the conversation was
    opened again ("(failed: …)"), and a failure the runtime gave no reason for got no notice at all."""
    from hexstudio.core.services.chat import shown_reply

    _run, board, c = on_a_run(tmp_path)

    async def go() -> list[Any]:
        await ask(c, "warm up")
        session = board.opened[-1]
        outs = []
        real_send = FakeSession.send
        for error in ("the HTP ran out of memory", None):

            async def failing(
                user: str, *, on_chunk: Any = None, stop: Any = None, e: Any = error
            ) -> TurnResult:
                res = await real_send(session, user, on_chunk=on_chunk, stop=stop)
                res.turn.state = "failed"
                return TurnResult(
                    res.turn, "half a rep", "failed", None, res.chunks, "persistent", True, 1.0, 2.0, e
                )

            session.send = failing  # type: ignore[method-assign]
            outs.append((await ask(c, "and now"))[0])
        return outs

    with_reason, without = asyncio.run(go())
    assert with_reason.shown == "half a rep\n\n*(failed: the HTP ran out of memory)*"
    assert with_reason.notice.failed and "out of memory" in with_reason.notice.text
    assert without.shown == "half a rep\n\n*(failed)*"
    assert without.notice is not None and without.notice.failed and "no reason" in without.notice.text
    assert without.notice.hint and "console" in without.notice.hint
    # the live bubble and the reloaded conversation say the same
    assert c.record is not None
    assert [shown_reply(t) for t in c.record.turns[-2:]] == [with_reason.shown, without.shown]


def test_an_unexpected_fault_is_a_failed_turn_that_says_so_and_the_session_goes(tmp_path: Path) -> None:
    """An exception of no handled type (a fault of HexStudio's own) left a "…" bubble, no message, a turn saved
    as failed with no error, and the broken session kept for the next message."""
    run, board, c = on_a_run(tmp_path)

    async def go() -> Any:
        await ask(c, "warm up")
        board.opened[-1].raises = KeyError("n_past")
        out, _ = await ask(c, "and now")
        assert c.session is None  # the next message loads the model again
        back, _ = await ask(c, "again")
        await c.wait_closed()
        return out, back

    out, back = asyncio.run(go())
    assert out.turn is None and out.shown == "*(failed: KeyError: 'n_past')*"
    assert out.notice is not None and out.notice.failed and "HexStudio failed" in out.notice.text
    assert out.notice.hint and "log" in out.notice.hint
    assert back.shown == "echo: again" and len(board.opened) == 2 and board.opened[0].closed
    assert [(t["state"], t["error"]) for t in stored(run, c)["turns"]][1] == ("failed", "KeyError: 'n_past'")


def test_a_long_chat_is_fitted_with_a_dozen_renders_not_one_per_turn_dropped() -> None:
    """The context meter dropped the oldest turn one at a time and rendered and counted the whole chat again each
    time: a 300-turn chat on a 4,096 context took hundreds of renders on every keystroke of the reply budget and
    every send, on the window's thread. The same turns are kept, found by halving."""
    from hexstudio.core.genie.conversation import Conversation
    from hexstudio.core.services.chat import context_use

    conv = Conversation(template="plain")
    conv.context_length = 4096
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(1)
        return len(text.split())

    conv.count_tokens = count
    for i in range(300):
        t = conv.add(f"question {i} " + "w " * 20)
        t.reply, t.state = "answer " + "w " * 20, "complete"

    def linear(
        budget: int, user: str = ""
    ) -> int:  # what the loop kept: the fewest oldest turns dropped to fit
        history = [t for t in conv.turns if t.state == "complete"]
        k = 0
        while k < len(history) and len(conv._render(history[k:], user).split()) > budget:
            k += 1
        return k

    for reply in (64, 1000, 4000, 4095):
        counted.clear()
        use = context_use(conv, reply)
        assert len(counted) <= 12, len(counted)
        assert use.dropped == linear(max(4096 - reply, 1)), reply
        assert use.used <= max(4096 - reply, 1) or not use.kept
    counted.clear()
    prompt = conv.prompt_for("next")
    assert len(counted) <= 12 and prompt.endswith("next")
    assert conv.dropped_turns == linear(4096 - conv.max_reply_tokens, "next") > 0
