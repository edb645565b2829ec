"""Static-shape ONNX graphs for one part of a Llama-family decoder, as the board runs it."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable
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
    """The whole model in fp32 (tests and small models only: the quantize stage loads one part at a
    time with load_part_model)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    return model


def safetensors_index(hf_dir: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (reads only the files' headers)."""
    from safetensors import safe_open

    d = Path(hf_dir)
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        wm = json.loads(idx.read_text(encoding="utf-8")).get("weight_map") or {}
        return {str(k): d / str(v) for k, v in wm.items()}
    out: dict[str, Path] = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118 (safe_open is not a dict)
                out[k] = f
    if not out:
        raise OSError(f"no *.safetensors files in {d}")
    return out


def part_tensor_names(names: list[str], start: int, stop: int, first: bool, last: bool, tied: bool) -> list[str]:
    """The checkpoint tensors one part needs: its layers, plus the embedding (first part) or the
    final norm and lm_head (last part; the embedding again when the head is tied to it)."""
    keep = []
    for n in names:
        if ".layers." in n:
            try:
                li = int(n.split(".layers.", 1)[1].split(".", 1)[0])
            except ValueError:
                continue
            if start <= li < stop:
                keep.append(n)
        elif "embed_tokens" in n:
            if first or (last and tied):
                keep.append(n)
        elif (n.startswith("lm_head") or n.endswith("model.norm.weight") or n == "norm.weight") and last:
            keep.append(n)
    return keep


def load_part_model(hf_dir: str | Path, start: int, stop: int, first: bool, last: bool,
                    index: dict[str, Path] | None = None) -> Any:
    """A CausalLM skeleton on the meta device with ONLY layers [start, stop) (and the embedding /
    final norm / lm_head the part needs) materialized in fp32 from the safetensors files, read
    tensor by tensor (safe_open is lazy). Memory: one part's weights, not the model's."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(hf_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    index = index if index is not None else safetensors_index(hf_dir)
    wanted = part_tensor_names(list(index), start, stop, first, last, tied)
    by_file: dict[Path, list[str]] = {}
    for n in wanted:
        by_file.setdefault(index[n], []).append(n)
    params = dict(model.named_parameters())
    state: dict[str, Any] = {}
    for f, names in by_file.items():
        with safe_open(str(f), framework="pt") as sf:
            for n in names:
                key = n if n in params else (n[len("model."):] if n.startswith("model.") else f"model.{n}")
                if key not in params:
                    continue
                state[key] = sf.get_tensor(n).to(torch.float32)
    if last and "lm_head.weight" not in state and "lm_head.weight" in params:
        emb = state.get("model.embed_tokens.weight")
        if emb is None:
            raise OSError(f"{hf_dir}: the checkpoint has no lm_head.weight and no embedding to tie it to")
        state["lm_head.weight"] = emb
    missing = [k for k in params if _param_in_part(k, start, stop, first, last) and k not in state]
    if missing:
        raise OSError(f"{hf_dir}: the safetensors files lack {len(missing)} tensors of layers {start}..{stop - 1} "
                      f"(e.g. {missing[0]})")
    model.load_state_dict(state, strict=False, assign=True)
    head = getattr(model, "lm_head", None)
    if last and head is not None and head.weight.device.type == "meta":   # tied to the embedding
        emb = state.get("model.embed_tokens.weight")
        if emb is None:
            raise OSError(f"{hf_dir}: the checkpoint has no lm_head.weight and no embedding to tie it to")
        head.weight = torch.nn.Parameter(emb, requires_grad=False)
    # buffers computed at construction (rotary inv_freq) are on meta: rebuild the rotary module on CPU
    rot = model.model.rotary_emb
    model.model.rotary_emb = type(rot)(config=cfg)
    model.eval()
    return model


def _param_in_part(key: str, start: int, stop: int, first: bool, last: bool) -> bool:
    if ".layers." in key:
        li = int(key.split(".layers.", 1)[1].split(".", 1)[0])
        return start <= li < stop
    if "embed_tokens" in key:
        return first
    if key.startswith("lm_head") or key == "model.norm.weight":
        return last
    return False


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


PartHook = Callable[[list[dict[str, Any]], dict[str, Any]], None]


def export_deployment_graphs(hf_dir: str | Path | None, out_dir: str | Path, context_length: int, ar_n: int,
                             parts: int, model: Any = None, kinds: tuple[str, ...] = ("prompt_processor",
                                                                                      "token_generator"),
                             seq_lens: dict[str, int] | None = None,
                             after_part: PartHook | None = None) -> list[dict[str, Any]]:
    """Export float ONNX graphs for every part and kind into out_dir/<graph>.onnx; returns the
    quantize.json "graphs" entries (paths relative to out_dir's parent), prompt processors first.

    Part by part: without `model`, only the part's own tensors are read from hf_dir's safetensors
    (load_part_model), so memory holds one part's fp32 weights. `after_part(entries, named)` is
    called after each part with its graph entries and its parameters by checkpoint name (numpy)."""
    import torch
    from transformers import AutoConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model is not None:
        cfg = model.config
    else:
        if hf_dir is None:
            raise ValueError("export_deployment_graphs needs hf_dir or model")
        cfg = AutoConfig.from_pretrained(str(hf_dir))
    heads = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    ranges = layer_ranges(cfg.num_hidden_layers, parts)
    index = safetensors_index(hf_dir) if model is None and hf_dir is not None else None
    graphs: list[dict[str, Any]] = []
    for k, (start, stop) in enumerate(ranges, start=1):
        first, last = k == 1, k == parts
        src = model if model is not None else load_part_model(hf_dir, start, stop, first, last, index)  # type: ignore[arg-type]
        mod = _part_module(src, start, stop, first, last)
        entries: list[dict[str, Any]] = []
        for kind in kinds:
            s = (seq_lens or {}).get(kind, ar_n if kind == "prompt_processor" else 1)
            past = context_length - s
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
            entries.append({"name": name, "kind": kind, "part": k, "seq_len": s, "layers": list(range(start, stop)),
                            "float_onnx": f"{out.name}/{name}.onnx", "inputs": ins, "outputs": outs})
        if after_part is not None:
            named = {n: p.detach().numpy() for n, p in src.named_parameters(remove_duplicate=False)
                     if p.device.type != "meta" and _param_in_part(n, start, stop, first, last)}
            after_part(entries, named)
            del named
        graphs.extend(entries)
        del mod
        if model is None:
            del src
        gc.collect()
    order = {kind: i for i, kind in enumerate(kinds)}
    graphs.sort(key=lambda g: (order[g["kind"]], g["part"]))
    return graphs
