"""The README's main command, as a user runs it: `hexstudio run --model builtin:tiny-llama --board sim` with the
default settings (no test shortcuts), every stage passing its gate with no override. Where onnxruntime-qnn is
installed the flow compiles locally and the simulator board runs real Genie, so greedy parity is judged against
the host's HTP simulation and must be N/N."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.workers.qnn.libs import find_qnn_libs

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow(
    reason="the README's command end to end on the defaults, with real aimet-onnx, a local QNN compile and real "
    "Genie on the HTP simulator: the acceptance test of the default flow, nothing in it can be stubbed"
)
def test_the_readme_command_passes_every_gate_on_the_defaults(tmp_path: Path) -> None:
    env = {**os.environ, "HEXSTUDIO_WORKSPACE": str(tmp_path / "ws")}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexstudio",
            "run",
            "--model",
            "builtin:tiny-llama",
            "--board",
            "sim",
            "--json",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["ok"], (doc, p.stderr[-3000:])
    run = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    settings = run["inputs"]["settings"]
    assert settings["override_gates"] == [] and settings["compile_target"] == "auto"
    assert settings["calibration_samples"] == 8  # the default a user gets, not the fixtures' 4
    for name, st in run["stages"].items():
        assert st["state"] == "done", (name, st.get("state"))
        assert st["gate"]["passed"] and st["gate"]["override"] is None, (name, st["gate"])
    ev = {
        k: (m["value"] if isinstance(m, dict) else m) for k, m in run["stages"]["evaluate"]["metrics"].items()
    }
    assert ev["parity_matched"] == ev["parity_total"] > 0
    bundle = json.loads(
        (Path(doc["run_dir"]) / "artifacts" / "compile" / "bundle" / "bundle.json").read_text()
    )
    # Qualcomm's runtime: a local compile, real Genie, the exact HTP reference
    if find_qnn_libs() is not None:
        assert bundle["compile_target"] == "local" and bundle["binaries"] == "qnn"
        assert ev["parity_reference"] == "htp"
        val = json.loads((Path(doc["run_dir"]) / "artifacts" / "validate" / "validation.json").read_text())
        assert val["htp_simulation"]["ran"] and val["checks"]["htp_logits_argmax_agreement"]["ok"]
    else:
        assert bundle["simulated"] is True
