"""What a Hugging Face model is, whether HexStudio supports it, and what each stage will cost.

Pure Python (json only): the studio imports it for `hexstudio model inspect` and preflight,
so a user can check a model from its config.json alone, before downloading 16 GB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.shared import config_bounds, families
from hexstudio.shared.errors import ActionableError

GiB = 1024**3

# Refused, with why: the Genie "basic" dialog and HexStudio's export handle dense decoders only.
REFUSED = {
    "mamba": "a state-space (Mamba) model: it has no attention KV cache, which the prompt processor / "
    "token generator export and Genie's basic dialog need",
    "moe": "a mixture-of-experts model: expert routing is not supported by HexStudio's part export",
    "hybrid": "a hybrid attention/state-space model: its recurrent layers have no KV-cache graph layout",
}

# The reference recipe (facts/workstation.md): Llama-3.1-8B, context 4096, AIMET-ONNX on an RTX 5090.
REFERENCE = {
    "model": "Llama-3.1-8B (Nemotron-Nano-8B)",
    "context_length": 4096,
    "quantize_peak_rss_bytes": 182_062_912 * 1024,
    "quantize_wall_s": 44 * 60 + 59,
    "disk_bytes": 200 * 10**9,
    "bundle_bytes": 5 * 10**9,
    "min_ram_plus_swap_bytes": 150 * 10**9,
    "vram_guidance_bytes": 80 * 10**9,
}

# Memory model of the quantize and validate stages, MEASURED by bench/quantize_memory.py on 2026-11-23
# (docs/PERFORMANCE.md: 2-core CPU-only machine, synthetic Llamas of 13M/22M/84M/291M parameters with an
# 840-token vocabulary and one of 260M with 32k, split in 4 parts, context 256, AR-64, 2 samples):
#   quantize peak RSS = FIXED + max(LAYER x decoder-layer parameters,
#                                   HEAD x lm_head parameters,
#                                   VOCAB x embedding rows the calibration can reach x hidden)
#                       + one token-generator sample's past KV
# The export is piece by piece (one decoder layer in torch at a time; the embedding table and the lm_head
# streamed into the data files, never materialized) and the calibration one QuantSim per unit (a decoder
# layer; the lm_head in column chunks no larger than a layer; the embedding on the rows of the calibration
# tokens), so the peak follows the largest decoder layer: a line through the four 840-vocab sizes gives
# 22.7 bytes per layer parameter (22.6-22.8 at each size) and an intercept of 570 MiB (import baseline
# 462 MiB + aimet/onnxruntime sessions) -> FIXED 0.56 GiB. The 32k-vocab model (lm_head 33.6M, 2.7 x a
# layer) peaks at 920 MiB, 10.9 bytes per lm_head parameter above FIXED (its part's finish: the chunks'
# quantized lm_head concatenated and the simulation graph written) -> HEAD, an upper bound that is
# larger than a layer's term only where the lm_head is > 2.1 layers. VOCAB (28.8 bytes per embedding-unit
# parameter) was measured when the embedding unit held the whole table; it now holds at most
# calibration_samples x calibration_seq_len rows.
# Whole-model QuantSim (parts=1, calibration_unit "part"), same bench: WHOLE bytes/parameter of the model.
# Validate (13M/22M/84M only): slope 24.2 bytes/part-parameter, intercept 145 MiB (its import baseline:
# onnxruntime, numpy, tokenizers, 49 MiB) -> 25 and 0.15 GiB.
# Against the goal (2.5 x the largest part's FP16 bytes + a fixed overhead): 1.8 x at 291M (4
# parts of 6 layers) and 2.2 x at 260M/32k vocabulary above FIXED. An 8B Llama-3 (5 parts, context 4096)
# is estimated at ~6.5 GiB, ~1.6 x its largest part's FP16 above FIXED. Extrapolated, not measured.
# The per-sample terms (one token-generator calibration sample's past KV; validation's KV caches) were
# too small to see at context 256: they are computed from the shapes, not measured.
QUANTIZE_FIXED_BYTES = int(0.56 * GiB)
# what a CUDA context and onnxruntime's CUDA provider hold on the GPU before any tensor (about 0.3-0.5 GiB on
# recent drivers; an allowance, not measured here: no GPU on the measuring machine)
CUDA_CONTEXT_BYTES = int(0.5 * GiB)
QUANTIZE_BYTES_PER_LAYER_PARAM = 22.7
QUANTIZE_BYTES_PER_VOCAB_PARAM = 28.8
QUANTIZE_BYTES_PER_HEAD_PARAM = 10.9
# Validate runs one run unit at a time (a decoder layer, the embedding, an lm_head column chunk no larger
# than a layer; issue 20): FIXED (onnxruntime + tokenizers + torch/transformers for the float-fidelity
# check's layer-by-layer checkpoint forward) + UNIT bytes per parameter of the largest run unit (fp32
# initializers + onnxruntime's pre-packed MatMul weights; the embedding table is a unit of its own) + the
# running layer's KV cache in its full layout for every sequence (3 windows, both graph kinds).
# (Before: 0.15 GiB + 25 bytes per largest-PART parameter, part-major sessions: ~51 GiB for an 8B.)
# MEASURED at the true 8B layer shapes (bench/llama8b_shapes.py, 2026-11-25 20:00, 2 and 4 layers, 2 parts,
# context 4096, after onnxruntime outputs were copied instead of viewed): 3.04 and 2.99 GiB: flat in the
# layers (an earlier run, before that fix, grew +0.63 GiB per layer). The run unit there is the 525M-parameter
# embedding table: 4.6 bytes per unit parameter above FIXED and the KV term. The unit term is the smaller of
# 8.0 bytes per unit parameter (small units, where onnxruntime's own allocations dominate) and 0.5 GiB + 4.6
# bytes per unit parameter (large units; the 0.5 GiB is margin over the two measured points): an 8B
# (Llama-3.1 shapes, context 4096) estimates ~3.5 GiB, against 3.04 GiB measured.
VALIDATE_FIXED_BYTES = int(0.6 * GiB)
VALIDATE_BYTES_PER_UNIT_PARAM = 8.0  # small units
VALIDATE_LARGE_UNIT_BYTES = int(0.5 * GiB)  # large units: this + the per-parameter term below
VALIDATE_BYTES_PER_LARGE_UNIT_PARAM = 4.6
# Disk of the run folder (weights stored once, issue 20): the float weights once per part in fp32 (the prompt
# processor and token generator share one data file; the upload graphs hard-link it): 4 bytes per parameter;
# the simulation weights once per part as integers: int4 + an fp32 scale per 64-weight block (0.5625 bytes) for
# the decoder layers, int8 for the lm_head, uint16 for the embedding table; + the larger of the quantize stage's
# temporary files (one part's fake-quantized fp32 weights and its calibration units: 4 bytes per part
# parameter) and the validate stage's (the lm_head's column chunks, float fp32 + simulation int8: 5 bytes per
# lm_head parameter); + the bundle.
FLOAT_BYTES_PER_PARAM = 4.0
# Local QNN compile (compile_target local; bench/llama8b_shapes.py --compile-run, issue 28), MEASURED 2026-11-27 on a
# 4-layer slice at the true Llama-3.1-8B shapes (context 4096, AR-128, 2 parts, shared form, 2 cores): part 1 (2 layers
# + the embedding table) 479 s, peak 11.60 GiB, binary 1.29 GB; part 2 (2 layers + the lm_head) 76 s, 6.45 GiB,
# 0.76 GB; HTP rewrite 6 s / 0.19 GiB; work folder 4.17 GB. A slice's parts hold one kind of layer each, so the
# per-layer terms come from `hexstudio predict`'s compiles at the same shapes on the same QNN EP path (~2.5 GiB and
# ~47 s per decoder layer, docs/PERFORMANCE.md); the rest of part 1's peak is the embedding table's, the rest of
# the wall time the embedding's and the lm_head's. The peak is one part's compile child (parts compile one at a time).
LOCAL_COMPILE_BYTES_PER_LAYER_PARAM = 2.5 * GiB / 218.1e6
LOCAL_COMPILE_BYTES_PER_EMBED_PARAM = (11.60 - 2 * 2.5) * GiB / 525.3e6
LOCAL_COMPILE_SECONDS_PER_LAYER_PARAM = 47.0 / 218.1e6
LOCAL_COMPILE_SECONDS_PER_VOCAB_PARAM = (563.0 - 4 * 47.0) / (2 * 525.3e6)  # embedding + lm_head
# disk: the rewritten graphs and the context binaries each hold about the simulation weights (int4 + block scales
# for the layers, uint16 embedding table, int8 lm_head): 4.13 GB estimated for the slice, 4.17 GB measured
# The AI Hub upload (hexstudio/workers/aihub_upload.py): each of a part's two graphs carries its weights as their
# integers (decoder layers and lm_head in int8 with fp32 scales, the embedding table in uint16), norms in fp32; the
# client zips each upload (deflate level 1): ratio MEASURED at the 8B layer shapes (bench/llama8b_shapes.py,
# docs/PERFORMANCE.md)
AIHUB_UPLOAD_ZIP_RATIO = 11.16 / 19.78  # sent / directories at 32 layers (2- and 4-layer slices, 2026-11-27)
AIHUB_UPLOAD_SCALE_BYTES_PER_LAYER_PARAM = 4 / 64  # an fp32 block scale per 64 weights (LPBQ)
AIHUB_UPLOAD_ENCODINGS_BYTES_PER_LAYER_PARAM = (
    0.256  # the encodings' JSON: the bench's slope (fp16 form) above 2 x 2 B
)
SIM_BYTES_PER_LAYER_PARAM = 0.5625
WHOLE_QUANTSIM_BYTES_PER_PARAM = 23.0  # whole-model QuantSim: bytes per parameter of the whole model


class ModelInfoError(ActionableError, ValueError):
    """config.json is missing or unreadable."""


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _classify(cfg: dict[str, Any]) -> tuple[bool, str, str]:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else str(cfg.get("model_type", "unknown"))
    mt = str(cfg.get("model_type", "")).lower()
    low = arch.lower()
    if "mamba" in low or "mamba" in mt or "ssm" in mt:
        kind = (
            "hybrid"
            if ("hybrid" in low or "nemotronh" in low or cfg.get("hybrid_override_pattern"))
            else "mamba"
        )
        return False, arch, f"{arch} is {REFUSED[kind]}."
    if (
        cfg.get("hybrid_override_pattern")
        or "jamba" in low
        or "nemotronh" in low
        or (
            cfg.get("layer_types")
            and any(t not in ("full_attention", "sliding_attention") for t in cfg.get("layer_types") or [])
        )
    ):
        return False, arch, f"{arch} is {REFUSED['hybrid']}."
    if (
        any(
            cfg.get(k)
            for k in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
        )
        or "moe" in low
        or "mixtral" in low
    ):
        return False, arch, f"{arch} is {REFUSED['moe']}."
    qc = cfg.get("quantization_config")
    if qc:
        # AWQ/GPTQ (qweight, scales), bitsandbytes (packed uint8) or FP8 (compressed-tensors) checkpoints: the
        # export reads float weights by their HF names, and an FP8 weight without its scale would load silently
        # wrong. HexStudio quantizes itself (AIMET), from the original weights.
        method = qc.get("quant_method", "quantized") if isinstance(qc, dict) else "quantized"
        return (
            False,
            arch,
            f"This checkpoint is already quantized ({method}: config.json has a quantization_config). "
            "HexStudio quantizes for the NPU itself (AIMET W4A16) from the original weights: use the "
            "original bf16/fp16 repository this one was made from.",
        )
    supported = families.supported_architectures()  # hexstudio.shared.families
    if arch in supported:
        return True, arch, f"{arch} is a dense Llama-family decoder: supported."
    return (
        False,
        arch,
        (
            f"{arch} is not a supported architecture. HexStudio supports dense Llama-family "
            f"decoders: {', '.join(sorted(supported))}."
        ),
    )


def count_parameters(cfg: dict[str, Any]) -> int:
    cfg = families.normalized_config(cfg)
    fam = families.family_of_model_type(str(cfg.get("model_type", "")))
    h = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kvh = int(_first(cfg, "num_key_value_heads", default=heads))
    hd = int(_first(cfg, "head_dim", default=h // heads))
    ffn = int(cfg["intermediate_size"])
    vocab = int(cfg["vocab_size"])
    attn = h * heads * hd + 2 * h * kvh * hd + heads * hd * h
    if cfg.get("attention_bias"):
        attn += heads * hd + 2 * kvh * hd
    mlp = 3 * h * ffn
    norms = 2 * h
    if fam is not None and fam.qk_norm:
        norms += 2 * hd  # q_norm, k_norm
    if fam is not None and fam.qkv_bias:
        attn += heads * hd + 2 * kvh * hd  # qkv biases
    emb = vocab * h
    head = 0 if cfg.get("tie_word_embeddings") else vocab * h
    return layers * (attn + mlp + norms) + emb + head + h


INSPECT_CONTEXT = 512  # the context length the inspect-time rope check uses


def inspect_config(cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = families.normalized_config(cfg)  # the family's config.json keys in our names, its defaults filled
    try:  # every number in range before anything is sized from it (hexstudio.shared.config_bounds)
        config_bounds.check_config(cfg)
    except config_bounds.ConfigBoundsError as exc:
        archs = cfg.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "this model"
        return {
            "architecture": arch,
            "model_type": cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None,
            "supported": False,
            "reason": f"{exc.message} {exc.hint}",
            "error": exc.fields(),
        }
    supported, arch, reason = _classify(cfg)
    info: dict[str, Any] = {
        "architecture": arch,
        "model_type": cfg.get("model_type"),
        "supported": supported,
        "reason": reason,
    }
    try:
        heads = int(cfg["num_attention_heads"])
        h = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        info.update(
            {
                "num_parameters": count_parameters(cfg) if supported else None,
                "num_layers": int(cfg["num_hidden_layers"]),
                "hidden_size": h,
                "num_heads": heads,
                "num_kv_heads": int(_first(cfg, "num_key_value_heads", default=heads)),
                "head_dim": int(_first(cfg, "head_dim", default=h // heads)),
                "intermediate_size": int(_first(cfg, "intermediate_size", default=0)),
                "vocab_size": int(cfg["vocab_size"]),
                "rope_theta": float(
                    _first(
                        cfg,
                        "rope_theta",
                        default=(cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0),
                    )
                ),
                "rope_scaling": cfg.get("rope_scaling"),
                "max_position_embeddings": int(_first(cfg, "max_position_embeddings", default=2048)),
                "sliding_window": sliding_window(cfg),
                "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
                # the checkpoint's own precision (transformers writes torch_dtype, newer versions dtype)
                "weight_bytes": 4
                if str(_first(cfg, "torch_dtype", "dtype", default="")) in ("float32", "fp32")
                else 2,
                "bos_token_id": cfg.get("bos_token_id"),
                "eos_token_ids": eos if isinstance(eos, list) else ([eos] if eos is not None else []),
            }
        )
    except (KeyError, TypeError, ValueError) as exc:
        if supported:
            info.update(
                {"supported": False, "reason": f"config.json lacks or has a bad {exc}: it is incomplete."}
            )
    if info["supported"]:
        # the rope must be one Genie can compute (hexstudio.shared.rope: default, linear, dynamic within its range,
        # llama3, yarn, longrope), or the compile stage would refuse it hours later. Checked at a short context:
        # only what no context length can express is refused here (a dynamic rope's limit is checked at compile).
        from hexstudio.shared import rope

        try:
            info["rope_scaling"] = rope.rope_settings(cfg)[1] or None
            rope.genie_positional_encoding(cfg, INSPECT_CONTEXT)
        except (rope.RopeError, KeyError, TypeError, ValueError) as exc:
            info.update({"supported": False, "reason": f"{arch}: {exc}"})
    return info


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelInfoError(
            f"{path} does not exist. A Hugging Face model folder holds config.json, "
            "the tokenizer files and *.safetensors."
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelInfoError(f"{path} cannot be read: {exc}. Download the model again.") from None
    if not isinstance(data, dict):
        raise ModelInfoError(f"{path} is not a JSON object.")
    return data


def inspect_folder(folder: str | Path) -> dict[str, Any]:
    """Inspect a Hugging Face folder; needs only config.json."""
    info = inspect_config(read_config(folder))
    p = Path(folder)
    info["files"] = {
        "config": True,
        "tokenizer": (p / "tokenizer.json").is_file(),
        "chat_template": _has_chat_template(p),
        "safetensors": sorted(x.name for x in p.glob("*.safetensors")),
    }
    return info


def _has_chat_template(p: Path) -> bool:
    if (p / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((p / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, json.JSONDecodeError):
        return False


# Where the part count comes from (docs/model.md): a context binary on the HTP has a memory ceiling of about
# 4 GB (a larger one does not load); Qualcomm keeps each part of an 8B model near 1-2 GB (qai-hub-models splits
# Llama 3.1 8B in 5 parts: ~1 GB each of a ~5 GB W4A16 bundle), so a part aims at PART_TARGET_BYTES; on a board
# with little memory no part takes more than BOARD_RAM_PART_FRACTION of its RAM.
CONTEXT_CEILING_BYTES = 4 * 1024**3
PART_TARGET_BYTES = 1024**3  # the average part
PART_LIMIT_BYTES = (
    3 * 1024**3
)  # the largest part (the embedding's or the lm_head's): a margin under the ceiling
BOARD_RAM_PART_FRACTION = 1 / 8
BOARD_RAM_BUNDLE_FRACTION = 0.6  # the bundle + KV cache should leave the OS and Genie the rest


def layer_parameters(info: dict[str, Any]) -> float:
    """Parameters of one decoder layer: the model's, less the embedding and an lm_head of its own (a tied
    lm_head is the embedding: Llama-3.2-1B, the small Qwen2.5s), over the layers."""
    n = int(info.get("num_parameters") or 0)
    emb = int(info.get("vocab_size") or 0) * int(info.get("hidden_size") or 0)
    tables = emb if info.get("tie_word_embeddings") else 2 * emb
    return max(0, n - tables) / max(1, int(info.get("num_layers") or 1))


def deployed_bytes(info: dict[str, Any], context_length: int) -> dict[str, Any]:
    """W4A16 deployment sizes: per decoder layer (int4 LPBQ weights + its 8-bit KV cache at this context),
    the embedding and the lm_head (8-bit), and the whole bundle."""
    layers = max(1, int(info.get("num_layers") or 1))
    emb = int(info.get("vocab_size") or 0) * int(info.get("hidden_size") or 0)
    per_layer_params = layer_parameters(info)
    kv_layer = 2 * int(info.get("num_kv_heads") or 1) * int(info.get("head_dim") or 1) * context_length
    layer = int(0.5 * 1.03 * per_layer_params) + kv_layer  # 4-bit weights + block scales, 8-bit KV
    return {
        "layer_bytes": layer,
        "embedding_bytes": emb,
        "lm_head_bytes": emb,
        "bundle_bytes": layer * layers + 2 * emb,
        "layers": layers,
    }


def part_plan(
    info: dict[str, Any],
    context_length: int = 4096,
    board_ram_bytes: int | None = None,
    board_name: str | None = None,
) -> dict[str, Any]:
    """How many parts to split the model in, and why: parts of PART_TARGET_BYTES on average (layers split
    evenly, the embedding in the first part, the lm_head in the last), more if the largest would pass
    PART_LIMIT_BYTES (under the ~4 GB context ceiling) or 1/8 of the board's RAM when it is known; 2 for tiny
    models so part chaining is always exercised; never more than the layer count. Also says whether the bundle
    fits the board."""
    d = deployed_bytes(info, context_length)
    layers = d["layers"]
    n = int(info.get("num_parameters") or 0)
    target, limit = PART_TARGET_BYTES, PART_LIMIT_BYTES
    why = [
        f"A context binary must stay under the HTP's ~{CONTEXT_CEILING_BYTES / 1024**3:.0f} GiB per-context "
        f"ceiling; Qualcomm keeps an 8B model's parts near 1-2 GB (qai-hub-models: 5 parts for Llama 3.1 8B), so "
        f"parts average {target / 1024**3:.1f} GiB and none passes {limit / 1024**3:.0f} GiB."
    ]
    if board_ram_bytes:
        cap = int(board_ram_bytes * BOARD_RAM_PART_FRACTION)
        if cap < limit:
            limit, target = cap, min(target, cap)
            why.append(
                f"{board_name or 'The board'} has {board_ram_bytes / 1024**3:.1f} GiB of RAM: parts are kept "
                f"under 1/{round(1 / BOARD_RAM_PART_FRACTION)} of it ({cap / 1024**3:.2f} GiB)."
            )

    def largest(p: int) -> int:
        sizes = []
        for k, (a, b) in enumerate(layer_ranges(layers, p)):
            sizes.append(
                (b - a) * d["layer_bytes"]
                + (d["embedding_bytes"] if k == 0 else 0)
                + (d["lm_head_bytes"] if k == p - 1 else 0)
            )
        return max(sizes)

    if n < 100_000_000:
        parts = min(2, layers)
        why.append("A tiny model: 2 parts, so the chaining of parts is exercised.")
    else:
        parts = max(
            -(-d["bundle_bytes"] // target),
            next((p for p in range(1, layers + 1) if largest(p) <= limit), layers),
        )
        why.append(
            f"{parts} part(s) of ~{d['bundle_bytes'] / parts / 1024**3:.2f} GiB (largest "
            f"{largest(parts) / 1024**3:.2f} GiB) for a {d['bundle_bytes'] / 1024**3:.2f} GiB W4A16 bundle at "
            f"context {context_length}."
        )
    parts = max(1, min(parts, layers))
    big = largest(parts)
    if big > CONTEXT_CEILING_BYTES:
        why.append(
            f"Even one layer per part leaves a {big / 1024**3:.1f} GiB part: over the context ceiling "
            "(the embedding or the lm_head alone is too big); this model cannot be deployed as is."
        )
    fits = None
    if board_ram_bytes:
        fits = d["bundle_bytes"] <= BOARD_RAM_BUNDLE_FRACTION * board_ram_bytes
        why.append(
            f"The bundle ({d['bundle_bytes'] / 1024**3:.2f} GiB) "
            + ("fits" if fits else "does NOT fit")
            + f" in {round(BOARD_RAM_BUNDLE_FRACTION * 100)}% of {board_name or 'the board'}'s "
            f"{board_ram_bytes / 1024**3:.1f} GiB of RAM" + ("." if fits else ": pick a smaller model.")
        )
    return {
        "parts": parts,
        "largest_part_bytes": big,
        "bundle_bytes": d["bundle_bytes"],
        "part_target_bytes": target,
        "part_limit_bytes": limit,
        "context_ceiling_bytes": CONTEXT_CEILING_BYTES,
        "board_ram_bytes": board_ram_bytes,
        "fits_board": fits,
        "explanation": why,
    }


def default_parts(
    info: dict[str, Any], context_length: int = 4096, board_ram_bytes: int | None = None
) -> int:
    """How many parts to split the model in (part_plan)."""
    return int(part_plan(info, context_length, board_ram_bytes)["parts"])


def layer_ranges(num_layers: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) layer ranges, as even as possible (earlier parts take the extra layer)."""
    base, extra = divmod(num_layers, parts)
    out, start = [], 0
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        out.append((start, stop))
        start = stop
    return out


