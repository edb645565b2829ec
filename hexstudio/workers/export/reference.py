"""The checkpoint's own forward pass, layer by layer, for the float-fidelity check (validate stage).

transformers' own modules compute it (the decoder layer class, the rotary embedding with the model's
rope scaling, the final norm), each decoder layer filled from the safetensors files just before it runs
and returned to the meta device after (hexstudio.workers.export.weights.CheckpointWeights, as the export reads
them): memory holds one layer's fp32 weights, the token rows of the embedding and a block of the
lm_head's rows, never the model. Returns every layer's output hidden state and the logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_BYTES = 16 << 20


def checkpoint_forward(hf_dir: str | Path, token_ids: Sequence[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """([hidden state after layer i, [T, H]] for every layer, logits [T, V]) of the checkpoint on
    `token_ids` (positions 0..T-1, causal), in fp32."""
    import torch
    from safetensors import safe_open

    from hexstudio.workers.export.weights import CheckpointWeights

    src = CheckpointWeights(hf_dir)
    cfg = src.config
    inner = src.model.model
    ids = [int(t) for t in token_ids]
    t = len(ids)
    with torch.no_grad():
        key = src._key("model.embed_tokens.weight")
        if key is None:
            raise OSError(f"{hf_dir}: no embedding table in the safetensors files")
        with safe_open(str(src.index[key]), framework="pt") as sf:
            sl = sf.get_slice(key)
            x = torch.stack([sl[i : i + 1][0].to(torch.float32) for i in ids])[None]
        pos = torch.arange(t)[None]
        shared_rotary = getattr(inner, "rotary_emb", None)
        # the model's own rotary embedding computes cos/sin once for every layer; older transformers (4.45's
        # Mistral) give each attention its own, which the layer calls with position_ids itself
        rope_kwargs = (
            {"position_embeddings": _fresh_rotary(shared_rotary, cfg)(x, pos)}
            if shared_rotary is not None
            else {}
        )
        mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
        hidden: list[np.ndarray] = []
        for i, layer in enumerate(inner.layers):
            src.load(layer, f"model.layers.{i}.")
            own = getattr(layer.self_attn, "rotary_emb", None)
            if own is not None:  # its inv_freq is a non-persistent buffer, still on the meta device
                layer.self_attn.rotary_emb = _fresh_rotary(own, cfg)
            try:
                out = layer(x, attention_mask=mask, position_ids=pos, use_cache=False, **rope_kwargs)
            finally:
                src.release(layer)
            x = out[0] if isinstance(out, tuple) else out
            hidden.append(x[0].numpy().copy())
        src.load(inner.norm, "model.norm.")
        h = inner.norm(x)[0].numpy()
        src.release(inner.norm)
        key = src._key("lm_head.weight")
        if key is None:
            raise OSError(f"{hf_dir}: no lm_head weight in the safetensors files")
        with safe_open(str(src.index[key]), framework="pt") as sf:
            sl = sf.get_slice(key)
            rows, cols = (int(d) for d in sl.get_shape())
            logits: np.ndarray = np.empty((t, rows), np.float32)
            step = max(1, BLOCK_BYTES // (4 * cols))
            for r0 in range(0, rows, step):
                w = sl[r0 : min(rows, r0 + step)].to(torch.float32).numpy()
                logits[:, r0 : r0 + w.shape[0]] = h @ w.T
    return hidden, logits


def _fresh_rotary(module: Any, cfg: Any) -> Any:
    """A new rotary embedding of the model's own class on the CPU (the skeleton's is on the meta device):
    built from the config where the class takes one, else from the attention's (dim, positions, base)
    as transformers 4.45's Mistral builds it."""
    cls = type(module)
    try:
        return cls(config=cfg)
    except TypeError:
        return cls(module.dim, max_position_embeddings=module.max_position_embeddings, base=module.base)


def fidelity(
    graph_hidden: dict[int, np.ndarray],
    graph_logits: np.ndarray,
    ref_hidden: list[np.ndarray],
    ref_logits: np.ndarray,
    layer_tolerance: float,
) -> dict[str, Any]:
    """Compare the float deployment graphs with the checkpoint at the same positions: per layer the
    largest hidden-state difference relative to the reference's largest magnitude, the first layer over
    `layer_tolerance`, top-1 agreement and the largest logit difference."""
    layers: list[dict[str, Any]] = []
    first_bad: int | None = None
    for li in sorted(graph_hidden):
        a, b = graph_hidden[li], ref_hidden[li]
        rel = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))
        layers.append({"layer": li, "max_relative_error": rel})
        if first_bad is None and not rel <= layer_tolerance:
            first_bad = li
    top1 = float(np.mean(np.argmax(graph_logits, -1) == np.argmax(ref_logits, -1)))
    err = float(np.max(np.abs(graph_logits - ref_logits)))
    return {
        "top1_agreement": top1,
        "max_logit_error": err,
        "first_differing_layer": first_bad,
        "layers": layers,
    }
