"""Issue 32, Compare as in DL Workbench: a chosen baseline, a real chart (pyqtgraph bars, not an SVG printed as
text), differences marked only beyond the noise (a stated tolerance, or the measured spread), and export to
HTML, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from tests.gui.conftest import keep_screenshot
from tests.support.gate_runs import PASSING, finish_stage


def _runs(ws: Path) -> list[Any]:
    """Three runs of the same model on this machine: B's quantize 4 % slower than A's (noise), its compile twice
    as long (a real difference); C's compile as A's."""
    from hexstudio.core.runs import Workspace

    out = []
    for quantize_s, compile_s in ((100.0, 10.0), (104.0, 20.0), (99.0, 10.2)):
        m = Workspace(ws).create_run("builtin:tiny-llama", "sim", {})
        for name in ("model", "preflight", "quantize", "validate", "compile"):
            finish_stage(
                m,
                name,
                PASSING[name],
                duration_s={"quantize": quantize_s, "compile": compile_s}.get(name, 1.0),
            )
        out.append(m)
    return out


def _reports(runs: list[Any]) -> list[dict[str, Any]]:
    from hexstudio.core.reports.collect import build_report

    return [build_report(m.run_dir) for m in runs]


def _row(c: dict[str, Any], label: str) -> dict[str, Any]:
    return next(r for r in c["rows"] if r["label"] == label)


def test_differences_are_marked_only_beyond_the_noise_against_the_chosen_baseline(tmp_path: Path) -> None:
    from hexstudio.core.reports.compare import HIGHER_IS_BETTER, LOWER_IS_BETTER
    from hexstudio.core.reports.compare import compare_reports as compare_runs
    from hexstudio.core.reports.compare import write_compare as write_comparison
    from hexstudio.core.reports.noise import compare_csv, judge_row

    a, b, c_ = _runs(tmp_path / "ws")
    reps = _reports([a, b, c_])
    c = compare_runs(reps)
    assert c["baseline"] == a.run_id and [r["run_id"] for r in c["runs"]] == [a.run_id, b.run_id, c_.run_id]
    q, comp = _row(c, "Quantize duration"), _row(c, "Compile duration")
    assert q["judgement"] == ["same", "same"]  # 4 %: within the stated ±10 % for timings
    assert q["noise"][0]["how"] == "stated tolerance ±10 %"
    assert comp["judgement"] == ["worse", "same"]  # twice as long: beyond the noise
    # another baseline: B becomes the first column, and A's compile is now the better one
    c2 = compare_runs(reps, baseline=b.run_id)
    assert c2["runs"][0]["run_id"] == b.run_id and _row(c2, "Compile duration")["judgement"] == [
        "better",
        "better",
    ]
    # a tighter stated tolerance marks the 4 % too
    assert _row(compare_runs(reps, timing_tolerance=0.02), "Quantize duration")["judgement"][0] == "worse"
    # a measured spread wider than the tolerance keeps a difference within it "same"
    row: dict[str, Any] = {
        "name": "gen_tok_s",
        "values": [30.0, 27.0],
        "deltas": [-0.1],
        "judgement": [],
        "section": "bench",
    }
    judge_row(row, [1.5, 1.5], (0.05, 0.02), HIGHER_IS_BETTER, LOWER_IS_BETTER)
    assert row["judgement"] == ["same"] and row["noise"][0]["how"].startswith("measured spread")
    judge_row(row, [0.1, 0.1], (0.05, 0.02), HIGHER_IS_BETTER, LOWER_IS_BETTER)
    assert row["judgement"] == ["worse"]
    # exports: CSV (one line a row, the judgement and its noise), JSON, HTML
    lines = list(csv.reader(io.StringIO(compare_csv(c))))
    assert lines[0][3] == f"{a.run_id} (baseline)"
    qline = next(x for x in lines if x[1] == "Quantize duration")
    assert qline[3:6] == ["100.0", "104.0", "99.0"] and "same" in qline and "stated tolerance ±10 %" in qline
    for fmt in ("csv", "json", "html"):
        out = write_comparison(c, fmt, tmp_path / f"cmp.{fmt}")
        assert out.stat().st_size > 200
    assert json.loads((tmp_path / "cmp.json").read_text())["baseline"] == a.run_id
    text = (tmp_path / "cmp.html").read_text()
    assert "Baseline: <code>" in text and "5 %" not in text and "stated tolerance" in text


def test_compare_dialog_chart_baseline_and_export(qtbot: Any, tmp_path: Path) -> None:
    import pyqtgraph as pg

    from hexstudio.ui.compare import CompareDialog

    a, b, c_ = _runs(tmp_path / "ws")
    d = CompareDialog(_reports([a, b, c_]))
    qtbot.addWidget(d)
    d.resize(1100, 720)
    d.show()
    assert d.baseline_combo.count() == 3 and d.c["baseline"] == a.run_id
    d.metric_combo.setCurrentIndex(d.metric_combo.findText("Compile duration (s)"))
    bars = [i for i in d.plot.getPlotItem().items if isinstance(i, pg.BarGraphItem)]
    assert {b.opts["name"] for b in bars} == {"baseline", "worse", "same (within the noise)"}
    assert any(isinstance(i, pg.LinearRegionItem) for i in d.plot.getPlotItem().items)  # the noise band
    assert "<svg" not in d.view.toHtml() and "leg0" not in d.view.toPlainText()  # no SVG printed as text
    assert "stated tolerance" in d.message.text() or "tolerance" in d.message.text()
    qtbot.wait(100)
    keep_screenshot(d, "compare-dialog", tmp_path)
    d.baseline_combo.setCurrentIndex(1)
    assert d.c["baseline"] == b.run_id and d.metric_combo.currentText() == "Compile duration (s)"
    bars = [i for i in d.plot.getPlotItem().items if isinstance(i, pg.BarGraphItem)]
    assert {b.opts["name"] for b in bars} == {"baseline", "better"}
    for fmt in ("html", "csv", "json"):
        assert d.export_buttons[fmt].isEnabled()
        out = d.export(fmt, tmp_path / f"exported.{fmt}")
        assert out.is_file() and fmt.upper() in d.message.text()