# the Validate stage's teacher-forced windows: a prompt through the prompt processor, then AR-1 steps
# (hexstudio/workers/validate.py); a context must hold one window and a step more
VALIDATION_PROMPT_TOKENS = 48
VALIDATION_FORCED_STEPS = 48
# the shortest context a run may ask for: one validation window and a step more
MIN_CONTEXT_LENGTH = VALIDATION_PROMPT_TOKENS + VALIDATION_FORCED_STEPS + 1


def validation_room(context_length: int) -> str | None:
    """Why the Validate stage could not run at this context length (None: it can)."""
    need = VALIDATION_PROMPT_TOKENS + VALIDATION_FORCED_STEPS
    if context_length >= MIN_CONTEXT_LENGTH:
        return None
    return (
        f"context_length {context_length} leaves no room for the Validate stage: its teacher-forced windows are "
        f"{VALIDATION_PROMPT_TOKENS} prompt tokens and {VALIDATION_FORCED_STEPS} steps, {need} positions and a "
        "step more. Use a longer context."
    )


def sliding_window(cfg: dict[str, Any]) -> int | None:
    """The attention window the model was trained with, where one is in force (None: full attention).
    Mistral-7B-v0.1 sets sliding_window (no switch); Qwen2/Qwen3 set one but use it only with
    use_sliding_window true; layer_types naming sliding_attention layers use it too."""
    w = cfg.get("sliding_window")
    if not isinstance(w, int) or isinstance(w, bool) or w <= 0:
        return None
    switched = cfg.get("use_sliding_window")
    layers = cfg.get("layer_types") or []
    if switched is True or (switched is None and not layers) or "sliding_attention" in layers:
        return w
    return None


