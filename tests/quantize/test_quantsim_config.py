"""The QuantSim configuration choice (hexstudio/workers/quant/aimet_compat.py quantsim_config, run setting quantsim_config):
HexStudio's LLM configuration file loads, and a QuantSim built with it on a small attention-like graph puts no
more activation quantizers on data-movement ops than AIMET's stock htp_v73, one fewer on the Constant, and
leaves aimet-onnx's module globals as it found them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hexstudio.shared.run_settings import DEFAULTS
from hexstudio.workers.quant import aimet_compat

pytest.importorskip("aimet_onnx")

DATA_MOVEMENT = ("Transpose", "Reshape", "Slice", "Tile", "Expand", "Squeeze", "Unsqueeze")


def _graph() -> Any:
    """x -> MatMul -> Reshape -> Transpose -> (Div by a Constant) -> Transpose -> Reshape -> Slice ->
    Concat(past, .) -> Tile -> MatMul: the data movement of an attention block and its 1/sqrt(d) scale."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name: str, a: np.ndarray) -> Any:
        return numpy_helper.from_array(a, name)

    inits = [
        init("w1", rng.standard_normal((64, 64)).astype(np.float32)),
        init("w2", rng.standard_normal((64, 64)).astype(np.float32)),
        init("s1", np.array([1, 4, 2, 32], np.int64)),
        init("s2", np.array([1, 4, 64], np.int64)),
        init("st", np.array([0], np.int64)),
        init("en", np.array([2], np.int64)),
        init("ax", np.array([1], np.int64)),
        init("reps", np.array([1, 2, 1], np.int64)),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["a"], name="mm1"),
        n("Reshape", ["a", "s1"], ["r"], name="reshape1"),
        n("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3], name="transpose1"),
        n("Constant", [], ["eight"], value=numpy_helper.from_array(np.array(8.0, np.float32)), name="const8"),
        n("Div", ["t", "eight"], ["d"], name="div1"),
        n("Transpose", ["d"], ["t2"], perm=[0, 2, 1, 3], name="transpose2"),
        n("Reshape", ["t2", "s2"], ["r2"], name="reshape2"),
        n("Slice", ["r2", "st", "en", "ax"], ["sl"], name="slice1"),
        n("Concat", ["past", "sl"], ["cat"], axis=1, name="concat1"),
        n("Tile", ["cat", "reps"], ["tl"], name="tile1"),
        n("MatMul", ["tl", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention_like",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 64]),
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 3, 64]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10, 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _quantized_outputs(kind: aimet_compat.QuantsimConfigKind, tmp: Path) -> dict[str, str]:
    """{tensor: producing op type} of the enabled activation quantizers of a sim built with `kind`."""
    model = _graph()
    producer = {o: node.op_type for node in model.graph.node for o in node.output}
    sim = aimet_compat.make_sim(
        model,
        param_bits=8,
        activation_bits=16,
        path=str(tmp),
        providers=["CPUExecutionProvider"],
        session_options={},
        config_file=aimet_compat.quantsim_config("v73", kind),
        llm_globals=kind == "llm",
    )
    return {
        name: producer.get(name, "input")
        for name, q in sim.qc_quantize_op_dict.items()
        if name in sim.activation_names and q.enabled
    }


def test_the_llm_configuration_is_a_valid_v73_file() -> None:
    from aimet_onnx.common.quantsim_config.json_config_importer import JsonConfigImporter

    path = aimet_compat.quantsim_config("v73", "llm")
    assert Path(path).is_file() and Path(path).name == "htp_llm_v73.json"
    cfg = JsonConfigImporter.import_json_config_file(path)  # aimet-onnx's own schema check
    assert cfg["defaults"]["hw_version"] == "V73"
    assert cfg["defaults"]["per_channel_quantization"] is True
    for op in ("Transpose", "Reshape", "Slice", "Tile", "Gather"):
        assert cfg["op_type"][op]["is_output_quantized"] is False, op
    assert (
        json.loads(Path(path).read_text(encoding="utf-8"))["op_type"]["Gather"]["per_channel_quantization"]
        == "False"
    )  # the embedding table per tensor (quantize_unit calibrates a compacted table)
    # a later Hexagon takes the nearest older file (aimet-onnx only logs hw_version); the stock alias stays
    assert aimet_compat.quantsim_config("v79", "llm") == path
    assert aimet_compat.quantsim_config(None, "llm") == path
    assert aimet_compat.quantsim_config("v73", "aimet") == "htp_v73"
    with pytest.raises(ValueError, match="unknown quantsim configuration"):
        aimet_compat.quantsim_config("v73", "qualcomm")  # type: ignore[arg-type]
    # the default stays AIMET's stock configuration: "llm" agreed less with the HTP simulator (docs/quantize.md)
    assert DEFAULTS.quantsim_config == "aimet" and aimet_compat.quantsim_config("v73") == "htp_v73"


def test_the_llm_configuration_quantizes_no_more_data_movement_than_stock(tmp_path: Path) -> None:
    from aimet_onnx import quantsim

    before = {
        g: getattr(quantsim, g) for g in ("op_types_to_tie_qtzrs", "_tie_qtzrs", "op_outputs_to_ignore")
    }
    before_values = {g: list(v) if isinstance(v, list) else v for g, v in before.items()}
    stock = _quantized_outputs("aimet", tmp_path / "aimet")
    llm = _quantized_outputs("llm", tmp_path / "llm")

    def moved(q: dict[str, str]) -> list[str]:
        return sorted(t for t, op in q.items() if op in DATA_MOVEMENT)

    assert len(moved(llm)) <= len(moved(stock)), (moved(llm), moved(stock))
    assert not moved(llm), moved(llm)  # Transpose/Reshape/Slice/Tile outputs: no requantization
    assert "eight" in stock and "eight" not in llm  # a Constant's output is not quantized (qai-hub-models)
    assert len(llm) < len(stock)
    for t in ("x", "past", "a", "d", "cat", "y"):  # the computing ops and inputs keep theirs
        assert t in llm, t
    # the globals were restored (the same objects, unchanged), so the next sim is not affected
    for g, v in before.items():
        assert getattr(quantsim, g) is v, g
        assert (list(v) if isinstance(v, list) else v) == before_values[g], g
    assert _quantized_outputs("aimet", tmp_path / "again") == stock
