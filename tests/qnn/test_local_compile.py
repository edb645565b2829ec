"""Local compile with QNN 2.51 (onnxruntime-qnn): every deployment graph of the built-in model compiles whole
on QNN HTP for the IQ-9075's v73 (CPU fallback off), and the context binaries, read back through Qualcomm's
libQnnSystem, hold what Genie needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.qnn.conftest import needs_qnn

pytestmark = [needs_qnn, pytest.mark.slow]


def _bundle(local_run: Path) -> Path:
    return local_run / "artifacts" / "compile" / "bundle"


def test_every_graph_compiles_whole_and_reads_back_as_genie_needs(local_run: Path) -> None:
    import onnx

    from hexstudio.workers.qnn.context_info import read_context_info
    from hexstudio.workers.qnn.htp_graph import deployment_io
    from hexstudio.workers.qnn.libs import find_qnn_libs

    libs = find_qnn_libs()
    assert libs is not None
    b = _bundle(local_run)
    doc = json.loads((b / "bundle.json").read_text())
    assert doc["binaries"] == "qnn" and doc["compile_target"] == "local" and doc["simulated"] is False
    assert doc["context_binary_form"] == "single" and doc["qnn_version"] == libs.qnn_version
    assert (b / "tool-versions.yaml").read_text().startswith(f"qairt: {libs.qnn_version}.")
    cfg = json.loads((b / "genie_config.json").read_text())
    bins = cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert len(bins) == 4  # 2 parts x (prompt processor, token generator)
    # each binary once: moved into the bundle, not copied beside QNN's log
    assert not list((local_run / "artifacts" / "compile" / "htp" / "ctx").rglob("*.bin"))
    assert list((local_run / "artifacts" / "compile" / "htp" / "ctx").rglob("compile.log"))
    q = json.loads((local_run / "artifacts" / "quantize" / "quantize.json").read_text())
    gdir = local_run / "artifacts" / "compile" / "htp" / "graphs"
    seen: dict[str, tuple[float, int]] = {}
    for g in q["graphs"]:
        kind = "prompt" if g["kind"] == "prompt_processor" else "token"
        name = next(x for x in bins if f"_{kind}_part_{g['part']}_of_" in x)
        info = read_context_info(b / name, libs.system)
        assert info.soc_model == 77 and info.build_id.startswith(f"v{libs.qnn_version}")
        assert len(info.graphs) == 1
        qg = info.graphs[0]
        ins, outs = deployment_io(
            onnx.load(str(next(gdir.glob(f"{g['name']}~*.onnx"))), load_external_data=False)
        )
        for want, got in ((ins, qg.inputs), (outs, qg.outputs)):
            by = {t.name: t for t in got}
            assert set(by) == {t.name for t in want}, g["name"]
            for t in want:
                assert by[t.name].dtype == t.dtype and tuple(by[t.name].shape) == t.shape, (g["name"], t.name)
                if t.scale is not None:  # QNN's offset is ONNX's negative zero point
                    assert (
                        by[t.name].scale == pytest.approx(t.scale, rel=1e-6)
                        and by[t.name].offset == -t.zero_point
                    )
                    seen.setdefault(t.name, (by[t.name].scale, by[t.name].offset))
                    # Genie: every shared tensor has ONE encoding across graphs and parts
                    assert seen[t.name] == (by[t.name].scale, by[t.name].offset), (g["name"], t.name)
    # the KV cache out has exactly its input's encoding in the compiled binaries (QNN did not re-derive it from
    # the Transpose in front of it: the audit's worry)
    for name, enc in seen.items():
        if name.endswith("_out") and name.startswith("past_"):
            assert seen[name.replace("_out", "_in")] == enc


def test_the_checker_runs_on_what_the_binaries_hold(local_run: Path) -> None:
    from hexstudio.core.services.bundle_check import check

    findings = check(_bundle(local_run))
    assert [f for f in findings if f.severity == "error"] == [], [f.message for f in findings]
    assert any(f.code == "genie_parser_ok" for f in findings)


def test_a_node_htp_refuses_fails_the_compile_with_its_name(tmp_path: Path) -> None:
    """CPU fallback is off: a Gather over a raw uint16 table (the form HTP refuses) is named, never run on the CPU."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from hexstudio.workers.qnn.compile import GraphToCompile, LocalCompileError, compile_part
    from hexstudio.workers.qnn.ep import HtpTarget

    table = numpy_helper.from_array(np.arange(64 * 8, dtype=np.uint16).reshape(64, 8), "table")
    g = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"], name="raw_gather"),
            helper.make_node("DequantizeLinear", ["rows", "s", "z"], ["out"], name="dq"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8])],
        [
            table,
            numpy_helper.from_array(np.array(0.01, np.float32), "s"),
            numpy_helper.from_array(np.array(100, np.uint16), "z"),
        ],
    )
    path = tmp_path / "raw.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    with pytest.raises(LocalCompileError) as err:
        compile_part(
            [GraphToCompile("raw", "prompt_processor", 1, 1, path)],
            tmp_path / "out",
            HtpTarget(77, "v73"),
            shared=False,
        )
    assert err.value.code == "htp_unsupported_nodes" and "raw_gather" in err.value.message
    assert not list((tmp_path / "out").glob("*.bin"))


