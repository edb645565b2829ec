"""Float export fidelity (issue 19 item 3): for tiny random-init models built with transformers' own
classes, the exported float deployment pair (prompt processor then token generator, run one unit at a
time as the validate stage runs it) matches the checkpoint's own forward, layer by layer; a broken export
(rope scaling dropped from the positional encoding Genie computes) fails the check naming layer 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CL, AR, PROMPT, STEPS = 64, 16, 12, 6
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
LLAMA32 = {**LLAMA3, "factor": 32.0}
COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 300,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-untied-llama3-rope": ("LlamaConfig", {**COMMON, "rope_scaling": LLAMA3, "rope_theta": 500000.0}),
    "llama-tied-llama3.2-rope": (
        "LlamaConfig",
        {**COMMON, "rope_scaling": LLAMA32, "rope_theta": 500000.0, "tie_word_embeddings": True},
    ),
    "llama-head-dim-32": ("LlamaConfig", {**COMMON, "head_dim": 32}),
    "qwen2": ("Qwen2Config", {**COMMON, "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {**COMMON, "head_dim": 24}),
    "mistral": ("MistralConfig", {**COMMON, "sliding_window": None}),
}


def _model(tmp: Path, name: str) -> Path:
    import torch
    import transformers

    cls_name, kw = MODELS[name]
    # Qwen3 arrived in transformers 4.51 (the validated recipe pins 4.45)
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    cfg = getattr(transformers, cls_name)(**kw)
    torch.manual_seed(0)
    arch = cls_name.replace("Config", "ForCausalLM")
    model = getattr(transformers, arch)(cfg).eval()
    out = tmp / name
    model.save_pretrained(out, safe_serialization=True)
    return out


def _check(hf: Path, tmp: Path, pe_edit: Any = None) -> dict[str, Any]:
    from hexstudio.shared.rope import genie_positional_encoding
    from hexstudio.workers.arloop import UnitSessions, prefill_calls, run_unit_major
    from hexstudio.workers.export import export_deployment_graphs
    from hexstudio.workers.quant.rununits import split_for_run
    from hexstudio.workers.validate import EXPORT_THRESHOLDS, _export_fidelity, _hidden_names

    cfg = json.loads((hf / "config.json").read_text())
    pe = genie_positional_encoding(cfg, CL)
    if pe_edit is not None:
        pe = pe_edit(pe)
    graphs = export_deployment_graphs(hf, tmp / "q" / "float", CL, AR, 2)
    hidden = _hidden_names({"num_layers": cfg["num_hidden_layers"]})
    names = {n for ns in hidden.values() for n in ns}
    units = {
        (g["kind"], g["part"]): [
            u.to_json() for u in split_for_run(tmp / "q" / g["float_onnx"], tmp / "u", g["name"], names)
        ]
        for g in graphs
    }
    us = UnitSessions(units, graphs, positional_encoding=pe, context_length=CL)
    rng = np.random.default_rng(1)
    seq = [int(t) for t in rng.integers(2, cfg["vocab_size"], PROMPT + STEPS)]
    calls, n_past = prefill_calls(0, seq[:PROMPT], 0, AR, CL)
    for t in seq[PROMPT:]:
        calls.append((0, "token_generator", [t], n_past))
        n_past += 1
    capture: dict[int, dict[str, Any]] = {i: {} for i in range(len(calls))}
    kv = graphs[0]
    kvh = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert kv["inputs"][4] == "past_key_0_in"
    logits = run_unit_major(us, calls, {0: us.cache(kvh, hd)}, CL, capture=capture)
    return _export_fidelity(
        hf,
        seq,
        calls,
        [capture[i] for i in range(len(calls))],
        np.stack(logits[-(STEPS + 1) :]),
        hidden,
        dict(EXPORT_THRESHOLDS),
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float_pair_matches_the_checkpoint(name: str, tmp_path: Path) -> None:
    res = _check(_model(tmp_path, name), tmp_path)
    assert res["first_differing_layer"] is None, res["layers"]
    assert all(c["ok"] for c in res["checks"].values()), res["checks"]
    assert res["checks"]["export_layer_error"]["value"] < 1e-4
    assert len(res["layers"]) == 3


def test_dropped_rope_scaling_fails_naming_the_first_layer(tmp_path: Path) -> None:
    hf = _model(tmp_path, "llama-untied-llama3-rope")

    def drop(pe: dict[str, Any]) -> dict[str, Any]:
        assert "rope-scaling" in pe
        return {k: v for k, v in pe.items() if k != "rope-scaling"}

    res = _check(hf, tmp_path, drop)
    assert res["first_differing_layer"] == 0
    assert not res["checks"]["export_layer_error"]["ok"]
