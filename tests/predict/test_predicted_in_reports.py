"""Predicted speed in a run's report and in Compare: beside the measured figures, labeled, never mixed (issue 28)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.core.reports.collect import build_report
from app.core.reports.compare import compare_reports
from app.core.reports.predicted import predicted_section, predicted_ttft
from app.core.reports.render import to_html, validate_report
from app.core.runs import Workspace
from app.core.services import ServiceError
from app.core.services.predict import request_for_run, run_prediction_doc, save_for_run
from tests.predict.test_predict import EVK, TINY
from workers.shared.predict import LABEL, GraphTiming, combine


def prediction(scale: float = 1.0) -> dict[str, Any]:
    def t(key: str, seq: int, layers: int, us: float, vocab: int = 0) -> GraphTiming:
        us *= scale
        return GraphTiming(key=key, seq=seq, context=512, layers=layers, vocab=vocab, sim_us=us,
                           sim_lower_us=us * 0.9, sim_upper_us=us * 1.1)

    timings = {"tg1": t("tg1", 1, 1, 300), "tg2": t("tg2", 1, 2, 580), "lm_tg": t("lm", 1, 1, 40, 2048),
               "pp1": t("pp1", 128, 1, 900), "pp2": t("pp2", 128, 2, 1750), "lm_pp": t("lmp", 128, 1, 200, 2048)}
    return combine("builtin:tiny-llama", TINY, EVK, 512, 128, 2, "2.51.0", timings).to_json()


def test_predicted_ttft_counts_prompt_processor_passes() -> None:
    doc = prediction()
    one = doc["prompt_pass"]["total_ms"]["value"]
    assert predicted_ttft(doc, 29)["value"] == pytest.approx(one)
    assert predicted_ttft(doc, 300)["value"] == pytest.approx(3 * one)


def test_beside_keeps_measured_and_predicted_in_separate_fields() -> None:
    kpis = [{"name": "gen_tok_s", "value": 10.03, "source": "device"},
            {"name": "ttft_ms", "value": 183.5, "source": "device"},
            {"name": "prompt_tokens", "value": 29, "source": "device"}]
    s = predicted_section(prediction(), kpis)
    assert s is not None and s["label"] == LABEL
    gen = next(b for b in s["beside"] if b["name"] == "gen_tok_s")
    assert gen["measured"] == 10.03 and gen["measured_source"] == "device"
    assert gen["predicted"]["value"] != 10.03 and gen["predicted"]["lower"] <= gen["predicted"]["value"]
    ttft = next(b for b in s["beside"] if b["name"] == "ttft_ms")
    assert "29-token" in ttft["label"] and ttft["measured"] == 183.5
    assert predicted_section(None, kpis) is None


def test_a_runs_report_and_compare_show_the_prediction_labeled(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    runs = [ws.create_run("builtin:tiny-llama", "sim", {"context_length": 512}) for _ in range(2)]
    r0 = build_report(runs[0].run_dir)
    assert r0["predicted"] is None
    validate_report(r0)
    with pytest.raises(ServiceError):
        save_for_run(runs[0].run_dir, {"decode_tok_s": 1})   # not a prediction document
    for i, m in enumerate(runs):
        save_for_run(m.run_dir, prediction(1.0 + i))
    assert run_prediction_doc(runs[0].run_dir) is not None
    req = request_for_run(runs[0].run_dir)
    assert (req.model, req.board, req.context_length) == ("builtin:tiny-llama", "sim", 512)
    reports = [build_report(m.run_dir) for m in runs]
    validate_report(reports[0])
    p = reports[0]["predicted"]
    assert p["label"] == LABEL and p["decode_tok_s"]["value"] > 0
    assert [t["prompt_tokens"] for t in p["ttft_ms"]] == [128, 512]
    assert all(k.get("source") != "predicted" for k in reports[0]["kpis"])   # never among the measured KPIs
    html = to_html(reports[0])
    assert "PREDICTED (HTP simulator), not measured" in html and "predicted (HTP simulator)" in html
    c = compare_reports(reports)
    pred = [r for r in c["rows"] if r["section"] == "predicted"]
    assert pred and all("predicted" in r["label"] for r in pred)
    assert all(r["section"] != "predicted" for r in c["rows"] if r["name"] in ("gen_tok_s", "ttft_ms"))
    dec = next(r for r in pred if r["name"] == "predicted_decode_tok_s")
    assert dec["judgement"] == ["worse"]    # the second run's graphs were simulated twice as slow
    (runs[1].run_dir / "predicted" / "prediction.json").unlink()
    with pytest.raises(Exception, match="nothing in common"):
        compare_reports([build_report(m.run_dir) for m in runs])
