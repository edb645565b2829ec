"""Predicted speed in a run's report and in Compare: beside the measured figures, labeled, never mixed (issue 28)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.reports.collect import build_report
from hexstudio.core.reports.compare import compare_reports
from hexstudio.core.reports.predicted import predicted_section, predicted_ttft
from hexstudio.core.reports.render import to_html, validate_report
from hexstudio.core.runs import Workspace
from hexstudio.core.services import ServiceError
from hexstudio.core.services.predict import request_for_run, resolve_target, run_prediction_doc, save_for_run
from hexstudio.shared.predict import LABEL, GraphTiming, combine
from hexstudio.shared.run_settings import DEFAULT_DEVICE
from tests.predict.test_predict import EVK, TINY, timing


def prediction(scale: float = 1.0) -> dict[str, Any]:
    def t(key: str, seq: int, layers: int, us: float, vocab: int = 0) -> GraphTiming:
        return timing(key, seq, layers, us * scale, vocab, context=512)

    timings = {
        "tg1": t("tg1", 1, 1, 300),
        "tg2": t("tg2", 1, 2, 580),
        "lm_tg": t("lm", 1, 1, 40, 2048),
        "pp1": t("pp1", 128, 1, 900),
        "pp2": t("pp2", 128, 2, 1750),
        "lm_pp": t("lmp", 128, 1, 200, 2048),
    }
    return combine("builtin:tiny-llama", TINY, EVK, 512, 128, 2, "2.51.0", timings).to_json()


def test_predicted_ttft_counts_prompt_processor_passes() -> None:
    doc = prediction()
    one = doc["prompt_pass"]["total_ms"]["value"]
    assert predicted_ttft(doc, 29)["value"] == pytest.approx(one)
    assert predicted_ttft(doc, 300)["value"] == pytest.approx(3 * one)


def test_beside_keeps_measured_and_predicted_in_separate_fields() -> None:
    kpis = [
        {"name": "gen_tok_s", "value": 10.03, "source": "device"},
        {"name": "ttft_ms", "value": 183.5, "source": "device"},
        {"name": "prompt_tokens", "value": 29, "source": "device"},
    ]
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
        save_for_run(runs[0].run_dir, {"decode_tok_s": 1})  # not a prediction document
    for i, m in enumerate(runs):
        save_for_run(m.run_dir, prediction(1.0 + i))
    assert run_prediction_doc(runs[0].run_dir) is not None
    req = request_for_run(runs[0].run_dir)
    assert (req.model, req.board, req.context_length) == ("builtin:tiny-llama", "sim", 512)
    assert req.device == DEFAULT_DEVICE  # the device the run compiles for, not a fallback
    other = ws.create_run("builtin:tiny-llama", "sim", {"device": "Snapdragon 8 Elite QRD"})
    req = request_for_run(other.run_dir)
    assert req.device == "Snapdragon 8 Elite QRD"
    assert resolve_target(req.board, req.device).dsp_arch != resolve_target("sim", None).dsp_arch
    reports = [build_report(m.run_dir) for m in runs]
    validate_report(reports[0])
    p = reports[0]["predicted"]
    assert p["label"] == LABEL and p["decode_tok_s"]["value"] > 0
    assert [t["prompt_tokens"] for t in p["ttft_ms"]] == [128, 512]
    assert all(k.get("source") != "predicted" for k in reports[0]["kpis"])  # never among the measured KPIs
    html = to_html(reports[0])
    assert "PREDICTED (HTP simulator), not measured" in html and "predicted (HTP simulator)" in html
    c = compare_reports(reports)
    pred = [r for r in c["rows"] if r["section"] == "predicted"]
    assert pred and all("predicted" in r["label"] for r in pred)
    assert all(r["section"] != "predicted" for r in c["rows"] if r["name"] in ("gen_tok_s", "ttft_ms"))
    dec = next(r for r in pred if r["name"] == "predicted_decode_tok_s")
    assert dec["judgement"] == ["worse"]  # the second run's graphs were simulated twice as slow
    (runs[1].run_dir / "predicted" / "prediction.json").unlink()
    with pytest.raises(Exception, match="nothing in common"):
        compare_reports([build_report(m.run_dir) for m in runs])


def test_a_speculative_dialog_is_costed_at_its_measured_acceptance(tmp_path: Path) -> None:
    """issue 29: predicted tok/s with and without the dialog. lade: a step is one AR-N pass; spd: draft_len draft
    tokens + one AR-N verification; the dialog gains only above step time / token time tokens per step."""
    from hexstudio.core.reports.predicted import speculative_prediction
    from hexstudio.shared.predict import speculative_rate

    doc = prediction()
    token, pp = doc["token"]["total_ms"]["value"], doc["prompt_pass"]["total_ms"]["value"]
    lade = speculative_rate(doc, "lade", 3.0)
    assert lade is not None and lade["label"] == LABEL
    assert lade["tok_s"]["value"] == pytest.approx(3.0 * 1000 / pp, rel=1e-3)
    assert lade["basic_tok_s"]["value"] == pytest.approx(1000 / token, rel=1e-3)
    assert lade["break_even_accepted"] == pytest.approx(pp / token, abs=0.01)
    assert lade["tok_s"]["lower"] <= lade["tok_s"]["value"] <= lade["tok_s"]["upper"]
    small = prediction(0.25)  # a draft simulated at a quarter of the cost
    spd = speculative_rate(doc, "spd", 2.0, draft_len=3, draft=small)
    assert spd is not None and "3 draft tokens" in spd["step"]
    assert spd["step_ms"]["value"] == pytest.approx(3 * small["token"]["total_ms"]["value"] + pp, rel=1e-3)
    # with an AR-4 graph in the bundle (ar_sizes) spd verifies its 4 tokens there: costed between AR-1 and AR-N
    n = int(doc["ar_n"])
    spd4 = speculative_rate(doc, "spd", 2.0, draft_len=3, draft=small, ar_sizes=[4])
    assert spd4 is not None and spd4["step_ar"] == 4 and "AR-4 verification pass" in spd4["step"]
    between = token + (pp - token) * 3 / (n - 1)
    assert spd4["step_ms"]["value"] == pytest.approx(
        3 * small["token"]["total_ms"]["value"] + between, rel=1e-3
    )
    assert spd4["tok_s"]["value"] > spd["tok_s"]["value"]
    assert speculative_rate(doc, "spd", 2.0, draft=small, ar_sizes=[2])["step_ar"] == n  # type: ignore[index]
    assert speculative_rate(doc, "spd", 2.0) is None  # no draft cost: no figure
    assert speculative_rate(doc, "basic", 1.0) is None

    ws = Workspace(tmp_path / "ws")
    target, draft = (ws.create_run(m, "sim", {}) for m in ("builtin:tiny-llama", "builtin:tiny-llama-draft"))
    assert speculative_prediction(target.run_dir, {}, {"dialog": "lade", "accepted_per_step": 2.0}) is None
    save_for_run(target.run_dir, doc)
    assert speculative_prediction(target.run_dir, {}, {"dialog": "basic"}) is None
    got = speculative_prediction(target.run_dir, {}, {"dialog": "lade", "accepted_per_step": 3.0})
    assert got == lade
    bundle = draft.run_dir / "artifacts" / "compile" / "bundle"
    settings = {"spd_draft": str(bundle), "spd_draft_len": 3}
    missing = speculative_prediction(target.run_dir, settings, {"dialog": "spd", "accepted_per_step": 2.0})
    assert missing is not None and "hexstudio predict" in missing["missing"]
    save_for_run(draft.run_dir, small)
    assert (
        speculative_prediction(target.run_dir, settings, {"dialog": "spd", "accepted_per_step": 2.0}) == spd
    )
    # the draft run's context changed after its prediction: its costs are for another graph, not used
    draft.settings["context_length"] = int(small["context_length"]) * 2
    draft.save()
    stale = speculative_prediction(target.run_dir, settings, {"dialog": "spd", "accepted_per_step": 2.0})
    assert stale is not None and "tok_s" not in stale, stale
    assert stale["missing"].startswith("the draft model's run: this prediction was made for other settings")
    assert f"context {small['context_length']} → {int(small['context_length']) * 2}" in stale["missing"]
    draft.settings["context_length"] = int(small["context_length"])
    draft.save()
    # in the report: beside the measured acceptance, labeled predicted
    r = build_report(target.run_dir)
    r["evaluation"] = {
        "source": "simulated",
        "simulated": True,
        "legs": [],
        "leg_titles": {},
        "suites": [],
        "prompt_format": "plain",
        "tool_format": "none",
        "board_session": {"dialog": "lade", "accepted_per_step": 3.0, "accepted_per_step_cases": 4},
    }
    r["predicted"]["speculative"] = got
    validate_report(r)
    html = to_html(r)
    assert "3.00 tokens accepted per step" in html and f"{lade['tok_s']['value']:.2f} tok/s" in html
    assert f"gains only above {lade['break_even_accepted']:.2f} tokens accepted per step" in html


def test_a_prediction_made_before_the_settings_changed_is_out_of_date(tmp_path: Path) -> None:
    """Predict, then change the context length or the device: the saved prediction is for another graph shape or
    Hexagon; the report says so and sets nothing beside the measurements, and Compare leaves it out."""
    ws = Workspace(tmp_path / "ws")
    runs = [ws.create_run("builtin:tiny-llama", "sim", {"context_length": 512}) for _ in range(2)]
    for m in runs:
        save_for_run(m.run_dir, prediction())
    assert build_report(runs[0].run_dir)["predicted"]["stale"] is None
    m = runs[0]
    m.settings["context_length"] = 1024
    m.settings["device"] = "Snapdragon 8 Elite QRD"
    m.save()
    rep = build_report(m.run_dir)
    validate_report(rep)
    stale = rep["predicted"]["stale"]
    assert "context 512 → 1024" in stale and "Snapdragon 8 Elite QRD" in stale and "predict again" in stale
    assert rep["predicted"]["beside"] == []
    assert "Out of date:" in to_html(rep)
    from hexstudio.core.reports.predicted import predicted_rows

    skipped: list[str] = []
    assert predicted_rows([rep, build_report(runs[1].run_dir)], skipped, lambda *a: a) == []
    assert any("made for other settings" in s for s in skipped)


def test_a_run_on_a_device_unknown_offline_gets_a_stand_in_prediction_said_so(tmp_path: Path) -> None:
    """A run whose device is an AI Hub device not in the offline list was predicted for the IQ-9075 with a note
    saying the simulator board "stands for" it, the device the run compiles for, and the prediction was never out
    of date: the report set it beside the measured figures as if for the run's Hexagon."""
    from hexstudio.core.services.predict import plan, request_for_run

    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim", {"context_length": 512})
    m.settings["device"] = "Snapdragon 7 Gen 3 QRD"  # an AI Hub device HexStudio does not know offline
    m.save()
    req = request_for_run(m.run_dir)
    assert req.device is None and req.unknown_device == "Snapdragon 7 Gen 3 QRD"
    target = plan(req).target
    assert target.name == "Dragonwing IQ-9075 EVK"
    assert "'Snapdragon 7 Gen 3 QRD', a device HexStudio does not know offline" in target.note
    assert "in its place" in target.note and "stands for" not in target.note
    save_for_run(m.run_dir, prediction())
    rep = build_report(m.run_dir)
    validate_report(rep)
    stale = rep["predicted"]["stale"]
    assert stale and "does not know offline" in stale and "hexstudio bundle devices" in stale
    assert rep["predicted"]["beside"] == []
