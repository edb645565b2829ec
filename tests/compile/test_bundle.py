"""The Genie bundle writer and the simulation bundle."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared import bundle as gb
from hexstudio.shared.data import builtin_model_dir
from hexstudio.shared.run_settings import RunSettings
from tests.compile.genie_bundles import BUNDLE_FILES
from tests.support.cli import hexstudio as _hexstudio
from tests.support.configs import LLAMA_31_8B


def test_bundle_config_for_a_llama_31_8b_config_only_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    (tmp_path / "tokenizer.json").write_text("{}")
    out = _hexstudio(
        "bundle",
        "config",
        "--model",
        str(tmp_path),
        "--device",
        "Dragonwing IQ-9075 EVK",
        "--context-length",
        "4096",
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)["dialog"]
    assert d["context"] == {
        "version": 1,
        "size": 4096,
        "n-vocab": 128256,
        "bos-token": 128000,
        "eos-token": [128001, 128008, 128009],
    }
    pe = d["engine"]["model"]["positional-encoding"]
    assert pe["rope-theta"] == 500000.0
    assert pe["rope-scaling"]["rope-type"] == "llama3" and pe["rope-scaling"]["factor"] == 8.0
    assert d["engine"]["backend"]["QnnHtp"]["kv-dim"] == 128
    assert d["engine"]["model"]["binary"]["ctx-bins"] == [
        f"{gb.model_slug(tmp_path.name)}_part_{i}_of_5.bin" for i in range(1, 6)
    ]
    # Genie's own validation accepts it, and so does the whole-bundle checker's config part
    from hexstudio.shared.bundle.genie_schema import dialog_create_errors, genie_config_errors

    assert (
        genie_config_errors(json.loads(out.stdout)) == []
        and dialog_create_errors(json.loads(out.stdout)) == []
    )
    for section in (
        d,
        d["context"],
        d["sampler"],
        d["tokenizer"],
        d["engine"],
        d["engine"]["backend"],
        d["engine"]["backend"]["QnnHtp"],
        d["engine"]["model"],
        d["engine"]["model"]["binary"],
    ):
        assert section["version"] == 1
    assert (
        "pos-id-dim" not in d["engine"]["backend"]["QnnHtp"]
        and "rope-theta" not in d["engine"]["backend"]["QnnHtp"]
    )


def test_bundle_checks_refuse_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(gb.BundleError, match="weight sharing"):
        gb.check_device({"name": "old", "dsp_arch": "v68", "soc_model": 1}, lpbq=False)
    cfg = gb.genie_config(LLAMA_31_8B, 4096, ["a.bin"], 128)
    with pytest.raises(gb.BundleError, match="context"):
        gb.check_genie_config(cfg, LLAMA_31_8B, 2048)
    cfg["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"]["factor"] = 4.0
    with pytest.raises(gb.BundleError, match="rope settings differ"):
        gb.check_genie_config(cfg, LLAMA_31_8B, 4096)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    bad = _hexstudio("bundle", "config", "--model", str(tmp_path), "--context-length", "1000")
    assert bad.returncode == 1 and "not a multiple of AR-N 128" in bad.stderr


def test_simulation_bundle_is_complete_and_labeled(compiled_sim_run: Path) -> None:
    bdir = compiled_sim_run / "artifacts" / "compile" / "bundle"
    doc = json.loads((bdir / "bundle.json").read_text())
    assert doc["simulated"] is True and doc["emulated"] is False
    assert gb.verify_bundle(bdir) == []
    names = {f["path"] for f in doc["files"]}
    # laid out as qai-hub-models lays out a real bundle; the context binaries are simulated ones
    assert {*BUNDLE_FILES, "tiny_llama_part_1_of_2.bin", "tiny_llama_part_2_of_2.bin"} <= names
    cfg = json.loads((bdir / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == [
        "tiny_llama_part_1_of_2.bin",
        "tiny_llama_part_2_of_2.bin",
    ]
    from hexstudio.workers.genie_sim.simbin import read_sim_bin

    part1 = read_sim_bin(bdir / "tiny_llama_part_1_of_2.bin")
    assert [g["name"] for g in part1] == ["prompt_ar128_cl512_1_of_2", "token_ar1_cl512_1_of_2"]
    assert all(g["onnx"] in names for g in part1)
    assert part1[0]["inputs"]["past_key_0_in"] == {
        "shape": [2, 1, 64, 384],
        "dtype": "uint8",
        "quantization_parameters": part1[0]["outputs"]["past_key_0_out"]["quantization_parameters"],
    }
    from hexstudio.shared.bundle.check import check_bundle

    assert [f for f in check_bundle(bdir) if f.severity == "error"] == []
    assert cfg["context"]["size"] == doc["context_length"] == 512
    # the simulation bundle passes Genie's schema too (backend QnnHtp; bundle.json says simulated)
    from hexstudio.shared.bundle.genie_schema import dialog_create_errors, genie_config_errors

    full = json.loads((bdir / "genie_config.json").read_text())
    assert genie_config_errors(full) == [] and dialog_create_errors(full) == []
    assert cfg["engine"]["backend"]["type"] == "QnnHtp"
    # tampering is detected
    (bdir / "tokenizer.json").write_text("{}")
    assert gb.verify_bundle(bdir) == ["changed tokenizer.json"]
    (bdir / "tokenizer.json").write_text(
        (compiled_sim_run / "artifacts" / "model" / "hf" / "tokenizer.json").read_text()
    )


# -- rope settings: copied field by field, from either config.json layout --------------------------------
def _pe(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(cfg["dialog"]["engine"]["model"]["positional-encoding"])


def test_llama3_rope_scaling_is_copied_field_by_field() -> None:
    hf = {
        **LLAMA_31_8B,
        "rope_scaling": {
            "factor": 32.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "llama3",
        },
    }
    pe = _pe(gb.genie_config(hf, 4096, ["a.bin"], 128))
    assert pe == {
        "type": "rope",
        "rope-dim": 64,
        "rope-theta": 500000,
        "rope-scaling": {
            "rope-type": "llama3",
            "factor": 32.0,
            "low-freq-factor": 2.0,
            "high-freq-factor": 8.0,
            "original-max-position-embeddings": 4096,
        },
    }
    # a missing field is refused, never filled with an invented default
    partial = {**LLAMA_31_8B, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(gb.BundleError, match="lacks low_freq_factor"):
        gb.genie_config(partial, 4096, ["a.bin"], 128)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("low-freq-factor", 2.0, "rope settings differ.*inverse frequency"),
        ("high-freq-factor", 1.0, "rope settings differ.*inverse frequency"),
        ("original-max-position-embeddings", 4096, "rope settings differ.*inverse frequency"),
        ("factor", 4.0, "rope settings differ.*inverse frequency"),
        ("rope-type", "linear", "refused by Genie: Rope type not supportedlinear"),
    ],
)
def test_the_pre_write_check_compares_the_rope_numerically(field: str, value: Any, match: str) -> None:
    cfg = gb.genie_config(LLAMA_31_8B, 4096, ["a.bin"], 128)
    gb.check_genie_config(cfg, LLAMA_31_8B, 4096)  # as written: passes
    cfg["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"][field] = value
    with pytest.raises(gb.BundleError, match=match):
        gb.check_genie_config(cfg, LLAMA_31_8B, 4096)
    cfg = gb.genie_config(LLAMA_31_8B, 4096, ["a.bin"], 128)
    cfg["dialog"]["engine"]["model"]["positional-encoding"]["rope-theta"] = 10000
    with pytest.raises(gb.BundleError, match="rope settings differ"):
        gb.check_genie_config(cfg, LLAMA_31_8B, 4096)
    cfg = gb.genie_config(LLAMA_31_8B, 4096, ["a.bin"], 128)
    cfg["dialog"]["engine"]["backend"]["QnnHtp"]["kv-dim"] = 64
    with pytest.raises(gb.BundleError, match="kv-dim 64 differs from the model's head_dim 128"):
        gb.check_genie_config(cfg, LLAMA_31_8B, 4096)


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "linear", "factor": 2.0},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
            "short_factor": [1.0 + i / 64 for i in range(64)],
            "long_factor": [2.0 + i / 16 for i in range(64)],
        },
    ],
)
def test_rope_scalings_genie_can_compute_are_mapped_and_pass_genie(
    tmp_path: Path, scaling: dict[str, Any]
) -> None:
    """linear, YaRN, dynamic (within its range) and longrope are expressed in Genie's terms (llama3/longrope/
    none) and the tables Genie computes from the config equal the model's."""
    from hexstudio.shared import rope
    from hexstudio.shared.bundle.genie_schema import genie_config_errors

    hf = {**LLAMA_31_8B, "rope_scaling": scaling}
    cfg = gb.genie_config(hf, 4096, ["a.bin"], 128)
    assert genie_config_errors(cfg) == []
    gb.check_genie_config(cfg, hf, 4096)
    assert rope.rope_mismatch(cfg["dialog"]["engine"]["model"]["positional-encoding"], hf, 4096) is None
    (tmp_path / "config.json").write_text(json.dumps(hf))
    out = _hexstudio("bundle", "config", "--model", str(tmp_path))
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "hf,match",
    [
        ({**LLAMA_31_8B, "rope_scaling": {"rope_type": "mrope", "factor": 2.0}}, "type 'mrope'"),
        ({**LLAMA_31_8B, "partial_rotary_factor": 0.5}, "rotates only part"),
    ],
)
def test_rope_genie_cannot_compute_is_refused(tmp_path: Path, hf: dict[str, Any], match: str) -> None:
    from hexstudio.shared import modelinfo

    with pytest.raises(gb.BundleError, match=match):
        gb.genie_config(hf, 4096, ["a.bin"], 128)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    out = _hexstudio("bundle", "config", "--model", str(tmp_path))
    assert out.returncode == 1 and "Traceback" not in out.stderr and re.search(match, out.stderr)
    info = modelinfo.inspect_config(hf)  # refused at inspect, hours before compile
    assert info["supported"] is False and re.search(match, info["reason"])