def test_the_rewrite_keeps_the_arithmetic(local_run: Path) -> None:
    """The HTP graph on the CPU, fed Genie's quantized buffers, computes what the simulation graph computes: exactly,
    except the requantized mixed-precision MatMuls (v_proj -> the 8-bit KV out), within one 8-bit step."""
    import onnx
    import onnxruntime as ort

    from hexstudio.workers.qnn.htp_graph import deployment_io
    from hexstudio.workers.qnn.htp_session import dequantize, quantize

    q = json.loads((local_run / "artifacts" / "quantize" / "quantize.json").read_text())
    g = next(g for g in q["graphs"] if g["kind"] == "token_generator" and g["part"] == 1)
    sim = local_run / "artifacts" / "quantize" / g["sim_onnx"]
    htp = next((local_run / "artifacts" / "compile" / "htp" / "graphs").glob(f"{g['name']}~*.onnx"))
    ins, outs = deployment_io(onnx.load(str(htp), load_external_data=False))
    rng = np.random.default_rng(0)
    feeds_q = {}
    for t in ins:
        if t.dtype == "int32":
            feeds_q[t.name] = rng.integers(0, 500, t.shape).astype(np.int32)
        else:
            feeds_q[t.name] = rng.integers(0, 255 if t.dtype == "uint8" else 65535, t.shape).astype(
                np.uint8 if t.dtype == "uint8" else np.uint16
            )
    float_feeds = {
        t.name: (dequantize(feeds_q[t.name], t) if t.scale is not None else feeds_q[t.name]) for t in ins
    }
    cpu = ["CPUExecutionProvider"]
    ref = ort.InferenceSession(str(sim), providers=cpu)
    got = ort.InferenceSession(str(htp), providers=cpu)
    names = [t.name for t in outs]
    a = dict(zip(names, ref.run(names, float_feeds), strict=True))
    b = dict(zip(names, got.run(names, feeds_q), strict=True))
    for t in outs:
        codes_ref = quantize(a[t.name], t).astype(np.int64)
        diff = np.abs(codes_ref - b[t.name].astype(np.int64))
        if t.name.startswith("past_value"):
            assert diff.max() <= 1, t.name
        else:
            assert diff.max() == 0, t.name
    # Genie's lade seeds token ids 1000+: the built-in's 840-row table gathers them as its last row, not an error
    ids = next(t for t in ins if t.dtype == "int32")
    past = dict(
        zip(names, got.run(names, {**feeds_q, ids.name: np.full(ids.shape, 1000, np.int32)}), strict=True)
    )
    last = dict(
        zip(names, got.run(names, {**feeds_q, ids.name: np.full(ids.shape, 839, np.int32)}), strict=True)
    )
    assert all(np.array_equal(past[n], last[n]) for n in names)


def test_the_board_form_shares_weights_in_one_binary_per_part(local_run: Path, tmp_path: Path) -> None:
    """For a real board, one context binary per part holds the prompt processor and the token generator with
    shared weights (what AI Hub's link job makes); QNN's reader sees both graphs in it."""
    from hexstudio.workers.qnn.compile import GraphToCompile, compile_part, read_back
    from hexstudio.workers.qnn.ep import HtpTarget

    q = json.loads((local_run / "artifacts" / "quantize" / "quantize.json").read_text())
    gdir = local_run / "artifacts" / "compile" / "htp" / "graphs"
    part1 = [
        GraphToCompile(g["name"], g["kind"], 1, int(q["parts"]), next(gdir.glob(f"{g['name']}~*.onnx")))
        for g in sorted(q["graphs"], key=lambda g: g["kind"] != "prompt_processor")
        if g["part"] == 1
    ]
    cp = compile_part(part1, tmp_path / "shared", HtpTarget(77, "v73"), shared=True)
    read_back(cp, part1)
    assert len(cp.bins) == 1 and len(cp.infos[0].graphs) == 2
    assert set(cp.graphs) == {g.name for g in part1}
    single = sum(
        p.stat().st_size for p in (local_run / "artifacts" / "compile" / "bundle").glob("*_part_1_of_2.bin")
    )
    assert cp.bins[0].stat().st_size < single  # the weights are stored once
