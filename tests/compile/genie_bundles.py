"""Small synthetic Genie bundles for the contract checks (no quantization run, no real binaries).

`write_bundle(path)` lays a bundle out as qai-hub-models does (quic/ai-hub-models v0.46,
qai_hub_models/models/_shared/llm/export.py and model.py, utils/llm_helpers.py; /tmp research notes
summarised in docs/genie.md): `<model>_part_{i}_of_{n}.bin` (small dummy bytes), genie_config.json as
`create_genie_config` writes it (but with the model's own rope-scaling values instead of its hard-coded
factor 8.0), htp_backend_ext_config.json, tool-versions.yaml (`qairt:` only), metadata.yaml (each
component's I/O: shape, dtype, quantization), tokenizer.json, tokenizer_config.json, config.json.

The defaults describe Llama 3.2 1B Instruct (16 layers, head_dim 64, 8 KV heads, llama3 rope factor 32)
split as qai-hub-models splits it: part 1 the embedding Gather, part 2 layers 0-7, part 3 layers 8-15 and
the LM head; CL 4096, AR 128 and 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

LLAMA_32_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "tie_word_embeddings": True,
    "rope_scaling": {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
MODEL_ID = "llama_v3_2_1b_instruct"
QAIRT = "2.42.0.251225135753_193295"
SPECIALS = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
}

# The files a Genie bundle lays out beside its context binaries, as qai-hub-models does; tool-versions.yaml
# aside (only a real compile has a QAIRT version to write).
BUNDLE_FILES = (
    "genie_config.json",
    "htp_backend_ext_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "metadata.yaml",
)

# encodings (AIMET convention real = (q + offset) * scale): one per shared tensor
MASK_Q = {"scale": 50.0 / 65535, "offset": -65535}  # [-50, 0]: the largest code is 0.0
ROPE_Q = {"scale": 2.0 / 65535, "offset": -32768}  # cos and sin: one encoding
KV_Q = {"scale": 0.05, "offset": -128}  # 8-bit symmetric
HIDDEN_Q = {"scale": 0.0004, "offset": -32768}
LOGITS_Q = {"scale": 0.001, "offset": -30000}


def boundary(layer: int | None, slash: bool = True) -> str:
    """A part boundary's name: metadata.yaml keeps qai-hub-models' ONNX (slash) form."""
    if layer is None:
        return (
            "/model/model/embed_tokens/Gather_output_0"
            if slash
            else "_model_model_embed_tokens_Gather_output_0"
        )
    return (
        f"/model/model/layers.{layer}/Add_1_output_0"
        if slash
        else f"_model_model_layers_{layer}_Add_1_output_0"
    )


def _t(shape: list[int], dtype: str, q: dict[str, Any] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
    if q is not None:
        d["quantization_parameters"] = dict(q)
    return d


def graph_specs(
    hf: dict[str, Any] = LLAMA_32_1B,
    cl: int = 4096,
    parts: list[list[int] | None] | None = None,
    ars: tuple[int, ...] = (128, 1),
    slash: bool = True,
) -> dict[str, dict[str, Any]]:
    """metadata.yaml components: {f"{prompt|token}_{i}_of_{n}": {"inputs", "outputs"}}. `parts`: the layers of
    each part (None: the embedding-only first part)."""
    L, hd, kvh = hf["num_hidden_layers"], hf["head_dim"], hf["num_key_value_heads"]
    parts = parts if parts is not None else [None, list(range(0, 8)), list(range(8, L))]
    n = len(parts)
    out: dict[str, dict[str, Any]] = {}
    for ar in ars:
        inst = "prompt" if ar > 1 else "token"
        prev_layer: int | None = None
        for i, layers in enumerate(parts, 1):
            ins: dict[str, Any] = {}
            outs: dict[str, Any] = {}
            if i == 1:
                ins["input_ids"] = _t([1, ar], "int32")
            else:
                ins[boundary(prev_layer, slash)] = _t([1, ar, hf["hidden_size"]], "uint16", HIDDEN_Q)
            if layers:
                ins["attention_mask"] = _t([1, 1, ar, cl], "uint16", MASK_Q)
                ins["position_ids_cos"] = _t([1, 1, ar, hd // 2], "uint16", ROPE_Q)
                ins["position_ids_sin"] = _t([1, 1, ar, hd // 2], "uint16", ROPE_Q)
                for layer in layers:
                    ins[f"past_key_{layer}_in"] = _t([kvh, 1, hd, cl - ar], "uint8", KV_Q)
                    ins[f"past_value_{layer}_in"] = _t([kvh, 1, cl - ar, hd], "uint8", KV_Q)
            if i == n:
                outs["logits"] = _t([1, ar, hf["vocab_size"]], "uint16", LOGITS_Q)
            else:
                last = layers[-1] if layers else None
                outs[boundary(last, slash)] = _t([1, ar, hf["hidden_size"]], "uint16", HIDDEN_Q)
                prev_layer = last
            for layer in layers or []:
                outs[f"past_key_{layer}_out"] = _t([kvh, 1, hd, ar], "uint8", KV_Q)
                outs[f"past_value_{layer}_out"] = _t([kvh, 1, ar, hd], "uint8", KV_Q)
            out[f"{inst}_{i}_of_{n}"] = {"inputs": ins, "outputs": outs}
    return out


def genie_config(
    hf: dict[str, Any] = LLAMA_32_1B, cl: int = 4096, n: int = 3, model_id: str = MODEL_ID
) -> dict[str, Any]:
    """genie_config.json as qai-hub-models' create_genie_config writes it for a model with rope scaling
    (pos-id-dim/rope-theta removed from QnnHtp, positional-encoding added), with the model's own factor."""
    rs = hf["rope_scaling"]
    return {
        "dialog": {
            "version": 1,
            "type": "basic",
            "context": {
                "version": 1,
                "size": cl,
                "n-vocab": hf["vocab_size"],
                "bos-token": hf["bos_token_id"],
                "eos-token": hf["eos_token_id"],
            },
            "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
            "tokenizer": {"version": 1, "path": "tokenizer.json"},
            "engine": {
                "version": 1,
                "n-threads": 3,
                "backend": {
                    "version": 1,
                    "type": "QnnHtp",
                    "QnnHtp": {
                        "version": 1,
                        "use-mmap": True,
                        "spill-fill-bufsize": 0,
                        "mmap-budget": 0,
                        "poll": True,
                        "cpu-mask": "0xe0",
                        "kv-dim": hf["head_dim"],
                        "allow-async-init": False,
                    },
                    "extensions": "htp_backend_ext_config.json",
                },
                "model": {
                    "version": 1,
                    "type": "binary",
                    "binary": {
                        "version": 1,
                        "ctx-bins": [f"{model_id}_part_{i}_of_{n}.bin" for i in range(1, n + 1)],
                    },
                    "positional-encoding": {
                        "type": "rope",
                        "rope-dim": hf["head_dim"] // 2,
                        "rope-theta": int(hf["rope_theta"]),
                        "rope-scaling": {
                            "rope-type": rs["rope_type"],
                            "factor": rs["factor"],
                            "low-freq-factor": rs["low_freq_factor"],
                            "high-freq-factor": rs["high_freq_factor"],
                            "original-max-position-embeddings": rs["original_max_position_embeddings"],
                        },
                    },
                },
            },
        }
    }


