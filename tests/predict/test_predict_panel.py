"""The Preflight page's speed panel: shows the run's prediction, every figure labeled predicted (issue 28)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.services.predict import save_for_run
from tests.predict.test_predicted_in_reports import prediction

pytest.importorskip("PySide6", reason="the GUI needs PySide6")


def _window(tmp_path: Path, qtbot: Any) -> Any:
    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow

    c = RunController(Workspace(tmp_path / "ws"))
    w = MainWindow(c)
    qtbot.addWidget(w)
    return c, w


def test_the_preflight_page_shows_a_kept_prediction_labeled(qtbot: Any, tmp_path: Path) -> None:
    c, w = _window(tmp_path, qtbot)
    panel = w.pages["preflight"].predict_panel
    assert not panel.button.isEnabled()  # no run yet
    m = c.new_run("builtin:tiny-llama", "sim", {"context_length": 512})
    w.pages["preflight"].refresh_results()
    assert panel.button.isEnabled() and panel.table.rowCount() == 0
    save_for_run(m.run_dir, prediction())
    w.pages["preflight"].refresh_results()
    labels = [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())]
    assert labels == [
        "predicted TTFT, 128-token prompt",
        "predicted TTFT, 512-token prompt",
        "predicted decode, short context",
        "predicted decode, full context",
    ]
    assert (
        "predicted (HTP simulator)" in panel.title() and "predicted (HTP simulator)" in panel.message.text()
    )
    assert "Out of date" not in panel.message.text()
    # the context changed since: the report marked it out of date, the panel showed it as current
    m.settings["context_length"] = 1024
    m.save()
    w.pages["preflight"].refresh_results()
    assert "Out of date" in panel.message.text() and "context 512 → 1024" in panel.message.text()


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime_qnn") is None, reason="onnxruntime-qnn is not installed"
)
def test_predict_button_runs_the_real_predictor_for_the_run(qtbot: Any, tmp_path: Path) -> None:
    c, w = _window(tmp_path, qtbot)
    m = c.new_run("builtin:tiny-llama", "sim", {"context_length": 512})
    panel = w.pages["preflight"].predict_panel
    panel.refresh()
    doc = asyncio.run(panel.predict())
    assert doc is not None and doc["label"] == "predicted (HTP simulator)"
    assert (m.run_dir / "predicted" / "prediction.json").is_file()
    assert panel.table.rowCount() == 4 and panel.button.isEnabled()


@pytest.mark.parametrize("fault", ["service", "unexpected"])
def test_a_failed_prediction_says_why_and_what_to_do(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A refusal says why and what to do; a fault of no handled type (which left the button off, the progress
    line on screen) is said too. Either way the panel is usable again."""
    from hexstudio.core.services import ServiceError
    from hexstudio.ui import predict_panel

    async def fails(*_a: Any, **_k: Any) -> dict[str, Any]:
        if fault == "unexpected":
            raise KeyError("ttft_ms")
        raise ServiceError("onnxruntime-qnn is not installed.", "Install it with ./dev install-qnn.")

    monkeypatch.setattr(predict_panel, "predict_for_run", fails)
    c, w = _window(tmp_path, qtbot)
    c.new_run("builtin:tiny-llama", "sim", {"context_length": 512})
    panel = w.pages["preflight"].predict_panel
    panel.refresh()
    assert asyncio.run(panel.predict()) is None
    text = panel.message.text()
    assert panel.button.isEnabled()
    if fault == "unexpected":
        assert "failed unexpectedly: KeyError" in text and "log" in text
    else:
        assert "The prediction failed: onnxruntime-qnn is not installed." in text
        assert "What to do:</b> Install it with ./dev install-qnn." in text


def test_a_prediction_under_way_keeps_the_panel_and_lands_on_its_own_run(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any refresh (another run opened, a setting changed, a stage ended) turned the button back on mid-prediction,
    so a second predictor could start beside the first; and the first's figures were then shown under whichever
    run was open, though the panel names neither run nor model."""
    from hexstudio.core.services.predict import run_prediction_doc
    from hexstudio.ui import predict_panel

    release = asyncio.Event()

    async def slow(run_dir: Path, *_a: Any, **_k: Any) -> dict[str, Any]:
        await release.wait()
        doc = prediction()
        save_for_run(run_dir, doc)
        return doc

    monkeypatch.setattr(predict_panel, "predict_for_run", slow)
    c, w = _window(tmp_path, qtbot)
    a = c.new_run("builtin:tiny-llama", "sim", {"context_length": 512})
    panel = w.pages["preflight"].predict_panel
    panel.refresh()

    async def scenario() -> dict[str, Any] | None:
        task = asyncio.ensure_future(panel.predict())
        await asyncio.sleep(0)
        assert not panel.button.isEnabled()
        b = c.new_run("builtin:tiny-llama", "sim", {"context_length": 512})
        w.refresh()  # as the window does when a run opens
        panel.refresh()
        assert not panel.button.isEnabled() and "simulating" in panel.message.text()
        release.set()
        doc = await task
        assert run_prediction_doc(b.run_dir) is None
        return doc

    assert asyncio.run(scenario()) is not None
    assert run_prediction_doc(a.run_dir) is not None  # kept with the run it was made for
    assert panel.table.rowCount() == 0 and panel.button.isEnabled()  # run B has none
    assert f"The prediction for run {a.run_dir.name} is done and kept with that run." in panel.message.text()
    assert "No prediction for this run yet." in panel.message.text()
