"""The Chat page's sampler settings reach the runner: the per-run genie_config override on the board
(one genie-t2t-run per turn) and the sampler argument of the persistent helper; the simulator samples
with them; Nemotron with reasoning on picks the thinking preset as the CLI does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import push_to_board, window_on_run

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France?"


def test_sampler_presets_and_values(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.pages.chat import ChatPage

    page = ChatPage(RunController(Workspace(tmp_path / "ws")))
    qtbot.addWidget(page)
    assert page.sampler_preset() == "deterministic"
    assert page.sampler_settings() == {"seed": 42, "temp": 0.0, "top-k": 1, "top-p": 1.0}
    assert "simulator board samples" in page.sampler_combo.toolTip()
    # Nemotron with reasoning on samples like `hexstudio chat` does: the thinking preset
    page.template_combo.setCurrentText("nemotron-reasoning-on")
    assert page.sampler_preset() == "thinking"
    assert page.sampler_settings() == {"seed": 42, "temp": 0.6, "top-k": 40, "top-p": 0.95}
    page.template_combo.setCurrentText("llama3")
    assert page.sampler_preset() == "deterministic"
    # editing a value makes it a custom sampler, which a template change leaves alone
    page.topk_spin.setValue(20)
    assert page.sampler_preset() == "custom" and page.sampler_settings() == {
        "seed": 42,
        "temp": 0.0,
        "top-k": 20,
        "top-p": 1.0,
    }
    page.template_combo.setCurrentText("nemotron-reasoning-on")
    assert page.sampler_preset() == "custom" and page.sampler_settings()["top-k"] == 20  # type: ignore[index]
    # the bundle's own sampler: nothing is overridden and the values cannot be edited
    page.sampler_combo.setCurrentIndex(page.sampler_combo.findData("bundle"))
    assert page.sampler_settings() is None and not page.temp_spin.isEnabled()
    page.sampler_combo.setCurrentIndex(page.sampler_combo.findData("thinking"))
    assert page.temp_spin.isEnabled() and page.temp_spin.value() == pytest.approx(0.6)


def test_chosen_sampler_reaches_the_runner(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, compiled_sim_run: Path
) -> None:
    c, w = window_on_run(qtbot, tmp_path, compiled_sim_run)

    async def scenario() -> None:
        await push_to_board(c, w)
        ch: Any = w.pages["chat"]
        ch.refresh()
        doc = ch.board_doc()
        assert doc is not None and doc["simulated"]
        remote = Path(str(doc["remote_bundle"]))
        ch.max_tokens.setValue(16)

        # one genie-t2t-run per turn: the run reads this chat's copy of genie_config.json
        ch.session_mode = "per_turn"
        greedy = await ch.send(QUESTION)
        assert greedy is not None and greedy.state == "complete", greedy
        assert ch.session.mode == "per_turn" and ch.session._config.startswith("genie_config.hexstudio-")
        sampler = json.loads((remote / ch.session._config).read_text())["dialog"]["sampler"]
        assert (sampler["temp"], sampler["top-k"], sampler["top-p"], sampler["seed"]) == (0.0, 1, 1.0, 42)

        # new values: the session loads again with them (the conversation is kept) and the reply changes
        ch.new_chat()
        await ch.chat.wait_closed()
        ch.temp_spin.setValue(1.5)
        ch.topk_spin.setValue(1000)
        ch.seed_spin.setValue(7)
        assert ch.sampler_preset() == "custom"
        hot = await ch.send(QUESTION)
        assert hot is not None and hot.state == "complete", hot
        sampler = json.loads((remote / ch.session._config).read_text())["dialog"]["sampler"]
        assert (sampler["temp"], sampler["top-k"], sampler["top-p"], sampler["seed"]) == (1.5, 1000, 1.0, 7)
        assert hot.reply != greedy.reply, (
            "the simulator sampled at temperature 1.5 yet replied as greedy decoding"
        )
        ch.seed_spin.setValue(8)  # changed mid-conversation: reopened with the new seed, history kept
        again = await ch.send("And of Italy?")
        assert again is not None and len(ch.conversation.turns) == 2
        assert json.loads((remote / ch.session._config).read_text())["dialog"]["sampler"]["seed"] == 8
        assert ch.session.sampler_values["seed"] == 8 and QUESTION in ch.conversation.as_markdown()

        # the model kept loaded: the helper starts with the sampler on its command line
        ch.new_chat()
        await ch.chat.wait_closed()
        ch.session_mode = "auto"
        ch.sampler_combo.setCurrentIndex(ch.sampler_combo.findData("thinking"))
        turn = await ch.send(QUESTION)
        assert turn is not None and ch.session.mode == "persistent", ch.session.fallback_reason
        argv, _env = ch.session.helper_argv()
        i = argv.index("--sampler")
        assert json.loads(argv[i + 1]) == {"seed": 42, "temp": 0.6, "top-k": 40, "top-p": 0.95}
        await ch.close_session()

    gui_loop.run_until_complete(scenario())