def tokenizer_files(hf: dict[str, Any] = LLAMA_32_1B) -> tuple[dict[str, Any], dict[str, Any]]:
    """A tiny tokenizer.json (a byte-level BPE with the special tokens as added tokens) and
    tokenizer_config.json naming bos/eos as Llama 3.x Instruct does."""
    vocab = {"h": 0, "i": 1, "hi": 2}
    tok = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "special": True,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
            }
            for i, c in SPECIALS.items()
        ],
        "model": {"type": "BPE", "vocab": vocab, "merges": ["h i"]},
    }
    tc = {
        "bos_token": SPECIALS[hf["bos_token_id"]],
        "eos_token": "<|eot_id|>",
        "added_tokens_decoder": {str(i): {"content": c, "special": True} for i, c in SPECIALS.items()},
    }
    return tok, tc


def write_bundle(
    path: Path,
    *,
    hf: dict[str, Any] = LLAMA_32_1B,
    cl: int = 4096,
    components: dict[str, dict[str, Any]] | None = None,
    cfg: dict[str, Any] | None = None,
    model_id: str = MODEL_ID,
    soc_model: int = 77,
    dsp_arch: str = "v73",
) -> Path:
    """The bundle folder qai-hub-models' export writes (`<model>-genie-w4a16-<chipset>/`)."""
    path.mkdir(parents=True, exist_ok=True)
    comps = components if components is not None else graph_specs(hf, cl)
    n = max(int(k.rsplit("_of_", 1)[1]) for k in comps)
    cfg = cfg if cfg is not None else genie_config(hf, cl, n, model_id)
    (path / "genie_config.json").write_text(json.dumps(cfg, indent=4))
    for b in cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]:
        (path / b).write_bytes(b"QNN context binary stand-in " + b.encode())
    (path / "htp_backend_ext_config.json").write_text(
        json.dumps(
            {
                "devices": [
                    {
                        "soc_model": soc_model,
                        "dsp_arch": dsp_arch,
                        "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}],
                    }
                ],
                "memory": {"mem_type": "shared_buffer"},
                "context": {"weight_sharing_enabled": True},
            }
        )
    )
    (path / "tool-versions.yaml").write_text(f"qairt: {QAIRT}\n")
    (path / "metadata.yaml").write_text(
        yaml.safe_dump({"components": comps, "precision": "w4a16", "runtime": "genie"}, sort_keys=False)
    )
    tok, tc = tokenizer_files(hf)
    (path / "tokenizer.json").write_text(json.dumps(tok))
    (path / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    (path / "config.json").write_text(json.dumps(hf, indent=2))
    return path


if __name__ == "__main__":  # regenerate the checked-in fixture
    write_bundle(Path(__file__).parent / "fixtures" / f"{MODEL_ID}-genie-w4a16-qualcomm_qcs9075")
