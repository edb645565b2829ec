"""Static-shape ONNX graphs for one part of a Llama-family decoder, as the board runs it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workers.modelinfo import layer_ranges

MASK_VALUE = -1000.0  # additive mask; Qualcomm's -100 did not mask on larger models (facts/quantization.md)
OPSET = 17


def graph_name(kind: str, ar: int, context_length: int, part: int, parts: int) -> str:
    prefix = "prompt" if kind == "prompt_processor" else "token"
    return f"{prefix}_ar{ar}_cl{context_length}_{part}_of_{parts}"


def graph_io_names(part: int, parts: int, layers: range) -> tuple[list[str], list[str]]:
    inputs = ["input_ids" if part == 1 else "hidden_states_in", "attention_mask", "position_ids"]
    outputs = ["logits" if part == parts else "hidden_states_out"]
    for li in layers:
        inputs += [f"past_key_{li}_in", f"past_value_{li}_in"]
        outputs += [f"past_key_{li}_out", f"past_value_{li}_out"]
    return inputs, outputs


def load_hf_model(hf_dir: str | Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    return model


def _part_module(model: Any, start: int, stop: int, first: bool, last: bool) -> Any:
    import torch
    from torch import nn

    cfg = model.config
    inner = model.model
    heads = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    groups = heads // kvh
    rot = inner.rotary_emb
    inv_freq = rot.inv_freq.detach().clone().float()
    scaling = float(getattr(rot, "attention_scaling", 1.0))

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    class Part(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = inner.embed_tokens if first else None
            self.layers = nn.ModuleList(inner.layers[start:stop])
            self.norm = inner.norm if last else None
            self.lm_head = model.lm_head if last else None
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                    *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            h = self.embed(x.long()) if self.embed is not None else x
            s = h.shape[1]
            freqs = pos.float()[..., None] * self.inv_freq[None, None, :]        # [1,S,HD/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = (emb.cos() * scaling)[:, None]                                # [1,1,S,HD]
            sin = (emb.sin() * scaling)[:, None]
            outs: list[torch.Tensor] = []
            for i, layer in enumerate(self.layers):
                pk, pv = past[2 * i], past[2 * i + 1]                          # [1,KVH,HD,P], [1,KVH,P,HD]
                attn = layer.self_attn
                res = h
                x_ = layer.input_layernorm(h)
                q = attn.q_proj(x_).view(1, s, heads, hd).transpose(1, 2)
                k = attn.k_proj(x_).view(1, s, kvh, hd).transpose(1, 2)
                v = attn.v_proj(x_).view(1, s, kvh, hd).transpose(1, 2)
                if getattr(attn, "q_norm", None) is not None:
                    q = attn.q_norm(q)
                    k = attn.k_norm(k)
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                kt = k.transpose(2, 3)                                          # [1,KVH,HD,S]
                keys = torch.cat((pk, kt), dim=3)                               # [1,KVH,HD,CL]
                vals = torch.cat((pv, v), dim=2)                                # [1,KVH,CL,HD]
                if groups > 1:
                    keys_r = keys.repeat_interleave(groups, dim=1)
                    vals_r = vals.repeat_interleave(groups, dim=1)
                else:
                    keys_r, vals_r = keys, vals
                scores = torch.matmul(q, keys_r) / math.sqrt(hd) + mask
                probs = torch.softmax(scores, dim=-1)
                a = torch.matmul(probs, vals_r).transpose(1, 2).reshape(1, s, heads * hd)
                h = res + attn.o_proj(a)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
                outs += [kt, v]
            if self.norm is not None and self.lm_head is not None:
                h = self.lm_head(self.norm(h))
            return (h, *outs)

    return Part().eval()


def export_deployment_graphs(hf_dir: str | Path, out_dir: str | Path, context_length: int, ar_n: int,
                             parts: int, model: Any = None, kinds: tuple[str, ...] = ("prompt_processor",
                                                                                      "token_generator"),
                             seq_lens: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Export float ONNX graphs for every part and kind into out_dir/<graph>.onnx; returns the
    quantize.json "graphs" entries (paths relative to out_dir's parent)."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else load_hf_model(hf_dir)
    cfg = model.config
    heads = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    ranges = layer_ranges(cfg.num_hidden_layers, parts)
    graphs: list[dict[str, Any]] = []
    for kind in kinds:
        s = (seq_lens or {}).get(kind, ar_n if kind == "prompt_processor" else 1)
        past = context_length - s
        for k, (start, stop) in enumerate(ranges, start=1):
            first, last = k == 1, k == parts
            mod = _part_module(model, start, stop, first, last)
            x = (torch.zeros((1, s), dtype=torch.int32) if first
                 else torch.zeros((1, s, cfg.hidden_size), dtype=torch.float32))
            mask = torch.zeros((1, 1, s, context_length), dtype=torch.float32)
            pos = torch.arange(s, dtype=torch.int32)[None]
            kv = []
            for _ in range(start, stop):
                kv += [torch.zeros((1, kvh, hd, past)), torch.zeros((1, kvh, past, hd))]
            name = graph_name(kind, s, context_length, k, parts)
            ins, outs = graph_io_names(k, parts, range(start, stop))
            path = out / f"{name}.onnx"
            with torch.no_grad():
                torch.onnx.export(mod, (x, mask, pos, *kv), str(path), input_names=ins, output_names=outs,
                                  opset_version=OPSET, dynamo=False, do_constant_folding=True)
            graphs.append({"name": name, "kind": kind, "part": k, "seq_len": s, "layers": list(range(start, stop)),
                           "float_onnx": f"{out.name}/{name}.onnx", "inputs": ins, "outputs": outs})
    return graphs
