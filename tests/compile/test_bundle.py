"""The Genie bundle writer and the simulation bundle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers import bundle as gb

LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
               "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def _hexstudio(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("hexstudio")), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ})


def test_bundle_config_for_a_llama_31_8b_config_only_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    (tmp_path / "tokenizer.json").write_text("{}")
    out = _hexstudio("bundle", "config", "--model", str(tmp_path), "--device", "Dragonwing IQ-9075 EVK",
                     "--context-length", "4096")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)["dialog"]
    assert d["context"] == {"version": 1, "size": 4096, "n-vocab": 128256, "bos-token": 128000,
                            "eos-token": [128001, 128008, 128009]}
    pe = d["engine"]["model"]["positional-encoding"]
    assert pe["rope-theta"] == 500000.0
    assert pe["rope-scaling"]["rope-type"] == "llama3" and pe["rope-scaling"]["factor"] == 8.0
    assert d["engine"]["backend"]["QnnHtp"]["kv-dim"] == 128
    assert len(d["engine"]["model"]["binary"]["ctx-bins"]) == 5


def test_bundle_checks_refuse_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(gb.BundleError, match="weight sharing"):
        gb.check_device({"name": "old", "dsp_arch": "v68", "soc_model": 1})
    cfg = gb.genie_config(LLAMA_31_8B, 4096, ["a.bin"], 128)
    with pytest.raises(gb.BundleError, match="context"):
        gb.check_genie_config(cfg, LLAMA_31_8B, 2048)
    cfg["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"]["factor"] = 4.0
    with pytest.raises(gb.BundleError, match="rope scaling"):
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
    assert {"genie_config.json", "htp_backend_ext_config.json", "tokenizer.json", "tool-versions.yaml",
            "graphs.json"} <= names
    cfg = json.loads((bdir / "genie_config.json").read_text())["dialog"]
    assert all(b.startswith("sim/") and b.endswith(".onnx") and b in names for b in cfg["engine"]["model"]["binary"]["ctx-bins"])
    assert cfg["context"]["size"] == doc["context_length"] == 512
    # tampering is detected
    (bdir / "tokenizer.json").write_text("{}")
    assert gb.verify_bundle(bdir) == ["changed tokenizer.json"]
    (bdir / "tokenizer.json").write_text((compiled_sim_run / "artifacts" / "model" / "hf" / "tokenizer.json").read_text())
