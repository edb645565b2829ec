"""Rotary position embeddings as Genie computes them, and the model's own rope expressed in Genie's terms.

Genie computes the rotary tables itself from genie_config.json's `positional-encoding` and feeds them
to the graphs as `position_ids_cos` / `position_ids_sin`, half-width [1, 1, AR, rope-dim] with
rope-dim = head_dim / 2 (the graph does the rotate-half). So the config, not the graph, decides the
positions the model sees: it must reproduce the Hugging Face model's rope exactly.

What Genie does (QAIRT 2.40 / Genie 1.13, `examples/Genie/Genie/src/qualla/engines/qnn-htp/
nsp-model.cpp` `calculate_rope_embeddings`, and `Dialog.cpp` `validateRopeScalingConfig`; see
docs/genie.md for the citations):
- inv_freq[j] = theta ** (-j / rope-dim), j < rope-dim, with theta read as an int32 (a fractional
  theta is truncated);
- rope-type `llama3`: Meta's smooth wavelength blend (factor, low/high-freq-factor,
  original-max-position-embeddings), the same formula as transformers;
- rope-type `longrope`: inv_freq[j] /= long-factor[j] when context.size > original-max-position-
  embeddings, else short-factor[j] (chosen once, by the context size), and both cos and sin are
  multiplied by sqrt(1 + ln(factor) / ln(original-max-position-embeddings));
- `default`: no scaling. Genie 1.13 has no `linear` or `yarn` code.

Linear, YaRN, a fractional theta and longrope with an explicit attention factor all come down to
per-frequency divisors plus one cos/sin multiplier, which Genie's longrope carries exactly: the
divisors as short-factor (= long-factor) and the multiplier through `factor`. `genie_positional_
encoding` does that, and checks the result numerically against the model's own tables.

numpy only (hexstudio.core imports this through hexstudio.shared.bundle).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hexstudio.shared.config_bounds import check_config
from hexstudio.shared.errors import ActionableError

# how close Genie's tables must come to the model's (relative to the largest inverse frequency)
TOLERANCE = 1e-6


class RopeError(ActionableError, ValueError):
    """The model's rope cannot be expressed in a genie_config.json; the message says why and what to do."""


