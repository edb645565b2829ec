"""metadata.yaml (hexstudio/workers/bundle_metadata.py): each component's I/O shapes, compiled dtypes and
quantization, as qai-hub-models writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hexstudio.workers import bundle_metadata as md

AR, CL, KVH, HD, H, V = 4, 16, 2, 8, 32, 64


def _onnx(path: Path, ins: dict[str, tuple[int, list[int]]], outs: dict[str, tuple[int, list[int]]]) -> None:
    import onnx
    from onnx import TensorProto, helper

    vi = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in ins.items()]
    vo = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outs.items()]
    # a trivial body: every output is an Identity of the first float input (shapes are not checked here)
    src = next(n for n, (t, _) in ins.items() if t == TensorProto.FLOAT)
    nodes = [helper.make_node("Identity", [src], [n]) for n in outs]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", vi, vo)), str(path))


def _enc(name: str, bw: int, scale: float, offset: int, sym: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "bw": bw,
        "dtype": "INT",
        "enc_type": "PER_TENSOR",
        "is_sym": sym,
        "offset": [offset],
        "scale": [scale],
    }


def _part(qdir: Path, kind: str, part: int, parts: int, layer: int) -> dict[str, Any]:
    from onnx import TensorProto

    F, I32 = TensorProto.FLOAT, TensorProto.INT32
    seq = AR if kind == "prompt_processor" else 1
    name = f"{'prompt' if seq > 1 else 'token'}_ar{seq}_cl{CL}_{part}_of_{parts}"
    ins: dict[str, tuple[int, list[int]]] = {}
    if part == 1:
        ins["input_ids"] = (I32, [1, seq])
    else:
        ins[f"_model_model_layers_{layer - 1}_Add_1_output_0"] = (F, [1, seq, H])
    ins |= {
        "attention_mask": (F, [1, 1, seq, CL]),
        "position_ids_cos": (F, [1, 1, seq, HD // 2]),
        "position_ids_sin": (F, [1, 1, seq, HD // 2]),
        f"past_key_{layer}_in": (F, [KVH, 1, HD, CL - seq]),
        f"past_value_{layer}_in": (F, [KVH, 1, CL - seq, HD]),
    }
    first_out = "logits" if part == parts else f"_model_model_layers_{layer}_Add_1_output_0"
    outs = {
        first_out: (F, [1, seq, V] if part == parts else [1, seq, H]),
        f"past_key_{layer}_out": (F, [KVH, 1, HD, seq]),
        f"past_value_{layer}_out": (F, [KVH, 1, seq, HD]),
    }
    gdir = qdir / "parts" / name
    gdir.mkdir(parents=True)
    _onnx(gdir / "model.onnx", ins, outs)
    acts = [
        _enc("attention_mask", 16, 0.0152, -65535),
        _enc("position_ids_cos", 16, 3.05e-5, -32768),
        _enc("position_ids_sin", 16, 3.05e-5, -32768),
    ]
    for kv in ("key", "value"):
        acts += [
            _enc(f"past_{kv}_{layer}_in", 8, 0.05, -128, True),
            _enc(f"past_{kv}_{layer}_out", 8, 0.05, -128, True),
        ]
    if part == parts:
        acts.append(_enc("logits", 16, 0.001, -30000))
    if part > 1:
        acts.append(_enc(f"_model_model_layers_{layer - 1}_Add_1_output_0", 16, 7.2e-6, -30800))
    (gdir / "model.encodings").write_text(
        json.dumps({"version": "1.0.0", "activation_encodings": acts, "param_encodings": []})
    )
    return {
        "name": name,
        "kind": kind,
        "part": part,
        "seq_len": seq,
        "layers": [layer],
        "inputs": list(ins),
        "outputs": list(outs),
        "onnx": f"parts/{name}/model.onnx",
        "encodings": f"parts/{name}/model.encodings",
    }


@pytest.fixture
def quantized(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    graphs = [
        _part(tmp_path, kind, p, 2, p - 1) for kind in ("prompt_processor", "token_generator") for p in (1, 2)
    ]
    return tmp_path, graphs


def test_component_names_follow_the_graph_names() -> None:
    assert md.component_name("prompt_ar128_cl512_1_of_2") == "prompt_1_of_2"
    assert md.component_name("token_ar1_cl4096_5_of_5") == "token_5_of_5"
    assert (
        md.component_name("prompt_ar128_cl4096_03_of_12") == "prompt_03_of_12"
    )  # Genie's lexicographic order
    with pytest.raises(md.MetadataError, match="not of the form"):
        md.component_name("part1_prompt")


def test_graph_spec_reads_shapes_from_the_onnx_and_dtypes_from_the_encodings(
    quantized: tuple[Path, list[dict[str, Any]]],
) -> None:
    qdir, graphs = quantized
    p1 = md.graph_spec(graphs[0], qdir)
    assert list(p1["inputs"]) == graphs[0]["inputs"] and list(p1["outputs"]) == graphs[0]["outputs"]
    assert p1["inputs"]["input_ids"] == {"shape": [1, AR], "dtype": "int32"}
    assert p1["inputs"]["attention_mask"] == {
        "shape": [1, 1, AR, CL],
        "dtype": "uint16",
        "quantization_parameters": {"scale": 0.0152, "offset": -65535},
    }
    assert p1["inputs"]["past_key_0_in"]["dtype"] == "uint8"
    assert p1["inputs"]["past_key_0_in"]["shape"] == [KVH, 1, HD, CL - AR]
    assert p1["outputs"]["past_value_0_out"] == {
        "shape": [KVH, 1, AR, HD],
        "dtype": "uint8",
        "quantization_parameters": {"scale": 0.05, "offset": -128},
    }
    # part 1's boundary output has no encoding of its own (qai-hub-models drops the Gather's): the
    # --quantize_full_type w8a16 fallback makes it uint16, without parameters
    assert p1["outputs"]["_model_model_layers_0_Add_1_output_0"] == {"shape": [1, AR, H], "dtype": "uint16"}
    t2 = md.graph_spec(graphs[3], qdir)
    assert t2["inputs"]["_model_model_layers_0_Add_1_output_0"]["quantization_parameters"] == {
        "scale": 7.2e-6,
        "offset": -30800,
    }
    assert t2["outputs"]["logits"]["shape"] == [1, 1, V] and t2["outputs"]["logits"]["dtype"] == "uint16"


def test_shapes_from_the_graph_entry_and_legacy_encodings(tmp_path: Path) -> None:
    (tmp_path / "e.encodings").write_text(
        json.dumps(
            {
                "activation_encodings": {
                    "attention_mask": [{"bitwidth": 16, "scale": 0.5, "offset": -65535, "dtype": "int"}],
                    "past_key_0_in": [{"bitwidth": 8, "scale": 0.25, "offset": -128}],
                }
            }
        )
    )
    entry = {
        "name": "token_ar1_cl16_1_of_1",
        "encodings": "e.encodings",
        "io": {
            "inputs": {"attention_mask": [1, 1, 1, 16], "past_key_0_in": {"shape": [2, 1, 8, 15]}},
            "outputs": [{"name": "logits", "shape": [1, 1, 64]}],
        },
    }
    spec = md.graph_spec(entry, tmp_path)
    assert spec["inputs"]["attention_mask"]["quantization_parameters"] == {"scale": 0.5, "offset": -65535}
    assert spec["inputs"]["past_key_0_in"] == {
        "shape": [2, 1, 8, 15],
        "dtype": "uint8",
        "quantization_parameters": {"scale": 0.25, "offset": -128},
    }
    assert spec["outputs"]["logits"] == {"shape": [1, 1, 64], "dtype": "uint16"}


def test_a_name_missing_from_the_graph_is_an_error(quantized: tuple[Path, list[dict[str, Any]]]) -> None:
    qdir, graphs = quantized
    with pytest.raises(md.MetadataError, match=r"position_ids named in quantize\.json are not in the graph"):
        md.graph_spec({**graphs[0], "inputs": ["input_ids", "position_ids"]}, qdir)


def test_build_write_read_round_trip(quantized: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    qdir, graphs = quantized
    doc = md.build_metadata(list(reversed(graphs)), qdir)
    assert list(doc["components"]) == ["prompt_1_of_2", "prompt_2_of_2", "token_1_of_2", "token_2_of_2"]
    assert (doc["precision"], doc["runtime"]) == ("w4a16", "genie")
    path = tmp_path / "metadata.yaml"
    md.write_metadata(path, doc)
    text = path.read_text()
    assert text.startswith("components:\n  prompt_1_of_2:\n    inputs:\n      input_ids:\n")
    assert "shape:\n        - 1\n" in text and "[" not in text  # block-style lists, as qai-hub-models writes
    assert md.read_metadata(path) == doc
    with pytest.raises(md.MetadataError, match="Two graphs map"):
        md.build_metadata([graphs[0], graphs[0]], qdir)
    path.write_text("runtime: genie\n")
    with pytest.raises(md.MetadataError, match="no `components`"):
        md.read_metadata(path)
