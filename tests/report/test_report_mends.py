"""Report faults a review found: a damaged prediction or stage document failed the whole report, a PDF without
Pango said "crashed", a schema mismatch left no report at all, and Compare wrote 10800 s as 1.08e+04."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hexstudio.core.reports.collect import build_report
from hexstudio.core.reports.compare import _fmt
from hexstudio.core.reports.predicted import PREDICTION_FILE
from hexstudio.core.reports.render import ReportError, to_pdf
from tests.support.gate_runs import gate_failed_run


def test_a_damaged_prediction_or_stage_document_leaves_its_part_out(tmp_path: Path) -> None:
    m = gate_failed_run(tmp_path / "ws", "evaluate")
    pred = m.run_dir / PREDICTION_FILE
    pred.parent.mkdir(parents=True, exist_ok=True)
    pred.write_text(json.dumps({"predicted": True, "ar_n": 128, "ttft_ms": {}}))  # no decode_tok_s, no passes
    (m.run_dir / "artifacts" / "model" / "model.json").write_text("null")
    chat = m.run_dir / "artifacts" / "chat" / "chat.json"
    chat.parent.mkdir(parents=True, exist_ok=True)
    chat.write_text("[1, 2]")
    rep = build_report(m.run_dir)  # was KeyError / AttributeError out of build_report
    assert rep["predicted"] is None and rep["chat"] is None


def test_pdf_without_pango_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WeasyPrint installed without libpango raises OSError on import, not ImportError: it went out as a crash."""
    fake = tmp_path / "site" / "weasyprint"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError(\"cannot load library 'libpango-1.0-0'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "weasyprint", raising=False)
    with pytest.raises(ReportError) as err:
        to_pdf("<html></html>")
    assert "libpango" in err.value.message and err.value.hint and "libpango-1.0-0" in err.value.hint


def test_compare_writes_large_figures_in_full() -> None:
    assert _fmt(10800.0, "s") == "10,800.00" and _fmt(31090.0, "ms") == "31,090.00"
    assert _fmt(0.012345, "") == "0.01235" and _fmt(12.3456, "tok/s") == "12.35"


def test_a_report_that_misses_its_schema_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hint said "export --format html meanwhile", but every format was validated first: no report at all."""
    from hexstudio.cli.main import main
    from hexstudio.core.reports import render

    def mismatch(_r: object) -> None:
        raise ReportError("The report does not match its schema at kpis: bad", "This is a HexStudio bug ...")

    monkeypatch.setattr(render, "validate_report", mismatch)
    m = gate_failed_run(tmp_path / "ws", "evaluate")
    out = tmp_path / "r.html"
    rc = main(
        ["report", m.run_id, "--workspace", str(tmp_path / "ws"), "--format", "html", "--out", str(out)]
    )
    assert rc == 0 and out.is_file() and "<html" in out.read_text()
    assert "warning: The report does not match its schema" in capsys.readouterr().err
