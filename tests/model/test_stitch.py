"""Stitching exported pieces into one part graph (hexstudio/workers/export/stitch.py), on hand-built ONNX pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def _piece(path: Path, weight: np.ndarray, weight_name: str, x: str = "x", y: str = "y") -> None:
    """y = MatMul(x, weight) followed by Relu, with an intermediate named like the exporter names them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    g = helper.make_graph(
        [
            helper.make_node("MatMul", [x, weight_name], ["/mm/MatMul_output_0"], name="/mm/MatMul"),
            helper.make_node("Relu", ["/mm/MatMul_output_0"], [y], name="/act/Relu"),
        ],
        "piece",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(weight, weight_name)],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_pieces_are_wired_renamed_and_their_weights_streamed(tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort

    from hexstudio.workers.export.stitch import PartGraphWriter

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((16, 32)).astype(np.float32)  # the checkpoint's [out, in] = [32, 16], transposed
    w1 = rng.standard_normal((32, 8)).astype(np.float32)
    _piece(tmp_path / "p0.onnx", w0, "onnx::MatMul_7")  # anonymous: named by content (transposed)
    _piece(tmp_path / "p1.onnx", w1, "layer.proj.weight")  # kept by the exporter: named directly
    out = tmp_path / "part" / "g.onnx"
    w = PartGraphWriter(out, ["hidden_states_in"], ["hidden_states_out"])
    added = w.add(
        tmp_path / "p0.onnx",
        "/layers.0",
        {"x": "hidden_states_in", "y": "/layers.0/hidden"},
        {},
        {"model.layers.0.proj.weight": np.ascontiguousarray(w0.T)},
    )
    added += w.add(
        tmp_path / "p1.onnx",
        "/layers.1",
        {"x": "/layers.0/hidden", "y": "hidden_states_out"},
        {"layer.proj.weight": "model.layers.1.proj.weight"},
        {"model.layers.1.proj.weight": w1},
    )
    w.save()
    assert added == ["model.layers.0.proj.weight", "model.layers.1.proj.weight"]
    onnx.checker.check_model(str(out))
    m = onnx.load(str(out), load_external_data=False)
    assert [n.name for n in m.graph.node] == [
        "/layers.0/mm/MatMul",
        "/layers.0/act/Relu",
        "/layers.1/mm/MatMul",
        "/layers.1/act/Relu",
    ]
    assert all(
        not i.raw_data and {e.key: e.value for e in i.external_data}["location"] == "g.onnx.data"
        for i in m.graph.initializer
    )
    x = rng.standard_normal((1, 16)).astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(
        None, {"hidden_states_in": x}
    )[0]
    want = np.maximum(np.maximum(x @ w0, 0) @ w1, 0)
    assert np.allclose(got, want, atol=1e-5)


def test_an_unwired_piece_input_and_a_missing_part_output_are_errors(tmp_path: Path) -> None:
    from hexstudio.workers.export.stitch import PartGraphWriter, StitchError

    _piece(tmp_path / "p.onnx", np.ones((4, 4), np.float32), "w")
    w = PartGraphWriter(tmp_path / "g.onnx", ["a"], ["b"])
    with pytest.raises(StitchError, match="input/output 'x' the part does not wire"):
        w.add(tmp_path / "p.onnx", "/p", {"y": "b"}, {}, {})
    w.abort()
    assert not (tmp_path / "g.onnx.data").exists()
    w = PartGraphWriter(tmp_path / "g.onnx", ["a"], ["b", "c"])
    w.add(tmp_path / "p.onnx", "/p", {"x": "a", "y": "b"}, {}, {})
    with pytest.raises(StitchError, match="no piece provides c"):
        w.save()
    assert not (tmp_path / "g.onnx").exists() and not (tmp_path / "g.onnx.data").exists()


def test_a_part_whose_second_graph_fails_leaves_no_graph_behind(tmp_path: Path) -> None:
    """A part's prompt processor and token generator share one data file: when the second failed to save (a full
    disk), the data file was removed but the first graph, already in place, stayed and pointed at it."""
    from hexstudio.workers.export.stitch import PartGraphWriter, SharedData, StitchError

    _piece(tmp_path / "p.onnx", np.ones((4, 4), np.float32), "w")
    shared = SharedData(tmp_path / "prompt.onnx.data")
    writers = [PartGraphWriter(tmp_path / f"{k}.onnx", ["a"], ["b"], shared) for k in ("prompt", "token")]
    writers[0].add(tmp_path / "p.onnx", "/p", {"x": "a", "y": "b"}, {}, {})
    writers[0].save()
    assert (tmp_path / "prompt.onnx").exists()
    with pytest.raises(StitchError, match="no piece provides"):
        writers[1].save()  # nothing added: its output is missing
    for w in writers:  # what export_graphs does when a part fails
        w.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.onnx"]


def test_a_placeholder_weight_is_replaced_by_the_streamed_tensor(tmp_path: Path) -> None:
    """A vocabulary-sized weight exported as a few-row placeholder: the stitcher writes the real tensor
    from its blocks (transposed where the exporter folded the transpose), widens the output, and
    refuses a placeholder of another shape."""
    import onnx
    import onnxruntime as ort

    from hexstudio.workers.export.stitch import PartGraphWriter, StitchError
    from hexstudio.workers.export.weights import StreamedWeight

    rng = np.random.default_rng(5)
    real = rng.standard_normal((50, 16)).astype(np.float32)  # checkpoint [vocab, hidden]
    stand_in = rng.standard_normal((8, 16)).astype(np.float32)

    def blocks() -> object:
        for r0 in range(0, 50, 7):  # uneven blocks, a short last one
            yield real[r0 : r0 + 7]

    sw = StreamedWeight("lm_head.weight", 50, 16, 8, blocks)  # type: ignore[arg-type]
    _piece(tmp_path / "head.onnx", np.ascontiguousarray(stand_in.T), "onnx::MatMul_3", y="logits")
    out = tmp_path / "part" / "g.onnx"
    w = PartGraphWriter(out, ["hidden"], ["logits"])
    assert w.add(
        tmp_path / "head.onnx",
        "/head",
        {"x": "hidden", "logits": "logits"},
        {},
        {"lm_head.weight": stand_in},
        {"lm_head.weight": sw},
        {"logits": 50},
    ) == ["lm_head.weight"]
    w.save()
    onnx.checker.check_model(str(out))
    m = onnx.load(str(out))
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [1, 50]
    x = rng.standard_normal((1, 16)).astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"hidden": x})[0]
    np.testing.assert_allclose(got, np.maximum(x @ real.T, 0), rtol=1e-5, atol=1e-5)

    _piece(
        tmp_path / "bad.onnx", rng.standard_normal((16, 9)).astype(np.float32), "onnx::MatMul_4", y="logits"
    )
    w2 = PartGraphWriter(tmp_path / "part2" / "g.onnx", ["hidden"], ["logits"])
    with pytest.raises(StitchError, match=r"placeholder of lm_head.weight came out as \[16, 9\]"):
        w2.add(
            tmp_path / "bad.onnx",
            "/head",
            {"x": "hidden", "logits": "logits"},
            {"onnx::MatMul_4": "lm_head.weight"},
            {},
            {"lm_head.weight": sw},
            {"logits": 50},
        )
    w2.abort()
    assert not (tmp_path / "part2" / "g.onnx.data").exists()
