"""The Chat page's Dialog choice (issue 29): only the dialogs the open bundle carries are listed (basic always,
lade / spd where the Compile stage wrote genie_config.<type>.json), a change loads the model again with the
conversation kept, a runtime that cannot run the dialog says so, and a speculative dialog's accepted tokens per
step show in the reply's KPI line."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import keep_screenshot, push_to_board, window_on_run


def _page(qtbot: Any, tmp_path: Path) -> tuple[Any, Any]:
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.pages.chat import ChatPage

    c = RunController(Workspace(tmp_path / "ws"))
    c.new_run("builtin:tiny-llama")
    page = ChatPage(c)
    qtbot.addWidget(page)
    page.refresh()
    return c, page


def _dialogs(page: Any) -> list[str]:
    return [page.dialog_combo.itemData(i) for i in range(page.dialog_combo.count())]


def test_the_dialog_choice_lists_only_the_bundles_dialogs(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.core.genie.chat_store import ChatStore
    from hexstudio.core.services.chat import SessionSetup, reopen_reason
    from hexstudio.ui.pages.chat import ChatPage

    c, page = _page(qtbot, tmp_path)
    # no bundle yet: basic alone, nothing to choose
    assert _dialogs(page) == ["basic"] and not page.dialog_combo.isEnabled() and page.dialog() == "basic"
    bundle = c.manifest.run_dir / "artifacts" / "compile" / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "genie_config.json").write_text("{}")
    (bundle / "genie_config.lade.json").write_text("{}")
    page.refresh()
    assert _dialogs(page) == ["basic", "lade"] and page.dialog_combo.isEnabled()
    assert page.dialog_combo.itemText(1) == "Lookahead (lade)"
    page.dialog_combo.setCurrentIndex(1)
    assert page.dialog() == "lade" and page.session_setup().dialog == "lade"
    assert "next message loads the model" in page.chat_message.text()
    # a session loaded with basic must load again: the reopen policy names the dialog
    why = reopen_reason(SessionSetup(sampler=page.sampler_settings()), page.session_setup())
    assert why is not None and why.startswith("The dialog changed")
    assert reopen_reason(page.session_setup(), page.session_setup()) is None
    # kept in the run: the run opened again shows lade while its bundle has it
    assert ChatStore(c.manifest.run_dir).load_settings()["dialog"] == "lade"
    (bundle / "genie_config.spd.json").write_text("{}")
    again = ChatPage(c)
    qtbot.addWidget(again)
    again.refresh()
    assert _dialogs(again) == ["basic", "lade", "spd"] and again.dialog() == "lade"
    # a bundle without it: basic
    (bundle / "genie_config.lade.json").unlink()
    third = ChatPage(c)
    qtbot.addWidget(third)
    third.refresh()
    assert _dialogs(third) == ["basic", "spd"] and third.dialog() == "basic"


def test_accepted_tokens_per_step_show_in_the_kpi_line(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.core.genie.chat_store import ChatStore, ChatTurn
    from hexstudio.core.services.chat import kpi_line

    kpis = {
        "ttft_ms": 120.0,
        "prompt_tok_s": 150.0,
        "gen_tok_s": 20.0,
        "init_ms": 900.0,
        "generated_tokens": 16,
        "source": "simulated",
    }
    assert "accepted" not in kpi_line(kpis)  # the basic dialog: no such figure
    line = kpi_line({**kpis, "accepted_per_step": 3.6667})
    assert "3.67 tokens/step accepted" in line and line.endswith("[SIMULATED]")
    c, page = _page(qtbot, tmp_path)
    store = ChatStore(c.manifest.run_dir)
    rec = store.new(template="auto", system="")
    rec.turns = [
        ChatTurn(user="hi", reply="hello", state="complete", kpis={**kpis, "accepted_per_step": 3.6667})
    ]
    store.save(rec)
    page.reload_conversations(select_newest=True)
    assert "3.67 tokens/step accepted" in page.kpi_label.text()
    assert "3.67 tokens/step accepted" in page.transcript.bubbles[-1].kpi_label.text()


@pytest.mark.slow
def test_a_dialog_the_runtime_cannot_run_is_told_and_basic_still_chats(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, compiled_sim_run: Path
) -> None:
    c, w = window_on_run(qtbot, tmp_path, compiled_sim_run)
    run = c.manifest.run_dir

    async def scenario() -> None:
        await push_to_board(c, w)
        ch: Any = w.pages["chat"]
        doc = ch.board_doc()
        pushed = Path(str(doc["remote_bundle"]))
        # the bundle on the board carries a lade dialog beside the basic one (as Compile writes it)
        shutil.copy(pushed / "genie_config.json", pushed / "genie_config.lade.json")
        ch.refresh()
        assert "lade" in _dialogs(ch)
        ch.max_tokens.setValue(8)
        basic = await ch.send("What is the capital of France?")
        assert basic is not None and basic.state == "complete", basic
        assert ch.session.dialog == "basic"
        if "lade" in ch.session.runtime.dialogs:
            pytest.skip(f"{ch.session.runtime.title} runs lade: the twin's refusal is not reachable here")
        ch.dialog_combo.setCurrentIndex(ch.dialog_combo.findData("lade"))
        refused = await ch.send("And of Italy?")
        assert refused is None and ch.session is None
        text = ch.chat_message.text()
        assert "runs only the basic dialog, not lade" in text and "What to do" in text, text
        assert "failed:" in ch.transcript.bubbles[-1].text
        assert ch.conversation.turns and ch.conversation.turns[0].reply == basic.reply  # history kept
        ch.dialog_combo.setCurrentIndex(ch.dialog_combo.findData("basic"))
        again = await ch.send("And of Italy?")
        assert again is not None and again.state == "complete" and ch.session.dialog == "basic"
        rec = json.loads((run / "chats" / "conversations" / f"{ch.record.id}.json").read_text())
        assert rec["dialog"] == "basic" and [t["state"] for t in rec["turns"]] == [
            "complete",
            "failed",
            "complete",
        ]
        await ch.close_session()

    gui_loop.run_until_complete(scenario())


def test_another_run_opened_while_a_reply_loads_waits_for_it(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """Run B opened while run A's message waits for its model: the page stays on A until the reply ends (saying
    so), A's turn is kept in A, then the page shows B with the session closed."""
    from hexstudio.core.genie.chat_store import ChatStore
    from tests.core.test_chat_controller import SlowBoard

    c, page = _page(qtbot, tmp_path)
    a = c.manifest.run_dir
    board = SlowBoard()
    page.chat.connect = board.connect
    page.board_doc = lambda: {"board": "sim", "remote_bundle": "/b"}

    async def scenario() -> None:
        reply = asyncio.ensure_future(page.send("hello from A"))
        await board.loading.wait()
        b = c.new_run("builtin:tiny-llama").run_dir
        page.refresh()
        assert "shows it when this reply ends" in page.chat_message.text()
        page.resize(1280, 720)
        keep_screenshot(page, "chat-run-switch-waits", tmp_path)
        assert page.chat.store is not None and page.chat.store.run_dir == a
        board.loaded.set()
        turn = await reply
        assert turn is not None and turn.reply == "echo: hello from A"
        assert page.chat.store.run_dir == b and page.chat.session is None
        assert not page.transcript.bubbles and "reply ends" not in page.chat_message.text()
        (rec,) = [r for r in ChatStore(a).conversations() if r.turns]
        assert [t.user for t in rec.turns] == ["hello from A"] and not [
            r for r in ChatStore(b).conversations() if r.turns
        ]
        await page.chat.wait_closed()

    gui_loop.run_until_complete(scenario())
    assert board.opened[0].closed


def test_regenerate_without_a_board_keeps_the_exchange_and_new_chat_clears_the_plots(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """Regenerate on a run whose bundle is on no board took the last exchange out, then send() refused: the
    turn and its reply were lost, and the next message inherited the old reply as a version. And New chat left
    the earlier conversation's reply rates on the plots (which carry no SIMULATED tag of their own)."""
    from tests.core.test_chat_controller import Board

    _c, page = _page(qtbot, tmp_path)
    board = Board()
    page.chat.connect = board.connect
    page.board_doc = lambda: {"board": "sim", "remote_bundle": "/b"}

    async def scenario() -> None:
        await page.send("first")
        await page.send("second")
        assert page.history_plot.rates and page.rate_plot.xs
        page.board_doc = lambda: None  # the Board stage is being run again
        page.regenerate()
        assert "run the Board stage" in page.chat_message.text()
        assert [t.user for t in page.record.turns] == ["first", "second"] and len(
            page.transcript.bubbles
        ) == 4
        page.new_chat()
        assert page.history_plot.rates == [] and page.rate_plot.xs == []
        await page.chat.wait_closed()

    gui_loop.run_until_complete(scenario())