def test_a_dynamic_rope_beyond_its_range_is_refused_at_compile_not_at_inspect() -> None:
    from hexstudio.shared import modelinfo

    hf = {
        **LLAMA_31_8B,
        "max_position_embeddings": 2048,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
    }
    assert modelinfo.inspect_config(hf)["supported"] is True
    gb.genie_config(hf, 2048, ["a.bin"], 128)
    with pytest.raises(gb.BundleError, match="dynamic"):
        gb.genie_config(hf, 4096, ["a.bin"], 128)


def test_bos_eos_are_numbers_never_null() -> None:
    no_bos = {k: v for k, v in LLAMA_31_8B.items() if k != "bos_token_id"}
    ctx = gb.genie_config(no_bos, 4096, ["a.bin"], 128)["dialog"]["context"]
    assert ctx["bos-token"] == -1 and ctx["eos-token"] == [128001, 128008, 128009]
    assert (
        gb.genie_config({**LLAMA_31_8B, "eos_token_id": 2}, 4096, ["a.bin"], 128)["dialog"]["context"][
            "eos-token"
        ]
        == 2
    )
    with pytest.raises(gb.BundleError, match="no eos_token_id"):
        gb.genie_config({**LLAMA_31_8B, "eos_token_id": None}, 4096, ["a.bin"], 128)