def check_parts(info: dict[str, Any], parts: int) -> tuple[str, str] | None:
    """(why, what to do) when the model cannot be split into `parts` parts (each needs a layer), else None."""
    layers = int(info["num_layers"])
    if 1 <= int(parts) <= layers:
        return None
    return (
        f"{parts} parts for a model of {layers} layers: every part needs at least one layer.",
        f"Give --parts between 1 and {layers}, or leave it out (auto picks the run's split).",
    )


def check_context(info: dict[str, Any], context_length: int, ar_n: int) -> str | None:
    """An error message, or None when the context length is usable."""
    if ar_n <= 0 or context_length <= 0:
        return "context_length and ar_n must be positive."
    if context_length <= ar_n:
        return f"context_length {context_length} must be larger than AR-N {ar_n}."
    if context_length % ar_n:
        lo, hi = context_length // ar_n * ar_n, (context_length // ar_n + 1) * ar_n
        # offer only lengths that pass the other checks
        use = f"{lo} or {hi}" if lo >= MIN_CONTEXT_LENGTH and lo > ar_n else str(hi)
        return (
            f"context_length {context_length} is not a multiple of AR-N {ar_n}: the prompt processor "
            f"consumes the context in blocks of {ar_n} tokens. Use {use}."
        )
    maxpos = int(info.get("max_position_embeddings") or 0)
    if maxpos and context_length > maxpos:
        return (
            f"context_length {context_length} is beyond what the model was trained for "
            f"(max_position_embeddings {maxpos}). Use at most {maxpos}."
        )
    window = info.get("sliding_window")
    if isinstance(window, int) and context_length > window:
        return (
            f"context_length {context_length} is beyond the model's sliding attention window ({window} tokens): "
            "the exported graphs attend over the whole context, where the model attends over its last "
            f"{window} tokens only, so past {window} tokens its replies would not be the model's. Use at most "
            f"{window // ar_n * ar_n}."
        )
    return None


