"""The Validate stage's HTP simulation leg: each part on the onnxruntime simulation and on Qualcomm's HTP
simulator, compared in codes, gated on thresholds (hexstudio/workers/qnn/htp_agreement.py says why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.qnn.conftest import needs_qnn

pytestmark = [needs_qnn, pytest.mark.slow]


def test_validate_runs_the_htp_leg_and_it_passes(validated_run: Path) -> None:
    doc = json.loads((validated_run / "artifacts" / "validate" / "validation.json").read_text())
    htp = doc["htp_simulation"]
    assert htp["ran"] is True and htp["ok"] is True
    assert (
        doc["checks"]["htp_logits_argmax_agreement"]["ok"]
        and doc["checks"]["htp_logits_mean_code_error"]["ok"]
    )
    assert htp["logits_argmax_agreement"] >= 0.9 and htp["positions"] > 100
    assert [p["graph"] for p in htp["parts"]] == [
        "prompt_ar128_cl512_1_of_2",
        "prompt_ar128_cl512_2_of_2",
        "token_ar1_cl512_1_of_2",
        "token_ar1_cl512_2_of_2",
    ]


def test_a_wrong_encoding_in_the_compiled_graph_fails_the_leg(validated_run: Path, tmp_path: Path) -> None:
    """A fault the leg exists for: the compiled graph computes something else than the simulation (here the first
    RMSNorm's square becomes a cube, as a wrong rewrite would do): agreement collapses and the gate says so."""
    import numpy as np
    from onnx import helper, numpy_helper

    from hexstudio.workers.qnn.htp_agreement import measure
    from hexstudio.workers.qnn.htp_graph import htp_graph
    from hexstudio.workers.quant.calib import load_tokenizer

    def faulty(model: Any) -> Any:
        m, rep = htp_graph(model)
        pow_node = next(n for n in m.graph.node if n.op_type == "Pow")
        three = numpy_helper.from_array(np.array(3.0, np.float32), "fault_exponent")
        m.graph.node.insert(0, helper.make_node("Constant", [], ["fault_exponent"], value=three))
        pow_node.input[1] = "fault_exponent"
        return m, rep

    art = validated_run / "artifacts"
    q = json.loads((art / "quantize" / "quantize.json").read_text())
    tok = load_tokenizer(art / "model" / "hf")
    ids = tok.encode(
        "The capital of France is Paris. The sky was grey and the wind was strong.", add_special_tokens=False
    ).ids
    good = measure(art / "quantize", q, tmp_path / "good", ids)
    bad = measure(art / "quantize", q, tmp_path / "bad", ids, rewrite=faulty)
    assert good.ok and not bad.ok
    assert bad.logits_mean_code_error > 10 * good.logits_mean_code_error


def test_the_leg_runs_in_the_installers_side_environment_with_the_same_figures(
    validated_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validated GPU recipe (Python 3.10) cannot hold onnxruntime-qnn: the workstation installer puts it in a side
    environment (hexstudio.workers.qnn.libs). The leg then runs in a child process of that environment, with the figures it
    gives in process (here the 'side environment' is this one behind another interpreter path)."""
    import dataclasses
    import sys

    from hexstudio.shared.errors import ActionableError
    from hexstudio.workers.qnn import libs as qnn_libs
    from hexstudio.workers.qnn.htp_agreement import measure_json
    from hexstudio.workers.quant.calib import load_tokenizer

    here = qnn_libs.find_qnn_libs()
    assert here is not None and here.in_process
    art = validated_run / "artifacts"
    q = json.loads((art / "quantize" / "quantize.json").read_text())
    ids = (
        load_tokenizer(art / "model" / "hf")
        .encode("The sky was grey and the wind was strong.", add_special_tokens=False)
        .ids
    )
    inside = measure_json(art / "quantize", q, tmp_path / "in", ids)
    side = tmp_path / "side-env" / "python"
    side.parent.mkdir()
    side.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    side.chmod(0o755)
    monkeypatch.setattr(qnn_libs, "find_qnn_libs", lambda: dataclasses.replace(here, python=str(side)))
    assert not qnn_libs.find_qnn_libs().in_process
    assert measure_json(art / "quantize", q, tmp_path / "side", ids) == inside
    side.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named onnxruntime_qnn' >&2; exit 1\n")
    with pytest.raises(ActionableError, match=r"side environment .* No module named onnxruntime_qnn"):
        measure_json(art / "quantize", q, tmp_path / "broken", ids)
