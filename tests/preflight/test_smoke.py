"""Preflight's AIMET smoke test makes the calls quantization makes: it passes on this stack, and a stack
without the APIs quantization needs fails it with the step, the error and the fix (a real aimet-onnx
with those APIs taken away in the child process: fault injection, not a mock of the smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.shared import preflight_checks

pytest.importorskip("aimet_onnx")
REPO = Path(__file__).resolve().parents[2]


def _smoke(pre: str = "") -> dict:
    code = pre + "\nfrom hexstudio.workers.quant.smoke import run\nimport json\nprint(json.dumps(run()))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_smoke_test_quantizes_a_unit_with_the_stages_calls() -> None:
    res = _smoke()
    assert res["ok"], res
    assert res["encodings"]["int4_lpbq_weight_encodings"] == 1 and res["counts"]["kv_tensors"] == 2
    assert res["relative_error"] < 0.2
    # which API family it used is recorded, so a report says what the stack offered
    assert set(res["features"]) >= {"qspec_lpbq", "session_options_kwargs", "set_tensor_precision"}


def test_a_stack_that_cannot_quantize_fails_preflight_naming_the_step() -> None:
    # an aimet-onnx without either LPBQ API (neither QSpec.lpbq nor set_lpbq_for_params)
    res = _smoke(
        "import aimet_onnx, aimet_onnx.quantsim as q\n"
        "for m in (aimet_onnx, q):\n"
        "    m.__dict__.pop('QSpec', None)\n"
        "q.__dict__.pop('set_lpbq_for_params', None)\n"
    )
    assert not res["ok"] and res["step"] == "quantsim", res
    msgs = _smoke_checks({"aimet_smoke": res})
    assert (
        msgs[0]["status"] == "fail"
        and "quantsim" in msgs[0]["message"]
        and "cannot quantize" in msgs[0]["message"]
    )
    assert "validated recipe" in msgs[0]["fix"] and "install-workstation.sh" in msgs[0]["fix"]


def _smoke_checks(p: dict) -> list[dict]:
    """The aimet_smoke check of preflight_checks.run_checks for a probe holding only the smoke result."""
    from tests.preflight.test_checks import needs_8b, probe

    full = probe(aimet_smoke=p["aimet_smoke"])
    return [c for c in preflight_checks.run_checks(full, needs_8b()) if c["id"] == "aimet_smoke"]