def estimate(
    info: dict[str, Any],
    context_length: int,
    ar_n: int = 128,
    parts: int | None = None,
    calibration_samples: int = 20,
    calibration_seq_len: int = 2048,
    context_variants: int = 1,
    ar_variants: int = 0,
    calibration_unit: str = "layer",
) -> dict[str, Any]:
    """Memory and disk each stage needs, in bytes (planning figures, not guarantees). `context_variants`: how many
    context lengths the bundle holds (context_length and the smaller `context_lengths`): each compiles every graph
    again (time; for the simulator's one-graph binaries also disk), while the quantize stage's files, the board's
    weight-shared binaries and the KV cache (sized by the largest CL) stay as for one. `ar_variants`: how many more
    prompt-processor lengths (`ar_sizes`) each context length holds: one more graph to compile per part each.
    `calibration_unit` "part": one QuantSim holds a whole part (hexstudio/workers/quant/partwise.py), at the
    whole-model figure per parameter, where "layer" holds one decoder layer."""
    n = int(info.get("num_parameters") or 0)
    parts = parts or default_parts(info)
    layers = int(info.get("num_layers") or 1)
    h = int(info.get("hidden_size") or 0)
    vocab = int(info.get("vocab_size") or 0)
    kvh = int(info.get("num_kv_heads") or 1)
    hd = int(info.get("head_dim") or 1)
    emb = vocab * h
    per_layer = layer_parameters(info)

    def part_params(p: int) -> int:
        return int(per_layer * -(-layers // p) + emb)  # the largest part: ceil(layers/p) layers + embedding

    # the largest calibration unit: a decoder layer (the lm_head's column chunks are no larger), the
    # lm_head's finish, or the embedding on the rows the calibration tokens can reach
    emb_rows = min(vocab, max(1, calibration_samples) * max(1, calibration_seq_len))
    unit = max(
        QUANTIZE_BYTES_PER_LAYER_PARAM * per_layer,
        QUANTIZE_BYTES_PER_HEAD_PARAM * emb,
        QUANTIZE_BYTES_PER_VOCAB_PARAM * emb_rows * h,
    )

    def partwise_peak(p: int) -> int:
        # one token-generator calibration sample: the part's past KV in fp32, held by the feed and the
        # session (x3); samples are generated one at a time and part outputs go to disk
        tg_sample = 3 * 2 * -(-layers // p) * kvh * hd * context_length * 4
        if calibration_unit == "part":
            return QUANTIZE_FIXED_BYTES + int(WHOLE_QUANTSIM_BYTES_PER_PARAM * part_params(p)) + tg_sample
        return QUANTIZE_FIXED_BYTES + int(unit) + tg_sample

    largest_part_params = part_params(parts)
    fp16_part = 2 * largest_part_params
    kv_bytes = 2 * layers * kvh * hd * context_length * 2
    partwise = partwise_peak(parts)
    fit_parts = next((p for p in range(1, layers + 1) if partwise_peak(p) <= 64 * GiB), None)
    whole = (
        QUANTIZE_FIXED_BYTES
        + int(WHOLE_QUANTSIM_BYTES_PER_PARAM * n)
        + 3 * 2 * layers * kvh * hd * context_length * 4
    )
    # validation: one run unit's float or QDQ sessions (a layer, the embedding table, an lm_head chunk no
    # larger than a layer) + the running layer's fp32 KV cache for 3 sequences, both graph kinds
    run_unit = max(per_layer, emb)
    unit_bytes = min(
        VALIDATE_BYTES_PER_UNIT_PARAM * run_unit,
        VALIDATE_LARGE_UNIT_BYTES + VALIDATE_BYTES_PER_LARGE_UNIT_PARAM * run_unit,
    )
    validate = VALIDATE_FIXED_BYTES + int(unit_bytes) + 2 * 3 * 2 * kvh * hd * context_length * 4
    bundle = int(0.6 * n)  # W4 weights + int8 lm_head + context metadata
    # 2 graphs per part, each with: the layers' int4 and the lm_head's int8 as int8 (1 B) + the LPBQ scales in fp32
    # (one per 64 layer weights), the embedding table as uint16; + the encodings' JSON (0.26 B per layer parameter)
    upload = int(
        2
        * (
            (per_layer * layers + emb)
            + AIHUB_UPLOAD_SCALE_BYTES_PER_LAYER_PARAM * per_layer * layers
            + 2 * emb
        )
        + AIHUB_UPLOAD_ENCODINGS_BYTES_PER_LAYER_PARAM * per_layer * layers
    )
    sim = (
        SIM_BYTES_PER_LAYER_PARAM * per_layer * layers + 1 * emb + 2 * emb
    )  # layers int4, lm_head int8, table uint16
    disk = int(FLOAT_BYTES_PER_PARAM * n + sim + max(4 * largest_part_params, 5 * emb)) + bundle
    return {
        "num_parameters": n,
        "parts": parts,
        "largest_part_fp16_bytes": fp16_part,
        "hf_download_bytes": int(info.get("weight_bytes") or 2) * n,  # float32 checkpoints are twice bf16's
        "quantize_peak_rss_bytes": partwise,
        # with CUDA the calibration unit's sessions sit on the GPU: the peak less the host-side fixed part, plus
        # the CUDA context (a planning figure from the CPU measurements; not measured on a GPU)
        "quantize_peak_vram_bytes": partwise - QUANTIZE_FIXED_BYTES + CUDA_CONTEXT_BYTES,
        "whole_model_quantsim_rss_bytes": whole,
        "validate_peak_rss_bytes": validate,
        "peak_rss_bytes": max(partwise, validate),  # what the machine must hold: the larger stage
        "largest_part_parameters": largest_part_params,
        "fits_64_gib": partwise <= 64 * GiB,
        # the fewest parts whose estimate fits 64 GiB (None: no split fits; one decoder layer or the
        # lm_head alone is too big)
        "parts_to_fit_64_gib": fit_parts,
        # the run folder (float + simulation weights once per part, the quantize and validate stages'
        # temporary files, the bundle); the download is hf_download_bytes (the reference recipe: 200+ GB)
        "disk_bytes": disk,
        "bundle_bytes": bundle,
        "kv_cache_bytes": kv_bytes,
        # a local QNN compile (compile_target local): the largest part's compile child, the whole model's wall
        # time on 2 cores, the work folder (rewritten graphs + context binaries); measured at 8B shapes
        "local_compile_peak_rss_bytes": int(
            LOCAL_COMPILE_BYTES_PER_LAYER_PARAM * per_layer * -(-layers // parts)
            + LOCAL_COMPILE_BYTES_PER_EMBED_PARAM * emb
        ),
        "local_compile_seconds": int(
            max(1, context_variants)
            * (2 + max(0, ar_variants))
            / 2
            * (
                LOCAL_COMPILE_SECONDS_PER_LAYER_PARAM * per_layer * layers
                + LOCAL_COMPILE_SECONDS_PER_VOCAB_PARAM * 2 * emb
            )
        ),
        "local_compile_disk_bytes": int(
            max(1, context_variants)
            * (2 + max(0, ar_variants))
            * (SIM_BYTES_PER_LAYER_PARAM * per_layer * layers + 2 * emb + emb)
        ),
        "context_variants": max(1, context_variants),
        "ar_variants": max(0, ar_variants),
        # the AI Hub compile's upload (the directories; the zips the client sends)
        "aihub_upload_bytes": upload,
        "aihub_upload_zipped_bytes": int(AIHUB_UPLOAD_ZIP_RATIO * upload),
        "reference": REFERENCE,
    }


def hf_dir_of(model_doc: dict[str, Any], model_dir: str | Path) -> Path:
    """The Hugging Face folder recorded in model.json: relative paths are relative to model.json's folder."""
    p = Path(str(model_doc["hf_dir"]))
    return p if p.is_absolute() else Path(model_dir) / p
