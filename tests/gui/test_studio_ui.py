"""The studio as its users expect it (issue 24), without a full run: the chat transcript's rendering
(Markdown, code blocks with Copy, thinking folded, no raw HTML entities), conversations kept in the run,
spin boxes a passing wheel cannot change, honest stage states, the runs dashboard, Help/About, the theme."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import studio_window


def test_thinking_and_code_are_split_out_of_a_reply() -> None:
    from hexstudio.ui.chat_view import segments, split_thinking

    r = split_thinking("<think>\nLet me see: 2+2.\n</think>\n\nIt is **4**.")
    assert (r.thinking, r.thinking_done, r.answer) == ("Let me see: 2+2.", True, "It is **4**.")
    r = split_thinking("<think>still going")  # streaming: the answer has not started
    assert r.thinking == "still going" and not r.thinking_done and r.answer == ""
    r = split_thinking("the template opened it</think>Answer")  # Qwen3 with enable_thinking
    assert r.thinking == "the template opened it" and r.answer == "Answer"
    assert split_thinking("plain").thinking is None
    parts = segments("Run this:\n```python\nprint('hi')\n```\nthen\n```\nunfinished")
    assert parts == [
        ("text", "Run this:", ""),
        ("code", "print('hi')", "python"),
        ("text", "then", ""),
        ("code", "unfinished", ""),
    ]


def test_message_bubble_renders_markdown_code_and_folded_thinking(qtbot: Any) -> None:
    from PySide6.QtGui import QGuiApplication

    from hexstudio.ui.chat_view import CodeBlock, TranscriptView

    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    view.add("user", "Is it <b>bold</b> &amp; safe?")
    b = view.add("assistant")
    b.set_text(
        "<think>The user asks about HTML.</think>It&#x27;s **fine** &amp; safe:\n```bash\necho 'ok'\n```\n",
        streaming=False,
    )
    shown = b.rendered_text()
    assert (
        "It's fine & safe:" in shown and "&#x27;" not in shown and "&amp;" not in shown and "**" not in shown
    )
    # the user's own text is shown exactly as typed (not read as HTML)
    assert view.bubbles[0].rendered_text() == "Is it <b>bold</b> &amp; safe?"
    assert b.think_button is not None and b.think_label is not None
    assert not b.think_button.isHidden() and b.think_label.isHidden()  # folded
    assert "Thought" in b.think_button.text()
    b.think_button.click()
    assert not b.think_label.isHidden() and "HTML" in b.think_label.text()
    (code,) = b.findChildren(CodeBlock)
    code.copy_button.click()
    assert QGuiApplication.clipboard().text() == "echo 'ok'"
    b.copy_button.click()
    assert QGuiApplication.clipboard().text().startswith("It&#x27;s **fine**")  # the Markdown, no thinking
    assert "copy" in view.plain_text().lower() or "echo 'ok'" in view.plain_text()


def test_conversations_are_kept_in_the_run_and_chats_made_elsewhere_are_listed(tmp_path: Path) -> None:
    from hexstudio.core.genie.chat_store import ChatStore, ChatTurn

    run = tmp_path / "run"
    (run / "artifacts" / "chat").mkdir(parents=True)
    (run / "run.json").write_text(
        json.dumps({"inputs": {"settings": {"benchmark_prompt": "Capital of France?"}}})
    )
    (run / "artifacts" / "chat" / "chat.json").write_text(
        json.dumps(
            {
                "source": "simulated",
                "prompt": "Question: Capital of France? Answer:",
                "reply": " Paris.",
                "state": "complete",
                "kpis": {"gen_tok_s": 40.0, "source": "simulated"},
            }
        )
    )
    (run / "chats").mkdir()
    (run / "chats" / "20250101-000000-1-0001.jsonl").write_text(
        json.dumps({"type": "session", "started": "2025-01-01T00:00:00", "template": "llama3"})
        + "\n"
        + json.dumps(
            {
                "type": "turn",
                "user": "hi",
                "reply": "hello",
                "state": "complete",
                "kpis": {},
                "source": "device",
            }
        )
        + "\n"
    )
    store = ChatStore(run)
    recs = store.conversations()
    origins = sorted(r.origin for r in recs)
    assert origins == ["Run Chat benchmark", "hexstudio chat"]
    bench = next(r for r in recs if r.origin == "Run Chat benchmark")
    assert bench.turns[0].user == "Capital of France?" and bench.turns[0].reply == " Paris."
    # listed again: not imported twice
    assert len(store.conversations()) == 2
    mine = store.new(template="auto")
    mine.turns.append(
        ChatTurn(
            user="A question that is rather long, longer than a title should ever be",
            reply="x",
            state="complete",
        )
    )
    store.save(mine)
    again = ChatStore(run).load(mine.id)
    assert again is not None and again.turns[0].reply == "x" and again.title.endswith("…")
    assert ChatStore(run).conversations()[0].id == mine.id  # the newest first


def test_a_wheel_over_an_unfocused_spin_box_scrolls_the_page_not_the_value(
    qtbot: Any, tmp_path: Path
) -> None:
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    c, w = studio_window(qtbot, tmp_path / "ws")
    c.new_run("builtin:tiny-llama")
    w.resize(1280, 720)
    w.show()
    w.show_stage("quantize")
    spin = w.pages["quantize"]._setting_widgets["calibration_seq_len"]
    before = spin.value()
    events = len(c.manifest.data.get("events", []))

    def wheel(target: Any) -> None:
        pos = QPointF(target.width() / 2, target.height() / 2)
        ev = QWheelEvent(
            pos,
            QPointF(target.mapToGlobal(pos.toPoint())),
            QPoint(0, 0),
            QPoint(0, 120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(target, ev)

    for _ in range(4):
        wheel(spin)
        wheel(spin.lineEdit())
    assert spin.value() == before
    assert not spin.hasFocus()
    assert (
        len(c.manifest.data.get("events", [])) == events
        and c.manifest.settings["calibration_seq_len"] == before
    )
    # with the focus (clicked or tabbed into), the wheel edits it as usual
    w.activateWindow()
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=3000)
    wheel(spin)
    assert spin.value() == before + 1


def test_stage_page_states_are_honest(qtbot: Any, tmp_path: Path) -> None:
    from hexstudio.ui.widgets import STATE_TEXT

    c, w = studio_window(qtbot, tmp_path / "ws")
    m = c.new_run("builtin:tiny-llama")
    assert STATE_TEXT["cancelled"] == "cancelled by you" and "crash or reboot" in STATE_TEXT["interrupted"]
    page = w.pages["quantize"]
    st = m.stage("quantize").data

    def ended(how: dict[str, Any]) -> None:
        """The Quantize stage ended `how` in run.json; the window refreshes as after a stage."""
        st.update(how)
        m.save()
        w.refresh()
        w.update_resume_bar()

    ended(
        {
            "state": "cancelled",
            "attempts": 2,
            "started": "2025-01-01T10:00:00",
            "outcome": {"kind": "cancelled", "message": "The Quantize stage was cancelled."},
        }
    )
    assert (
        "cancelled by you" in page.state_label.text()
        and "Attempt 2 was cancelled by you" in page.outcome_label.text()
    )
    assert not w.resume_bar.isHidden() and "cancelled by you" in w.resume_bar.label.text()
    ended(
        {
            "state": "interrupted",
            "attempts": 3,
            "outcome": {"kind": "interrupted", "message": "The process was gone."},
        }
    )
    assert (
        "crash or reboot" in page.state_label.text()
        and "Attempt 3 was interrupted" in page.outcome_label.text()
    )
    assert "interrupted" in w.resume_bar.label.text() and w.resume_bar.resume_button.isEnabled()
    # while the stage runs again its page says so and greys the previous attempt's results
    c.running_stage = "quantize"
    page.refresh()
    assert "working" in page.state_label.text() and not page.results_box.isEnabled()
    assert (
        "previous attempt" in page.results_box.title() and "Attempt 3 is running" in page.outcome_label.text()
    )
    c.running_stage = None


def test_runs_dashboard_sorts_and_compares(qtbot: Any, tmp_path: Path, compiled_sim_run: Path) -> None:
    from PySide6.QtCore import Qt

    from hexstudio.ui.dialogs.runs import RUN_COLUMNS, RunsDialog
    from tests.support.sim_runs import copy_run

    c, w = studio_window(qtbot, tmp_path / "ws")
    done = copy_run(compiled_sim_run, tmp_path / "ws")
    fresh = c.new_run("builtin:tiny-llama")
    d = RunsDialog(c, w)
    qtbot.addWidget(d)
    headers = [d.table.horizontalHeaderItem(i).text() for i in range(d.table.columnCount())]
    assert headers == list(RUN_COLUMNS)
    rows = {
        d.table.item(r, 0).data(256): [d.table.item(r, col).text() for col in range(len(RUN_COLUMNS))]
        for r in range(d.table.rowCount())
    }
    assert set(rows) == {done.name, fresh.run_id}
    assert rows[done.name][4] == "passed" and rows[done.name][7].endswith(
        "B"
    )  # verdict (status word), peak RSS
    assert rows[fresh.run_id][3] == "0/9 stages passed"
    d.table.sortItems(2, Qt.SortOrder.AscendingOrder)  # by creation time, oldest first
    first = d.table.item(0, 0).data(256)
    d.table.sortItems(2, Qt.SortOrder.DescendingOrder)
    assert d.table.item(0, 0).data(256) != first
    d.table.selectAll()
    assert d.compare_button.isEnabled() and not d.open_button.isEnabled()
    text = d.comparison_html([done.name, done.name])
    assert "<table" in text


def test_title_about_and_theme(qtbot: Any, tmp_path: Path) -> None:
    from PySide6.QtCore import QSettings

    from hexstudio.ui import theme
    from hexstudio.ui.dialogs.about import AboutDialog

    c, w = studio_window(qtbot, tmp_path / "ws")
    assert w.windowTitle() == "HexStudio"
    m = c.new_run("builtin:tiny-llama")
    assert w.windowTitle() == f"{m.run_id} — HexStudio"
    assert QSettings().value("recent/run") == m.run_id  # a new run is the one reopened at launch
    about = AboutDialog(c, w)
    qtbot.addWidget(about)
    text = about.text.text()
    assert "PySide6" in text and "Qt " in text and "gui.md" in text and "log" in text
    # issue 27: the keyring backend in use, said truly: the tests' keyrings.alt plain-text file is no keyring
    # that encrypts, and About says where the file is and how to get one that does
    from hexstudio.core.secrets import backend_info

    path = str(backend_info()["path"])
    assert "PLAIN-TEXT file at" in text and path in text and "keyrings.alt.file.PlaintextKeyring" in text
    assert "not encrypted" in text and "EncryptedKeyring" in text and "Warning" in text
    try:
        w.set_theme("dark")
        assert theme.is_dark() and QSettings().value("ui/theme") == "dark"
        w.set_theme("light")
        assert not theme.is_dark()
    finally:
        w.set_theme("system")


@pytest.mark.parametrize(
    "rows,expected",
    [
        ([[0, 1, 0], [1, 2, 0], [2, 3, 0], [0, 1, 0], [1, 5, 0]], 2),  # the time went back: a new attempt
        ([[0, 1, 0], [0.5, 2, 0], [1, 3, 0], [300, 1, 0], [300.5, 2, 0]], 2),  # a long pause between attempts
        ([[0, 1, 0], [0.5, 2, 0], [1, 3, 0]], 1),
    ],
)
def test_report_memory_chart_shows_one_attempt(rows: list[list[float]], expected: int) -> None:
    from hexstudio.core.reports.render import attempts, plots

    assert len(attempts(rows)) == expected
    svgs = plots(
        {
            "series": {"resources": {"quantize": rows + [[rows[-1][0] + 0.5, 2e9, 0]] * 3}},
            "estimates": {"quantize_peak_rss_bytes": 3 * 1024**3},
        }
    )["resources"]
    assert len(svgs) == 1 and "preflight estimate 3.00 GiB" in svgs[0] and 'fill="currentColor"' in svgs[0]
    if expected > 1:
        assert f"attempt {expected} of {expected}" in svgs[0]


def test_job_dock_estimate_line_says_its_figure(qtbot: Any) -> None:
    """The dock's memory plot labels its dashed line with the stage's own preflight estimate, from the first
    stage on and when the next stage brings another figure (it once read just "estimate", or the previous
    stage's figure); its legend stays clear of the peak label."""
    from hexstudio.ui.plots import ResourcePlot

    plot = ResourcePlot()
    qtbot.addWidget(plot)
    plot.resize(600, 200)
    plot.show()
    gib = 1024**3
    plot.set_estimate(0.58 * gib)
    assert plot.estimate.isVisible() and plot.estimate.label.toPlainText() == "preflight estimate 0.58 GiB"
    assert abs(plot.estimate.value() - 0.58) < 1e-9
    plot.set_estimate(1.25 * gib)
    assert plot.estimate.label.toPlainText() == "preflight estimate 1.25 GiB"
    plot.set_estimate(None)
    assert not plot.estimate.isVisible()
    for i in range(10):
        plot.add(float(i), (0.1 + 0.05 * i) * gib, None)
    plot.redraw()
    assert plot.peak_label.toPlainText() == "peak 0.55 GiB"
    legend = plot.getPlotItem().legend
    assert legend is not None and legend.offset[0] < 0 and legend.offset[1] < 0  # anchored bottom right
