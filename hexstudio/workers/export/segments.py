"""The pieces a part graph is exported in, one torch module each: the token embedding (first part),
one decoder layer, and the head (final norm + lm_head, last part).

Exporting a part piece by piece keeps one decoder layer's weights (not the part's) inside the ONNX
exporter at a time; hexstudio.workers.export.stitch joins the pieces into the part graph. The maths is the
board's (Genie's I/O contract, docs/genie.md): static shapes, the KV cache as explicit inputs/outputs
(keys stored transposed, [KVH, 1, HD, P]; values [KVH, 1, P, HD]), an additive attention mask, and
the rotary cos/sin as inputs (Genie computes them from genie_config.json: hexstudio/shared/rope.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, cfg: Any) -> Dims:
        heads = int(cfg.num_attention_heads)
        kvh = int(getattr(cfg, "num_key_value_heads", None) or heads)
        hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return cls(int(cfg.hidden_size), heads, kvh, hd)


def embed_module(embed: Any) -> Any:
    """(input_ids) -> hidden: the token embedding, the first piece of part 1."""
    import torch
    from torch import nn

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = embed

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embed(ids.long())

    return Embed().eval()


def layer_module(layer: Any, dims: Dims) -> Any:
    """(hidden, mask, cos, sin, past_key, past_value) -> (hidden, key, value) for one decoder layer, in
    Genie's layout (qai-hub-models' Llama export): cos/sin half-width [1, 1, S, HD/2] computed outside
    the graph, applied to each head's two halves (the same rotation as transformers' rotate_half);
    past_key [KVH, 1, HD, P] (transposed), past_value [KVH, 1, P, HD]; key out [KVH, 1, HD, S] and
    value out [KVH, 1, S, HD] hold only this step's entries, keys after the rotation."""
    import torch
    from torch import nn

    heads, kvh, hd = dims.heads, dims.kv_heads, dims.head_dim
    groups = heads // kvh

    half = hd // 2

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(
            self,
            h: torch.Tensor,
            mask: torch.Tensor,
            cos: torch.Tensor,
            sin: torch.Tensor,
            pk: torch.Tensor,
            pv: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            s = h.shape[1]
            attn = self.layer.self_attn
            x = self.layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, s, heads, hd).transpose(1, 2)
            k = attn.k_proj(x).view(1, s, kvh, hd).transpose(1, 2)
            v = attn.v_proj(x).view(1, s, kvh, hd).transpose(1, 2)
            if getattr(attn, "q_norm", None) is not None:
                q = attn.q_norm(q)
                k = attn.k_norm(k)
            q = rotate(q, cos, sin)
            k = rotate(k, cos, sin)
            kt = k.transpose(2, 3)  # [1,KVH,HD,S]
            keys = torch.cat((pk.transpose(0, 1), kt), dim=3)  # [1,KVH,HD,CL]
            vals = torch.cat((pv.transpose(0, 1), v), dim=2)  # [1,KVH,CL,HD]
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                vals = vals.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, keys) / math.sqrt(hd) + mask
            probs = torch.softmax(scores, dim=-1)
            a = torch.matmul(probs, vals).transpose(1, 2).reshape(1, s, heads * hd)
            h = h + attn.o_proj(a)
            h = h + self.layer.mlp(self.layer.post_attention_layernorm(h))
            return h, kt.transpose(0, 1), v.transpose(0, 1)  # [KVH,1,HD,S], [KVH,1,S,HD]

    return Block().eval()


def head_module(norm: Any, lm_head: Any) -> Any:
    """(hidden) -> logits."""
    import torch
    from torch import nn

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = norm
            self.lm_head = lm_head

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.lm_head(self.norm(h))

    return Head().eval()