# -- the model's rope (Hugging Face config.json) ---------------------------------------------------------
def rope_settings(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope theta, rope scaling or None) from either config.json layout: transformers < 5 (`rope_theta` and
    `rope_scaling` at the top level) or transformers 5 (`rope_parameters` holding both). A scaling of type
    "default" (or none) means no scaling. Every number is checked against its plausible range first
    (hexstudio.shared.config_bounds: ConfigBoundsError, a ValueError) so no table is sized from a crafted one."""
    check_config(hf_config)
    params = hf_config.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]  # per-layer-type layout: the decoder layers' entry
    params = params if isinstance(params, dict) else {}
    theta = hf_config.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = hf_config.get("rope_scaling") or params or None
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type in (None, "default") and not (set(scaling) - _NON_SCALING):
            scaling = None
    return float(theta), (dict(scaling) if scaling else None)


_NON_SCALING = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def head_dim_of(hf_config: dict[str, Any]) -> int:
    heads = int(hf_config["num_attention_heads"])
    return int(hf_config.get("head_dim") or int(hf_config["hidden_size"]) // heads)


def _partial_rotary(hf_config: dict[str, Any], scaling: dict[str, Any] | None) -> float:
    v = hf_config.get("partial_rotary_factor")
    if v is None and scaling:
        v = scaling.get("partial_rotary_factor")
    if v is None:
        params = hf_config.get("rope_parameters")
        if isinstance(params, dict):
            v = params.get("partial_rotary_factor")
    return float(v) if v is not None else 1.0


def model_inv_freq(hf_config: dict[str, Any], context_size: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim / 2] in float64, cos/sin multiplier) of the model's rope for a
    deployment of `context_size` tokens, by the published formulas transformers implements (default,
    linear, dynamic, llama3, yarn, longrope). Raises RopeError for what a static-shape deployment
    cannot reproduce."""
    theta, rs = rope_settings(hf_config)
    hd = head_dim_of(hf_config)
    if abs(_partial_rotary(hf_config, rs) - 1.0) > 1e-9:
        raise RopeError(
            "This model rotates only part of each attention head (partial_rotary_factor "
            f"{_partial_rotary(hf_config, rs)}); Genie rotates the whole head (rope-dim = head_dim / 2). "
            "Choose a model that rotates the whole head (Llama, Qwen, Mistral families)."
        )
    dim = hd
    exponent = np.arange(0, dim, 2, dtype=np.float64) / dim
    base = 1.0 / (theta**exponent)
    if rs is None:
        return base, 1.0
    rtype = str(rs.get("rope_type", rs.get("type")))
    max_pos = int(hf_config.get("max_position_embeddings") or 0)

    def need(key: str) -> Any:
        if rs.get(key) is None:
            raise RopeError(
                f"This model's {rtype} rope scaling in config.json lacks {key} ({_text(rs)}). "
                "HexStudio copies these values and never guesses them: fix the model's config.json "
                "(as published by its authors)."
            )
        return rs[key]

    if rtype == "linear":
        return base / float(need("factor")), 1.0
    if rtype == "dynamic":
        orig = int(rs.get("original_max_position_embeddings") or max_pos)
        if context_size > orig:
            raise RopeError(
                f"This model's dynamic (NTK) rope changes with the sequence length beyond {orig} "
                f"tokens; a {context_size}-token deployment cannot reproduce it. Use a context length "
                f"of at most {orig}."
            )
        return base, 1.0
    if rtype == "llama3":
        factor, low, high = (
            float(need("factor")),
            float(need("low_freq_factor")),
            float(need("high_freq_factor")),
        )
        return _llama3(base, factor, low, high, float(need("original_max_position_embeddings"))), 1.0
    top_orig = hf_config.get("original_max_position_embeddings")  # Phi-3 keeps it at the top level
    if rtype == "yarn":
        orig = int(rs.get("original_max_position_embeddings") or top_orig or max_pos)
        if not orig:  # the correction range is computed from it (and a factor left out from max_pos / it)
            need("original_max_position_embeddings")
        # a factor left out (DeepSeek-V3's form) is max_position_embeddings over the pretrained length, as in
        # transformers' _compute_yarn_parameters
        factor = (
            float(rs["factor"])
            if rs.get("factor") is not None
            else max_pos / orig
            if max_pos
            else need("factor")
        )

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = rs.get("attention_factor")
        if af is None:
            m, mad = rs.get("mscale"), rs.get("mscale_all_dim")
            af = mscale(factor, m) / mscale(factor, mad) if m and mad else mscale(factor)
        beta_fast = float(rs.get("beta_fast") or 32)
        beta_slow = float(rs.get("beta_slow") or 1)

        def corr_dim(rot: float) -> float:
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

        lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        # float32 like transformers' ramp, so the tables agree to the last bit that matters
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(lo)) / np.float32(hi - lo), 0, 1)
        extrap = 1.0 - ramp.astype(np.float64)
        inv = (base / factor) * (1 - extrap) + base * extrap
        return inv, float(af)
    if rtype == "longrope":
        orig = int(
            rs.get("original_max_position_embeddings") or top_orig or need("original_max_position_embeddings")
        )
        factor = float(rs["factor"]) if rs.get("factor") is not None else max_pos / orig
        af = rs.get("attention_factor")
        if af is None:
            af = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = need("long_factor") if context_size > orig else need("short_factor")
        ext_a = np.asarray(ext, dtype=np.float64)
        if ext_a.shape != base.shape:
            raise RopeError(
                f"This model's longrope factors have {ext_a.size} entries; its heads need {base.size}."
            )
        return base / ext_a, float(af)
    if rtype == "default":
        return base, 1.0
    raise RopeError(
        f"This model's config.json uses rope scaling of type '{rtype}' ({_text(rs)}), which HexStudio "
        "cannot express in a Genie bundle (Genie computes the rope tables from genie_config.json). "
        "Choose a model with default, linear, dynamic, llama3, yarn or longrope rope scaling."
    )


def _llama3(base: np.ndarray, factor: float, low: float, high: float, orig: float) -> np.ndarray:
    low_wl, high_wl = orig / low, orig / high
    wavelen = 2 * math.pi / base
    inv = np.where(wavelen > low_wl, base / factor, base)
    with np.errstate(divide="ignore", invalid="ignore"):  # high == low: no medium band to blend
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv / factor + smooth * inv
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    out: np.ndarray = np.where(medium, smoothed, inv)
    return out


