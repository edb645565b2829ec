"""The AI Hub upload at a fraction of the bytes (issue 28, docs/aihub-upload.md): integer-encoded weights and
the embedding table as their integers, re-quantizing to exactly the integers the fp32 weights quantize to; the
rest as it was; a graph the emulator (and AI Hub) type-checks and onnxruntime runs to the fake-quantized
graph's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers import aihub_upload as au
from hexstudio.workers.quant.qdq import int_form


def _external_fp32(init: Any, base: Path) -> np.ndarray:
    """A float32 initializer from its external data (the quantize stage hard-links its data files, which
    onnx's own loader refuses to read)."""
    ext = {e.key: e.value for e in init.external_data}
    return np.fromfile(
        base / ext["location"],
        dtype=np.float32,
        count=int(np.prod(init.dims)),
        offset=int(ext.get("offset", 0)),
    ).reshape([int(d) for d in init.dims])


def _requantize_everything(qdir: Path, g: dict[str, Any], up: Path) -> dict[str, int]:
    """For every param encoding of graph `g`: the uploaded weight's integers == the fp32 weight's."""
    import onnx

    src = qdir / g["onnx"]
    model = onnx.load(str(src), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    seen = {"int": 0, "fp32": 0}
    for name, enc in au.load_encodings(qdir / g["encodings"]).params.items():
        w = _external_fp32(inits[name], src.parent)
        got = au.uploaded_weight(up, name)
        form = int_form(enc, list(w.shape))
        if form is None:  # e.g. a 16-bit per-tensor norm weight: uploaded exactly as it was
            assert np.array_equal(got, w), name
            seen["fp32"] += 1
            continue
        before = au.quantize_ints(w, form)
        after = au.quantize_ints(got, form)
        assert np.array_equal(before, after), f"{name}: {int((before != after).sum())} integers changed"
        # what the graph's ops make is the integers times their scales, in fp32
        assert np.array_equal(got, (before.astype(np.float32) * form.expand(w.shape)).astype(np.float32)), (
            name
        )
        seen["int"] += 1
    return seen


def test_uploaded_integer_weights_requantize_to_the_same_integers(
    validated_run: Path, tmp_path: Path
) -> None:
    import onnx

    qdir = validated_run / "artifacts" / "quantize"
    q = json.loads((qdir / "quantize.json").read_text())
    total_int = 0
    for g in q["graphs"]:
        before = sum(f.stat().st_size for f in (qdir / g["onnx"]).parent.iterdir())
        planned = au.plan_bytes(qdir / g["onnx"], qdir / g["encodings"])
        up, st = au.write_upload_dir(qdir / g["onnx"], qdir / g["encodings"], tmp_path, g["name"])
        assert sorted(p.name for p in up.iterdir()) == [
            f"{g['name']}.{x}" for x in ("data", "encodings", "onnx")
        ]
        assert st.inexact == [] and st.int_tensors > 0
        assert abs(st.bytes - planned) < 64 << 10, (
            st.bytes,
            planned,
        )  # the plan: the .onnx's new nodes aside
        assert st.bytes < 0.5 * before, (st.bytes, before)
        seen = _requantize_everything(qdir, g, up)
        total_int += seen["int"]
        # the embedding table: uploaded as its 16-bit integers, the same ones the quantize stage's graph holds
        tables = au.gather_tables(
            onnx.load(str(qdir / g["onnx"]), load_external_data=False),
            au.load_encodings(qdir / g["encodings"]).activations,
        )
        assert st.int_tensors == seen["int"] + len(tables)
        assert (len(tables) == 1) == g["name"].endswith("_1_of_2"), g["name"]
        for name, enc in tables.items():
            src = onnx.load(str(qdir / g["onnx"]), load_external_data=False)
            w = _external_fp32(
                next(i for i in src.graph.initializer if i.name == name), (qdir / g["onnx"]).parent
            )
            want, exact = au.table_rows(w, enc)
            got, _ = au.table_rows(au.uploaded_weight(up, name), enc)
            assert exact and np.array_equal(got, want), name
        m = onnx.load(str(up / f"{g['name']}.onnx"), load_external_data=False)
        onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
        assert [i.name for i in m.graph.input] == g["inputs"] and [o.name for o in m.graph.output] == g[
            "outputs"
        ]
    assert (
        total_int == sum(g["stats"]["int4_lpbq_weight_encodings"] for g in q["graphs"]) + 2
    )  # + the lm_head x2


def _tiny_graph(d: Path, scale_lpbq: float = 0.01) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """x @ W (LPBQ, 128 x 8, block 64) * g (16-bit per-tensor) @ H (int8 per-channel, 8 x 4), weights external."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((128, 8)) * scale_lpbq * 3).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(8)).astype(np.float32)
    h = (rng.standard_normal((8, 4)) * 0.05).astype(np.float32)
    arrays = {"W": w, "G": gamma, "H": h}
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["a"]),
            helper.make_node("Mul", ["a", "G"], ["b"]),
            helper.make_node("MatMul", ["b", "H"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(
        model, str(d / "model.onnx"), save_as_external_data=True, location="model.data", size_threshold=0
    )
    lpbq_scale: np.ndarray = np.full(8, scale_lpbq, np.float32)
    ib = rng.integers(1, 17, size=8 * 2)
    encs = {
        "version": "1.0.0",
        "activation_encodings": [],
        "param_encodings": [
            {
                "name": "W",
                "enc_type": "LPBQ",
                "bw": 8,
                "compressed_bw": 4,
                "block_size": 64,
                "is_sym": True,
                "dtype": "INT",
                "scale": lpbq_scale.tolist(),
                "offset": [-128] * 8,
                "per_block_int_scale": ib.tolist(),
            },
            {
                "name": "G",
                "enc_type": "PER_TENSOR",
                "bw": 16,
                "is_sym": False,
                "dtype": "INT",
                "scale": [float(gamma.max()) / 65535],
                "offset": [0],
            },
            {
                "name": "H",
                "enc_type": "PER_CHANNEL",
                "bw": 8,
                "is_sym": True,
                "dtype": "INT",
                "scale": (np.abs(h).max(axis=0) / 127).tolist(),
                "offset": [-128] * 4,
            },
        ],
    }
    (d / "model.encodings").write_text(json.dumps(encs))
    return d / "model.onnx", d / "model.encodings", arrays


def test_a_tiny_graph_upload_runs_like_the_fake_quantized_graph(tmp_path: Path) -> None:
    import onnxruntime as ort

    src, enc, arrays = _tiny_graph(tmp_path / "src")
    up, st = au.write_upload_dir(src, enc, tmp_path / "up", "tiny")
    assert (st.int_tensors, st.fp32_tensors, st.inexact) == (2, 1, [])
    # int8 integers, G in fp32, the scales: LPBQ's 2 blocks x 8 outputs and the lm_head-like H's 4 channels
    assert st.data_bytes == (128 * 8 + 8 * 4) + 4 * 8 + 4 * (2 * 8 + 4)
    encs = au.load_encodings(enc).params
    x = np.random.default_rng(1).standard_normal((1, 128)).astype(np.float32)
    # the reference: the fake-quantized weights in fp32 (what the compiler computes from the fp32 upload)
    ref = {}
    for n, a in arrays.items():
        form = int_form(encs[n], list(a.shape))
        ref[n] = a if form is None else (au.quantize_ints(a, form) * form.expand(a.shape)).astype(np.float32)
    want = ((x @ ref["W"]) * ref["G"]) @ ref["H"]
    got = ort.InferenceSession(str(up / "tiny.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[
        0
    ]
    # the graph's ops make the fake-quantized weights (integer x scale in fp32): the same outputs up to the
    # float summation order; a compiler re-quantizes them to the same integers (checked below)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    made = {n: au.uploaded_weight(up, n) for n in arrays}
    assert np.array_equal(made["W"], ref["W"]) and np.array_equal(made["H"], ref["H"])
    for n, a in arrays.items():
        form = int_form(encs[n], list(a.shape))
        if form is not None:
            assert np.array_equal(
                au.quantize_ints(au.uploaded_weight(up, n), form), au.quantize_ints(a, form)
            )


def _embedding_graph(d: Path) -> tuple[np.ndarray, dict[str, Any], float]:
    """`d/m.onnx` (+ m.data, m.encodings): a Gather-only 300 x 16 table E with its own 16-bit per-tensor
    encoding. Returns (the table, its encoding, its scale)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    table = (rng.standard_normal((300, 16)) * 0.02).astype(np.float32)
    lo, hi = float(table.min()), float(table.max())
    scale = (hi - lo) / 65535
    enc = {"name": "E", "enc_type": "PER_TENSOR", "bw": 16, "is_sym": False, "dtype": "INT"}
    enc |= {"scale": [scale], "offset": [round(lo / scale)]}
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"], axis=0)],
        "emb",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 5])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 5, 16])],
        [numpy_helper.from_array(table, "E")],
    )
    d.mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(d / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    (d / "m.encodings").write_text(
        json.dumps(
            {"version": "1.0.0", "activation_encodings": [enc, {**enc, "name": "h"}], "param_encodings": []}
        )
    )
    return table, enc, scale


def test_an_embedding_table_is_uploaded_as_its_16_bit_integers(tmp_path: Path) -> None:
    """A Gather-only table with its own 16-bit encoding: half of fp32, exact, and the Gather's output is the
    fake-quantized table's rows (what the compiler makes of the fp32 upload)."""
    import onnxruntime as ort
    from qai_hub import public_api_pb2 as pb
    from qai_hub.util.zipped_model import zip_model

    from tests.aihub_emulator.server import uploaded_model_outputs

    d = tmp_path / "src"
    table, enc, scale = _embedding_graph(d)
    assert au.plan_bytes(d / "m.onnx", d / "m.encodings") < table.nbytes // 2 + 4096
    up, st = au.write_upload_dir(d / "m.onnx", d / "m.encodings", tmp_path / "up", "emb")
    assert (st.int_tensors, st.int_params, st.fp32_tensors, st.inexact) == (1, table.size, 0, [])
    assert st.data_bytes == table.size * 2
    ids = np.array([[0, 7, 299, 150, 7]], np.int32)
    got = ort.InferenceSession(str(up / "emb.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"ids": ids}
    )[0]
    q, exact = au.table_rows(table, enc)
    assert exact
    fake = (q.astype(np.float32) - np.float32(-enc["offset"][0])) * np.float32(scale)
    assert np.array_equal(got[0], fake[ids[0]])  # the fake-quantized rows, bit for bit
    assert np.array_equal(au.table_rows(got[0], enc)[0], q[ids[0]])  # re-quantized: the same integers
    assert (
        np.abs(fake - table).max() <= scale
    )  # within one step (half, but for the rounded zero point at the ends)
    zipped = Path(zip_model(str(tmp_path / "z"), str(up))).read_bytes()
    assert uploaded_model_outputs(pb.MODEL_TYPE_AIMET_ONNX, zipped, True) == ["h"]
    # setting aihub_compact_upload off: the table as it was, fp32 (what qai-hub-models uploads)
    up32, st32 = au.write_upload_dir(d / "m.onnx", d / "m.encodings", tmp_path / "up32", "emb", compact=False)
    assert (st32.int_tensors, st32.fp32_tensors, st32.data_bytes) == (0, 1, table.nbytes)
    assert np.array_equal(au.uploaded_weight(up32, "E"), table)
    assert au.plan_bytes(d / "m.onnx", d / "m.encodings", compact=False) > table.nbytes


def test_the_encodings_file_is_parsed_once_per_plan_and_per_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan_bytes and write_upload_dir each read the encodings document once (both sections from one parse:
    at 8B the file is several hundred MB), with the same results; compact=False reads it not at all."""
    graphs = [_tiny_graph(tmp_path / "tiny")[:2]]  # weights: the param encodings
    _embedding_graph(tmp_path / "emb")  # a gathered table: the activation encodings
    graphs.append((tmp_path / "emb" / "m.onnx", tmp_path / "emb" / "m.encodings"))
    plans = [au.plan_bytes(src, enc) for src, enc in graphs]
    uploads = [au.write_upload_dir(src, enc, tmp_path / "up0", "g")[1] for src, enc in graphs]
    real = json.loads
    texts = {p.read_text(encoding="utf-8") for _, p in graphs}
    parses: list[str] = []

    def counting(s: Any, *args: Any, **kwargs: Any) -> Any:
        if s in texts:  # every parse of an encodings document, whoever makes it
            parses.append(s)
        return real(s, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    for (src, enc), plan, upload in zip(graphs, plans, uploads, strict=True):
        parses.clear()
        assert au.plan_bytes(src, enc) == plan and len(parses) == 1, (src.name, len(parses))
        parses.clear()
        _, st = au.write_upload_dir(src, enc, tmp_path / "up1", "g")
        assert st == upload and st.int_tensors > 0 and len(parses) == 1, (src.name, len(parses))
        parses.clear()
        au.plan_bytes(src, enc, compact=False)
        au.write_upload_dir(src, enc, tmp_path / "up2", "g", compact=False)
        assert parses == []


def test_a_weight_whose_integers_do_not_come_back_stays_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weight whose integer x scale would not re-quantize to the same integers (integer x scale is one fp32
    multiply, so no real encoding was found that fails; the check's answer is forced for W) is uploaded as it
    was, fp32, and named; the other weights are not affected."""
    real = au.int_rows

    def fails_for_w(w: np.ndarray, form: Any, r0: int) -> tuple[np.ndarray, bool]:
        q, ok = real(w, form, r0)
        return q, ok and w.shape != (128, 8)

    monkeypatch.setattr(au, "int_rows", fails_for_w)
    src, enc, arrays = _tiny_graph(tmp_path / "src")
    up, st = au.write_upload_dir(src, enc, tmp_path / "up", "tiny")
    assert st.inexact == ["W"] and st.int_tensors == 1 and st.fp32_tensors == 2
    assert np.array_equal(au.uploaded_weight(up, "W"), arrays["W"])


def test_the_emulator_refuses_an_int8_weight_fed_straight_to_a_float_op(tmp_path: Path) -> None:
    """What AI Hub refuses (a type error), the emulator refuses too; the Cast form passes."""
    import onnx
    from qai_hub import public_api_pb2 as pb
    from qai_hub.util.zipped_model import zip_model

    from tests.aihub_emulator.server import JobRefused, uploaded_model_outputs

    src, enc, _ = _tiny_graph(tmp_path / "src")
    up, _ = au.write_upload_dir(src, enc, tmp_path / "up", "tiny")
    ok = Path(zip_model(str(tmp_path / "z1"), str(up))).read_bytes()
    assert uploaded_model_outputs(pb.MODEL_TYPE_AIMET_ONNX, ok, True) == ["y"]
    m = onnx.load(str(up / "tiny.onnx"), load_external_data=False)
    for n in [n for n in m.graph.node if n.name.startswith("W_")]:  # W's Cast, Reshapes and Mul
        m.graph.node.remove(n)
    next(i for i in m.graph.initializer if i.name == "W" + au.INT_SUFFIX).name = "W"
    onnx.save(m, str(up / "tiny.onnx"))
    bad = Path(zip_model(str(tmp_path / "z2"), str(up))).read_bytes()
    with pytest.raises(JobRefused, match=r"is not valid: .*MatMul.*int8"):
        uploaded_model_outputs(pb.MODEL_TYPE_AIMET_ONNX, bad, True)


def test_eta_and_link_speed_say_where_the_speed_comes_from() -> None:
    from hexstudio.workers.aihub import eta_text, link_speed

    assert link_speed(RunSettings()) == (100.0, "assumed; set aihub_link_mbps to your uplink")
    assert link_speed(RunSettings(aihub_link_mbps=40)) == (40.0, "setting aihub_link_mbps")
    assert eta_text(25e9, 100) == "33 min" and eta_text(1e6, 100) == "0 s" and eta_text(66e9, 50) == "2.9 h"


def test_the_uplink_an_upload_measured_is_the_next_etas_speed(tmp_path: Path) -> None:
    from hexstudio.workers.aihub import link_speed
    from hexstudio.workers.aihub_uplink import FILE, MIN_BYTES, read_rate, record_rate

    hub, emulator = "https://app.aihub.qualcomm.com", "http://127.0.0.1:5123"
    assert read_rate(tmp_path, hub) is None
    assert (
        record_rate(tmp_path, hub, MIN_BYTES - 1, 0.5) is None and not (tmp_path / FILE).exists()
    )  # too small
    rate = record_rate(tmp_path, hub, 250e6, 40.0)
    assert rate is not None and rate.mbps == 50.0 and read_rate(tmp_path, hub) == rate
    assert read_rate(tmp_path, emulator) is None  # the emulator never stands in for Qualcomm's service
    record_rate(tmp_path, emulator, 10e6, 0.1)
    assert read_rate(tmp_path, hub) == rate and read_rate(tmp_path, emulator).mbps == 800.0  # type: ignore[union-attr]
    mbps, source = link_speed(RunSettings(), rate)
    assert mbps == 50.0 and source.startswith(f"measured {rate.measured_at[:10]} over 0.25 GB")
    assert link_speed(RunSettings(aihub_link_mbps=40), rate) == (
        40.0,
        "setting aihub_link_mbps",
    )  # the user's word wins
    (tmp_path / FILE).write_text("{not json")
    assert read_rate(tmp_path, hub) is None  # a damaged file: the ETA assumes, the compile goes on
    assert record_rate(tmp_path, hub, 250e6, 40.0) == read_rate(tmp_path, hub)
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # no temporary left behind


def test_a_429_is_the_status_not_the_digits_in_a_port_or_an_id() -> None:
    """The rate-limit error is told by HTTP status 429 in the error chain, never by the digits 429 inside an
    emulator's port or a job id (a stalled listing on port 42913 once read as rate-limiting)."""
    from hexstudio.workers.aihub import says_429

    assert says_429("ResponseError: too many 429 error responses")
    assert says_429("HTTPError: 429 Client Error: Too Many Requests for url")
    assert not says_429("HTTPConnectionPool(host='127.0.0.1', port=42913): Read timed out. (read timeout=3)")
    assert not says_429("url: http://127.0.0.1:42913/api/v1/devices/ | job jx429k")