def test_default_rope_and_the_rope_parameters_layout(tmp_path: Path) -> None:
    # {"rope_type": "default"}: no scaling; positional-encoding still carries theta and rope-dim (QnnHtp never)
    hf = {**LLAMA_31_8B, "rope_scaling": {"rope_type": "default"}, "rope_theta": 250000.0}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    out = _hexstudio("bundle", "config", "--model", str(tmp_path))
    assert out.returncode == 0, out.stderr
    eng = json.loads(out.stdout)["dialog"]["engine"]
    assert eng["model"]["positional-encoding"] == {"type": "rope", "rope-dim": 64, "rope-theta": 250000}
    assert "pos-id-dim" not in eng["backend"]["QnnHtp"] and "rope-theta" not in eng["backend"]["QnnHtp"]

    # transformers 5 keeps theta (and the scaling) under rope_parameters
    t5 = {k: v for k, v in LLAMA_31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    t5["rope_parameters"] = {**LLAMA_31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert gb.rope_settings(t5) == (500000.0, t5["rope_parameters"])
    assert gb.genie_config(t5, 4096, ["a.bin"], 128) == gb.genie_config(LLAMA_31_8B, 4096, ["a.bin"], 128)
    t5_plain = {**t5, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
    pe = gb.genie_config(t5_plain, 4096, ["a.bin"], 128)["dialog"]["engine"]["model"]["positional-encoding"]
    assert pe["rope-theta"] == 1000000


def test_the_builtin_model_gets_its_real_theta() -> None:
    hf = json.loads((builtin_model_dir() / "config.json").read_text())
    assert hf["rope_parameters"]["rope_theta"] == 500000.0
    # as shipped, and in the pure transformers-5 layout (theta only under rope_parameters)
    t5_only = {k: v for k, v in hf.items() if k != "rope_theta"}
    for layout in (hf, t5_only):
        cfg = gb.genie_config(layout, 512, ["a.bin"], int(hf["head_dim"]))
        gb.check_genie_config(cfg, layout, 512)
        assert gb.genie_rope(cfg) == {"theta": 500000.0, "dim": 32, "scaling": None}


def test_the_sim_bundle_of_the_builtin_model_carries_its_theta(compiled_sim_run: Path) -> None:
    cfg = json.loads(
        (compiled_sim_run / "artifacts" / "compile" / "bundle" / "genie_config.json").read_text()
    )
    assert gb.genie_rope(cfg)["theta"] == 500000.0


# -- device and context checks ----------------------------------------------------------------------------
def test_each_device_check_can_fire() -> None:
    with pytest.raises(gb.BundleError, match="LPBQ"):  # v68: no LPBQ (checked first)
        gb.check_device({"name": "old", "dsp_arch": "v68", "soc_model": 1})
    with pytest.raises(gb.BundleError, match="weight sharing"):  # v68 without LPBQ weights: weight sharing
        gb.check_device({"name": "old", "dsp_arch": "v68", "soc_model": 1}, lpbq=False)
    with pytest.raises(gb.BundleError, match="weight sharing"):  # v69: LPBQ fine, no weight sharing
        gb.check_device({"name": "8g1", "dsp_arch": "v69", "soc_model": 36, "weight_sharing": False})
    with pytest.raises(gb.BundleError, match="weight sharing"):  # v73 whose attribute says no
        gb.check_device({"name": "x", "dsp_arch": "v73", "soc_model": 2, "weight_sharing": False})
    gb.check_device({"name": "iq9", "dsp_arch": "v73", "soc_model": 77, "weight_sharing": True})


def test_compiled_context_length_comes_from_the_graph_names() -> None:
    names = ["prompt_ar128_cl4096_1_of_2", "token_ar1_cl4096_1_of_2", "prompt_ar128_cl4096_2_of_2"]
    assert gb.compiled_context_length(names) == 4096
    # a second context length must hold every graph the first does (Genie switches between whole variants)
    with pytest.raises(gb.BundleError, match=r"not the same set .*prompt_ar128_cl2048_1_of_2"):
        gb.compiled_context_length([*names, "token_ar1_cl2048_1_of_2", "prompt_ar128_cl2048_2_of_2"])
    both = [*names, *(n.replace("cl4096", "cl2048") for n in names)]
    assert gb.compiled_context_length(both) == 4096  # the largest: genie_config's context size
    with pytest.raises(gb.BundleError, match="does not name its context length"):
        gb.compiled_context_length(["prompt_part1"])


def _fake_quantize(
    tmp_path: Path, hf: dict[str, Any], context_length: int, graph_cl: int
) -> tuple[Path, Path]:
    qdir, hf_dir = tmp_path / "quantize", tmp_path / "hf"
    (qdir / "sim").mkdir(parents=True)
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(hf))
    (hf_dir / "tokenizer.json").write_text("{}")
    graphs = []
    for kind, prefix, ar in (("prompt_processor", "prompt", 128), ("token_generator", "token", 1)):
        name = f"{prefix}_ar{ar}_cl{graph_cl}_1_of_1"
        (qdir / "sim" / f"{name}.onnx").write_bytes(b"onnx")
        graphs.append({"name": name, "kind": kind, "part": 1, "sim_onnx": f"sim/{name}.onnx"})
    (qdir / "quantize.json").write_text(
        json.dumps(
            {"context_length": context_length, "ar_n": 128, "parts": 1, "head_dim": 128, "graphs": graphs}
        )
    )
    return qdir, hf_dir


@pytest.mark.parametrize("case", ["context", "rope"])
def test_the_compile_stage_check_fails_as_a_clear_worker_error(tmp_path: Path, case: str) -> None:
    from hexstudio.shared.bundle.genie_schema import genie_config_errors
    from hexstudio.workers.genie_config import checked_genie_config
    from hexstudio.workers.runtime import WorkerError

    if case == "context":  # quantize.json says 1024, the graphs were exported at 512
        qdir, hf_dir = _fake_quantize(tmp_path, LLAMA_31_8B, 1024, 512)
        match = "context size 1024 differs from the compiled context length 512"
    else:
        qdir, hf_dir = _fake_quantize(
            tmp_path, {**LLAMA_31_8B, "rope_scaling": {"type": "mrope", "factor": 2.0}}, 512, 512
        )
        match = "type 'mrope'"
    q = json.loads((qdir / "quantize.json").read_text())
    hf = json.loads((hf_dir / "config.json").read_text())
    with pytest.raises(WorkerError) as ei:  # before anything is written or uploaded
        checked_genie_config(hf, hf_dir, q, ["m_part_1_of_1.bin"], RunSettings())
    assert ei.value.code == "bundle_check" and match in ei.value.message and ei.value.hint
    # the same inputs with matching graphs give a config Genie accepts
    qdir, hf_dir = _fake_quantize(tmp_path / "ok", LLAMA_31_8B, 512, 512)
    cfg = checked_genie_config(
        LLAMA_31_8B,
        hf_dir,
        json.loads((qdir / "quantize.json").read_text()),
        ["m_part_1_of_1.bin"],
        RunSettings(),
    )
    assert cfg["dialog"]["context"]["size"] == 512 and genie_config_errors(cfg) == []


def test_metadata_says_the_precision_the_run_quantized_at(tmp_path: Path) -> None:
    """The local and simulator bundles' metadata.yaml said w4a16 whatever the run's weight and activation bits
    (only AI Hub's passed them): it follows quantize.json's precision block now, on every compile path."""
    from hexstudio.workers import bundle_metadata as gm

    (tmp_path / "quantize.json").write_text(
        json.dumps({"precision": {"weights": "int8 LPBQ block 64", "activations": "int8"}})
    )
    assert gm.build_metadata([], tmp_path)["precision"] == "w8a8"
    (tmp_path / "quantize.json").unlink()
    assert gm.build_metadata([], tmp_path)["precision"] == "w4a16"  # a quantize.json that says none
    assert gm.build_metadata([], tmp_path, "w4a8")["precision"] == "w4a8"