def _text(rs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in rs.items())


# -- Genie's side: genie_config.json positional-encoding -> tables ---------------------------------------
def genie_inv_freq(pe: dict[str, Any], context_size: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies [rope-dim] in float64, cos/sin multiplier) as Genie computes them from a
    `positional-encoding` object. Raises RopeError for what Genie refuses."""
    if pe.get("type", "rope") != "rope":
        raise RopeError(f"positional-encoding type {pe.get('type')!r} is not rope")
    dim = int(pe["rope-dim"])
    theta = int(pe.get("rope-theta", 10000))  # Genie parses rope-theta as an int32
    inv = float(theta) ** (-np.arange(dim, dtype=np.float64) / dim)
    rs = pe.get("rope-scaling")
    if not rs:
        return inv, 1.0
    rtype = rs.get("rope-type", "default")
    if rtype == "default":
        return inv, 1.0
    if rtype == "llama3":
        return _llama3(
            inv,
            float(rs["factor"]),
            float(rs["low-freq-factor"]),
            float(rs["high-freq-factor"]),
            float(rs["original-max-position-embeddings"]),
        ), 1.0
    if rtype == "longrope":
        orig = float(rs["original-max-position-embeddings"])
        ext = rs["long-factor"] if context_size > orig else rs["short-factor"]
        if len(rs["long-factor"]) != dim or len(rs["short-factor"]) != dim:
            raise RopeError(
                f"long-factor (len={len(rs['long-factor'])}) and short-factor "
                f"(len={len(rs['short-factor'])}) must have length rope-dim={dim}"
            )
        af = math.sqrt(1 + math.log(float(rs["factor"])) / math.log(orig))
        return inv / np.asarray(ext, dtype=np.float64), af
    raise RopeError(f"Rope type not supported{rtype}")


def rope_tables(
    inv_freq: np.ndarray, attention_factor: float, positions: int
) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) float32 [positions, rope-dim] for positions 0..positions-1."""
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return (
        (np.cos(angles) * attention_factor).astype(np.float32),
        (np.sin(angles) * attention_factor).astype(np.float32),
    )


