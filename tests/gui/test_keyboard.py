"""Keyboard use: Tab walks the Chat and Model pages as they read — inputs, then actions, then results —
and never stops on a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.gui.conftest import studio_window


def _window(tmp_path: Path, qtbot: Any) -> Any:
    c, w = studio_window(qtbot, tmp_path / "ws")
    c.new_run("builtin:tiny-llama")
    w.resize(1280, 900)
    w.show()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow, timeout=5000)
    return w


def _walk(qtbot: Any, start: Any, names: dict[Any, str], steps: int) -> list[str]:
    """Press Tab `steps` times from `start`; the named widgets that got the focus, in order."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from hexstudio.ui.plots import StyledPlot

    start.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None, timeout=5000)
    seen: list[str] = []
    for _ in range(steps):
        fw = QApplication.focusWidget()
        assert fw is not None
        w: Any = fw
        while w is not None and w not in names:  # a spin box's editor belongs to its spin box
            assert not isinstance(w, StyledPlot), "a plot took the keyboard focus"
            w = w.parentWidget()
        name = names.get(w, f"other:{type(fw).__name__}") if w is not None else f"other:{type(fw).__name__}"
        if not seen or seen[-1] != name:
            seen.append(name)
        qtbot.keyClick(fw, Qt.Key.Key_Tab)
    return seen


def _assert_before(seen: list[str], *names: str) -> None:
    pos = [seen.index(n) for n in names]
    assert pos == sorted(pos), f"Tab order {seen} does not visit {names} in that order"


def test_tab_walks_the_chat_page_message_send_stop_then_settings_then_the_rest(
    qtbot: Any, tmp_path: Path
) -> None:
    from hexstudio.ui.plots import StyledPlot

    w = _window(tmp_path, qtbot)
    w.show_stage("chat")
    ch: Any = w.pages["chat"]
    ch.send_button.setEnabled(True)  # as it is once the Board stage has pushed the bundle
    ch.stop_button.setEnabled(True)  # as it is while a reply streams
    ch.thinking_box.setEnabled(True)  # as it is where the model's chat template has a thinking switch
    names = {
        ch.input: "message",
        ch.send_button: "send",
        ch.stop_button: "stop",
        ch.runtime_combo: "runtime",
        ch.template_combo: "template",
        ch.thinking_box: "thinking",
        ch.system_edit: "system",
        ch.max_tokens: "max_tokens",
        ch.enter_sends_box: "enter_sends",
        ch.sampler_combo: "sampler",
        ch.temp_spin: "temp",
        ch.topk_spin: "top_k",
        ch.topp_spin: "top_p",
        ch.seed_spin: "seed",
        ch.new_button: "new",
        ch.conv_list: "conversations",
        ch.copy_button: "copy",
        ch.export_button: "export",
        ch.run_button: "run",
        ch.transcript: "transcript",
        ch.metrics: "metrics",
    }
    seen = _walk(qtbot, ch.input, names, 24)
    first = [
        "message",
        "send",
        "stop",
        "runtime",
        "template",
        "thinking",
        "system",
        "max_tokens",
        "enter_sends",
        "sampler",
        "temp",
        "top_k",
        "top_p",
        "seed",
    ]
    assert seen[: len(first)] == first, seen
    _assert_before(seen, "seed", "new", "conversations", "copy", "export", "run", "transcript", "metrics")
    assert not any(p.focusPolicy() & 0x1 for p in ch.findChildren(StyledPlot))  # plots take no Tab focus


def test_tab_walks_the_model_page_inputs_then_actions_then_results(qtbot: Any, tmp_path: Path) -> None:
    w = _window(tmp_path, qtbot)
    w.show_stage("model")
    mp: Any = w.pages["model"]
    names = {
        mp.builtin_radio: "source",
        mp.hf_radio: "source",
        mp.folder_radio: "source",
        mp.hf_edit: "hf_id",
        mp.folder_edit: "folder",
        mp.browse_button: "browse",
        mp.board_combo: "board",
        mp.context_spin: "context",
        mp.calib_spin: "calibration",
        mp.inspect_button: "inspect",
        mp.new_run_button: "new_run",
        mp.run_button: "run",
        mp.inspect_table: "inspect_table",
        mp.metrics: "metrics",
    }
    seen = _walk(qtbot, mp.builtin_radio, names, 16)
    _assert_before(
        seen,
        "source",
        "hf_id",
        "folder",
        "browse",
        "board",
        "context",
        "calibration",
        "inspect",
        "new_run",
        "run",
        "inspect_table",
        "metrics",
    )
    assert seen.index("metrics") == seen.index("inspect_table") + 1, seen
