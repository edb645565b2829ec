"""The whole studio flow, driven through the window on the built-in model and the simulator board:
model → preflight → quantize → validate → compile → board → a chat reply streams in → report exported.

Screenshots of every page are taken on the way (set HEXSTUDIO_SCREENSHOTS=DIR to keep them)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import studio_window, wait_until

pytestmark = pytest.mark.slow


async def _shot(widget: Any, name: str, tmp: Path, show: Any = None) -> Path:
    """Grab the window; with `show`, the job dock is hidden and the page scrolled so that widget is in view. The
    layouts settle by awaiting (never processEvents() inside the running task: see test_screenshots._keep)."""
    from PySide6.QtWidgets import QScrollArea

    out = tmp / "screens"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.png"
    # let the layouts settle (a reply just finished re-lays its bubble), as a person sees it
    for _ in range(3):
        await asyncio.sleep(0.05)
    if show is not None:
        widget.dock.hide()
        await asyncio.sleep(0.1)
        page = widget.stack.currentWidget()
        page.findChild(QScrollArea).ensureWidgetVisible(show, 0, 0)
        await asyncio.sleep(0.05)
    assert widget.grab().save(str(path)), f"could not save {path}"
    if show is not None:
        widget.dock.show()
    keep = os.environ.get("HEXSTUDIO_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(keep) / path.name)
    return path


def assert_in_view(win: Any, *widgets: Any) -> None:
    """Each widget is shown whole inside the window (not scrolled away, not cut off by its parents)."""
    from PySide6.QtCore import QPoint, QRect

    frame = QRect(QPoint(0, 0), win.size())
    for wd in widgets:
        assert wd.isVisible(), f"{wd.objectName()} is hidden"
        region = wd.visibleRegion().boundingRect()
        assert region.size() == wd.size(), f"{wd.objectName()} is cut off: {region} of {wd.size()}"
        top_left = wd.mapTo(win, QPoint(0, 0))
        assert frame.contains(QRect(top_left, wd.size())), f"{wd.objectName()} lies outside the window"


@pytest.mark.slow(
    reason="the one test that drives every stage through the window as a user does (quantize, validate, compile, "
    "board, chat, evaluate, report); each stage's own cost is measured and tested elsewhere"
)
def test_whole_flow_through_the_window(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    c, w = studio_window(qtbot, tmp_path / "ws", (1280, 900))
    w.show()
    seen: dict[str, list[str]] = {"states": [], "progress": []}
    c.stageState.connect(lambda s, st: seen["states"].append(f"{s}:{st}"))
    c.stageEvent.connect(lambda s, ev: seen["progress"].append(s) if ev.get("type") == "progress" else None)

    async def run_page(name: str, timeout: float = 300) -> None:
        w.show_stage(name)
        page = w.pages[name]
        assert page.run_button.isEnabled(), f"{name}: Run is disabled"
        page.run_button.click()
        assert c.busy
        await wait_until(lambda: not c.busy, timeout, f"the {name} stage")
        assert c.last_result is not None and c.last_result.ok, (c.last_result.message, c.last_result.hint)
        assert c.state(name) == "done"
        assert "✓ passed" in page.state_label.text()  # the one status model: a passed gate, not "done"

    async def scenario() -> None:
        mp = w.pages["model"]
        info = await mp.inspect()
        assert info is not None and info["supported"] and info["num_layers"] == 4
        assert mp.inspect_table.rowCount() >= 6
        await _shot(w, "01-model-inspect", tmp_path)
        mp.calib_spin.setValue(4)
        mp.new_run_button.click()
        assert c.manifest is not None and c.manifest.settings["calibration_samples"] == 4
        assert "builtin:tiny-llama" in w.run_label.text()
        # the user keeps one evaluation suite (the greedy-parity gate) on the Evaluate page: the default suites'
        # whole Evaluate stage is tested by tests/e2e/test_default_flow.py, and took 89 of this test's 170 s
        from PySide6.QtCore import Qt

        ep = w.pages["evaluate"]
        w.show_stage("evaluate")
        for i in range(ep.suite_list.count()):
            item = ep.suite_list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) != "greedy_parity":
                item.setCheckState(Qt.CheckState.Unchecked)
        assert c.manifest.settings["eval_suites"] == ["greedy_parity"]

        await run_page("preflight", 120)
        pf = w.pages["preflight"]
        assert pf.checks.rowCount() >= 5
        titles = [pf.checks.item(r, 0).text() for r in range(pf.checks.rowCount())]
        assert "Memory (RAM + swap)" in titles and "GPU" in titles  # titles, never snake_case ids
        await _shot(w, "02-preflight", tmp_path)

        await run_page("quantize", 300)
        # the job dock followed the worker: progress, log lines and RSS samples
        assert "quantize" in seen["progress"] and w.dock.plot.t and w.dock.plot.peak_rss > 0
        assert w.dock.progress.value() == 1000 and w.pages["quantize"].graphs.rowCount() == 4
        await _shot(w, "03-quantize", tmp_path)

        await run_page("validate", 300)
        said = w.pages["validate"].verdict.text()
        # the quantized side is a simulation on this CPU, and whether Qualcomm's HTP check ran is said
        assert "pass" in said and "Quantized: SIMULATED" in said and "HTP simulator check: " in said, said
        await _shot(w, "04-validate", tmp_path)

        await run_page("compile", 120)
        cp = w.pages["compile"]
        text = cp.bundle_label.text()
        assert cp.files.rowCount() >= 5 and ("SIMULATION" in text or "real QNN context binaries" in text)
        assert len(cp.files.item(0, 2).toolTip()) == 64  # the whole sha256 (the cell shows 16 characters)
        await _shot(w, "05-compile", tmp_path, show=cp.files)

        await run_page("board", 120)
        bp = w.pages["board"]
        assert bp.doctor.topLevelItemCount() >= 1 and "sent" in bp.push_label.text()
        items = await bp.probe()
        assert (
            items
            and items[0]["status"] == "ok"
            and "local simulator" in bp.console.toPlainText() + bp.conn_label.text()
        )
        await _shot(w, "06-board", tmp_path, show=bp.push_label)

        await run_page("chat", 120)
        ch = w.pages["chat"]
        w.show_stage("chat")
        assert "SIMULATED" in ch.board_label.text()
        # the Run Chat benchmark reply is a conversation of the run, shown in the transcript
        assert ch.record is not None and ch.record.origin == "Run Chat benchmark"
        assert len(ch.transcript.bubbles) == 2 and ch.transcript.bubbles[1].text.strip()
        w.resize(1280, 720)  # a laptop screen: the message box, Send and Stop stay in view
        ch.new_chat()
        ch.max_tokens.setValue(24)
        ch.input.setPlainText("What is the capital of France?")
        ch.send_button.click()
        # the reply streams in: text shows up while the reply is still being generated
        await wait_until(lambda: bool(ch.streamed), 120, "the first streamed chunk")
        assert ch.busy_chat and ch.stop_button.isEnabled()
        assert_in_view(w, ch.input, ch.send_button, ch.stop_button)
        await wait_until(lambda: not ch.busy_chat, 120, "the reply")
        assert_in_view(w, ch.input, ch.send_button, ch.stop_button)
        turn = ch.conversation.turns[-1]
        assert turn.state == "complete", turn
        assert "Paris" in turn.reply and "Paris" in ch.transcript.plain_text()
        assert turn.kpis["source"] == "simulated" and turn.kpis["gen_tok_s"] > 0
        assert ch.session is not None and ch.session.mode == "persistent", ch.session.fallback_reason
        assert "stays loaded" in ch.mode_label.text()
        assert (
            "SIMULATED" in ch.kpi_label.text() and "SIMULATED" in ch.transcript.bubbles[-1].kpi_label.text()
        )
        assert ch.rate_plot.xs and ch.history_plot.rates[-1] == pytest.approx(turn.kpis["gen_tok_s"])
        assert "tokens" in ch.context_meter.format() and ch.context_meter.value() > 0
        # real Genie: its own log lines reach the device console
        if ch.session.runtime.key == "genie-htp-sim":
            assert "[Genie " in w.pages["board"].console.toPlainText()
            assert "HTP simulator" in ch.board_label.text()
        await _shot(w, "07-chat", tmp_path)
        # a second turn keeps the conversation (multi-turn prompt) and can be stopped mid-reply
        ch.max_tokens.setValue(200)
        task = asyncio.ensure_future(ch.send("Tell me about the harbour."))
        await wait_until(
            lambda: len(ch.conversation.turns) == 2 and len(ch.streamed) > 3, 60, "the second reply to start"
        )
        ch.stop_button.click()
        turn2 = await task
        assert turn2 is not None and turn2.state == "aborted"
        assert not ch.busy_chat and ch.send_button.isEnabled()
        chat_id = ch.record.id
        assert [t.state for t in ch.record.turns] == ["complete", "aborted"]
        w.resize(1280, 900)

        # the report runs Evaluate first (float, sim and HTP legs): minutes when the suite runs beside it
        await run_page("report")
        rp = w.pages["report"]
        assert "tiny-llama" in rp.preview.toPlainText()
        out = tmp_path / "exported.html"
        assert await rp.export("html", out), rp.export_message.text()
        assert out.stat().st_size > 1000
        jout = tmp_path / "exported.json"
        assert await rp.export("json", jout), rp.export_message.text()
        exported = json.loads(jout.read_text())
        # the page's chat turns went into the run's chat journal, and from there into the report
        (sess,) = exported["chat_sessions"]
        assert [t["state"] for t in sess["turns"]] == ["complete", "aborted"]
        assert sess["source"] == "simulated" and sess["mode"] == "persistent"
        await _shot(w, "08-report", tmp_path)

        # every stage shows done in the stage list (a stage another page adds may not have run)
        assert all(
            c.state(s) == "done"
            for s in ("model", "preflight", "quantize", "validate", "compile", "board", "chat", "report")
        )
        await ch.close_session()

        # the studio opened again: the last run comes back with its conversations
        _c2, w2 = studio_window(qtbot, tmp_path / "ws")
        assert w2.restore_last_run() == c.manifest.run_id
        assert c.manifest.run_id in w2.windowTitle()
        ch2 = w2.pages["chat"]
        assert ch2.record is not None and ch2.record.id == chat_id
        assert "Paris" in ch2.transcript.plain_text() and len(ch2.transcript.bubbles) == 4
        assert ch2.conv_list.count() == 2  # this chat and the Run Chat benchmark

    gui_loop.run_until_complete(scenario())
    for state in ("quantize:running", "quantize:done", "chat:done", "report:done"):
        assert state in seen["states"]


def test_cancel_a_running_stage_from_the_dock(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    c, w = studio_window(qtbot, tmp_path / "ws")
    w.show()

    async def scenario() -> None:
        w.pages["model"].new_run_button.click()
        assert c.manifest is not None
        w.show_stage("quantize")
        w.pages["quantize"].run_button.click()
        await wait_until(
            lambda: c.running_stage == "quantize" and w.dock.fraction > 0, 120, "quantize to report progress"
        )
        assert w.dock.cancel_button.isEnabled()
        w.dock.cancel_button.click()
        await wait_until(lambda: not c.busy, 60, "the cancel")
        assert c.last_result is not None and not c.last_result.ok
        assert c.state("quantize") == "cancelled"
        assert c.state("model") == "done"
        # nothing half-written is left behind
        assert c.manifest is not None
        assert not (c.manifest.run_dir / "artifacts" / "quantize").exists()
        assert not (c.manifest.run_dir / "artifacts" / "quantize.partial").exists()

    gui_loop.run_until_complete(scenario())


def test_runs_dialog_opens_and_deletes(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    from hexstudio.ui.dialogs.history import HistoryDialog
    from hexstudio.ui.dialogs.runs import RunsDialog

    c, w = studio_window(qtbot, tmp_path / "ws")
    a = c.new_run("builtin:tiny-llama")
    b = c.new_run("builtin:tiny-llama")
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    assert d.table.rowCount() == 2
    w.open_run(a.run_id)
    assert c.manifest is not None and c.manifest.run_id == a.run_id and a.run_id in w.run_label.text()
    c.set_setting("calibration_samples", 5)
    h = HistoryDialog(c, w)
    qtbot.addWidget(h)
    texts = [h.table.item(r, 2).text() for r in range(h.table.rowCount())]
    assert any("calibration_samples:" in t and "→ 5" in t for t in texts)  # the old value too
    c.delete_run(b.run_id)
    d.reload()
    assert d.table.rowCount() == 1 and not b.run_dir.exists()


def test_compare_and_delete_leave_the_window_free(
    qtbot: Any, gui_loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compare built each run's report (its logs read whole: megabytes after a long quantize) and Delete removed
    tens of GB, both on the window's thread. The reports are built in a thread now, the button saying so, and the
    files are removed in a thread once the run is renamed away (a delete a crash cut short is finished too)."""
    from hexstudio.core.reports import collect
    from hexstudio.ui.dialogs.runs import RunsDialog
    from tests.gui.test_compare import _runs
    from tests.support.threads import record_threads

    a, b, _c = _runs(tmp_path / "ws")  # runs with stages to set side by side
    c, w = studio_window(qtbot, tmp_path / "ws")
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    built_on = record_threads(monkeypatch, collect, "build_report")
    d.table.selectAll()
    fut = d.compare_selected()
    assert fut is not None and d.compare_button.text() == "Comparing…" and not d.compare_button.isEnabled()
    gui_loop.run_until_complete(fut)
    from PySide6.QtWidgets import QMessageBox

    box = d.findChild(QMessageBox, "error_box")
    assert box is None or not box.isVisible(), box.text() + box.detailedText()
    assert len(built_on) == 3 and "MainThread" not in built_on
    assert (
        d.compare_dialog is not None
        and d.compare_button.text() == "Compare…"
        and d.compare_button.isEnabled()
    )
    d.compare_dialog.close()
    left = c.workspace.runs_dir / ".deleting-crashed-0000"  # an earlier delete the studio's crash cut short
    (left / "artifacts").mkdir(parents=True)
    c.delete_run(b.run_id)
    assert not b.run_dir.exists()  # gone from the list at once
    qtbot.waitUntil(lambda: not list(c.workspace.runs_dir.glob(".deleting-*")), timeout=10000)
    assert b.run_id not in [r.run_id for r in c.list_runs()] and a.run_id in [r.run_id for r in c.list_runs()]
