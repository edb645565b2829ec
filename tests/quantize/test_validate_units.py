"""Validation one run unit at a time (issue 20): the same metrics as whole-part sessions, and the float
export checked against the checkpoint itself (issue 19 item 3)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _validate(run: Path, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True)
    spec = {
        "schema": 1,
        "stage": "validate",
        "run_dir": str(run),
        "out_dir": str(out),
        "upstream": {
            "model": str(run / "artifacts" / "model"),
            "quantize": str(run / "artifacts" / "quantize"),
        },
        "settings": settings,
    }
    (out.parent / f"{out.name}.spec.json").write_text(json.dumps(spec))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexstudio.workers.validate",
            "--spec",
            str(out.parent / f"{out.name}.spec.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return dict(json.loads((out / "validation.json").read_text()))


def test_unit_major_validation_equals_part_major(validated_run: Path, tmp_path: Path) -> None:
    """The stage's validation (unit-major, the default) and the whole-part sessions give the same metrics
    (to 1e-6: they are rounded to 4-6 digits) and the same greedy continuations; no unit files are left."""
    unit = json.loads((validated_run / "artifacts" / "validate" / "validation.json").read_text())
    part = _validate(validated_run, tmp_path / "part", {"validate_unit": "part"})
    assert unit["memory"]["mode"].startswith("unit-major") and part["memory"]["mode"].startswith("part-major")
    for k, v in part["metrics"].items():
        assert abs(unit["metrics"][k] - v) <= 1e-6, (k, unit["metrics"][k], v)
    assert [g["float"] for g in unit["greedy"]] == [g["float"] for g in part["greedy"]]
    assert [g["quantized"] for g in unit["greedy"]] == [g["quantized"] for g in part["greedy"]]
    assert unit["calibration_graph"] == part["calibration_graph"]
    assert not (validated_run / "artifacts" / "validate" / "units.tmp").exists()


def test_float_export_matches_the_checkpoint_in_the_stage(validated_run: Path) -> None:
    doc = json.loads((validated_run / "artifacts" / "validate" / "validation.json").read_text())
    fe = doc["float_export"]
    assert fe["first_differing_layer"] is None and all(c["ok"] for c in fe["checks"].values())
    assert fe["checks"]["export_top1_agreement"]["value"] == 1.0
    assert fe["checks"]["export_layer_error"]["value"] < 1e-4
    assert [x["layer"] for x in fe["layers"]] == [0, 1, 2, 3]
    assert doc["metrics"]["export_first_differing_layer"] == -1 and doc["verdict"] == "pass"


def test_unit_major_runs_match_deployment_pair_with_lm_head_chunks(
    validated_run: Path, tmp_path: Path
) -> None:
    """Run units with the lm_head cut into column chunks (float and QDQ graphs) give DeploymentPair's logits."""
    import numpy as np

    from hexstudio.workers.arloop import DeploymentPair, UnitSessions, prefill_calls, run_unit_major
    from hexstudio.workers.quant.rununits import split_for_run

    q = json.loads((validated_run / "artifacts" / "quantize" / "quantize.json").read_text())
    qdir = validated_run / "artifacts" / "quantize"
    pe, cl = q["positional_encoding"], q["context_length"]
    for variant, key in (("float", "float_onnx"), ("sim", "sim_onnx")):
        units = {}
        for g in q["graphs"]:
            us = split_for_run(qdir / g[key], tmp_path / variant, g["name"], head_chunk_params=80_000)
            if g["part"] == 2:
                assert sum(1 for u in us if u.columns) >= 3
            units[(g["kind"], g["part"])] = [u.to_json() for u in us]
        sess = UnitSessions(units, q["graphs"], positional_encoding=pe, context_length=cl)
        pair = DeploymentPair.from_graphs(q["graphs"], qdir, positional_encoding=pe, variant=variant)
        ids = list(range(5, 60))
        calls, n_past = prefill_calls(0, ids, 0, q["ar_n"], cl)
        calls += [(0, "token_generator", [7], n_past), (0, "token_generator", [9], n_past + 1)]
        states = {0: sess.cache(q["num_kv_heads"], q["head_dim"])}
        got = run_unit_major(sess, calls, states, cl)
        want = [pair.prefill(ids), pair.step(7), pair.step(9)]
        for a, b in zip(got, want, strict=True):
            assert np.allclose(a, b, atol=1e-4, rtol=0), float(np.max(np.abs(a - b)))
        assert states[0].n_past == pair.n_past == len(ids) + 2
    shutil.rmtree(tmp_path)


def test_the_graphs_validate_does_not_score_are_named_and_the_gate_says_so(tmp_path: Path) -> None:
    """With context_lengths or ar_sizes the bundle holds more graphs than the deployment pair Validate scores; the
    gate said "both deployment graphs pass every threshold" and validation.json did not name the others."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.stages import get_stage
    from hexstudio.workers.validate import unscored_variants
    from tests.support.gate_runs import PASSING, finish_stage

    q = {
        "graphs": [{"name": "ar128_cl4096_1_of_2"}, {"name": "ar1_cl4096_1_of_2"}],
        "variants": [
            {"name": "ar128_cl1024_1_of_2", "seq_len": 128, "context_length": 1024, "variant_of": "x"},
            {"name": "ar1_cl1024_1_of_2", "seq_len": 1, "context_length": 1024, "variant_of": "y"},
            {"name": "ar4_cl4096_1_of_2", "seq_len": 4, "variant_of": "y"},
        ],
    }
    u = unscored_variants(q)
    assert u["graphs"] == ["ar128_cl1024_1_of_2", "ar1_cl1024_1_of_2", "ar4_cl4096_1_of_2"]
    assert u["text"] == (
        "3 more graph(s) of the bundle (context length 1024; AR-4) share these weights and encodings at other "
        "shapes and were not scored"
    )
    assert unscored_variants({"graphs": q["graphs"]}) == {"graphs": [], "text": ""}
    m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {})
    for name in ("model", "preflight", "quantize"):
        finish_stage(m, name, PASSING[name])
    finish_stage(m, "validate", {"verdict": "pass", "variants_not_scored": 3})
    gate = get_stage("validate").gate(m)
    assert gate.passed and "3 more graph(s) of other context lengths or AR sizes" in gate.reason
    assert "were not scored" in gate.reason
