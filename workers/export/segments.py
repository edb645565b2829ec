"""The pieces a part graph is exported in, one torch module each: the rotary prologue (with the
embedding in the first part), one decoder layer, and the head (final norm + lm_head, last part).

Exporting a part piece by piece keeps one decoder layer's weights (not the part's) inside the ONNX
exporter at a time; workers.export.stitch joins the pieces into the part graph. The maths is the
board's: static shapes, the KV cache as explicit inputs/outputs (keys stored transposed,
[1, KVH, HD, P]; values [1, KVH, P, HD]), an additive attention mask and explicit positions.
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


def rope_module(embed: Any, inv_freq: Any, scaling: float) -> Any:
    """(input_ids, position_ids) -> (hidden, cos, sin) with the embedding, else
    (position_ids) -> (cos, sin). cos/sin are [1, 1, S, HD]."""
    import torch
    from torch import nn

    class Rope(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = embed
            self.register_buffer("inv_freq", inv_freq.detach().clone().float(), persistent=False)

        def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            pos = inputs[-1]
            freqs = pos.float()[..., None] * self.inv_freq[None, None, :]        # [1,S,HD/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = (emb.cos() * scaling)[:, None]                                # [1,1,S,HD]
            sin = (emb.sin() * scaling)[:, None]
            if self.embed is None:
                return cos, sin
            return self.embed(inputs[0].long()), cos, sin

    return Rope().eval()


def layer_module(layer: Any, dims: Dims) -> Any:
    """(hidden, mask, cos, sin, past_key, past_value) -> (hidden, key, value) for one decoder layer;
    key is this step's keys transposed [1, KVH, HD, S], value [1, KVH, S, HD]."""
    import torch
    from torch import nn

    heads, kvh, hd = dims.heads, dims.kv_heads, dims.head_dim
    groups = heads // kvh

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, h: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    pk: torch.Tensor, pv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            s = h.shape[1]
            attn = self.layer.self_attn
            x = self.layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, s, heads, hd).transpose(1, 2)
            k = attn.k_proj(x).view(1, s, kvh, hd).transpose(1, 2)
            v = attn.v_proj(x).view(1, s, kvh, hd).transpose(1, 2)
            if getattr(attn, "q_norm", None) is not None:
                q = attn.q_norm(q)
                k = attn.k_norm(k)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            kt = k.transpose(2, 3)                                              # [1,KVH,HD,S]
            keys = torch.cat((pk, kt), dim=3)                                   # [1,KVH,HD,CL]
            vals = torch.cat((pv, v), dim=2)                                    # [1,KVH,CL,HD]
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                vals = vals.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, keys) / math.sqrt(hd) + mask
            probs = torch.softmax(scores, dim=-1)
            a = torch.matmul(probs, vals).transpose(1, 2).reshape(1, s, heads * hd)
            h = h + attn.o_proj(a)
            h = h + self.layer.mlp(self.layer.post_attention_layernorm(h))
            return h, kt, v

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
