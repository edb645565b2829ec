"""Hugging Face config.json documents of real models, for the tests that inspect, plan, estimate or bundle them
without downloading anything. Copy one (`{**LLAMA_31_8B, ...}`) to change it."""

from __future__ import annotations

from typing import Any

# meta-llama/Llama-3.1-8B-Instruct's config.json: the shape fields, its tokens and its llama3 rope scaling
LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