def genie_rope_tables(pe: dict[str, Any], context_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The tables Genie feeds: (cos, sin) float32 [context_size, rope-dim]."""
    inv, af = genie_inv_freq(pe, context_size)
    return rope_tables(inv, af, context_size)


INT32_MAX = 2**31 - 1


def genie_positional_encoding(hf_config: dict[str, Any], context_size: int) -> dict[str, Any]:
    """The `positional-encoding` object of genie_config.json that makes Genie compute this model's rope
    for a `context_size`-token deployment: native `llama3`/`longrope`/no scaling where the model's own
    values fit Genie's, otherwise (linear, YaRN, fractional theta, an explicit attention factor) longrope
    per-frequency divisors that reproduce the model's tables exactly. Every value comes from the model's
    config.json. Raises RopeError when the result would not match the model."""
    theta, rs = rope_settings(hf_config)
    hd = head_dim_of(hf_config)
    want_inv, want_af = model_inv_freq(hf_config, context_size)
    # Genie reads rope-theta as an int32: a larger theta (Llama-3-8B-Gradient-1048k: 3,580,165,449) is written as
    # the largest int32 and reproduced exactly by the divisors below, as a fractional theta is
    genie_theta = min(int(theta), INT32_MAX)
    pe: dict[str, Any] = {"type": "rope", "rope-dim": hd // 2, "rope-theta": genie_theta}
    rtype = str(rs.get("rope_type", rs.get("type"))) if rs else "default"
    integral = float(int(theta)) == theta and genie_theta == int(theta)
    if integral and rtype in ("default", "dynamic") and want_af == 1.0:
        pass
    elif integral and rtype == "llama3":
        pe["rope-scaling"] = {
            "rope-type": "llama3",
            "factor": float(rs["factor"]),  # type: ignore[index]
            "low-freq-factor": float(rs["low_freq_factor"]),  # type: ignore[index]
            "high-freq-factor": float(rs["high_freq_factor"]),  # type: ignore[index]
            "original-max-position-embeddings": int(rs["original_max_position_embeddings"]),  # type: ignore[index]
        }
    else:
        # per-frequency divisors against Genie's own base frequencies, one cos/sin multiplier
        genie_base = float(genie_theta) ** (-np.arange(hd // 2, dtype=np.float64) / (hd // 2))
        divisors = [float(x) for x in genie_base / want_inv]
        orig = int(
            (rs or {}).get("original_max_position_embeddings")
            or hf_config.get("max_position_embeddings")
            or context_size
        )
        orig = max(orig, 2)
        # sqrt(1 + ln(F) / ln(orig)) = attention factor  =>  F = orig ** (af^2 - 1)
        factor = float(orig ** (want_af * want_af - 1.0)) if want_af != 1.0 else 1.0
        pe["rope-scaling"] = {
            "rope-type": "longrope",
            "factor": factor,
            "original-max-position-embeddings": orig,
            "short-factor": divisors,
            "long-factor": list(divisors),
        }
    diff = rope_mismatch(pe, hf_config, context_size)
    if diff is not None:
        raise RopeError(f"The rope HexStudio would write for Genie does not reproduce the model's ({diff}).")
    return pe


def rope_mismatch(pe: dict[str, Any], hf_config: dict[str, Any], context_size: int) -> str | None:
    """None when the tables Genie computes from `pe` equal the model's (within TOLERANCE), else what differs."""
    try:
        want_inv, want_af = model_inv_freq(hf_config, context_size)
        got_inv, got_af = genie_inv_freq(pe, context_size)
    except (RopeError, KeyError, TypeError, ValueError) as exc:
        return str(exc)
    if got_inv.shape != want_inv.shape:
        return f"rope-dim {got_inv.size}, the model rotates {want_inv.size} frequency pairs (head_dim / 2)"
    rel = float(np.max(np.abs(got_inv - want_inv) / np.maximum(np.abs(want_inv), 1e-30)))
    if rel > TOLERANCE:
        j = int(np.argmax(np.abs(got_inv - want_inv) / np.maximum(np.abs(want_inv), 1e-30)))
        return (
            f"inverse frequency {j}: Genie {got_inv[j]:.9g}, model {want_inv[j]:.9g}, relative difference "
            f"{rel:.2g}"
        )
    if abs(got_af - want_af) > TOLERANCE * max(1.0, abs(want_af)):
        return f"cos/sin multiplier: Genie {got_af:.9g}, model {want_af:.9g}"
    return None


def rope_effect(pe: dict[str, Any], hf_config: dict[str, Any], context_size: int) -> dict[str, Any] | None:
    """What a rope that Genie can compute, but that differs from the model's, does over the context: None when
    they agree (within TOLERANCE). Raises RopeError/KeyError/... when either side cannot be computed.

    {"pairs": frequency pairs that differ, "of": their count, "max_angle_rad": the largest angle difference at
    the context's last position, "within_0_1_rad_until": the last position where every angle is within 0.1 rad
    (context_size when all are), "attention_factor": (Genie's, the model's) when the cos/sin multiplier differs}"""
    want_inv, want_af = model_inv_freq(hf_config, context_size)
    got_inv, got_af = genie_inv_freq(pe, context_size)
    if got_inv.shape != want_inv.shape:
        raise RopeError(
            f"rope-dim {got_inv.size}, the model rotates {want_inv.size} frequency pairs (head_dim / 2)"
        )
    diff = np.abs(got_inv - want_inv)
    rel = diff / np.maximum(np.abs(want_inv), 1e-30)
    af_differs = abs(got_af - want_af) > TOLERANCE * max(1.0, abs(want_af))
    if float(rel.max()) <= TOLERANCE and not af_differs:
        return None
    worst = float(diff.max())
    until = (
        context_size if worst * (context_size - 1) <= 0.1 else int(0.1 / worst) if worst > 0 else context_size
    )
    out: dict[str, Any] = {
        "pairs": int((rel > TOLERANCE).sum()),
        "of": int(want_inv.size),
        "max_angle_rad": round(worst * (context_size - 1), 4),
        "within_0_1_rad_until": until,
    }
    if af_differs:
        out["attention_factor"] = (round(got_af, 6), round(want_af, 6))
    return out
